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
from flexiq_plugins.operations import Sweeper, find_stranded

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
