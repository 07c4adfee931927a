"""SQLite's new-step statements run straight on pysqlite (``flexiq_plugins/_store/sql/driver.py``, issue 14).

They skip SQLAlchemy's execution wrapper, not what it guarantees: a driver
error is classified as before (a busy database is an outage, C28; a missing
table names the fix), nothing of a failed step is committed, and a row
written this way reads back exactly.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.dialects.postgresql import psycopg

from flexiq_plugins._store.base import Begun, JobEnvelope, StepRow
from flexiq_plugins._store.sql import SqlStepStore
from flexiq_plugins._store.sql.driver import DriverStatement, runs_on_driver
from flexiq_plugins.errors import StoreError, StoreUnavailable

ENVELOPE = JobEnvelope(task_name="shop.checkout", framework="test", args=[1])


def _claimed(store: SqlStepStore, run_key: str) -> Begun:
    begun = store.begin(run_key, "job-1", ENVELOPE, "worker-1", 60.0)
    assert isinstance(begun, Begun), begun
    return begun


def _no_busy_wait(store: SqlStepStore) -> None:
    """Make the store's connections give up on a lock at once instead of after the busy timeout."""

    def at_checkout(dbapi_connection: Any, *_: Any) -> None:
        dbapi_connection.execute("PRAGMA busy_timeout = 0")

    event.listen(store.engine, "checkout", at_checkout)


def test_c28_a_new_step_on_a_database_another_connection_holds_is_an_outage_and_commits_nothing(
    sqlite_url: str, make_sql_store: Callable[..., SqlStepStore]
) -> None:
    """``BEGIN IMMEDIATE`` refused ("database is locked") is ``StoreUnavailable``; once free, the step commits (C28)."""
    store = make_sql_store(sqlite_url)
    claim = _claimed(store, "run-locked").claim
    _no_busy_wait(store)
    other = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another writer (process or connection) holds the database
    try:
        with pytest.raises(StoreUnavailable, match="locked") as raised:
            store.commit_step(claim, StepRow(0, "charge#0", "run", b"v"))
        assert isinstance(raised.value.__cause__, sa.exc.OperationalError), "wrapped as SQLAlchemy wraps it"
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert store.get_steps("run-locked") == []
    assert store.get_run("run-locked").step_count == 0

    stored = store.commit_step(claim, StepRow(0, "charge#0", "run", b"v"))
    assert [s.step_key for s in store.get_steps("run-locked")] == ["charge#0"]
    assert stored.committed_at is not None


def test_a_new_step_whose_table_is_gone_names_the_fix_and_leaves_the_run_unchanged(
    sqlite_url: str, make_sql_store: Callable[..., SqlStepStore]
) -> None:
    """The ``INSERT`` failing after the run's ``UPDATE``: a ``StoreError`` naming the upgrade, nothing committed."""
    store = make_sql_store(sqlite_url)
    claim = _claimed(store, "run-no-table").claim
    steps = store.engine.dialect.identifier_preparer.quote(f"{store.table_prefix}steps")
    with store.engine.begin() as conn:
        conn.exec_driver_sql(f"DROP TABLE {steps}")

    with pytest.raises(StoreError, match="flexiq store upgrade"):
        store.commit_step(claim, StepRow(0, "charge#0", "run", b"v"))

    run = store.get_run("run-no-table")
    assert (run.step_count, run.step_bytes) == (0, 0)


def test_a_step_written_on_the_driver_reads_back_exactly(
    sqlite_url: str, make_sql_store: Callable[..., SqlStepStore]
) -> None:
    """Keys outside ASCII, a value with NUL bytes, the database's clock: as SQLAlchemy's own path stores them."""
    store = make_sql_store(sqlite_url)
    begun = _claimed(store, "run-ü")
    value = b"\x00\xffbytes\x00"
    stored = store.commit_step(begun.claim, StepRow(0, "zahlung ✓#0", "run", value, compensate="undo"))

    [row] = store.get_steps("run-ü")
    assert (row.step_key, row.value, row.compensate, row.attempt) == ("zahlung ✓#0", value, "undo", 1)
    assert row.committed_at == pytest.approx(stored.committed_at)
    run = store.get_run("run-ü")
    assert (run.step_count, run.step_bytes, run.updated_at) == (1, len(value), pytest.approx(stored.committed_at))


def test_a_statement_compiled_per_execution_is_refused() -> None:
    """An ``IN`` list expanded at each execution cannot be compiled once: a ``ValueError`` naming it."""
    table = sa.table("t", sa.column("k"))
    expanding = sa.select(table.c.k).where(table.c.k.in_(sa.bindparam("keys", expanding=True)))
    with pytest.raises(ValueError, match="compiled again at each execution"):
        DriverStatement(expanding, sa.create_engine("sqlite://").dialect)


def test_only_pysqlite_runs_statements_on_the_driver() -> None:
    """pysqlite (the default SQLite driver) does; a dialect that binds by name cannot (its statement is refused)."""
    assert runs_on_driver(sa.create_engine("sqlite://").dialect)
    named = psycopg.dialect()
    assert not runs_on_driver(named)
    with pytest.raises(ValueError, match="binds by name"):
        DriverStatement(sa.select(sa.bindparam("x")), named)
