"""When the framework itself ends or interrupts a job, the store agrees with it (C32, C38, C45).

Real worker processes (a prefork ``celery worker``, a ``dramatiq`` CLI) run
the jobs, since time limits and shutdowns belong to them:

- a hard time limit inside a step: Celery kills the pool process and
  acknowledges the message, Dramatiq raises ``TimeLimitExceeded`` and, with
  no retry left, rejects it; either way the run is ``failed`` and recovery
  never re-publishes it, so the killed step never runs again; with a
  committed step's undo, one more delivery runs it and the run is
  ``compensated``;
- a shutdown that interrupts a step (Celery's cold shutdown, Dramatiq's
  ``Shutdown`` for actors with ``notify_shutdown``): the job goes back to the
  broker, commits nothing for the interrupted step, counts no retry and no
  takeover;
- a warm shutdown lets the running step finish.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from flexiq_plugins.operations import find_stranded
from tests.conformance.harness import Harness
from tests.polling import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def harness(make_harness: Callable[..., Harness]) -> Harness:
    """The module's harness without an in-thread worker; a 1.5 s claim lease."""
    return make_harness(lease_seconds=1.5)


def test_c38_a_job_killed_by_its_time_limit_inside_a_step_fails_its_run_and_is_never_recovered(
    harness: Harness,
) -> None:
    """C38: ``charge`` outlives the task's 1.5 s hard time limit; the framework ends the job.

    The run is ``failed`` in the store, as the framework reports the job;
    once the dead attempt's lease has long expired, recovery does not count
    the run as stranded, so nothing runs ``charge`` again or reaches ``ship``.
    """
    with harness.worker_processes():
        job = harness.publish("overrun")
        run = harness.wait_status(job.run_key, "failed", "succeeded", "dead", timeout=60)
    assert run.status == "failed"
    wait_for(lambda: harness.store.now() > (run.lease_until or run.updated_at) + 2, 10, "the lease to be long over")
    assert job.run_key not in {s.run.run_key for s in find_stranded(harness.store, grace=0, stale_after=0)}
    assert harness.ledger.count(job.run_key, "charge") == 1
    assert harness.ledger.count(job.run_key, "ship") == 0
    assert harness.status(job.run_key) == "failed"


def test_c45_c32_a_time_limit_after_a_committed_undo_runs_the_undo_once_and_compensates_the_run(
    harness: Harness,
) -> None:
    """C45, C32, C38: ``reserve`` (with an undo) commits, then ``charge`` outlives the 1.5 s hard time limit.

    Celery kills the pool process (the core takes the run from the killed
    attempt and publishes it once more); Dramatiq raises ``TimeLimitExceeded``
    and, with no retry left, gives up. Either way one more delivery replays
    ``reserve``, stops before ``charge`` and runs the undo once: the run is
    ``compensated``, ``charge`` ran once, ``ship`` never, and recovery leaves it.
    """
    with harness.worker_processes():
        job = harness.publish("reserve_then_overrun")
        run = harness.wait_status(job.run_key, "compensated", "failed", "succeeded", "dead", timeout=60)
    assert run.status == "compensated"
    assert harness.ledger.count(job.run_key, "undo reserve") == 1
    assert (harness.ledger.count(job.run_key, "charge"), harness.ledger.count(job.run_key, "ship")) == (1, 0)
    assert job.run_key not in {s.run.run_key for s in find_stranded(harness.store, grace=0, stale_after=0)}
    assert harness.dead_letters(job.run_key) == []


def test_c38_a_shutdown_that_interrupts_a_step_puts_the_job_back_without_a_retry(harness: Harness) -> None:
    """C38: a deploy stops the worker while ``work``'s body runs; the job comes back and finishes.

    The interrupted attempt committed nothing: no step row, the run back to
    ``pending`` with no claim. A new worker runs the job again at once: the
    body of ``work`` ran twice with the same idempotency key, no execution
    saw a retry count, the store counts two attempts and no takeover, and
    nothing reached a dead-letter path.
    """
    with harness.worker_processes() as workers:
        job = harness.publish("hold_interruptible")
        wait_for(lambda: harness.ledger.count(job.run_key, "work") == 1, 60, "the body to start working")
        workers.shut_down(interrupt=True)
        workers.wait_exit()
    assert harness.steps(job.run_key) == []
    run = harness.run(job.run_key)
    assert (run.status, run.owner) == ("pending", None)

    harness.ledger.set_flag(job.run_key, "release")
    with harness.worker_processes():
        run = harness.wait_status(job.run_key, "succeeded", timeout=60)
    assert harness.ledger.keys(job.run_key, "work") == [f"{job.run_key}:work#0"] * 2
    assert [a["retries"] for a in harness.ledger.attempts(job.run_key)] == [0, 0]
    assert (run.attempt, run.takeovers) == (2, 0)
    assert harness.dead_letters(job.run_key) == []
    assert harness.broker_dead_letters(job.run_key) == []


def test_c38_a_warm_shutdown_lets_the_running_step_finish(harness: Harness) -> None:
    """C38: a warm shutdown (SIGTERM) waits for the body of ``work``; the run succeeds at its first attempt."""
    with harness.worker_processes() as workers:
        job = harness.publish("hold")
        wait_for(lambda: harness.ledger.count(job.run_key, "work") == 1, 60, "the body to start working")
        workers.shut_down(interrupt=False)
        harness.ledger.set_flag(job.run_key, "release")
        workers.wait_exit()
    run = harness.run(job.run_key)
    assert (run.status, run.attempt, run.takeovers) == ("succeeded", 1, 0)
    assert harness.ledger.count(job.run_key, "work") == 1


def test_c28_c38_a_retry_on_a_worker_process_is_not_the_framework_ending_the_job(harness: Harness) -> None:
    """C28, C38: a task-level retry on a real worker process leaves the run to the retry, which succeeds.

    The failed delivery's message is acknowledged after the retry is
    published, as for any retry; that is not the framework giving the job up,
    so the run is not settled ``failed`` and the retry runs the body.
    """
    with harness.worker_processes():
        job = harness.publish("notify_fails_once")
        run = harness.wait_status(job.run_key, "succeeded", "failed", timeout=60)
    assert run.status == "succeeded"
    assert [a["retries"] for a in harness.ledger.attempts(job.run_key)] == [0, 1]
