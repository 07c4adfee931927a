"""Recovery's copy of a ``queued`` run runs only while the run never started (C39).

A recorded job waits in a backlog longer than ``recovery_queued_seconds``;
recovery publishes a copy. If the original then starts first and hands the
run on (a framework retry, a sleep, a wait), the copy must not claim the
run: that would run the body a second time beside the retry. The copy is
marked ``unstarted_only`` (``JobInfo.unstarted_only``) and dropped as a
duplicate; a copy that finds the run still ``queued`` runs it, and one that
finds it finished replays its outcome (C37).
"""

from __future__ import annotations

import pytest

from flexiq_plugins import DurableConfig, JobEnvelope, MemoryStepStore, current_job
from flexiq_plugins._attempt.decisions import Ack, AckReason, Completed, Failure, Replay
from flexiq_plugins.integration import AttemptDriver, JobInfo
from tests.core.conftest import FakeClock

ENVELOPE = JobEnvelope("charge", "test")


@pytest.fixture
def store(clock: FakeClock) -> MemoryStepStore:
    store = MemoryStepStore(clock=clock)
    store.record_queued("run-1", "job-1", ENVELOPE)
    return store


@pytest.fixture
def driver(store: MemoryStepStore) -> AttemptDriver:
    return AttemptDriver(store, DurableConfig())


def copy() -> JobInfo:
    return JobInfo("run-1", "copy-1", ENVELOPE, unstarted_only=True)


def test_c39_a_copy_of_a_run_the_original_handed_to_a_retry_is_dropped(
    driver: AttemptDriver, store: MemoryStepStore
) -> None:
    """C39: the original claimed the run and failed (the framework will retry it); the copy does not run."""
    ran: list[str] = []

    def fails() -> None:
        ran.append("original")
        raise ValueError("card declined")

    assert isinstance(driver.run_job(JobInfo("run-1", "job-1", ENVELOPE), fails), Failure)
    assert store.get_run("run-1").status == "retrying"
    decision = driver.run_job(copy(), lambda: ran.append("copy"))
    assert decision == Ack(AckReason.DUPLICATE, "retrying")
    assert ran == ["original"]
    assert store.get_run("run-1").attempt == 1


def test_c39_a_copy_of_a_run_that_never_started_runs_it(driver: AttemptDriver, store: MemoryStepStore) -> None:
    """C39: the original was lost: the copy claims the queued run and completes it."""
    decision = driver.run_job(copy(), lambda: current_job.step.run("charge", lambda: "ch-1"))
    assert decision == Completed("ch-1")
    assert store.get_run("run-1").status == "succeeded"


def test_c37_a_copy_of_a_run_that_finished_replays_its_outcome(driver: AttemptDriver) -> None:
    """C37, C39: the original finished first: the copy replays its value, it does not run the body."""
    assert driver.run_job(JobInfo("run-1", "job-1", ENVELOPE), lambda: 42) == Completed(42)
    assert driver.run_job(copy(), lambda: 0) == Replay("succeeded", 42, None)
