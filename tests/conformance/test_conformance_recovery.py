"""A job whose message the broker loses is still run, once, by the workers' own recovery (C39, C46).

Real worker processes with their default recovery (a short interval and
grace for the test): no cron, no ``flexiq recover``, no user code. The job is
published through the framework's own publish path, so the integration
records its run ``queued`` before the message leaves; the message is then
purged from the broker before any worker sees it.
"""

from __future__ import annotations

from collections.abc import Callable
from uuid import uuid4

import pytest

from tests.conformance.harness import Harness

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def harness(make_harness: Callable[..., Harness]) -> Harness:
    """The module's harness without an in-thread worker; recovery every 0.5 s, a run queued 1 s is re-published."""
    return make_harness(recovery_interval_seconds=0.5, recovery_grace_seconds=1.0, recovery_queued_seconds=1.0)


def test_c39_a_message_lost_before_any_worker_took_it_is_recovered_and_finishes_once(harness: Harness) -> None:
    """C39, C35: publish a durable job, purge it from the broker, start a worker: it finishes, its body ran once.

    Before C39 the run did not exist until a worker started it, so nothing
    could find the purged job. Now it is ``queued`` from its publish on, the
    worker's sweeper re-publishes it under its run key, and it succeeds.
    """
    job = harness.publish_new("once")
    queued = harness.run(job.run_key)
    assert (queued.status, queued.attempt, queued.job_id) == ("queued", 0, job.job_id)
    harness.purge()
    with harness.worker_processes():
        run = harness.wait_status(job.run_key, "succeeded", timeout=90)
    assert harness.ledger.count(job.run_key, "work") == 1
    assert run.recovered_at is not None
    assert run.takeovers == 0


def test_c46_a_lost_job_published_with_its_own_run_key_is_recovered_and_finishes_once(harness: Harness) -> None:
    """C46, C39: a job published with a run key the producer chose (one run per order) is recorded ``queued``
    like one with a minted key; its message is lost before any worker took it, and the workers' recovery
    re-publishes it: it finishes, its body ran once.

    A producer's own key used to go out unrecorded, so a lost message was lost for good.
    """
    job = harness.publish("once", run_key=f"order-{uuid4().hex}")
    queued = harness.run(job.run_key)
    assert (queued.status, queued.attempt, queued.job_id) == ("queued", 0, job.job_id)
    harness.purge()
    with harness.worker_processes():
        run = harness.wait_status(job.run_key, "succeeded", timeout=90)
    assert harness.ledger.count(job.run_key, "work") == 1
    assert run.recovered_at is not None


def test_c39_a_recorded_job_runs_its_body_once_even_when_recovery_races_its_message(harness: Harness) -> None:
    """C39, C24: a recorded job published while a worker runs finishes with one body call, whether its own
    message or a copy recovery re-published (if the worker was slower than the 1 s queued limit) ran first."""
    with harness.worker_processes():
        job = harness.publish_new("once")
        harness.wait_status(job.run_key, "succeeded", timeout=60)
    assert harness.ledger.count(job.run_key, "work") == 1


def test_c39_a_lost_wake_up_is_recovered_by_the_workers_with_no_cron(harness: Harness) -> None:
    """C39, C35: the broker accepts a sleeping job's wake-up and loses it; the worker's own sweeper
    re-publishes the run once it is overdue, and it finishes. Nobody runs ``flexiq recover``."""
    job = harness.publish_new("nap", 0.2)
    # Only the wake-up is lost: on a busy machine the sweeper may also re-publish the run while it is
    # still queued (past recovery_queued_seconds), and that copy must not take the fault.
    lost = harness.lose_publishes(job.run_key, 1, only_status="sleeping")
    with harness.thread_worker():
        run = harness.wait_status(job.run_key, "succeeded", timeout=60)
    assert lost.used == 1
    assert lost.statuses == ["sleeping"]
    assert run.recovered_at is not None
    assert (harness.ledger.count(job.run_key, "before"), harness.ledger.count(job.run_key, "after")) == (1, 1)
