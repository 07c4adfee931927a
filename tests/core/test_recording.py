"""The core's part of C39: recording a new job at publish, settling an unclaimed run, recovery in workers.

``record_at_publish`` never fails a publish for the store: an unreachable
store (a real refused connection) is one WARNING per outage, a misconfigured
one an ERROR per cause. ``Sweeper.tick`` sweeps only while it holds the
store's one recovery lease, so two workers never sweep at once.
"""

from __future__ import annotations

import logging
from uuid import uuid4

import pytest

from flexiq_plugins import DurableConfig, MemoryStepStore, SqlStepStore
from flexiq_plugins._model.records import Begun, JobEnvelope
from flexiq_plugins._store.base import StepStore
from flexiq_plugins.integration import (
    record_at_publish,
    resolve_store,
    settle_unclaimed_run,
    start_recovery,
    wants_record,
)
from flexiq_plugins.operations import Sweeper, find_stranded, recover
from tests.polling import wait_for

ENVELOPE = JobEnvelope("shop.checkout", "test", "default", [1], {}, {})


def test_c39_the_message_option_wins_over_the_task_option_over_the_integration() -> None:
    """C39: ``flexiq_record`` on the message, else the task's ``record_at_publish``, else the integration's."""
    on, off = DurableConfig(), DurableConfig(record_at_publish=False)
    assert wants_record(on) is True
    assert wants_record(off) is False
    assert wants_record(on, task_option=False) is False
    assert wants_record(off, task_option=True) is True
    assert wants_record(on, task_option=True, call_option=False) is False
    assert wants_record(off, task_option=False, call_option=True) is True


def test_c39_record_at_publish_writes_a_queued_run() -> None:
    """C39: the run exists as ``queued`` with its job id as soon as the call returns."""
    store = MemoryStepStore()
    key = uuid4().hex
    assert record_at_publish(lambda: store, key, "job-1", ENVELOPE) is True
    assert (store.get_run(key).status, store.get_run(key).job_id) == ("queued", "job-1")


def test_c39_an_unreachable_store_publishes_unrecorded_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    """C39, C28: a store that refuses connections does not fail the publish; one WARNING for many jobs."""
    down = SqlStepStore("postgresql://postgres@127.0.0.1:1/test")
    with caplog.at_level(logging.INFO, logger="flexiq_plugins"):
        results = [record_at_publish(lambda: down, uuid4().hex, f"job-{i}", ENVELOPE) for i in range(3)]
    assert results == [False, False, False]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "cannot be reached" in warnings[0].getMessage()


def test_c39_c41_a_misconfigured_store_at_publish_is_one_clear_error(caplog: pytest.LogCaptureFixture) -> None:
    """C41: a store URL of an unknown scheme is one ERROR line naming it, whatever the number of jobs."""
    with caplog.at_level(logging.INFO, logger="flexiq_plugins"):
        results = [
            record_at_publish(lambda: resolve_store("nosuchdb://x/y"), uuid4().hex, "job", ENVELOPE) for _ in range(3)
        ]
    assert results == [False, False, False]
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "nosuchdb" in errors[0]


def test_c39_settle_unclaimed_run_ends_only_a_queued_run(store: StepStore) -> None:
    """C39: a recorded run no attempt claimed is settled; a run an attempt claimed is left to it."""
    queued, claimed = uuid4().hex, uuid4().hex
    store.record_queued(queued, "j1", ENVELOPE)
    store.record_queued(claimed, "j2", ENVELOPE)
    assert isinstance(store.begin(claimed, "j2", ENVELOPE, "w1", 30.0), Begun)
    assert settle_unclaimed_run(store, queued, "succeeded") is True
    assert settle_unclaimed_run(store, claimed, "succeeded") is False
    assert (store.get_run(queued).status, store.get_run(claimed).status) == ("succeeded", "running")
    assert find_stranded(store, grace=0, stale_after=0, queued_after=0) == []


def test_c39_a_queued_run_is_stranded_only_after_queued_after(store: StepStore) -> None:
    """C39: a run recorded at publish is re-published once it stayed ``queued`` past ``queued_after``."""
    key = uuid4().hex
    store.record_queued(key, "j1", ENVELOPE)
    assert find_stranded(store, queued_after=600) == []
    (found,) = find_stranded(store, queued_after=0)
    assert (found.run.run_key, found.why) == (key, "never_started")


def test_c39_two_sweepers_one_sweep_at_a_time(store: StepStore) -> None:
    """C39: of two workers' sweepers on one store, only the lease holder sweeps; the other's tick is skipped
    until the holder stops and gives the lease up."""
    first = Sweeper(store, {}, interval=60)
    second = Sweeper(store, {}, interval=60)
    assert first.tick() is not None
    assert second.tick() is None
    assert first.tick() is not None  # the holder renews
    first.stop()
    assert second.tick() is not None
    assert first.tick() is None


def test_c39_recovery_off_starts_no_sweeper(caplog: pytest.LogCaptureFixture) -> None:
    """C39: ``recovery=False`` is honoured: no sweeper, and one line saying recovery is off."""
    store = MemoryStepStore()
    with caplog.at_level(logging.INFO, logger="flexiq_plugins"):
        assert start_recovery(lambda: store, {}, DurableConfig(recovery=False), name="test worker") is None
    assert any("recovery is off" in r.getMessage() for r in caplog.records)
    sweeper = start_recovery(lambda: store, {}, DurableConfig(recovery_interval_seconds=3600), name="test worker")
    assert sweeper is not None
    sweeper.stop(timeout=5)


def test_c39_a_scheduled_job_is_not_stranded_before_it_is_due(store: StepStore) -> None:
    """C39: a job published with a countdown is recorded with its due time; recovery counts from then,
    so it never re-publishes a job that is only waiting for its ETA."""
    soon, later = uuid4().hex, uuid4().hex
    store.record_queued(soon, "j1", ENVELOPE)
    store.record_queued(later, "j2", ENVELOPE, 3600.0)
    assert store.get_run(later).wake_at is not None
    assert store.get_run(later).wake_at >= store.now() + 3500  # type: ignore[operator]
    assert [s.run.run_key for s in find_stranded(store, queued_after=0)] == [soon]


def test_c39_sweepers_of_different_frameworks_hold_different_leases(store: StepStore) -> None:
    """C39: a Dramatiq worker's sweeper (which can publish only Dramatiq jobs) never holds up the recovery of
    Celery runs in the same store: each framework set has its own lease."""

    def never(*_: object, **__: object) -> str:
        raise AssertionError("nothing to publish")

    celery_a, celery_b = Sweeper(store, {"celery": never}), Sweeper(store, {"celery": never})
    dramatiq = Sweeper(store, {"dramatiq": never})
    assert dramatiq.tick() is not None
    assert celery_a.tick() is not None
    assert celery_b.tick() is None


def _recorded(store: StepStore, *jobs: str) -> list[str]:
    """Record a queued run per job id; return their run keys once the store's clock has moved past them."""
    keys = [uuid4().hex for _ in jobs]
    for key, job in zip(keys, jobs, strict=True):
        store.record_queued(key, job, ENVELOPE)
    last = store.get_run(keys[-1]).created_at
    wait_for(lambda: store.now() > last, 5, "the store's clock to move on")
    return keys


class _Framework:
    """A publisher of the ``test`` framework that also reads job states (``JobStates``), recording its calls."""

    def __init__(self, states: dict[str, str] | None = None, *, unreadable: bool = False, refuse: bool = False):
        self.states = states or {}
        self.unreadable = unreadable
        self.refuse = refuse
        self.published: list[tuple[str, str | None, bool]] = []

    def __call__(
        self, envelope: JobEnvelope, run_key: str, *, job_id: str | None = None, unstarted_only: bool = False
    ) -> str:
        if self.refuse:
            raise ConnectionRefusedError("broker down")
        self.published.append((run_key, job_id, unstarted_only))
        return job_id or f"new-{len(self.published)}"

    def job_state(self, job_id: str, envelope: JobEnvelope) -> str | None:
        if self.unreadable:
            raise ConnectionRefusedError("result backend down")
        return self.states.get(job_id)


def test_c47_recovery_settles_a_queued_run_its_framework_reported_finished(store: StepStore) -> None:
    """C47: a run recorded at publish whose job a worker without the integration ran (its result store holds
    FAILURE, SUCCESS or REVOKED) is settled to match, never re-published; one with no terminal state is
    re-published under its own job id."""
    failed, done, revoked, lost = _recorded(store, "j-failed", "j-done", "j-revoked", "j-lost")
    framework = _Framework({"j-failed": "failed", "j-done": "succeeded", "j-revoked": "cancelled"})
    report = recover(store, {"test": framework}, queued_after=0)
    assert sorted((s.run.run_key, status) for s, status in report.settled) == sorted(
        [(failed, "failed"), (done, "succeeded"), (revoked, "cancelled")]
    )
    assert [store.get_run(k).status for k in (failed, done, revoked, lost)] == [
        "failed",
        "succeeded",
        "cancelled",
        "queued",
    ]
    assert framework.published == [(lost, "j-lost", True)]
    assert [(s.run.run_key, job) for s, job in report.recovered] == [(lost, "j-lost")]
    assert find_stranded(store, queued_after=0) == []  # settled, or recovered a moment ago


def test_c47_a_result_store_that_cannot_be_read_leaves_the_run_for_the_next_sweep(store: StepStore) -> None:
    """C47: when the framework's result store cannot be read, recovery neither settles nor re-publishes the
    never-started run (it might have run already); the next sweep that can read it decides."""
    [key] = _recorded(store, "j1")
    framework = _Framework(unreadable=True)
    report = recover(store, {"test": framework}, queued_after=0)
    assert (report.recovered, report.settled, framework.published) == ([], [], [])
    [(skipped, why)] = report.skipped
    assert skipped.run.run_key == key
    assert "cannot be read" in why
    assert store.get_run(key).status == "queued"
    framework.unreadable = False
    assert [job for _, job in recover(store, {"test": framework}, queued_after=0).recovered] == ["j1"]


def test_c39_a_dry_run_reports_what_the_framework_reported_without_settling(store: StepStore) -> None:
    """C47: ``recover(dry_run=True)`` lists a run it would settle, and changes nothing."""
    [key] = _recorded(store, "j1")
    report = recover(store, {"test": _Framework({"j1": "failed"})}, queued_after=0, dry_run=True)
    assert [(s.run.run_key, status) for s, status in report.settled] == [(key, "failed")]
    assert store.get_run(key).status == "queued"


def test_c35_a_failed_publish_leaves_the_run_a_candidate_and_three_in_a_row_pause_the_sweep(
    store: StepStore,
) -> None:
    """C35: a publish the broker refuses undoes the run's recovery mark, so the next sweep tries it again
    instead of waiting ``stale_after``; after three failures in a row a sweep leaves the rest to the next."""
    keys = _recorded(store, *(f"j{n}" for n in range(5)))
    framework = _Framework(refuse=True)
    report = recover(store, {"test": framework}, queued_after=0)
    assert len(report.failed) == 3
    assert len(report.skipped) == 2
    assert all("left to the next sweep" in why for _, why in report.skipped)
    assert all(store.get_run(key).recovered_at is None for key in keys)
    framework.refuse = False
    again = recover(store, {"test": framework}, queued_after=0)
    assert sorted(job for _, job in again.recovered) == [f"j{n}" for n in range(5)]


def test_c39_a_sweeper_woken_ticks_at_once(store: StepStore) -> None:
    """C39: ``Sweeper.wake()`` (a worker reconnected to its broker) sweeps now, not at the end of the interval."""
    [key] = _recorded(store, "j1")
    framework = _Framework()
    sweeper = Sweeper(store, {"test": framework}, interval=3600, queued_after=0).start()
    try:
        sweeper.wake()
        wait_for(lambda: framework.published != [], 10, "the woken sweeper to re-publish the run")
    finally:
        sweeper.stop(timeout=5)
    assert framework.published == [(key, "j1", True)]
