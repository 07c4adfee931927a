"""A worker process killed with SIGKILL inside step bodies, before and after a commit (C5, C6, C25, C26, C33, C51).

These tests run real worker processes (a prefork ``celery worker``, a
``dramatiq`` CLI) instead of the module's in-thread worker, with a short claim
lease so the redelivered job takes the dead worker's claim over quickly.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from flexiq_plugins import operations
from tests.conformance.harness import Harness
from tests.polling import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def harness(make_harness: Callable[..., Harness]) -> Harness:
    """The module's harness without an in-thread worker; a 1.5 s claim lease."""
    return make_harness(lease_seconds=1.5)


def test_c5_c6_c25_c26_sigkill_before_and_after_a_commit_runs_each_step_body_to_one_commit(harness: Harness) -> None:
    """C5, C6, C25, C26: the process running the job is killed twice; the run still succeeds.

    First inside ``charge``'s body, before its commit: the message was not
    acknowledged, so the broker delivers it again, the new attempt takes the
    dead worker's claim over once its lease expires, and ``charge`` runs again
    with the same idempotency key (C6). Then inside ``ship``'s body, after
    ``charge`` committed: ``charge`` is not called a third time (C5), ``ship``
    runs again with its same key. The store counts two takeovers (C25) and
    the run succeeds at the third attempt (C26).
    """
    with harness.worker_processes() as workers:
        job = harness.publish("crashy")
        for step in ("charge", "ship"):
            workers.kill(_hung(harness, job.run_key, step))
            workers.revive()
        run = harness.wait_status(job.run_key, "succeeded", timeout=60)

    ledger = harness.ledger
    assert ledger.keys(job.run_key, "charge") == [f"{job.run_key}:charge#0"] * 2
    assert ledger.keys(job.run_key, "ship") == [f"{job.run_key}:ship#0"] * 2
    assert (run.attempt, run.takeovers) == (3, 2)
    assert {a["job"] for a in ledger.attempts(job.run_key)} == {job.job_id}


def _hung(harness: Harness, run_key: str, step: str) -> int:
    """Wait until a worker process hangs in ``step``'s body; return its process id."""
    pid: int = wait_for(lambda: harness.ledger.hung(run_key, step), 60, f"the {step} body to hang")
    return pid


def test_c33_a_replay_after_sigkill_returns_the_same_payload_without_waiting(harness: Harness) -> None:
    """C33, C5: the run receives its event, then the process running it is killed inside ``ship``; the
    redelivered job replays the wait from its memo (the same payload, no second event received, no suspension)
    and finishes."""
    order = f"o-{harness.config.queue}"
    with harness.worker_processes() as workers:
        job = harness.publish("await_then_crash", order)
        harness.wait_status(job.run_key, "waiting")
        sent = operations.send_event(
            "payment", order, {"paid": 1200}, store=harness.store, publishers=harness.publishers()
        )
        assert [run_key for run_key, _ in sent.woken] == [job.run_key]
        workers.kill(_hung(harness, job.run_key, "ship"))
        workers.revive()
        harness.wait_status(job.run_key, "succeeded", timeout=60)

    notes = harness.ledger.entries(job.run_key, "paid")
    assert [n["payload"] for n in notes] == [{"paid": 1200}, {"paid": 1200}]
    assert notes[0]["attempt"] < notes[1]["attempt"]
    events = [r for r in harness.steps(job.run_key) if r.kind == "event"]
    assert [r.event_id for r in events] == [sent.event.id]


def test_c51_c6_a_sigkill_while_map_items_are_in_flight_reruns_only_the_uncommitted_items(harness: Harness) -> None:
    """C51, C5, C6, C25: a map of six items, three at a time; ``d`` and ``e`` hang in flight while ``a``, ``b``,
    ``c`` and ``f`` are committed, and the process is killed. The redelivered job takes the claim over and runs
    only ``d`` and ``e`` again, under their same idempotency keys; the committed items never run again."""
    with harness.worker_processes() as workers:
        job = harness.publish("fan_out", list("abcdef"), 3, ["d", "e"], [])
        hung = [_hung(harness, job.run_key, f"price {item}") for item in "de"]
        wait_for(lambda: _committed(harness, job.run_key) >= set("abcf"), 60, "a, b, c and f to commit")
        assert set(hung) == {hung[0]}, "one worker process runs the whole map"
        workers.kill(hung[0])
        workers.revive()
        run = harness.wait_status(job.run_key, "succeeded", timeout=60)

    ledger = harness.ledger
    assert [ledger.count(job.run_key, f"price {item}") for item in "abcdef"] == [1, 1, 1, 2, 2, 1]
    assert ledger.keys(job.run_key, "price d") == [f"{job.run_key}:price:d"] * 2
    assert (run.attempt, run.takeovers) == (2, 1)


def test_c51_c25_a_crash_loop_inside_a_map_converges_without_running_a_committed_item_twice(harness: Harness) -> None:
    """C51, C25: the process running a map is killed three times in a row, each time inside a later item (one
    item at a time: ``c``, then ``f``, then ``i``). Each new attempt runs only the items with no row, and the
    fourth finishes: no loop, and only the three killed items ran twice."""
    items = list("abcdefghij")
    with harness.worker_processes() as workers:
        job = harness.publish("fan_out", items, 1, ["c", "f", "i"], [])
        for item in "cfi":
            workers.kill(_hung(harness, job.run_key, f"price {item}"))
            workers.revive()
        run = harness.wait_status(job.run_key, "succeeded", timeout=60)

    counts = [harness.ledger.count(job.run_key, f"price {item}") for item in items]
    assert counts == [1, 1, 2, 1, 1, 2, 1, 1, 2, 1]
    assert (run.attempt, run.takeovers) == (4, 3)


def _committed(harness: Harness, run_key: str) -> set[str]:
    """The items of the ``price`` map of ``run_key`` committed so far."""
    return {r.step_key.removeprefix("price:") for r in harness.steps(run_key) if r.step_key.startswith("price:")}
