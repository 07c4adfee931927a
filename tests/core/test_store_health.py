"""One WARNING per store outage per process, whichever parts of the process meet it; one INFO at its end (C28, C41).

A worker process meets an outage in several places at once: its attempts
(put back), its lease renewals, its recovery sweeper, its publishes that
record their runs (C39). An operator wants one clear line per worker per
outage and one on recovery, not a line per part (or per job). The failures
here are real refused connections (a PostgreSQL URL on a closed port) or a
memory store switched down, as each part would meet them.
"""

from __future__ import annotations

import logging
import threading
from uuid import uuid4

import pytest

from flexiq_plugins import MemoryStepStore, SqlStepStore, StoreUnavailable
from flexiq_plugins._attempt import decisions
from flexiq_plugins._attempt.driver import AttemptDriver
from flexiq_plugins._attempt.job import JobInfo
from flexiq_plugins._attempt.lease import LeaseKeeper
from flexiq_plugins._attempt.store_health import BACK_MESSAGE, store_health
from flexiq_plugins._delivery.recording import record_at_publish
from flexiq_plugins._delivery.unregistered import dead_letter_unregistered
from flexiq_plugins._model.config import DurableConfig
from flexiq_plugins._model.records import JobEnvelope
from flexiq_plugins.errors import StoreMisconfigured
from flexiq_plugins.operations import Sweeper
from tests.conftest import POSTGRES, require_service
from tests.polling import wait_for

ENVELOPE = JobEnvelope(task_name="tasks.t", framework="celery", queue="q", args=[], kwargs={}, options={})


class SwitchedStore(MemoryStepStore):
    """A memory store whose calls raise ``StoreUnavailable`` while ``down`` (a real outage's error type)."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False
        self.calls = threading.Event()

    def _check(self) -> None:
        self.calls.set()
        if self.down:
            raise StoreUnavailable("connection refused")

    def now(self) -> float:
        self._check()
        return super().now()

    def begin(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self._check()
        return super().begin(*args, **kwargs)

    def renew(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self._check()
        return super().renew(*args, **kwargs)

    def record_queued(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self._check()
        return super().record_queued(*args, **kwargs)

    def list_runs(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self._check()
        return super().list_runs(*args, **kwargs)

    def acquire_sweep_lease(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self._check()
        return super().acquire_sweep_lease(*args, **kwargs)

    def commit_step(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self._check()
        return super().commit_step(*args, **kwargs)

    def finish(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self._check()
        return super().finish(*args, **kwargs)


def _job() -> JobInfo:
    return JobInfo(uuid4().hex, f"job-{uuid4().hex[:6]}", ENVELOPE)


def _store_lines(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level and r.name.startswith("flexiq_plugins")]


def test_c41_every_part_of_a_process_meeting_one_outage_logs_one_warning_and_one_info_at_its_end(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """C28, C41: put-backs, a lease renewal, a sweep and a publish of one process in one outage: one WARNING
    (the first part's, naming what follows from it), the others at DEBUG; one INFO when the store answers."""
    caplog.set_level(logging.DEBUG, logger="flexiq_plugins")
    store = SwitchedStore()
    driver = AttemptDriver(store, DurableConfig(store_retry_seconds=1, store_retry_max_seconds=5))
    claimed = store.begin("held-run", "job-h", ENVELOPE, "me", 30.0)
    store.down = True

    assert all(isinstance(driver.start(_job()), decisions.PutBack) for _ in range(3))
    keeper = LeaseKeeper(store, claimed.claim, 0.03)  # type: ignore[union-attr]
    store.calls.clear()
    keeper.start()
    assert store.calls.wait(10)
    keeper.stop()
    sweeper = Sweeper(store, {}, interval=60, name="test worker")
    sweeper._note_unreachable(StoreUnavailable("connection refused"), store_health(store).generation)
    assert record_at_publish(lambda: store, uuid4().hex, "job-p", ENVELOPE) is False

    warnings = _store_lines(caplog, logging.WARNING)
    assert len(warnings) == 1, warnings
    assert "jobs are put back after 1 s" in warnings[0]
    debug = "\n".join(_store_lines(caplog, logging.DEBUG))
    assert "lease renewal of run held-run failed" in debug
    assert "recovery paused" in debug
    assert "published without recording their runs" in debug

    store.down = False
    assert not isinstance(driver.start(_job()), decisions.PutBack)
    assert record_at_publish(lambda: store, uuid4().hex, "job-q", ENVELOPE) is True
    sweeper._note_reachable()
    assert _store_lines(caplog, logging.INFO).count(BACK_MESSAGE) == 1

    store.down = True  # a second outage is a second WARNING
    assert record_at_publish(lambda: store, uuid4().hex, "job-r", ENVELOPE) is False
    warnings = _store_lines(caplog, logging.WARNING)
    assert len(warnings) == 2, warnings
    assert "published without recording" in warnings[1]


def test_c41_two_stores_of_one_process_report_their_own_outages(caplog: pytest.LogCaptureFixture) -> None:
    """C41: an outage of one store does not hide the outage of another store of the same process."""
    first, second = SwitchedStore(), SwitchedStore()
    first.down = second.down = True
    assert record_at_publish(lambda: first, uuid4().hex, "job-1", ENVELOPE) is False
    assert record_at_publish(lambda: second, uuid4().hex, "job-2", ENVELOPE) is False
    assert len(_store_lines(caplog, logging.WARNING)) == 2
    assert store_health(first) is not store_health(second)
    assert store_health(first) is store_health(first)


def _misconfigured_store_error() -> StoreUnavailable:
    """A real ``StoreMisconfigured``: PostgreSQL answers that the database does not exist."""
    require_service(*POSTGRES)
    store = SqlStepStore(f"postgresql+psycopg://postgres@127.0.0.1:5432/no_such_db_{uuid4().hex[:8]}")
    try:
        store.record_queued("k", "j", ENVELOPE)
    except StoreMisconfigured as exc:
        return exc
    finally:
        store.close()
    raise AssertionError("a missing database was reachable")


def _refused_store_error() -> StoreUnavailable:
    """A real ``StoreUnavailable``: a refused connection."""
    store = SqlStepStore("postgresql+psycopg://postgres@127.0.0.1:1/test")
    try:
        store.record_queued("k", "j", ENVELOPE)
    except StoreUnavailable as exc:
        return exc
    finally:
        store.close()
    raise AssertionError("a closed port answered")


@pytest.mark.postgres
def test_c41_a_misconfigured_store_at_publish_is_an_error_not_an_outage_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """C41: a publish that meets a misconfigured store (its database does not exist) logs an ERROR naming it,
    not the outage's WARNING ("cannot be reached"), even when an outage of that store was reported before."""
    store = SqlStepStore(f"postgresql+psycopg://postgres@127.0.0.1:5432/no_such_db_{uuid4().hex[:8]}")
    try:
        store_health(store).failed("an earlier outage of this store")  # the outage is already reported
        caplog.set_level(logging.DEBUG, logger="flexiq_plugins")
        caplog.clear()
        assert record_at_publish(lambda: store, uuid4().hex, "job-1", ENVELOPE) is False
    finally:
        store.close()
    errors = _store_lines(caplog, logging.ERROR)
    assert len(errors) == 1, caplog.records
    assert "does not exist" in errors[0]


@pytest.mark.postgres
def test_c41_a_misconfiguration_met_during_an_outage_is_logged_as_an_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """C41: the store is first unreachable (WARNING), then answers that it cannot be used (the database was
    dropped, the password changed): that is an ERROR once, not a DEBUG line of the running outage."""
    refused, misconfigured = _refused_store_error(), _misconfigured_store_error()
    driver = AttemptDriver(MemoryStepStore(), DurableConfig(store_retry_seconds=1, store_retry_max_seconds=8))
    caplog.set_level(logging.DEBUG, logger="flexiq_plugins")
    caplog.clear()
    driver.store_outage(refused)
    driver.store_outage(misconfigured)
    driver.store_outage(misconfigured)
    assert len(_store_lines(caplog, logging.WARNING)) == 1
    errors = _store_lines(caplog, logging.ERROR)
    assert len(errors) == 1, caplog.records
    assert "does not exist" in errors[0]


def test_c41_jobs_of_unknown_tasks_discarded_during_an_outage_share_its_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """C41: a worker that discards jobs of tasks it does not have while the store is unreachable (a refused
    connection) cannot dead-letter their runs; that is the outage's one WARNING, not one WARNING per job."""
    store = SqlStepStore("postgresql+psycopg://postgres@127.0.0.1:1/test")
    caplog.set_level(logging.DEBUG, logger="flexiq_plugins")
    try:
        for i in range(3):
            applied = dead_letter_unregistered(
                lambda: store, uuid4().hex, f"job-{i}", "tasks.gone", known=["tasks.t"], worker="w", kind="task"
            )
            assert applied is False
    finally:
        store.close()
    assert len(_store_lines(caplog, logging.WARNING)) == 1, caplog.records
    assert store_health(store).down


def test_c41_an_outage_that_starts_again_after_another_part_saw_the_store_answer_is_logged_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """C41: the store flaps: attempts are put back (WARNING), a publish reaches it (INFO ``reachable again``),
    then it is down again while the attempts were never let through in between. That second outage is a second
    WARNING: after ``reachable again`` the log must not stay silent while every job is put back."""
    caplog.set_level(logging.DEBUG, logger="flexiq_plugins")
    store = SwitchedStore()
    driver = AttemptDriver(store, DurableConfig(store_retry_seconds=1, store_retry_max_seconds=5))
    sweeper = Sweeper(store, {}, interval=60, name="test worker")
    store.down = True
    assert isinstance(driver.start(_job()), decisions.PutBack)
    sweeper._note_unreachable(StoreUnavailable("connection refused"), store_health(store).generation)
    assert len(_store_lines(caplog, logging.WARNING)) == 1

    store.down = False
    assert record_at_publish(lambda: store, uuid4().hex, "job-p", ENVELOPE) is True
    assert _store_lines(caplog, logging.INFO).count(BACK_MESSAGE) == 1

    store.down = True
    caplog.clear()
    assert isinstance(driver.start(_job()), decisions.PutBack)
    sweeper._note_unreachable(StoreUnavailable("connection refused"), store_health(store).generation)
    warnings = _store_lines(caplog, logging.WARNING)
    assert len(warnings) == 1, caplog.records


def test_c41_a_failure_begun_before_the_store_came_back_belongs_to_the_old_outage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """C41: a sweep sent during an outage ends in its timeout after another part saw the store answer again:
    DEBUG, not a second WARNING (seen in CI: every process logged its outage twice). A failure begun after the
    store came back is a new outage, and is a WARNING again."""
    caplog.set_level(logging.DEBUG, logger="flexiq_plugins")
    store = SwitchedStore()
    health = store_health(store)
    driver = AttemptDriver(store, DurableConfig(store_retry_seconds=1, store_retry_max_seconds=5))
    sweeper = Sweeper(store, {}, interval=60, name="test worker")
    store.down = True
    sweep_began = health.generation  # the sweep's statement is sent during the outage ...
    assert isinstance(driver.start(_job()), decisions.PutBack)
    assert len(_store_lines(caplog, logging.WARNING)) == 1
    store.down = False
    assert record_at_publish(lambda: store, uuid4().hex, "job-p", ENVELOPE) is True
    assert _store_lines(caplog, logging.INFO).count(BACK_MESSAGE) == 1
    caplog.clear()

    sweeper._note_unreachable(StoreUnavailable("timed out"), sweep_began)  # ... and times out after it came back
    assert _store_lines(caplog, logging.WARNING) == [], caplog.records
    assert not health.down

    sweeper._note_unreachable(StoreUnavailable("connection refused"), health.generation)
    assert len(_store_lines(caplog, logging.WARNING)) == 1, caplog.records
    assert health.down


def test_c28_a_claim_held_through_an_outage_is_released_when_the_store_answers() -> None:
    """C28, C23: a step meets the outage and so does the release of the attempt's claim; the job is put back.
    The claim is released as soon as the store answers again, so the put-back's delivery claims the run at
    once (no busy put-backs until the lease expires, no takeover counted as for a dead worker)."""
    from flexiq_plugins import current_job

    store = SwitchedStore()
    driver = AttemptDriver(store, DurableConfig(lease_seconds=60))
    job = _job()

    def body() -> None:
        store.down = True  # the outage begins after the claim, as the first step commits
        current_job.step.run("charge", lambda: 1)

    decision = driver.run_job(job, body)
    assert isinstance(decision, decisions.PutBack)
    assert decision.reason is decisions.PutBackReason.STORE_UNAVAILABLE
    store.down = False
    wait_for(lambda: store.get_run(job.run_key).owner is None, 10, "the held claim to be released")
    run = store.get_run(job.run_key)
    assert (run.status, run.lease_until) == ("retrying", None)
    again = driver.run_job(job, lambda: current_job.step.run("charge", lambda: 1))
    assert isinstance(again, decisions.Completed)
    assert store.get_run(job.run_key).takeovers == 0
    assert driver.late_releases.pending == 0
