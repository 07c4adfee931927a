"""A new step's statements run straight on pysqlite and psycopg (``flexiq_plugins/_store/sql/driver.py``).

They skip SQLAlchemy's execution wrapper, not what it guarantees: a driver
error is classified as before (a busy database is an outage, C28; a missing
table names the fix; a connection the server killed is invalidated, its
result unknown), nothing of a failed step is committed, and a row written
this way reads back exactly.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event

from flexiq_plugins._model.records import Begun, JobEnvelope, StepRow
from flexiq_plugins._store.sql import SqlStepStore, normalize_url
from flexiq_plugins._store.sql import connections as sql_connections_module
from flexiq_plugins._store.sql.driver import DriverStatement, _dollar_placeholders, runs_on_driver
from flexiq_plugins.errors import ClaimLost, StoreError, StoreUnavailable
from tests.store.test_store_held import Checkouts, _backend_pid, _terminate

ENVELOPE = JobEnvelope(task_name="shop.checkout", framework="test", args=[1])


def _claimed(store: SqlStepStore, run_key: str) -> Begun:
    begun = store.begin(run_key, "job-1", ENVELOPE, "worker-1", 60.0)
    assert isinstance(begun, Begun), begun
    return begun


def _on_driver(postgres_url: str, driver: str) -> sa.URL:
    """The test PostgreSQL's URL through ``driver`` (``psycopg`` or ``psycopg2``); skips if it is not installed."""
    pytest.importorskip(driver)
    return sa.make_url(normalize_url(postgres_url)).set(drivername=f"postgresql+{driver}")


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


def test_pysqlite_and_psycopg_run_a_new_steps_statements_on_the_driver_and_pymysql_does_not(
    postgres_url: str, mysql_url: str
) -> None:
    """Which connections :func:`runs_on_driver`; the others keep SQLAlchemy's execution."""
    for url, expected in (("sqlite://", True), (postgres_url, True), (mysql_url, False)):
        engine = sa.create_engine(normalize_url(url))
        try:
            with engine.connect() as conn:
                assert runs_on_driver(conn) is expected, url
        finally:
            engine.dispose()


@pytest.mark.parametrize(
    "setup",
    [
        pytest.param(lambda e: event.listen(e, "before_cursor_execute", lambda *_: None), id="statement listener"),
        pytest.param(lambda e: event.listen(e, "handle_error", lambda _ctx: None), id="handle_error hook"),
        pytest.param(lambda e: e.execution_options(schema_translate_map={None: "main"}), id="schema_translate_map"),
    ],
)
def test_an_engine_with_what_sqlalchemys_execution_applies_keeps_it(setup: Callable[[sa.Engine], Any]) -> None:
    """A tracer, a statement rewriter, an error hook or a schema map on the engine: no statement bypasses them."""
    engine = sa.create_engine("sqlite://")
    configured = setup(engine) or engine
    with configured.connect() as conn:
        assert not runs_on_driver(conn)


def test_a_traced_sqlite_store_shows_every_statement_of_a_step_to_its_listener(
    sqlite_url: str, make_sql_store: Callable[..., SqlStepStore]
) -> None:
    """With a ``before_cursor_execute`` listener (an SQL tracer) the step's statements go through SQLAlchemy."""
    store = make_sql_store(sqlite_url)
    claim = _claimed(store, "run-traced").claim
    seen: list[str] = []
    event.listen(store.engine, "before_cursor_execute", lambda _c, _cur, statement, *_: seen.append(statement))
    store.commit_step(claim, StepRow(0, "charge#0", "run", b"v"))
    assert [s.split()[0] for s in seen] == ["BEGIN", "UPDATE", "INSERT"], seen


@pytest.mark.postgres
@pytest.mark.parametrize("driver", ["psycopg", "psycopg2"])
def test_c28_a_handle_error_hook_that_reads_an_error_as_a_lost_connection_still_decides(
    driver: str, postgres_url: str, make_sql_store: Callable[..., SqlStepStore]
) -> None:
    """SQLAlchemy's documented fail-over recipe: a read-only standby's refusal made a disconnect (C28)."""
    engine = sa.create_engine(_on_driver(postgres_url, driver))
    read_only = {"on": False}

    @event.listens_for(engine, "checkout")
    def _standby(dbapi_connection: Any, *_: Any) -> None:
        if read_only["on"]:
            cursor = dbapi_connection.cursor()
            cursor.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
            cursor.close()
            dbapi_connection.commit()

    @event.listens_for(engine, "handle_error")
    def _read_only_is_lost(ctx: Any) -> None:
        code = getattr(ctx.original_exception, "sqlstate", None) or getattr(ctx.original_exception, "pgcode", None)
        if code == "25006":  # read_only_sql_transaction
            ctx.is_disconnect = True

    try:
        store = make_sql_store(engine)
        claim = _claimed(store, "run-standby").claim
        engine.pool.dispose()
        read_only["on"] = True
        with pytest.raises(StoreUnavailable) as raised:
            store.commit_step(claim, StepRow(0, "charge#0", "run", b"v"))
        assert getattr(raised.value.__cause__, "connection_invalidated", False), repr(raised.value.__cause__)
    finally:
        read_only["on"] = False
        engine.pool.dispose()


def test_a_bind_left_without_a_value_is_refused_not_sent_as_null() -> None:
    """SQLAlchemy refuses a required bind with no value; so does the driver path (a ``KeyError`` naming it)."""
    engine = sa.create_engine("sqlite://")
    statement = DriverStatement(sa.select(sa.bindparam("k", type_=sa.Integer)), engine.dialect)
    with engine.connect() as conn:
        assert statement.first(conn, {"k": 7}) == (7,)
        with pytest.raises(KeyError, match="'k'"):
            statement.first(conn, {})


@pytest.mark.postgres
def test_c28_a_step_on_a_connection_the_server_killed_is_unavailable_with_the_connection_invalidated(
    postgres_url: str, make_sql_store: Callable[..., SqlStepStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """psycopg's error is read as a lost connection, as SQLAlchemy reads it: invalidated, not retried (C28)."""
    sql_store = make_sql_store(postgres_url)
    sql_store.now()
    checkouts = Checkouts(sql_store.engine)
    monkeypatch.setattr(sql_connections_module, "dead_after_idle", lambda *_: None)  # the kill shows at the statement
    with sql_store.held():
        begun = _claimed(sql_store, "run-killed")
        _terminate(postgres_url, _backend_pid(checkouts.out[-1][1]))
        with pytest.raises(StoreUnavailable) as raised:
            sql_store.commit_step(begun.claim, StepRow(0, "a#0", "run", b"1"))
        cause = raised.value.__cause__
        assert isinstance(cause, sa.exc.OperationalError), repr(cause)
        assert cause.connection_invalidated, repr(cause)
        sql_store.commit_step(begun.claim, StepRow(1, "b#0", "run", b"2"))
        assert len(checkouts.out) == 2, "the killed connection was replaced once"
    assert [row.step_key for row in sql_store.get_steps("run-killed")] == ["b#0"]


@pytest.mark.postgres
@pytest.mark.parametrize("driver", ["psycopg", "psycopg2"])
def test_c25_a_step_on_either_postgresql_driver_commits_once_and_is_refused_a_second_time(
    driver: str, postgres_url: str, make_sql_store: Callable[..., SqlStepStore]
) -> None:
    """The same key again is ``ClaimLost`` (the driver's unique violation, wrapped); so is a lost fence (C25)."""
    store = make_sql_store(_on_driver(postgres_url, driver).render_as_string(hide_password=False))
    begun = _claimed(store, "run-twice")
    value = b"\x00\xffbytes"
    stored = store.commit_step(begun.claim, StepRow(0, "zahlung ✓#0", "run", value))
    with pytest.raises(ClaimLost):
        store.commit_step(begun.claim, StepRow(1, "zahlung ✓#0", "run", b"again"))
    stale = dataclasses.replace(begun.claim, attempt=begun.claim.attempt + 1)
    with pytest.raises(ClaimLost):
        store.commit_step(stale, StepRow(1, "b#0", "run", b""))

    [row] = store.get_steps("run-twice")
    assert (row.step_key, row.value, row.committed_at) == ("zahlung ✓#0", value, pytest.approx(stored.committed_at))
    assert store.get_run("run-twice").step_count == 1


@pytest.mark.postgres
def test_c25_psycopg_steps_share_one_kept_cursor_and_a_refused_step_leaves_a_fresh_one_for_the_next(
    postgres_url: str, make_sql_store: Callable[..., SqlStepStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One ``RawCursor`` serves every step of a held connection; a step refused by the database closes it (C25).

    Opening and closing a psycopg cursor per statement costs more than a few
    microseconds, so the pooled connection keeps one. A statement that fails
    (here a step key already committed, the driver's unique violation) drops
    it, and the next step commits on a new one.
    """
    psycopg = pytest.importorskip("psycopg")
    opened: list[Any] = []
    open_cursor = psycopg.RawCursor.__init__

    def counted(self: Any, *args: Any, **kwargs: Any) -> None:
        opened.append(self)
        open_cursor(self, *args, **kwargs)

    monkeypatch.setattr(psycopg.RawCursor, "__init__", counted)
    store = make_sql_store(postgres_url)
    claim = _claimed(store, "run-kept").claim
    opened.clear()  # the claim's (its statement returns the run's steps: a cursor of its own, closed)
    with store.held():
        for position in range(4):
            store.commit_step(claim, StepRow(position, f"s{position}#0", "run", b"v"))
        assert len(opened) == 1, "each step opened a cursor of its own"
        with pytest.raises(ClaimLost):
            store.commit_step(claim, StepRow(4, "s0#0", "run", b"again"))
        assert opened[0].closed, "the cursor of the refused statement was kept"
        store.commit_step(claim, StepRow(4, "s4#0", "run", b"v"))
    assert len(opened) == 2
    assert [row.step_key for row in store.get_steps("run-kept")] == [f"s{i}#0" for i in range(5)]
    assert store.get_run("run-kept").step_count == 5


@pytest.mark.postgres
def test_c22_a_pooled_connection_does_not_keep_a_large_step_value_or_envelope_alive_after_its_statement(
    postgres_url: str, make_sql_store: Callable[..., SqlStepStore]
) -> None:
    """A kept cursor holds its last parameters: a large step value or job envelope runs on a cursor of its own.

    After the step and the record at publish, with the pooled connection back
    in the pool, nothing still references the 4 MB value or the 4 MB
    argument (C22 lets a step value be that large).
    """
    import gc
    import os
    import tracemalloc

    pytest.importorskip("psycopg")
    store = make_sql_store(postgres_url)
    claim = _claimed(store, "run-large").claim
    size = 4_000_000
    tracemalloc.start()
    try:
        with store.held():
            store.commit_step(claim, StepRow(0, "small#0", "run", b"v"))  # the connection's kept cursor
            store.commit_step(claim, StepRow(1, "large#0", "run", os.urandom(size)))  # its last statement
        gc.collect()
        after_step, _ = tracemalloc.get_traced_memory()
        store.record_queued("run-big-envelope", "job-2", JobEnvelope("shop.import", "test", args=["x" * size]))
        gc.collect()
        after_record, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert after_step < size, f"{after_step / 1e6:.1f} MB still referenced after the step"
    assert after_record < size, f"{after_record / 1e6:.1f} MB still referenced after the record at publish"
    assert [row.step_key for row in store.get_steps("run-large")] == ["small#0", "large#0"]


def test_psycopg_runs_a_long_statement_as_written_with_its_own_placeholders(postgres_url: str) -> None:
    """On psycopg a statement is compiled once with ``$n`` placeholders and sent as written.

    psycopg's cursor would convert ``%(name)s`` placeholders at every
    execution, caching that only for statements up to 4,096 bytes; an
    attempt start's one statement is longer. A bind used twice is sent once,
    a ``%`` in the statement's text stays a ``%``, and each value goes where
    its name says, past psycopg's size limit.
    """
    pytest.importorskip("psycopg")
    engine = sa.create_engine(normalize_url(postgres_url))
    padding = " + ".join(["0"] * 1500)  # makes the statement longer than 4,096 bytes
    statement = sa.select(
        sa.bindparam("b", type_=sa.Integer),
        sa.bindparam("a", type_=sa.Text),
        sa.bindparam("b", type_=sa.Integer) + sa.literal_column(padding),
        sa.literal_column("'50%'"),
    )
    try:
        on_driver = DriverStatement(statement, engine.dialect)
        assert len(on_driver.sql.encode()) > 4096
        assert "$1" in on_driver.sql
        assert "$2" in on_driver.sql
        assert "%(" not in on_driver.sql
        with engine.connect() as conn:
            for _ in range(7):  # past psycopg's threshold for preparing it on the server
                assert on_driver.first(conn, {"a": "ä", "b": 7}) == (7, "ä", 7, "50%")
    finally:
        engine.dispose()


def test_a_committed_step_comes_back_with_every_field_it_was_given(
    sqlite_url: str, make_sql_store: Callable[..., SqlStepStore]
) -> None:
    """``commit_step`` returns the row given, every field kept, with its commit time and attempt set (C5)."""
    store = make_sql_store(sqlite_url)
    begun = _claimed(store, "run-fields")
    given = StepRow(0, "charge#0", "run", b"v", wake_at=None, failure=None, compensate="refund", event_id=None)
    stored = store.commit_step(begun.claim, given)
    assert stored.committed_at is not None
    assert stored == dataclasses.replace(given, committed_at=stored.committed_at, attempt=begun.claim.attempt)
    assert [f.name for f in dataclasses.fields(StepRow)] == [  # a new field must be carried by commit_step too
        "position",
        "step_key",
        "kind",
        "value",
        "wake_at",
        "committed_at",
        "attempt",
        "failure",
        "compensate",
        "event_id",
    ]


def test_c39_a_psycopg_client_cursor_engine_keeps_client_side_binding_for_the_stores_statements(
    postgres_url: str, make_sql_store: Callable[..., SqlStepStore]
) -> None:
    """An engine whose psycopg connections use ``ClientCursor`` gets no statement prepared on the server (C39, C23).

    ``ClientCursor`` (SQLAlchemy's recipe for client-side binding) is what a
    transaction-pooling PgBouncer needs: a statement prepared on one server
    connection is missing, or already there, on the next, and the store's
    writes fail. The store's own statements (a publish record, an attempt
    start) run more often than psycopg's threshold for preparing one and must
    still go through the connection's cursor class.
    """
    psycopg = pytest.importorskip("psycopg")
    engine = sa.create_engine(
        _on_driver(postgres_url, "psycopg"),
        connect_args={"cursor_factory": psycopg.ClientCursor},
        pool_size=1,  # one connection: the one read below is the one the store used
        max_overflow=0,
    )
    store = make_sql_store(engine)
    for i in range(7):  # past psycopg's threshold for preparing a statement (5 executions); each autocommitted
        store.record_queued(f"run-{i}", f"job-{i}", ENVELOPE)
        _claimed(store, f"run-{i}")
    with store.engine.connect() as conn:  # before any read: psycopg drops its prepared statements at a rollback
        assert conn.connection.driver_connection.cursor_factory is psycopg.ClientCursor
        prepared = conn.exec_driver_sql("SELECT name, statement FROM pg_prepared_statements").all()
    assert prepared == []
    assert store.get_run("run-6").status == "running"


def test_a_psycopg_connections_own_cursor_class_sees_every_statement_of_an_attempt(
    postgres_url: str, make_sql_store: Callable[..., SqlStepStore]
) -> None:
    """A cursor class of the engine's own (a tracing instrumentation's) runs the hot statements too (C5, C9).

    The store sends its start, steps and finish on a ``RawCursor`` only where
    the connection's cursor class is psycopg's ``Cursor``; with another, they
    go through that class as SQLAlchemy's statements do, so whatever it
    records (a span, a log line) sees them.
    """
    psycopg = pytest.importorskip("psycopg")
    seen: list[str] = []

    class Traced(psycopg.Cursor):  # type: ignore[misc, name-defined]
        def execute(self, query: Any, *args: Any, **kwargs: Any) -> Any:
            seen.append(str(query))
            return super().execute(query, *args, **kwargs)

    engine = sa.create_engine(_on_driver(postgres_url, "psycopg"), connect_args={"cursor_factory": Traced})
    store = make_sql_store(engine)
    store.record_queued("run-traced", "job-1", ENVELOPE)
    begun = _claimed(store, "run-traced")
    seen.clear()
    stored = store.commit_step(begun.claim, StepRow(0, "charge#0", "run", b"v"))
    store.finish(begun.claim, "succeeded")
    assert stored.value == b"v"
    assert any("INSERT INTO" in sql and "steps" in sql for sql in seen), seen
    assert any(sql.lstrip().startswith(("UPDATE", "WITH")) and "status" in sql for sql in seen), seen
    assert all("$1" not in sql for sql in seen)  # SQLAlchemy's own placeholders, as the class expects
    assert store.get_run("run-traced").status == "succeeded"


def test_compiling_for_the_driver_leaves_the_engines_own_rendering_of_a_percent_alone(postgres_url: str) -> None:
    """The ``$n`` copy of psycopg's dialect keeps its own type processors: the engine's literals still double ``%``.

    A processor made while compiling for the driver would render a literal
    ``%`` as one ``%`` in a statement psycopg then reads with ``%(name)s``
    placeholders.
    """
    pytest.importorskip("psycopg")
    engine = sa.create_engine(normalize_url(postgres_url))
    text_type = sa.String()
    literal = sa.select(sa.literal("50%", text_type))
    try:
        with engine.connect() as conn:  # the engine has compiled and run statements before the copy is made
            conn.execute(sa.select(sa.literal(1)))
        dollar = _dollar_placeholders(engine.dialect)  # the copy DriverStatement compiles with
        rendered = str(literal.compile(dialect=dollar, compile_kwargs={"literal_binds": True}))
        assert "'50%'" in rendered  # the copy's processor, made first: no doubling there
        engine_sql = str(literal.compile(dialect=engine.dialect, compile_kwargs={"literal_binds": True}))
        assert "'50%%'" in engine_sql
        with engine.connect() as conn:
            assert conn.execute(literal).scalar_one() == "50%"
    finally:
        engine.dispose()
