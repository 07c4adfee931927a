"""Steps, retries, sleeps and idempotency keys: one behaviour for every adapter on every broker.

Each test runs against ``celery-redis``, ``celery-rabbitmq``, ``dramatiq-redis``
and ``dramatiq-rabbitmq`` through the module's harness and its in-thread
worker (see ``conftest.py``); the task bodies are ``scenarios.py``'s.
"""

from __future__ import annotations

import logging

import pytest

from flexiq_plugins import new_run_key
from tests.conformance.harness import Harness
from tests.conformance.scenarios import TYPED_VALUES, describe
from tests.polling import wait_for

pytestmark = pytest.mark.timeout(120)


def test_c5_c6_c28_a_committed_step_is_not_run_again_by_a_task_level_retry(harness: Harness) -> None:
    """C5, C6, C28: ``notify`` raises on its first call; the framework's retry policy retries the job.

    The retry replays ``charge`` from the store (its body ran once), runs
    ``notify`` again (the raising attempt committed nothing for it), and the
    run succeeds. The retry is the framework's own: the second execution of
    the body sees a retry count of 1.
    """
    job = harness.publish("notify_fails_once")
    run = harness.wait_status(job.run_key, "succeeded")

    ledger = harness.ledger
    assert ledger.count(job.run_key, "charge") == 1
    assert ledger.count(job.run_key, "notify") == 2
    assert [a["retries"] for a in ledger.attempts(job.run_key)] == [0, 1]
    assert run.attempt == 2
    rows = harness.steps(job.run_key)
    assert [(r.step_key, r.attempt) for r in rows] == [("charge#0", 1), ("notify#0", 2)]


def test_c15_c16_c17_a_sleep_ends_the_attempt_and_the_same_job_comes_back_without_a_retry(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """C15, C16, C17: ``step.sleep`` commits its wake time and ends the attempt; the same job comes back.

    The first execution of the body stops at the sleep (``after`` does not run
    in it); the job is delivered again with the same job id and run key, no
    earlier than the wake time fixed by the first commit, replays ``before``
    and runs ``after``. No retry is counted anywhere: every execution sees a
    retry count of 0, every message handed to the broker carries 0, and
    nothing is logged at WARNING or above while the test runs (the module's worker
    handles this job only).
    """
    caplog.set_level(logging.INFO)
    job = harness.publish("nap", 0.3)
    harness.wait_status(job.run_key, "succeeded")

    ledger = harness.ledger
    attempts = ledger.attempts(job.run_key)
    assert [(a["attempt"], a["job"], a["retries"]) for a in attempts] == [(1, job.job_id, 0), (2, job.job_id, 0)]
    assert [(e["what"], e["attempt"]) for e in ledger.entries(job.run_key) if e["what"] != "attempt"] == [
        ("before", 1),
        ("after", 2),
    ]
    before, sleep, after = harness.steps(job.run_key)
    assert (before.step_key, sleep.step_key, sleep.kind, after.step_key) == ("before#0", "sleep#0", "sleep", "after#0")
    assert sleep.attempt == 1
    assert sleep.wake_at is not None
    (woke,) = ledger.entries(job.run_key, "after")
    assert woke["at"] >= sleep.wake_at  # the body went on no earlier than the wake time of the first commit
    hops = harness.published(job.run_key)
    assert hops
    assert {(p.job_id, p.retries) for p in hops} == {(job.job_id, 0)}
    loud = [f"{r.name}: {r.getMessage()}" for r in caplog.records if r.levelno >= logging.WARNING]
    assert loud == []


def test_c10_c11_the_idempotency_key_is_the_same_across_a_sleep_and_a_retry(harness: Harness) -> None:
    """C10, C11: ``step.idempotency_key`` is ``"<run key>:<step key>"`` of the run key the job carries.

    The seed's checkout, published with a run key chosen by the caller:
    ``charge`` runs once before a sleep, ``receipt`` fails once and is retried,
    a keyed ``audit`` step runs once. Every call of a body saw the key derived
    from that run key and the step key alone, the same on every attempt.
    """
    run_key = new_run_key()
    harness.publish("checkout", 0.2, run_key=run_key)
    harness.wait_status(run_key, "succeeded")

    ledger = harness.ledger
    assert ledger.keys(run_key, "charge") == [f"{run_key}:charge#0"]
    assert ledger.keys(run_key, "receipt") == [f"{run_key}:receipt#0", f"{run_key}:receipt#0"]
    assert ledger.keys(run_key, "audit") == [f"{run_key}:audit:order-7"]
    assert [a["retries"] for a in ledger.attempts(run_key)] == [0, 0, 1]  # first, wake, retry


def test_c7_aware_datetime_decimal_and_uuid_step_values_keep_their_types(harness: Harness) -> None:
    """C7: a step returning an aware ``datetime``, a ``Decimal`` and a ``UUID`` gets them back with their types.

    The value is the same, of the same type, with the same UTC offset and
    digits, on the first run (decoded from what was stored) and on the memo
    hit after a sleep; the run succeeds.
    """
    job = harness.publish("typed_values", 0.2)
    run = harness.wait_status(job.run_key, "succeeded", "dead", "failed")

    assert run.status == "succeeded", [d.message for d in harness.dead_letters(job.run_key)]
    seen = [e["value"] for e in harness.ledger.entries(job.run_key, "seen")]
    assert seen == [describe(TYPED_VALUES)] * 2


@pytest.mark.parametrize("scenario", ["nap_without_retries", "nap"])
def test_c15_c16_a_sleep_whose_re_enqueue_fails_past_the_adapters_retries_stays_in_the_broker(
    harness: Harness, scenario: str
) -> None:
    """C15, C16: the broker refuses a sleep's re-enqueue longer than the adapter tries it itself.

    Target: the message is kept in the broker, not acknowledged as done, not
    counted as a retry, never handed to the framework's retry policy or
    dead-letter path, whether the task allows no retry at all
    (``nap_without_retries``: a retry policy would fail it to the dead-letter
    path) or three (``nap``: the retry policy's own re-enqueue would fail too
    and the wake-up be lost); the store says ``sleeping`` at every refused
    hand-off; once the broker accepts again the job wakes and finishes, each
    step body having run once.
    """
    run_key = new_run_key()
    outage = harness.refuse_publishes(run_key, harness.publish_tries)  # every try of the adapter's own
    harness.publish(scenario, 0.2, run_key=run_key)
    wait_for(lambda: _settled(harness, run_key), 30, "the run to finish or leave the broker")

    assert harness.broker_dead_letters(run_key) == []
    assert harness.dead_letters(run_key) == []
    assert {a["retries"] for a in harness.ledger.attempts(run_key)} == {0}
    assert {p.retries for p in harness.published(run_key)} == {0}
    assert outage.used >= harness.publish_tries  # the hand-off failed past the adapter's own tries
    assert set(outage.statuses) == {"sleeping"}
    assert harness.status(run_key) == "succeeded"
    assert harness.ledger.count(run_key, "before") == 1
    assert harness.ledger.count(run_key, "after") == 1


def _settled(harness: Harness, run_key: str) -> bool:
    """The run finished, or its job reached a dead-letter path (it will not come back by itself)."""
    status = harness.status(run_key)
    return status in ("succeeded", "failed", "dead") or bool(harness.broker_dead_letters(run_key))


def test_c36_a_job_published_without_a_run_key_keeps_one_run_key_across_outage_busy_and_sleep(
    harness: Harness,
) -> None:
    """C36: a producer without the integration publishes a job with no run key; it is one run to the end.

    The job's run key is its job id. Its first delivery meets a store outage
    and is put back; a duplicate (the same bare message) arrives while
    ``work`` holds the claim and is put back as busy; then the body sleeps
    and its hop is re-published. Every message the library published for
    the run carried that run key, so there is one run: ``charge`` ran once
    under one idempotency key, the attempts are numbered 1 and 2 (the
    put-backs start no attempt), and the run succeeded.
    """
    job = harness.publish_unstamped("charge_hold_nap", 0.2)
    harness.fail_store_begins(job.run_key, 1)
    wait_for(lambda: harness.ledger.count(job.run_key, "work") == 1, 30, "the body to hold its claim")
    harness.publish_duplicate(job)
    wait_for(lambda: _delayed(harness, job.run_key, busy=True), 30, "the duplicate to be put back")
    harness.ledger.set_flag(job.run_key, "release")
    run = harness.wait_status(job.run_key, "succeeded")

    ledger = harness.ledger
    assert ledger.keys(job.run_key, "charge") == [f"{job.run_key}:charge#0"]
    assert ledger.keys(job.run_key, "after") == [f"{job.run_key}:after#0"]
    assert [(a["attempt"], a["job"], a["retries"]) for a in ledger.attempts(job.run_key)] == [
        (1, job.job_id, 0),
        (2, job.job_id, 0),
    ]
    assert (run.run_key, run.attempt, run.takeovers) == (job.run_key, 2, 0)
    assert [r.run_key for r in harness.store.list_runs(limit=10_000) if r.job_id == job.job_id] == [job.run_key]
    delays = [p.delay for p in harness.published(job.run_key)]
    assert len(delays) >= 3  # the outage put-back, the busy put-back, the sleep's hop: each under the run key
    assert {p.job_id for p in harness.published(job.run_key)} == {job.job_id}


def _delayed(harness: Harness, run_key: str, *, busy: bool) -> bool:
    """Whether the run's messages include a put-back besides the first (the outage's)."""
    return len([p for p in harness.published(run_key) if p.delay is not None]) >= (2 if busy else 1)


# ------------------------------------------------------------ step maps (C51)
def test_c51_a_step_map_runs_each_item_once_and_a_task_retry_runs_only_the_failed_item(harness: Harness) -> None:
    """C51, C5, C6, C28: item ``c`` of a map raises on its first call; the framework retries the job, whose map
    replays the committed items and runs only ``c`` again, under the same idempotency key; the run succeeds with
    the values in the order of the items."""
    job = harness.publish("fan_out", ["a", "b", "c", "d"], 4, [], ["c"])
    run = harness.wait_status(job.run_key, "succeeded")

    ledger = harness.ledger
    assert [ledger.count(job.run_key, f"price {item}") for item in "abcd"] == [1, 1, 2, 1]
    assert ledger.keys(job.run_key, "price c") == [f"{job.run_key}:price:c"] * 2
    assert ledger.count(job.run_key, "total") == 1
    assert [a["retries"] for a in ledger.attempts(job.run_key)] == [0, 1]
    assert run.attempt == 2
    rows = harness.steps(job.run_key)
    assert (rows[0].step_key, rows[0].kind) == ("price#0", "map")
    assert sorted(r.step_key for r in rows[1:]) == ["price:a", "price:b", "price:c", "price:d", "total#0"]


@pytest.mark.timeout(180)
def test_c51_a_1000_item_map_commits_every_item_and_succeeds(harness: Harness) -> None:
    """C51: a map of 1,000 items in one job: every value comes back (their sum is right), one row per item and
    the map's entry are stored, and the run succeeds at its first attempt."""
    job = harness.publish("fan_out_many", 1000)
    run = harness.wait_status(job.run_key, "succeeded", timeout=150)

    assert [n["total"] for n in harness.ledger.entries(job.run_key, "total")] == [sum(2 * n for n in range(1000))]
    rows = harness.steps(job.run_key)
    assert len(rows) == 1001
    assert {r.step_key for r in rows} == {"double#0", *(f"double:{n}" for n in range(1000))}
    assert run.attempt == 1
