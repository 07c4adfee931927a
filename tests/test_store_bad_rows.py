"""Stored rows that cannot be read, on every SQL backend: typed errors and a precise dead letter.

A row can be damaged by hand, by a bug of an older version or by a restore gone
wrong. The job that meets it must not crash the worker with a raw
``JSONDecodeError`` or ``AssertionError``, and one bad row must not make a
whole listing fail: a job is dead-lettered at once with reason
``corrupt_record`` naming the run and the row (no retry could read it), the
listings show the run, and re-publishing it is refused with :class:`CorruptRecord`.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import sqlalchemy as sa

from flexiq_plugins import JobEnvelope, SqlStepStore, StepRow, current_job, operations
from flexiq_plugins._attempt import decisions
from flexiq_plugins.errors import CorruptRecord
from flexiq_plugins.integration import AttemptDriver, JobInfo

SQL_BACKENDS = [
    "sqlite",
    pytest.param("postgres", marks=pytest.mark.postgres),
    pytest.param("mysql", marks=pytest.mark.mysql),
]
ENVELOPE = JobEnvelope("shop.checkout", "test", "orders", [1])


@pytest.fixture(params=SQL_BACKENDS)
def sql_store(request: pytest.FixtureRequest, make_sql_store: Callable[..., SqlStepStore]) -> SqlStepStore:
    """A fresh SQL store on SQLite, PostgreSQL and MariaDB in turn."""
    return make_sql_store(request.getfixturevalue(f"{request.param}_url"))


def _retrying_run(store: SqlStepStore, run_key: str, *rows: StepRow) -> None:
    begun = store.begin(run_key, "job-0", ENVELOPE, "w", 30.0)
    for row in rows:
        store.commit_step(begun.claim, row)  # type: ignore[union-attr]
    store.finish(begun.claim, "retrying")  # type: ignore[union-attr]


def _set_envelope(store: SqlStepStore, run_key: str, text: str) -> None:
    runs = sa.table(f"{store.table_prefix}runs", sa.column("run_key"), sa.column("envelope"))
    with store.engine.begin() as conn:
        conn.execute(sa.update(runs).where(runs.c.run_key == run_key).values(envelope=text))


@pytest.mark.parametrize(
    "text", [pytest.param("{not json", id="not-json"), pytest.param('{"args": []}', id="no-task-name")]
)
def test_c35_a_run_whose_stored_envelope_cannot_be_read_is_dead_lettered_and_still_listed(
    sql_store: SqlStepStore, text: str
) -> None:
    """The worker dead-letters it ``corrupt_record`` without running the body; listings work; no re-publish."""
    _retrying_run(sql_store, "run-bad")
    _retrying_run(sql_store, "run-good")
    _set_envelope(sql_store, "run-bad", text)
    calls: list[int] = []

    started = AttemptDriver(sql_store).start(JobInfo("run-bad", "job-1", ENVELOPE))
    assert isinstance(started, decisions.DeadLetter)
    assert started.reason == "corrupt_record"
    assert "run 'run-bad': the stored job envelope cannot be read" in started.message
    assert calls == []

    listed = {r.run_key: r for r in sql_store.list_runs()}
    assert set(listed) == {"run-bad", "run-good"}
    assert listed["run-bad"].status == "dead"
    assert listed["run-bad"].envelope.task_name == "shop.checkout"  # from its own column
    assert listed["run-bad"].envelope.corrupt is not None
    assert listed["run-good"].envelope.corrupt is None

    (dead,) = sql_store.list_dead_letters()
    assert dead.reason == "corrupt_record"
    with pytest.raises(CorruptRecord, match="cannot be re-published"):
        operations.retry_dead_letter(sql_store, dead.id, {"test": lambda envelope, run_key: "never"})
    assert sql_store.get_run("run-bad").status == "dead"  # nothing changed


def test_c5_a_stored_run_step_whose_value_is_null_dead_letters_corrupt_record(sql_store: SqlStepStore) -> None:
    """A ``run`` step row with a NULL value, replayed, is ``CorruptRecord``, not a bare ``AssertionError``."""
    _retrying_run(sql_store, "run-null", StepRow(0, "charge#0", "run", None))
    calls: list[int] = []

    attempt = AttemptDriver(sql_store).start(JobInfo("run-null", "job-1", ENVELOPE))
    decision = attempt.run(lambda: current_job.step.run("charge", lambda: calls.append(1)))  # type: ignore[union-attr]
    assert isinstance(decision, decisions.DeadLetter)
    assert isinstance(decision.error, CorruptRecord)
    assert decision.reason == "corrupt_record"
    assert "step 'charge#0'" in decision.message
    assert calls == []
    assert operations.show_run(sql_store, "run-null").steps[0].value is None  # shown, not decoded
