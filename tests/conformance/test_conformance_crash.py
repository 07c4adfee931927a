"""A worker process killed with SIGKILL inside step bodies, before and after a commit (C5, C6, C25, C26, C33).

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
