"""The SQL store's plumbing: its engine, its connections, and one transaction per store call.

`SqlConnections` is what every method of
[`SqlStepStore`][flexiq_plugins.SqlStepStore] runs on. It holds the
engine (made by `engine` from a URL, or the caller's own), the tables,
the database's clock as a SQL expression, and the way a call gets a
connection and a transaction:

- **One transaction per call.** `_write`,
  `_read` and `_single_statement`
  run a call's work in one transaction (on PostgreSQL a single statement is
  autocommitted instead: no ``BEGIN``/``COMMIT`` round trips), inside the one
  boundary where database errors become the store's (`errors.translated`).
- **A held connection per attempt.** Inside `held` a
  thread keeps one pooled connection across its calls (a ``_Hold``), checked
  before each use as a pool checkout checks one.
- **Retries.** A connection the server had closed, found so quickly, is
  replaced and the call run once more, never after an unknown ``COMMIT``
  outcome (C28); a deadlock the server reports (the whole transaction was
  rolled back) is retried a few times before it surfaces as
  [`StoreUnavailable`][flexiq_plugins.errors.StoreUnavailable].
- **Sharing.** In-memory SQLite has one connection for all threads: its calls
  are serialized. A forked child never uses its parent's connections (the
  fork hook; a hold inherited across the fork is orphaned, never closed).
- **Lazy schema.** The first call runs the migrations (`migrate`) once
  per store object when ``auto_upgrade`` is on.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Protocol, TypeVar

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.pool import StaticPool

from ...errors import ConfigurationError, StoreUnavailable
from ..caller import ignore_engine
from .engine import (
    READ_ONLY,
    bad_store_message,
    create_engine,
    dead_after_idle,
    normalize_url,
    register_fork_hook,
    safe_url,
)
from .errors import is_deadlock, translation
from .folded import Folded, insert_if_absent
from .migrate import migrate
from .tables import DEFAULT_TABLE_PREFIX, store_tables

__all__ = ["Executes", "SqlConnections"]

_DEADLOCK_RETRIES = 3
_QUICK_DROP_S = 1.0
"""A connection found dead within this many seconds was stale (the server had closed it): worth one retry.

One that failed later timed out on a silent network (see `engine`); a
new connection would only wait for its connect timeout too.
"""
_CLOCKS = {
    "postgresql": "extract(epoch from clock_timestamp())",
    "mysql": "UNIX_TIMESTAMP(NOW(6))",
    "mariadb": "UNIX_TIMESTAMP(NOW(6))",
    "sqlite": "((julianday('now') - 2440587.5) * 86400.0)",
}

T = TypeVar("T")
_UNGUARDED = nullcontext()
"""The guard of a call on a pooled connection: none (stateless, so one serves every thread)."""


class _Dropped(Exception):
    """A transaction's connection was found dead (the server closed it): retried once if not at the commit."""

    def __init__(self, error: sa_exc.DBAPIError, committing: bool) -> None:
        super().__init__(str(error))
        self.error = error
        self.committing = committing


def _driver_connection(conn: Connection) -> Any:
    """The driver's connection under ``conn`` (which is checked out, so there is one)."""
    dbapi_connection = conn.connection.dbapi_connection
    assert dbapi_connection is not None
    return dbapi_connection


_ORPHANED: list[_Hold] = []
"""Holds a forked child inherited from its parent: kept, never closed (see `_Hold.orphan`)."""


class _Hold:
    """The connection one thread keeps for an attempt (`SqlConnections.held`); checked out at first use.

    Between calls the connection has no open transaction. ``autocommit`` says
    whether its driver connection is in autocommit mode now (PostgreSQL's
    single statements): it stays so across consecutive single statements and
    is switched back before a transaction and before it returns to the pool.
    On psycopg only the driver connection's ``autocommit`` flag is switched,
    and switched back to what it was (``restore``): its isolation level,
    which does not apply in autocommit mode, is left as it is; other drivers
    switch through the dialect's isolation level, as SQLAlchemy does.
    """

    __slots__ = ("autocommit", "conn", "depth", "pid", "restore", "used_at")

    def __init__(self) -> None:
        self.depth = 1
        self.conn: Connection | None = None
        self.autocommit = False
        self.restore: bool | None = None  # psycopg: its autocommit flag before the switch; None: the dialect's
        self.used_at = 0.0
        self.pid = os.getpid()

    def switch(self, engine: Engine, conn: Connection, autocommit: bool) -> None:
        """Put ``conn`` (the held connection) into autocommit mode, or back as it was; ``autocommit`` is then that."""
        dbapi_connection = _driver_connection(conn)
        if autocommit:
            if engine.dialect.driver == "psycopg":
                self.restore = dbapi_connection.autocommit
                dbapi_connection.autocommit = True
            else:
                engine.dialect.set_isolation_level(dbapi_connection, "AUTOCOMMIT")
        elif self.restore is not None:
            dbapi_connection.autocommit = self.restore
            self.restore = None
        else:
            engine.dialect.reset_isolation_level(dbapi_connection)
        self.autocommit = autocommit

    def orphan(self) -> None:
        """In a forked child: never touch the parent's connection, nor let it be garbage-collected.

        Closing it, or SQLAlchemy closing it when it is collected, would send
        the parent's server a rollback or a goodbye on the socket the parent
        still uses.
        """
        if self.conn is not None:
            _ORPHANED.append(self)

    def drop(self, engine: Engine) -> None:
        """Give the connection back to the pool (rolled back by the pool; a dead one is discarded)."""
        if os.getpid() != self.pid:  # the block began before a fork: the connection is the parent's
            self.orphan()
            return
        conn, self.conn = self.conn, None
        if conn is None:
            return
        try:
            if self.autocommit and not conn.invalidated:
                self.switch(engine, conn, False)
        except Exception:
            conn.invalidate()  # it cannot be put back as it was: the pool discards it
        finally:
            self.autocommit = False
            self.restore = None
            conn.close()


class Executes(Protocol):
    """Runs a Core statement: the store's own ``Connection``, or a caller's (C42)."""

    def execute(self, statement: Any, /) -> Any:
        """Execute ``statement``; the result has ``rowcount`` and ``scalar_one()``."""


class SqlConnections:
    """The engine, the tables and the transactions of a SQL store (see the module docstring).

    [`SqlStepStore`][flexiq_plugins.SqlStepStore] is built on it; its
    parameters are documented there. Construction does not connect.

    Raises:
      ConfigurationError: an unusable URL, another database or a missing driver.
    """

    def __init__(
        self,
        url_or_engine: str | URL | Engine,
        *,
        auto_upgrade: bool = True,
        table_prefix: str = DEFAULT_TABLE_PREFIX,
    ) -> None:
        self._owns_engine = not isinstance(url_or_engine, Engine)
        if isinstance(url_or_engine, Engine):
            self._engine = url_or_engine
        else:
            self._engine = create_engine(normalize_url(url_or_engine))
        self._dialect = self._engine.dialect.name
        if self._dialect not in _CLOCKS:
            raise ConfigurationError(bad_store_message(safe_url(self._engine.url)))
        self._clock: sa.ColumnElement[float] = sa.literal_column(
            _CLOCKS[self._dialect], type_=sa.Double(asdecimal=False)
        )
        self._t = store_tables(table_prefix)
        self._folded = Folded(self._t, self._clock, self._dialect)
        self._prefix = table_prefix
        self._schema_ready = not auto_upgrade
        # One shared connection (in-memory SQLite) must not run two transactions at once.
        self._shared_connection = isinstance(self._engine.pool, StaticPool)
        self._make_locks()
        register_fork_hook(self, SqlConnections._after_fork)
        ignore_engine(self._engine)  # the store's own transactions never make a step's open transaction (C42)

    @property
    def engine(self) -> Engine:
        """The SQLAlchemy engine the store uses."""
        return self._engine

    @property
    def table_prefix(self) -> str:
        """The prefix of the store's table names."""
        return self._prefix

    @property
    def url(self) -> str:
        """The store's URL with its password hidden."""
        return safe_url(self._engine.url)

    def close(self) -> None:
        """Dispose of the engine's connections (only if the store created the engine)."""
        if self._owns_engine:
            self._engine.dispose()

    # ------------------------------------------------ locks, holds and forks
    def _make_locks(self) -> None:
        self._schema_lock = threading.Lock()
        self._serial = threading.RLock()
        inherited: _Hold | None = getattr(getattr(self, "_holds", None), "hold", None)
        if inherited is not None:  # forked inside a hold: the connection stays the parent's
            inherited.orphan()
        self._holds = threading.local()  # each thread's _Hold; a forked child starts with none

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Keep one pooled connection for this thread's store calls inside the block.

        Without it every call checks a connection out of the pool and back in
        (with the checks of `engine`); inside it, the thread's first call
        checks one out and the following calls reuse it, each first checking
        it as a checkout would (closed by the server? idle for more than 10
        seconds: pinged), so a step body that ran for minutes finds a live
        connection. A call whose connection turned out dead drops it and is
        retried once on a new one, exactly as outside a hold (never after a
        ``COMMIT`` whose result is unknown, C28); a call that raised gives its
        connection back to the pool (rolled back) and the next call checks out
        another. Other threads (the lease keeper, the sweeper) keep using the
        pool. Re-entrant; the connection goes back to the pool when the
        outermost block exits, also on an exception (a time limit, a sleep's
        signal). In-memory SQLite (one connection shared by all threads) holds
        nothing.

        Yields:
          None.
        """
        hold: _Hold | None = getattr(self._holds, "hold", None)
        if hold is not None or self._shared_connection:
            if hold is not None:
                hold.depth += 1
            try:
                yield
            finally:
                if hold is not None:
                    hold.depth -= 1
            return
        hold = self._holds.hold = _Hold()
        try:
            yield
        finally:
            self._holds.hold = None
            hold.drop(self._engine)

    def _after_fork(self) -> None:
        self._make_locks()
        if not self._shared_connection:
            self._engine.dispose(close=False)

    def _ensure_schema(self) -> None:
        if self._schema_ready:
            return
        with self._schema_lock:
            if not self._schema_ready:
                migrate(self._engine, "head", self._prefix)
                self._schema_ready = True

    # ------------------------------------------------- one call, one transaction
    def _write(self, work: Callable[[Connection], T]) -> T:
        """Run ``work`` in one write transaction (committed unless it raises)."""
        return self._run(work, read_only=False)

    def _read(self, work: Callable[[Connection], T]) -> T:
        """Run ``work`` in one read-only transaction."""
        return self._run(work, read_only=True)

    def _single_statement(self, work: Callable[[Connection], T]) -> T:
        """Run ``work``, which sends exactly one write statement, autocommitted where that saves round trips.

        On PostgreSQL the statement commits by itself (one round trip instead
        of ``BEGIN``, the statement and ``COMMIT``); elsewhere it runs in a
        transaction as `_write` does.
        """
        return self._run(work, read_only=False, autocommit=self._dialect == "postgresql")

    def _run(self, work: Callable[[Connection], T], *, read_only: bool, autocommit: bool = False) -> T:
        retries = _DEADLOCK_RETRIES
        while True:
            try:
                try:  # what ``translated`` does, without a generator per call
                    return self._once(work, read_only=read_only, autocommit=autocommit)
                except Exception as exc:
                    error = translation(exc, self._engine)
                    if error is None:
                        raise
                    try:
                        raise error from exc
                    finally:
                        del error  # the frame, in the error's traceback, must not hold it (no cycle)
            except StoreUnavailable as exc:
                if not (retries and is_deadlock(exc.__cause__)):
                    raise
                retries -= 1
                time.sleep(0.01 * (_DEADLOCK_RETRIES - retries))

    def _once(self, work: Callable[[Connection], T], *, read_only: bool, autocommit: bool = False) -> T:
        guard: AbstractContextManager[Any] = self._serial if self._shared_connection else _UNGUARDED
        with guard:
            if not self._schema_ready:
                self._ensure_schema()
            started = time.monotonic()
            try:
                return self._transaction(work, read_only=read_only, autocommit=autocommit)
            except _Dropped as dropped:  # a pooled connection the server had closed: once more, on a new one
                if dropped.committing or time.monotonic() - started > _QUICK_DROP_S:
                    raise dropped.error  # noqa: B904 - the driver error, as translated() expects
            try:
                return self._transaction(work, read_only=read_only, autocommit=autocommit)
            except _Dropped as dropped:
                raise dropped.error  # noqa: B904 - the driver error, as translated() expects

    def _transaction(self, work: Callable[[Connection], T], *, read_only: bool, autocommit: bool) -> T:
        """Run ``work`` in one transaction on a pooled connection (pinged only after idling, see `engine`).

        With ``autocommit``, ``work`` is one statement that the database commits
        by itself (no ``BEGIN``/``COMMIT`` round trips); a drop during it leaves
        its result unknown, as a drop at a ``COMMIT`` does.

        Raises:
          _Dropped: the connection turned out dead; ``committing`` says whether
            that was at the ``COMMIT`` (its result is unknown) or before it
            (nothing was committed: safe to run again).
        """
        hold: _Hold | None = getattr(self._holds, "hold", None)
        if hold is not None:
            return self._held_transaction(hold, work, read_only=read_only, autocommit=autocommit)
        committing = autocommit
        try:
            with self._engine.connect() as conn:
                if read_only:
                    conn.execution_options(**{READ_ONLY: True})
                    return work(conn)
                if autocommit:
                    conn.execution_options(isolation_level="AUTOCOMMIT")
                with conn.begin() as transaction:
                    result = work(conn)
                    committing = True
                    transaction.commit()
                    return result
        except sa_exc.DBAPIError as exc:
            if exc.connection_invalidated:
                raise _Dropped(exc, committing) from exc
            raise

    def _held_connection(self, hold: _Hold) -> Connection:
        """The hold's connection, checked as a pool checkout checks one; a new one if none or dead."""
        conn = hold.conn
        if conn is not None and self._dialect != "sqlite":
            dead = dead_after_idle(self._engine, _driver_connection(conn), hold.used_at)
            if dead is not None:
                conn.invalidate()
                hold.drop(self._engine)
                conn = None
        if conn is None:
            conn = hold.conn = self._engine.connect()
        return conn

    def _held_transaction(
        self, hold: _Hold, work: Callable[[Connection], T], *, read_only: bool, autocommit: bool
    ) -> T:
        """`_transaction` on the connection the thread holds; one that raised is given back to the pool."""
        committing = autocommit
        try:
            conn = self._held_connection(hold)
            if autocommit != hold.autocommit:
                hold.switch(self._engine, conn, autocommit)
            if read_only:
                conn.execution_options(**{READ_ONLY: True})
                try:
                    result = work(conn)
                finally:
                    conn.execution_options(**{READ_ONLY: False})
                conn.rollback()
            elif autocommit:  # the server commits the statement: no transaction of SQLAlchemy's to begin
                result = work(conn)
                if conn.in_transaction():  # the statement went through SQLAlchemy, which began one
                    conn.commit()
            else:
                with conn.begin() as transaction:
                    result = work(conn)
                    committing = True
                    transaction.commit()
            hold.used_at = time.monotonic()
            return result
        except sa_exc.DBAPIError as exc:
            hold.drop(self._engine)
            if exc.connection_invalidated:
                raise _Dropped(exc, committing) from exc
            raise
        except BaseException:
            hold.drop(self._engine)
            raise

    # ------------------------------------------------------ statement helpers
    def _now(self, conn: Executes) -> float:
        return float(conn.execute(sa.select(self._clock)).scalar_one())

    def _insert_if_absent(self, table: sa.Table, values: dict[str, Any], key: str | tuple[str, ...]) -> sa.Insert:
        """An insert of ``values`` into ``table`` that does nothing when the primary key ``key`` exists."""
        return insert_if_absent(self._dialect, table, values, key)
