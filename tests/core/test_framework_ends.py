"""What the core decides when the framework ends, interrupts or runs a job eagerly (C32, C38, C45).

The adapters only report what happened (:class:`Ended`, a
:class:`WorkerInterrupted` raised in the body, an eager :class:`JobInfo`);
the status the run gets is decided here, once, for every framework. The
real-worker tests of each path are in ``tests/conformance``,
``tests/celery`` and ``tests/dramatiq``.
"""

from __future__ import annotations

from unittest.mock import ANY

import pytest

from flexiq_plugins import JobCancelled, JobEnded, JobEnvelope, UnsupportedInEagerMode, current_job
from flexiq_plugins._attempt import decisions
from flexiq_plugins.errors import Disposition, WorkerInterrupted, classify
from flexiq_plugins.integration import JobInfo
from flexiq_plugins.operations import cancel_run, find_stranded

CANCELLED = [decisions.Ended.REVOKED, decisions.Ended.EXPIRED, decisions.Ended.SKIPPED]
FAILED = [decisions.Ended.TIME_LIMIT, decisions.Ended.AGE_LIMIT, decisions.Ended.FAILED]


@pytest.mark.parametrize("how", CANCELLED + FAILED, ids=lambda how: how.value)
def test_c38_a_run_whose_job_the_framework_ended_is_settled_and_never_recovered(harness, clock, how):
    """C38: a revoke, expiry or skip cancels the run; a time or age limit or an acknowledged failure fails it.

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


class Published:
    """A publisher that records what it published (the adapter's, as the core calls it)."""

    def __init__(self, fail: bool = False) -> None:
        self.run_keys: list[str] = []
        self.fail = fail

    def __call__(self, envelope, run_key):
        if self.fail:
            raise ConnectionError("broker down")
        self.run_keys.append(run_key)
        return f"job-{len(self.run_keys) + 1}"


def test_c45_c32_a_hard_time_limit_after_a_committed_undo_takes_the_run_and_runs_the_undo_once(harness):
    """C45, C32, C38: the framework kills the attempt inside ``charge`` after ``reserve`` (undone by an undo) committed.

    The run is taken from the killed attempt (its next write is fenced out),
    waits ``pending`` and is published once through the adapter's publisher;
    that delivery replays ``reserve``, stops before ``charge`` and runs the
    undo once: the run is ``compensated``, and a duplicate replays ``JobEnded``.
    """
    undone, published = [], Published()

    def body():
        step = current_job.step
        step.run("reserve", lambda: "r-1", compensate=undone.append)
        if current_job.attempt == 1:  # the time limit strikes while this attempt runs
            status = harness.driver.framework_ended(
                harness.run_key,
                decisions.Ended.TIME_LIMIT,
                job_id="job-1",
                detail="hard time limit (1.5 s)",
                publisher=published,
            )
            assert status == "pending"
        return step.run("charge", lambda: "c-1")

    assert harness.run(body).reason is decisions.AckReason.DROPPED
    assert published.run_keys == [harness.run_key]
    assert harness.run(body, job_id="job-2") == decisions.Ack(decisions.AckReason.COMPENSATED, ANY)
    assert undone == ["r-1"]
    assert harness.store.get_run(harness.run_key).status == "compensated"
    replayed = harness.driver.run_job(harness.job("job-3"), body)
    assert isinstance(replayed, decisions.Replay)
    assert isinstance(replayed.error, JobEnded)
    assert "time_limit: hard time limit (1.5 s)" in str(replayed.error)


def test_c45_c32_an_age_limit_that_drops_a_sleeping_jobs_wake_up_runs_its_undo(harness):
    """C45, C32, C38: a sleeping run's wake-up is dropped for its age: the run (``sleeping``) compensates.

    Published once more, its next delivery runs the undo of ``charge`` and
    ends the run ``compensated``; recovery never counts it as stranded.
    """
    undone, published = [], Published()

    def body():
        current_job.step.run("charge", lambda: "ch_1", compensate=undone.append)
        current_job.step.sleep(60)
        return current_job.step.run("ship", lambda: "shipped")

    assert isinstance(harness.run(body), decisions.PutBack)
    assert harness.driver.framework_ended(harness.run_key, decisions.Ended.AGE_LIMIT, publisher=published) == "pending"
    assert published.run_keys == [harness.run_key]
    assert harness.run(body, job_id="job-2").reason is decisions.AckReason.COMPENSATED
    assert (undone, harness.store.get_run(harness.run_key).status) == (["ch_1"], "compensated")
    assert find_stranded(harness.store, grace=0, stale_after=0) == []


def test_c45_a_failing_end_without_undos_fails_the_run_and_a_duplicate_replays_it(harness):
    """C45, C37, C38: no committed undo: an age limit fails the run at once, nothing is published, and a
    new job with its run key replays ``JobEnded`` instead of being acknowledged without a result."""
    published = Published()

    def body():
        current_job.step.run("charge", lambda: "ch_1")
        current_job.step.sleep(60)

    harness.run(body)
    assert harness.driver.framework_ended(harness.run_key, decisions.Ended.AGE_LIMIT, publisher=published) == "failed"
    assert published.run_keys == []
    replayed = harness.driver.run_job(harness.job("job-2"), body)
    assert isinstance(replayed, decisions.Replay)
    assert (replayed.status, type(replayed.error)) == ("failed", JobEnded)


@pytest.mark.parametrize(
    ("how", "job_id"),
    [(decisions.Ended.AGE_LIMIT, "job-1"), (decisions.Ended.FAILED, "job-1"), (decisions.Ended.TIME_LIMIT, "job-9")],
    ids=["age_limit", "failed", "time_limit_of_another_job"],
)
def test_c38_an_end_that_did_not_kill_the_running_attempt_leaves_the_run_to_it(harness, how, job_id):
    """C38: a message dropped before its body (a duplicate, a put-back copy), or a time limit of another job,
    while a live attempt runs the run: the run is left to that attempt, which goes on and succeeds."""

    def body():
        assert harness.driver.framework_ended(harness.run_key, how, job_id=job_id) is None
        return current_job.step.run("charge", lambda: "ch_1")

    assert harness.run(body) == decisions.Completed("ch_1")
    assert harness.store.get_run(harness.run_key).status == "succeeded"


def test_c45_a_run_whose_undos_cannot_be_published_now_is_left_pending_for_recovery(harness, clock):
    """C45, C35: the broker refuses the publish of the delivery that runs the undos: the run stays ``pending``
    with its failure recorded, and recovery re-publishes it once ``stale_after`` has passed."""

    def body():
        current_job.step.run("charge", lambda: "ch_1", compensate=lambda charge: None)
        current_job.step.sleep(60)

    harness.run(body)
    ended = decisions.Ended.AGE_LIMIT
    assert harness.driver.framework_ended(harness.run_key, ended, publisher=Published(fail=True)) == "pending"
    clock.advance(7200)
    assert [s.run.run_key for s in find_stranded(harness.store, grace=0, stale_after=3600)] == [harness.run_key]


def test_c45_a_cancelled_attempt_tells_its_adapter_what_the_result_waiter_gets(harness):
    """C45, C34: an attempt that sees its cancellation ends ``Ack(CANCELLED)`` carrying the ``JobCancelled``
    a duplicate replays, for the adapter to store as the job's result."""

    def body():
        harness.store.request_cancel(harness.run_key, "order abandoned")
        return current_job.step.run("charge", lambda: "ch_1")

    decision = harness.run(body)
    assert decision.reason is decisions.AckReason.CANCELLED
    assert isinstance(decision.error, JobCancelled)
    assert str(decision.error) == "the run was cancelled: order abandoned"


class Reporter(Published):
    """A publisher that is also a ``ResultReporter``: records what the result waiters were told."""

    def __init__(self) -> None:
        super().__init__()
        self.told: list[tuple[str, BaseException]] = []

    def report_ended(self, envelope, job_id, error):
        self.told.append((job_id, error))
        return True


@pytest.mark.parametrize("undo", [False, True], ids=["nothing_to_undo", "compensating"])
def test_c45_cancel_run_tells_the_waiter_of_a_sleeping_runs_job_at_once(harness, undo):
    """C45, C34: ``cancel_run`` with a publisher that can report: the job the run's waiter holds (its last
    delivery's id) gets ``JobCancelled`` with the reason at once, whether the run ended or its undos run next."""
    reporter = Reporter()

    def body():
        current_job.step.run("charge", lambda: "ch_1", compensate=(lambda charge: None) if undo else None)
        current_job.step.sleep(60)

    harness.run(body, job_id="job-7")
    done = cancel_run(harness.run_key, reason="order abandoned", store=harness.store, publishers={"test": reporter})
    assert done.effect == ("compensating" if undo else "cancelled")
    assert [(job_id, type(error), str(error)) for job_id, error in reporter.told] == [
        ("job-7", JobCancelled, "the run was cancelled: order abandoned")
    ]
    assert reporter.run_keys == ([harness.run_key] if undo else [])


def test_c45_cancel_run_of_a_running_run_leaves_the_answer_to_its_attempt(harness):
    """C45, C34: a live attempt holds the run: nothing is reported now; the attempt's ``Ack`` carries it."""
    reporter = Reporter()

    def body():
        done = cancel_run(harness.run_key, store=harness.store, publishers={"test": reporter})
        assert done.effect == "requested"
        return current_job.step.run("charge", lambda: "ch_1")

    assert isinstance(harness.run(body).error, JobCancelled)
    assert reporter.told == []


def test_c45_cancel_run_says_when_no_message_is_left_to_answer_the_waiter(harness):
    """C45: a run waiting for an event without a deadline, cancelled without a publisher that can report,
    has no message left whose delivery would tell its waiter: the result's note says so."""

    def body():
        current_job.step.wait_for_event("payment", key="o-1")

    harness.run(body)
    done = cancel_run(harness.run_key, store=harness.store, publishers={})
    assert done.effect == "cancelled"
    assert "no result waiter was told" in done.note


def test_c38_an_acknowledged_failure_that_killed_the_attempt_takes_the_run_from_it(harness):
    """C38, C45: the framework acknowledged the loss of the worker process running the body (Celery's
    ``WorkerLostError`` with ``reject_on_worker_lost=False``): the run is taken from that job's claim and
    fails, instead of waiting for its lease to expire and a takeover to run the body again."""
    attempt = harness.start(job_id="job-1")
    ended = decisions.Ended.FAILED
    assert harness.driver.framework_ended(harness.run_key, ended, job_id="job-1", killed=True) == "failed"
    assert attempt.run(lambda: current_job.step.run("charge", lambda: "ch_1")).reason is decisions.AckReason.DROPPED
