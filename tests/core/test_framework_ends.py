"""What the core decides when the framework ends, interrupts or runs a job eagerly (C38).

The adapters only report what happened (:class:`Ended`, a
:class:`WorkerInterrupted` raised in the body, an eager :class:`JobInfo`);
the status the run gets is decided here, once, for every framework. The
real-worker tests of each path are in ``tests/conformance``,
``tests/celery`` and ``tests/dramatiq``.
"""

from __future__ import annotations

import pytest

from flexiq_plugins import JobEnvelope, current_job
from flexiq_plugins._attempt import decisions
from flexiq_plugins.errors import Disposition, UnsupportedInEagerMode, WorkerInterrupted, classify
from flexiq_plugins.integration import JobInfo
from flexiq_plugins.operations import find_stranded

CANCELLED = [decisions.Ended.REVOKED, decisions.Ended.EXPIRED, decisions.Ended.SKIPPED]
FAILED = [decisions.Ended.TIME_LIMIT, decisions.Ended.FAILED]


@pytest.mark.parametrize("how", CANCELLED + FAILED, ids=lambda how: how.value)
def test_c38_a_run_whose_job_the_framework_ended_is_settled_and_never_recovered(harness, clock, how):
    """C38: a revoke, expiry or skip cancels the run; a time limit or an acknowledged failure fails it.

    It applies to a sleeping run (the framework dropped its wake-up) and is
    final: recovery does not count it as stranded however late it is.
    """

    def body():
        current_job.step.run("charge", lambda: "ch_1")
        current_job.step.sleep(60)

    assert isinstance(harness.run(body), decisions.PutBack)
    status = harness.driver.framework_ended(harness.run_key, how)
    assert status == ("cancelled" if how in CANCELLED else "failed")
    run = harness.store.get_run(harness.run_key)
    assert (run.status, run.owner, run.wake_at, run.step_count) == (status, None, None, 2)
    clock.advance(7200)
    assert find_stranded(harness.store, grace=0, stale_after=0) == []


def test_c38_settling_a_killed_attempt_fences_it_and_a_finished_run_stays_finished(harness):
    """C38: the attempt the framework killed (its claim still held) can no longer commit; a terminal run is kept.

    Its next write is dropped as a lost claim, and a second report (Celery
    and Dramatiq can report one end twice) changes nothing.
    """
    attempt = harness.start()
    assert harness.driver.framework_ended(harness.run_key, decisions.Ended.TIME_LIMIT) == "failed"
    decision = attempt.run(lambda: current_job.step.run("charge", lambda: "ch_1"))
    assert decision == decisions.Ack(decisions.AckReason.DROPPED, decision.detail)
    assert harness.driver.framework_ended(harness.run_key, decisions.Ended.REVOKED) is None
    assert harness.store.get_run(harness.run_key).status == "failed"
    assert harness.driver.framework_ended("no-such-run", decisions.Ended.FAILED) is None


def test_c38_a_worker_shutdown_inside_a_step_puts_the_job_back_committing_nothing(harness):
    """C38: ``WorkerInterrupted`` raised in a step body: no step row, the run ``pending`` with no claim.

    The decision is a put-back for at once (``SHUTDOWN``), not a failure; the
    next delivery claims the run without a takeover and runs the step again.
    """
    calls = []

    def body():
        current_job.step.run("charge", lambda: "ch_1")

        def work():
            calls.append(current_job.attempt)
            if len(calls) == 1:
                raise WorkerInterrupted("the worker shut down")
            return "done"

        return current_job.step.run("work", work)

    decision = harness.run(body)
    assert isinstance(decision, decisions.PutBack)
    assert (decision.reason, decision.delay) == (decisions.PutBackReason.SHUTDOWN, 0.0)
    run = harness.store.get_run(harness.run_key)
    assert (run.status, run.owner) == ("pending", None)
    assert [r.step_key for r in harness.store.get_steps(harness.run_key)] == ["charge#0"]
    assert harness.run(body) == decisions.Completed("done")
    run = harness.store.get_run(harness.run_key)
    assert (run.attempt, run.takeovers, calls) == (2, 0, [1, 2])


def test_c38_worker_stopped_releases_a_running_claim_only(harness):
    """C38: the worker's main process killed the attempt: a ``running`` run goes back to ``pending``, nothing else."""
    harness.start()
    assert harness.driver.worker_stopped(harness.run_key) is True
    assert harness.store.get_run(harness.run_key).status == "pending"
    assert harness.driver.worker_stopped(harness.run_key) is False


def test_c38_an_eager_job_that_sleeps_fails_its_run(harness, clock):
    """C38: an eager job cannot be put back: its sleep fails the run (``UnsupportedInEagerMode``), nothing to resume."""
    job = JobInfo(harness.run_key, "job-1", JobEnvelope("task", "test"), eager=True)

    def body():
        current_job.step.run("charge", lambda: "ch_1")
        current_job.step.sleep(1)

    decision = harness.driver.run_job(job, body)
    assert isinstance(decision, decisions.Failure)
    assert isinstance(decision.error, UnsupportedInEagerMode)
    assert harness.store.get_run(harness.run_key).status == "failed"
    clock.advance(3600)
    assert find_stranded(harness.store, grace=0, stale_after=0) == []


def test_c38_worker_interrupted_is_not_an_error_and_not_retried():
    """C38: ``WorkerInterrupted`` is a ``BaseException`` classified ``INTERRUPTED``, never a retry or a dead letter."""
    error = WorkerInterrupted("shutdown")
    assert not isinstance(error, Exception)
    assert classify(error) is Disposition.INTERRUPTED


def test_c32_c38_an_acknowledged_failure_does_not_cancel_a_compensation_waiting_to_run(harness):
    """C32, C38: the framework reports the failure it acknowledged after the attempt handed it over (``give_up``).

    The run waits for the delivery that runs its undos; the late report of the
    same failure must not settle it ``failed`` and so skip the undos.
    """

    def body():
        current_job.step.run("charge", lambda: "ch_1", compensate=lambda charge: None)
        raise ConnectionError("carrier down")

    failure = harness.run(body)
    assert isinstance(failure, decisions.Failure)
    assert isinstance(harness.driver.give_up(failure), decisions.PutBack)
    assert harness.driver.framework_ended(harness.run_key, decisions.Ended.FAILED) is None
    assert harness.store.get_run(harness.run_key).status == "pending"
