"""The durable step store on SQLAlchemy Core: SQLite, PostgreSQL, MySQL/MariaDB.

Why it is built the way it is (engines, migrations and error translation have
their own modules, each with its reasons):

- **The database's clock, not the worker's (C23).** Every method that stamps or
  compares a time first reads the clock *inside its transaction*, after any row
  lock it needs is held (PostgreSQL ``clock_timestamp()``, MySQL/MariaDB
  ``NOW(6)``, SQLite ``julianday('now')``). A worker whose own clock runs an hour
  ahead therefore cannot see a live lease as expired and steal the claim.
- **One transaction per interface call (C9, C25).** ``begin`` decides on the
  run with its row locked (an upsert that returns the row; SQLite serializes
  writers with ``BEGIN IMMEDIATE`` as well), so two deliveries of one job decide
  Finished / Busy / claim one after the other; a run not stored yet is
  inserted already claimed in one statement. On PostgreSQL ``begin`` first
  tries without holding the lock: it reads the run and its row version, and
  writes the claim with a compare-and-set on that version, two autocommitted
  statements (:mod:`.folded` says why that decides the same); only a lost
  race takes the locking transaction. ``mark_recovered`` locks the row the
  same way. ``renew``, ``commit_step`` and ``finish`` are fenced ``UPDATE …
  WHERE run_key AND owner AND attempt``: a zero row count means another
  attempt took the run over, and nothing is written (:class:`ClaimLost`). The
  hot paths (a step, a start, a finish) are folded into as few statements as
  each database allows, in :mod:`.folded` (one autocommitted statement each on
  PostgreSQL). What each decision is (claim,
  busy, finished, fenced out, recoverable) is not written here but in
  :mod:`flexiq_plugins._store.claims`, shared with the memory store.
- **MySQL's insert-if-absent takes the row lock itself.** ``INSERT … ON
  DUPLICATE KEY UPDATE`` X-locks an existing row, where ``INSERT IGNORE`` would
  take a shared lock that two concurrent ``FOR UPDATE`` readers then deadlock
  on. A deadlock the server reports anyway (the whole transaction was rolled
  back) is retried a few times before it surfaces as :class:`StoreUnavailable`.
- **Lazy schema.** Construction never connects. The first call runs the Alembic
  migrations once per store object (thread-safe), under the migration lock of
  :mod:`.migrate`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Protocol, TypeVar

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.pool import StaticPool

from ..._model.records import (
    CLEANABLE_STATUSES,
    TERMINAL_STATUSES,
    UNSTARTED_STATUSES,
    AttemptStarted,
    BeginResult,
    Begun,
    Claim,
    DeadLetterRecord,
    EventPoll,
    EventRecord,
    JobEnvelope,
    NewDeadLetter,
    RunRecord,
    RunStatus,
    SentEvent,
    StepAttempt,
    StepAttemptBegin,
    StepAttemptFailed,
    StepAttemptFailure,
    StepRow,
)
from ...errors import (
    CancelRequested,
    ClaimLost,
    ConfigurationError,
    InvalidTransaction,
    RunLocked,
    StoreError,
    StoreUnavailable,
    UnknownDeadLetter,
    UnknownRun,
)
from ..base import StepStore
from ..caller import CallerConnection, family, ignore_engine
from ..claims import (
    Granted,
    already_committed,
    claim_lost,
    claim_of_new_run,
    decide_claim,
    fence,
    holds,
    may_recover,
    may_settle_cancelled,
    may_take_sweep_lease,
)
from ..events import WAITER_STATUSES, poll_result
from ..step_attempts import decide_step_attempt, failed_attempt, retry_cut_position
from .engine import (
    READ_ONLY,
    bad_store_message,
    create_engine,
    dead_after_idle,
    normalize_url,
    register_fork_hook,
    safe_url,
)
from .errors import describe, is_deadlock, is_lock_unavailable, is_missing_table, translated
from .folded import Folded
from .mapping import (
    attempt_values,
    dead_letter_record,
    dump_envelope,
    event_record,
    load_envelope,
    run_record,
    step_attempt,
    step_row,
    step_values,
)
from .migrate import migrate, schema_revision
from .tables import DEFAULT_TABLE_PREFIX, store_tables

__all__ = ["SqlStepStore"]

_DEADLOCK_RETRIES = 3
_QUICK_DROP_S = 1.0
"""A connection found dead within this many seconds was stale (the server had closed it): worth one retry.

One that failed later timed out on a silent network (see :mod:`.engine`); a
new connection would only wait for its connect timeout too.
"""
_CLOCKS = {
    "postgresql": "extract(epoch from clock_timestamp())",
    "mysql": "UNIX_TIMESTAMP(NOW(6))",
    "mariadb": "UNIX_TIMESTAMP(NOW(6))",
    "sqlite": "((julianday('now') - 2440587.5) * 86400.0)",
}

T = TypeVar("T")


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
"""Holds a forked child inherited from its parent: kept, never closed (see :meth:`_Hold.orphan`)."""


class _Hold:
    """The connection one thread keeps for an attempt (:meth:`SqlStepStore.held`); checked out at first use.

    Between calls the connection has no open transaction. ``autocommit`` says
    whether its driver connection is in autocommit mode now (PostgreSQL's
    single statements): it stays so across consecutive single statements and
    is switched back before a transaction and before it returns to the pool.
    """

    __slots__ = ("autocommit", "conn", "depth", "pid", "used_at")

    def __init__(self) -> None:
        self.depth = 1
        self.conn: Connection | None = None
        self.autocommit = False
        self.used_at = 0.0
        self.pid = os.getpid()

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
                engine.dialect.reset_isolation_level(_driver_connection(conn))
        except Exception:
            conn.invalidate()  # it cannot be put back as it was: the pool discards it
        finally:
            self.autocommit = False
            conn.close()


class _Executes(Protocol):
    """Runs a Core statement: the store's own ``Connection``, or a caller's (C42)."""

    def execute(self, statement: Any, /) -> Any:
        """Execute ``statement``; the result has ``rowcount`` and ``scalar_one()``."""


@dataclasses.dataclass(frozen=True)
class _StartArgs:
    """What :meth:`SqlStepStore.begin` was given (the envelope also as stored: JSON text)."""

    run_key: str
    job_id: str
    envelope: JobEnvelope
    envelope_json: str
    owner: str
    lease_seconds: float


class SqlStepStore(StepStore):
    """A :class:`StepStore` in a SQL database, through SQLAlchemy Core.

    Parameters:
      url_or_engine(str | URL | Engine): a SQLAlchemy URL (``sqlite:///path``,
        ``postgresql://…``, ``mysql://…``, ``mariadb://…``; a missing driver is
        filled in: psycopg 3, PyMySQL) or an engine you configured yourself (it
        is used as is, and not disposed by :meth:`close`).
      auto_upgrade(bool): run the shipped migrations on first use (once per
        store object). Off, run :func:`upgrade_store` (``flexiq store
        upgrade``) yourself.
      table_prefix(str): prefix of the table names (``flexiq_runs`` …).

    Raises:
      ConfigurationError: an unusable URL, another database or a missing driver.

    Construction does not connect; an unreachable server raises
    :class:`StoreUnavailable` at first use.
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
        register_fork_hook(self, SqlStepStore._after_fork)
        ignore_engine(self._engine)  # the store's own transactions never make a step's open transaction (C42)

    def __repr__(self) -> str:
        return f"SqlStepStore({safe_url(self._engine.url)!r}, table_prefix={self._prefix!r})"

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

    def describe(self) -> str:
        """The store for a worker's start line: its URL (password hidden), table prefix and schema revision.

        Creates or upgrades the tables first if the store does that (``auto_upgrade``).

        Raises:
          StoreUnavailable: the database cannot be reached.
          StoreError: another database error.
        """
        revision = self._read(lambda conn: schema_revision(conn, self._prefix))  # type: ignore[arg-type]
        return f"{self.url} (tables {self._prefix}*, schema revision {revision or 'none: run flexiq store upgrade'})"

    def close(self) -> None:
        """Dispose of the engine's connections (only if the store created the engine)."""
        if self._owns_engine:
            self._engine.dispose()

    # ---------------------------------------------------- plumbing
    def _make_locks(self) -> None:
        self._schema_lock = threading.Lock()
        self._serial = threading.RLock()
        inherited: _Hold | None = getattr(getattr(self, "_holds", None), "hold", None)
        if inherited is not None:  # forked inside a hold: the connection stays the parent's
            inherited.orphan()
        self._holds = threading.local()  # each thread's _Hold; a forked child starts with none

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Keep one pooled connection for this thread's store calls inside the block (issue 14).

        Without it every call checks a connection out of the pool and back in
        (with the checks of :mod:`.engine`); inside it, the thread's first call
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
        transaction as :meth:`_write` does.
        """
        return self._run(work, read_only=False, autocommit=self._dialect == "postgresql")

    def _run(self, work: Callable[[Connection], T], *, read_only: bool, autocommit: bool = False) -> T:
        retries = _DEADLOCK_RETRIES
        while True:
            try:
                with translated(self._engine):
                    return self._once(work, read_only=read_only, autocommit=autocommit)
            except StoreUnavailable as exc:
                if not (retries and is_deadlock(exc.__cause__)):
                    raise
                retries -= 1
                time.sleep(0.01 * (_DEADLOCK_RETRIES - retries))

    def _once(self, work: Callable[[Connection], T], *, read_only: bool, autocommit: bool = False) -> T:
        guard: AbstractContextManager[Any] = self._serial if self._shared_connection else nullcontext()
        with guard:
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
        """Run ``work`` in one transaction on a pooled connection (pinged only after idling, see :mod:`.engine`).

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
        """:meth:`_transaction` on the connection the thread holds; one that raised is given back to the pool."""
        committing = autocommit
        try:
            conn = self._held_connection(hold)
            if autocommit != hold.autocommit:
                dbapi_connection = _driver_connection(conn)
                if autocommit:
                    self._engine.dialect.set_isolation_level(dbapi_connection, "AUTOCOMMIT")
                else:
                    self._engine.dialect.reset_isolation_level(dbapi_connection)
                hold.autocommit = autocommit
            if read_only:
                conn.execution_options(**{READ_ONLY: True})
                try:
                    result = work(conn)
                finally:
                    conn.execution_options(**{READ_ONLY: False})
                conn.rollback()
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

    def _now(self, conn: _Executes) -> float:
        return float(conn.execute(sa.select(self._clock)).scalar_one())

    def _fenced_update(self, conn: _Executes, claim: Claim, **values: Any) -> None:
        """Update the run only while ``claim`` holds it, else raise :class:`ClaimLost` (C25)."""
        runs = self._t.runs
        result = conn.execute(sa.update(runs).where(*self._fence_of(claim)).values(**values))
        if result.rowcount != 1:
            raise claim_lost(claim)

    def now(self) -> float:
        """Return the database's clock, epoch seconds (C23).

        Raises:
          StoreUnavailable: the database cannot be reached.
        """
        return self._read(self._now)

    # ---------------------------------------------------- attempts
    def begin(self, run_key: str, job_id: str, envelope: JobEnvelope, owner: str, lease_seconds: float) -> BeginResult:
        """Claim the run for a new attempt and read its snapshot (C23–C26).

        Insert the run if absent, read it with the database clock, decide as
        :meth:`StepStore.begin` states (:func:`decide_claim`), and write the
        claim only on the run as read: PostgreSQL, two autocommitted statements
        (one for a new run), the claim a compare-and-set on the row version,
        else one transaction that locks the row; SQLite, one ``BEGIN
        IMMEDIATE`` transaction of three statements (one for a new run);
        MySQL/MariaDB, one transaction that locks the row (three statements,
        five for a run not stored yet).

        Parameters:
          run_key(str): the run (at most 255 characters).
          job_id(str): the framework's job id.
          envelope(JobEnvelope): stored with a new run (C35); must be JSON-compatible.
          owner(str): the claiming worker's id.
          lease_seconds(float): the lease, in seconds.

        Raises:
          StoreUnavailable: the database cannot be reached (retryable, C28).
          StoreError: the envelope is not JSON-compatible, or another database error.
        """
        envelope_json = dump_envelope(envelope)
        args = _StartArgs(run_key, job_id, envelope, envelope_json, owner, lease_seconds)
        if self._folded.claims_optimistically:
            begun = self._begin_optimistic(args)
            if begun is not None:
                return begun
        elif self._folded.claims_new_runs:
            return self._write(lambda conn: self._begin_in_three(conn, args))
        return self._write(lambda conn: self._begin(conn, args))

    def _begin_optimistic(self, args: _StartArgs) -> BeginResult | None:
        """PostgreSQL: :meth:`begin` in two autocommitted statements, or one for a new run.

        The first inserts a new run already claimed, or reads the stored run
        with the clock and its row version; :func:`decide_claim` decides on
        what it read. A granted claim is then written with the snapshot's read
        in one compare-and-set on that row version (:meth:`Folded.claim_if_unchanged`):
        the decision stands only if nobody wrote the run in between, exactly as
        if the row had stayed locked, and the claim's times are the clock read
        when it is written (C23). ``None`` if a concurrent write got in between
        (nothing was written): :meth:`begin` then decides again with the row locked.
        """
        granted_new = claim_of_new_run(args.run_key, owner=args.owner, lease_seconds=args.lease_seconds)
        run = self._single_statement(
            lambda conn: self._folded.claim_new_or_read(
                conn, args.run_key, args.envelope, args.envelope_json, job_id=args.job_id, granted=granted_new
            )
        )
        if run is None:
            return None
        stored = load_envelope(run.envelope, task_name=run.task_name, framework=run.framework, queue=run.queue)
        if run.inserted:
            claim = dataclasses.replace(granted_new.claim(args.run_key), lease_until=float(run.lease_until))
            now = float(run.created_at)
            return Begun(claim, (), now, granted_new.takeovers, stored, now, None)
        now = float(run.now)
        decision = decide_claim(run, now=now, owner=args.owner, lease_seconds=args.lease_seconds)
        if not isinstance(decision, Granted):
            return decision
        claimed = {**decision.values(), "job_id": args.job_id}
        del claimed["lease_until"]
        written = self._single_statement(
            lambda conn: self._folded.claim_if_unchanged(
                conn, args.run_key, run.version, claimed, lease_seconds=decision.lease_until - now
            )
        )
        if written is None:
            return None
        lease_until, claimed_at, rows = written
        claim = dataclasses.replace(decision.claim(args.run_key), lease_until=lease_until)
        snapshot = tuple(step_row(r) for r in rows)
        return Begun(claim, snapshot, claimed_at, decision.takeovers, stored, run.created_at, run.cancel_reason)

    def _begin_in_three(self, conn: Connection, args: _StartArgs) -> BeginResult:
        """SQLite: :meth:`begin` in one write transaction of one statement for a new run, three otherwise.

        ``BEGIN IMMEDIATE`` takes the database's write lock first. The new
        run is inserted already claimed; a stored run is read with the clock
        and its steps in one statement, and a granted claim written in one more.
        """
        granted_new = claim_of_new_run(args.run_key, owner=args.owner, lease_seconds=args.lease_seconds)
        row = self._folded.claim_new_run(
            conn, args.run_key, args.envelope, args.envelope_json, job_id=args.job_id, granted=granted_new
        )
        if row is not None:
            claim = dataclasses.replace(granted_new.claim(args.run_key), lease_until=float(row.lease_until))
            stored = load_envelope(
                args.envelope_json,
                task_name=args.envelope.task_name,
                framework=args.envelope.framework,
                queue=args.envelope.queue,
            )
            now = float(row.created_at)
            return Begun(claim, (), now, granted_new.takeovers, stored, now, None)
        run, rows = self._folded.read_run_and_steps(conn, args.run_key)
        if run is None:  # not possible under the write lock; decide the usual way all the same
            return self._begin(conn, args)
        now = float(run.now)
        decision = decide_claim(run, now=now, owner=args.owner, lease_seconds=args.lease_seconds)
        if not isinstance(decision, Granted):
            return decision
        self._folded.write_claim(conn, args.run_key, {**decision.values(), "job_id": args.job_id, "updated_at": now})
        stored = load_envelope(run.envelope, task_name=run.task_name, framework=run.framework, queue=run.queue)
        snapshot = tuple(step_row(r) for r in rows)
        return Begun(
            decision.claim(args.run_key), snapshot, now, decision.takeovers, stored, run.created_at, run.cancel_reason
        )

    def _begin(self, conn: Connection, args: _StartArgs) -> BeginResult:
        """:meth:`begin` with the run's row locked all along (MySQL/MariaDB; PostgreSQL after a race)."""
        run = self._folded.lock_run(conn, args.run_key, args.envelope, args.envelope_json)
        now = float(run.now)
        decision = decide_claim(run, now=now, owner=args.owner, lease_seconds=args.lease_seconds)
        if not isinstance(decision, Granted):
            return decision
        claimed = {**decision.values(), "job_id": args.job_id, "updated_at": now}
        snapshot = tuple(step_row(r) for r in self._folded.claim_and_snapshot(conn, args.run_key, claimed))
        stored = load_envelope(run.envelope, task_name=run.task_name, framework=run.framework, queue=run.queue)
        claim = decision.claim(args.run_key)
        return Begun(claim, snapshot, now, decision.takeovers, stored, run.created_at, run.cancel_reason)

    def record_queued(self, run_key: str, job_id: str, envelope: JobEnvelope, delay_seconds: float = 0.0) -> None:
        """Record a new job's run as ``queued``, unless the run exists (C39); see :meth:`StepStore.record_queued`.

        One statement in one transaction: an insert that does nothing on an
        existing run key.

        Raises:
          StoreUnavailable: the database cannot be reached.
          StoreError: the envelope is not JSON-compatible, or another database error.
        """
        envelope_json = dump_envelope(envelope)
        due = self._clock + max(delay_seconds, 0.0)
        statement = self._insert_run_if_absent(
            run_key, envelope, envelope_json, status="queued", job_id=job_id, wake_at=due
        )
        self._write(lambda conn: conn.execute(statement))

    def acquire_sweep_lease(self, owner: str, lease_seconds: float, *, name: str = "recovery") -> bool:
        """Take or renew the recovery lease on the database's clock (C39); see :meth:`StepStore.acquire_sweep_lease`.

        One transaction: insert the lease row if absent, lock it, decide with
        :func:`~flexiq_plugins._store.claims.may_take_sweep_lease`, write.

        Raises:
          StoreUnavailable: the database cannot be reached.
        """
        sweep = self._t.sweep

        def work(conn: Connection) -> bool:
            conn.execute(self._insert_if_absent(sweep, {"name": name}, "name"))
            row = conn.execute(sa.select(sweep).where(sweep.c.name == name).with_for_update()).one()
            now = self._now(conn)
            if not may_take_sweep_lease(row.owner, row.lease_until, owner=owner, now=now):
                return False
            values = {"owner": owner, "lease_until": now + lease_seconds}
            conn.execute(sa.update(sweep).where(sweep.c.name == name).values(**values))
            return True

        return self._write(work)

    def release_sweep_lease(self, owner: str, *, name: str = "recovery") -> None:
        """Give the recovery lease ``name`` up if ``owner`` holds it (C39).

        Raises:
          StoreUnavailable: the database cannot be reached.
        """
        sweep = self._t.sweep
        held = sa.and_(sweep.c.name == name, sweep.c.owner == owner)
        statement = sa.update(sweep).where(held).values(owner=None, lease_until=None)
        self._write(lambda conn: conn.execute(statement))

    def _insert_run_if_absent(
        self,
        run_key: str,
        envelope: JobEnvelope,
        envelope_json: str,
        *,
        status: str = "pending",
        job_id: str | None = None,
        wake_at: Any = None,
    ) -> sa.Insert:
        values = {
            "run_key": run_key,
            "task_name": envelope.task_name,
            "framework": envelope.framework,
            "queue": envelope.queue,
            "status": status,
            "job_id": job_id,
            "wake_at": wake_at,
            "attempt": 0,
            "takeovers": 0,
            "envelope": envelope_json,
            "step_count": 0,
            "step_bytes": 0,
            "created_at": self._clock,
            "updated_at": self._clock,
        }
        return self._insert_if_absent(self._t.runs, values, "run_key")

    def _insert_if_absent(self, table: sa.Table, values: dict[str, Any], key: str) -> sa.Insert:
        """An insert of ``values`` into ``table`` that does nothing when the primary key ``key`` exists."""
        if self._dialect == "postgresql":
            return postgresql.insert(table).values(values).on_conflict_do_nothing(index_elements=[key])
        if self._dialect == "sqlite":
            return sqlite.insert(table).values(values).on_conflict_do_nothing(index_elements=[key])
        stmt = mysql.insert(table).values(values)
        # Unlike INSERT IGNORE, this X-locks an existing row: no S→X upgrade deadlock.
        return stmt.on_duplicate_key_update({key: stmt.inserted[key]})

    def renew(self, claim: Claim, lease_seconds: float) -> Claim:
        """Extend the lease to the database's ``now + lease_seconds`` (C23), without waiting for a row lock.

        Fenced on ``(run_key, owner, attempt)``. PostgreSQL: one autocommitted
        ``UPDATE`` of the row a ``SELECT … FOR UPDATE NOWAIT`` locks, the
        clock read once it is locked. MySQL/MariaDB: one transaction of that
        locking read, the clock and the ``UPDATE``. SQLite: one ``BEGIN
        IMMEDIATE`` transaction (its lock is the whole database's: it waits,
        up to the busy timeout). A row another transaction holds (a
        transactional step's caller transaction, C42) is not waited for:
        :class:`RunLocked`, so the process's one renewer goes on renewing the
        other claims.

        Parameters:
          claim(Claim): the attempt's claim.
          lease_seconds(float): the new lease, in seconds from now.

        Raises:
          ClaimLost: another attempt holds the run (C25); nothing was written.
          RunLocked: the run's row is locked by another open transaction while
            the claim, as last committed, still holds it (PostgreSQL,
            MySQL/MariaDB); nothing was written: try again shortly.
          StoreUnavailable: the database cannot be reached.
        """
        if self._dialect == "sqlite":
            return self._write(lambda conn: self._renew_locked(conn, claim, lease_seconds))
        try:
            if self._dialect == "postgresql":
                return self._single_statement(lambda conn: self._renew_in_one(conn, claim, lease_seconds))
            return self._write(lambda conn: self._renew_nowait(conn, claim, lease_seconds))
        except StoreError as exc:
            if not is_lock_unavailable(exc.__cause__):
                raise
            refused = exc
        # InnoDB locks the row by its key before it reads the rest of the fence: a claim taken over is refused
        # the lock while the new owner's transaction holds the row. A plain read (the last committed row)
        # tells a lost claim (C25) from a held row.
        if not self._still_holds(claim):
            raise claim_lost(claim) from refused
        raise RunLocked(f"run {claim.run_key!r} is locked by another open transaction") from refused

    def _renew_locked(self, conn: Connection, claim: Claim, lease_seconds: float) -> Claim:
        until = self._now(conn) + lease_seconds
        self._fenced_update(conn, claim, lease_until=until)
        return dataclasses.replace(claim, lease_until=until)

    def _renew_in_one(self, conn: Connection, claim: Claim, lease_seconds: float) -> Claim:
        """PostgreSQL: ``UPDATE … WHERE run_key = (SELECT … fenced FOR UPDATE NOWAIT) RETURNING lease_until``."""
        runs = self._t.runs
        held = sa.select(runs.c.run_key).where(*self._fence_of(claim)).with_for_update(nowait=True)
        statement = (
            sa.update(runs)
            .where(runs.c.run_key == held.scalar_subquery())
            .values(lease_until=self._clock + lease_seconds)
            .returning(runs.c.lease_until)
        )
        until = conn.execute(statement).scalar_one_or_none()
        if until is None:
            raise claim_lost(claim)
        return dataclasses.replace(claim, lease_until=float(until))

    def _renew_nowait(self, conn: Connection, claim: Claim, lease_seconds: float) -> Claim:
        """MySQL/MariaDB: lock the fenced row without waiting (``FOR UPDATE NOWAIT``), then renew it."""
        runs = self._t.runs
        held = sa.select(runs.c.run_key).where(*self._fence_of(claim)).with_for_update(nowait=True)
        if conn.execute(held).first() is None:
            raise claim_lost(claim)
        return self._renew_locked(conn, claim, lease_seconds)

    def _fence_of(self, claim: Claim) -> list[sa.ColumnElement[bool]]:
        runs = self._t.runs
        return [runs.c[name] == value for name, value in fence(claim).items()]

    def commit_step(self, claim: Claim, row: StepRow) -> StepRow:
        """Insert one step row and update the run's step totals (C5, C9).

        One transaction, fenced on the claim, in as few statements as the
        database allows (one on PostgreSQL: :mod:`.folded`).

        Parameters:
          claim(Claim): the attempt's claim.
          row(StepRow): the step to store; ``committed_at`` and ``attempt`` are set here.

        Returns:
          StepRow: the stored row, ``committed_at`` on the database's clock.

        Raises:
          ClaimLost: another attempt holds the run, or the step key is already
            committed (C25); nothing was written.
          CancelRequested: the run's cancellation was requested; the row *is*
            committed and travels with it (C34).
          StoreUnavailable: the database cannot be reached.
        """

        written = self._single_statement(lambda conn: self._folded.commit_step(conn, claim, row))
        stored = dataclasses.replace(row, committed_at=written.now, attempt=claim.attempt)
        if written.cancel_reason is not None:
            raise CancelRequested(written.cancel_reason, stored)
        return stored

    def _clock_and_cancel(self, conn: Connection, run_key: str) -> tuple[float, str | None]:
        """The database's clock and the run's requested cancellation, in the one statement that read the clock."""
        runs = self._t.runs
        query = sa.select(self._clock.label("now"), runs.c.cancel_reason).where(runs.c.run_key == run_key)
        row = conn.execute(query).first()
        return (self._now(conn), None) if row is None else (float(row.now), row.cancel_reason)

    def commit_step_on(self, connection: CallerConnection, claim: Claim, row: StepRow) -> StepRow:
        """Write one step row in the caller's open transaction on ``connection`` (C42).

        The same statements as :meth:`commit_step` (the run's row updated,
        fenced on the claim, then the step row inserted), sent on the caller's
        connection and not committed here: they commit or roll back with the
        caller's transaction. The fenced update locks the run's row until then.
        A fence that matches nothing while this store still sees the claim held
        means the connection reaches another database.

        Parameters:
          connection(CallerConnection): the caller's connection, inside its transaction.
          claim(Claim): the attempt's claim.
          row(StepRow): the step to store.

        Raises:
          InvalidTransaction: the connection is to another database, or the
            store's tables are not there (another table prefix).
          ClaimLost: another attempt holds the run, or the step is already committed (C25).
          StoreError: the caller's connection reported another database error.
        """
        if family(connection.dialect_name) != family(self._dialect):
            raise self._elsewhere(connection, f"a {connection.dialect_name} database")
        try:
            return self._commit_step(connection, claim, row)
        except ClaimLost as exc:
            if isinstance(exc.__cause__, sa_exc.IntegrityError) or not self._still_holds(claim):
                raise
            raise self._elsewhere(connection, "a database where this run is not claimed") from exc
        except sa_exc.SQLAlchemyError as exc:
            if is_missing_table(exc):
                raise self._elsewhere(connection, "a database without the store's tables") from exc
            raise StoreError(
                f"step {row.step_key!r} could not be written on {connection.description}: {describe(exc)}"
            ) from exc

    def _elsewhere(self, connection: CallerConnection, what: str) -> InvalidTransaction:
        return InvalidTransaction(
            f"{connection.description} reaches {what}, not the step store's database ({self.url}, table "
            f"prefix {self._prefix!r}); a transactional step needs the store and the tables its body "
            "writes in one database: pass a connection to the store's database, or make it a plain step.run"
        )

    def _still_holds(self, claim: Claim) -> bool:
        """Whether the run as last committed is still ``claim``'s (a read that takes no lock)."""
        try:
            return holds(self.get_run(claim.run_key), claim)
        except UnknownRun:
            return False

    def _commit_step(self, conn: _Executes, claim: Claim, row: StepRow, now: float | None = None) -> StepRow:
        runs = self._t.runs
        now = self._now(conn) if now is None else now
        self._fenced_update(
            conn,
            claim,
            step_count=runs.c.step_count + 1,
            step_bytes=runs.c.step_bytes + row.size,
            updated_at=now,
        )
        stored = dataclasses.replace(row, committed_at=now, attempt=claim.attempt)
        try:
            conn.execute(sa.insert(self._t.steps).values(run_key=claim.run_key, **step_values(stored)))
        except sa_exc.IntegrityError as exc:
            raise already_committed(claim, row.step_key) from exc
        return stored

    # ---------------------------------------------------- step attempts
    def begin_step_attempt(self, claim: Claim, step_key: str, max_attempts: int) -> StepAttemptBegin:
        """Journal a new attempt of ``step_key`` before its body runs, if its budget allows (C31).

        One transaction, fenced on the claim: open attempts become ``lost``,
        then :func:`~flexiq_plugins._store.step_attempts.decide_step_attempt`
        decides on the database's clock and a started attempt is inserted.

        Parameters:
          claim(Claim): the attempt's claim.
          step_key(str): the step.
          max_attempts(int): the step's budget, the first attempt included.

        Raises:
          ClaimLost: another attempt holds the run (C25); nothing was written.
          StoreUnavailable: the database cannot be reached.
        """
        return self._write(lambda conn: self._begin_step_attempt(conn, claim, step_key, max_attempts))

    def _attempts_of(self, run_key: str, step_key: str) -> sa.ColumnElement[bool]:
        attempts = self._t.attempts
        return sa.and_(attempts.c.run_key == run_key, attempts.c.step_key == step_key)

    def _begin_step_attempt(self, conn: Connection, claim: Claim, step_key: str, max_attempts: int) -> StepAttemptBegin:
        attempts = self._t.attempts
        now = self._now(conn)
        self._fenced_update(conn, claim, updated_at=now)
        mine = self._attempts_of(claim.run_key, step_key)
        conn.execute(sa.update(attempts).where(mine, attempts.c.outcome.is_(None)).values(outcome="lost"))
        rows = conn.execute(sa.select(attempts).where(mine).order_by(attempts.c.number))
        decision = decide_step_attempt([step_attempt(r) for r in rows], now=now, max_attempts=max_attempts)
        if isinstance(decision, AttemptStarted):
            started = StepAttempt(claim.run_key, step_key, decision.number, claim.attempt, now)
            conn.execute(sa.insert(attempts).values(**attempt_values(started)))
        return decision

    def fail_step_attempt(
        self, claim: Claim, failure: StepAttemptFailure, *, row: StepRow | None = None
    ) -> StepAttemptFailed:
        """Record a failed step attempt and, for a step failed for good, commit its step row (C31).

        One transaction, fenced on the claim; ``failed_at`` and ``retry_at``
        are on the database's clock.

        Parameters:
          claim(Claim): the attempt's claim.
          failure(StepAttemptFailure): the attempt and its error.
          row(StepRow | None): the step row to commit with it.

        Raises:
          ClaimLost: another attempt holds the run, or ``row``'s key is already
            committed (C25); nothing was written.
          StoreUnavailable: the database cannot be reached.
        """
        return self._write(lambda conn: self._fail_step_attempt(conn, claim, failure, row))

    def _fail_step_attempt(
        self, conn: Connection, claim: Claim, failure: StepAttemptFailure, row: StepRow | None
    ) -> StepAttemptFailed:
        attempts = self._t.attempts
        now = self._now(conn)
        stored = self._commit_step(conn, claim, row, now) if row is not None else None
        if row is None:
            self._fenced_update(conn, claim, updated_at=now)
        mine = self._attempts_of(claim.run_key, failure.step_key)
        number = failure.number
        if number is None:
            last = sa.select(sa.func.coalesce(sa.func.max(attempts.c.number), 0)).where(mine)
            number = int(conn.execute(last).scalar_one()) + 1
        existing = conn.execute(sa.select(attempts).where(mine, attempts.c.number == number)).first()
        journaled = step_attempt(existing) if existing is not None else None
        attempt = failed_attempt(
            journaled or StepAttempt(claim.run_key, failure.step_key, number, claim.attempt, now), failure, now
        )
        if journaled is None:
            conn.execute(sa.insert(attempts).values(**attempt_values(attempt)))
        else:
            conn.execute(sa.update(attempts).where(mine, attempts.c.number == number).values(**attempt_values(attempt)))
        return StepAttemptFailed(attempt, stored)

    def get_step_attempts(self, run_key: str) -> list[StepAttempt]:
        """Return the run's step attempts, ordered by ``started_at``, step key and number (C31).

        Raises:
          StoreUnavailable: the database cannot be reached.
        """
        attempts = self._t.attempts
        query = (
            sa.select(attempts)
            .where(attempts.c.run_key == run_key)
            .order_by(attempts.c.started_at, attempts.c.step_key, attempts.c.number)
        )
        return [step_attempt(r) for r in self._read(lambda conn: conn.execute(query).all())]

    def start_compensation(self, run_key: str, marker: StepRow, *, status: str, attempt: int) -> bool:
        """Turn a run that is not running into one that compensates at its next delivery (C32).

        One transaction: a compare-and-set on ``status``, ``attempt`` and an
        unheld claim; then ``marker`` is inserted after the last step and the
        run becomes ``pending``.

        Parameters:
          run_key(str): the run.
          marker(StepRow): the ``compensation`` row; its position is chosen here.
          status(str): the status the run must have.
          attempt(int): the attempt number the run must be at.

        Returns:
          bool: whether it applied.

        Raises:
          StoreUnavailable: the database cannot be reached.
        """
        return self._write(lambda conn: self._start_compensation(conn, run_key, marker, status, attempt))

    def _start_compensation(self, conn: Connection, run_key: str, marker: StepRow, status: str, attempt: int) -> bool:
        runs, steps = self._t.runs, self._t.steps
        now = self._now(conn)
        held = (runs.c.run_key == run_key, runs.c.status == status, runs.c.attempt == attempt, runs.c.owner.is_(None))
        changed = conn.execute(
            sa.update(runs)
            .where(*held)
            .values(
                status="pending",
                step_count=runs.c.step_count + 1,
                step_bytes=runs.c.step_bytes + marker.size,
                updated_at=now,
            )
        )
        if changed.rowcount != 1:
            return False
        last = sa.select(sa.func.coalesce(sa.func.max(steps.c.position), -1)).where(steps.c.run_key == run_key)
        position = int(conn.execute(last).scalar_one()) + 1
        stored = dataclasses.replace(marker, position=position, committed_at=now, attempt=attempt)
        conn.execute(sa.insert(steps).values(run_key=run_key, **step_values(stored)))
        return True

    def finish(
        self,
        claim: Claim,
        status: RunStatus,
        *,
        drop_steps: bool = False,
        dead_letter: NewDeadLetter | None = None,
        wake_at: float | None = None,
        outcome: bytes | None = None,
    ) -> None:
        """End the attempt: set ``status`` and release the claim (C26, C27, C30, C37).

        One transaction, fenced on the claim.

        Parameters:
          claim(Claim): the attempt's claim.
          status(str): ``sleeping``, ``retrying``, ``succeeded``, ``failed``,
            ``dead``, ``cancelled`` or ``compensated``.
          drop_steps(bool): delete the run's step rows and step attempts (C27).
          dead_letter(NewDeadLetter | None): record a dead letter carrying the
            run's envelope (C30).
          wake_at(float | None): the run's wake time when ``sleeping``, epoch seconds (C35).
          outcome(bytes | None): the run's outcome, written in the same
            ``UPDATE`` as the status (C37); ``None`` clears it.

        Raises:
          ClaimLost: another attempt holds the run (C25); nothing was written.
          StoreUnavailable: the database cannot be reached.
        """

        values: dict[str, Any] = {
            "status": status,
            "owner": None,
            "lease_until": None,
            "wake_at": wake_at,
            "outcome": outcome,
        }
        if drop_steps:
            values.update(step_count=0, step_bytes=0)
        if self._dialect == "postgresql" and dead_letter is None:  # one statement, autocommitted
            self._single_statement(lambda conn: self._folded.finish_in_one(conn, claim, values, drop_steps))
            return

        def work(conn: Connection) -> None:
            self._folded.finish(conn, claim, values, dead_letter)
            if drop_steps:
                steps, attempts = self._t.steps, self._t.attempts
                conn.execute(sa.delete(steps).where(steps.c.run_key == claim.run_key))
                conn.execute(sa.delete(attempts).where(attempts.c.run_key == claim.run_key))

        self._write(work)

    def settle_failed(self, run_key: str, attempt: int) -> bool:
        """Mark a ``retrying`` run ``failed`` once the framework gives up.

        One transaction; applies only while the run is ``retrying`` at ``attempt``.

        Parameters:
          run_key(str): the run.
          attempt(int): the attempt that ended ``retrying``.

        Returns:
          bool: whether the run was marked ``failed``.

        Raises:
          StoreUnavailable: the database cannot be reached.
        """
        runs = self._t.runs

        def work(conn: Connection) -> bool:
            result = conn.execute(
                sa.update(runs)
                .where(runs.c.run_key == run_key, runs.c.status == "retrying", runs.c.attempt == attempt)
                .values(status="failed", updated_at=self._now(conn))
            )
            return result.rowcount == 1

        return self._write(work)

    # ---------------------------------------------------- events
    def poll_event(self, claim: Claim, topic: str, key: str, deadline: float | None) -> EventPoll:
        """Look for the event a waiting step can receive (C33); see :meth:`StepStore.poll_event`.

        Two transactions, each fenced on the claim: the wait fields are
        recorded and committed first, so a sender that commits an event after
        the read below finds this run among its waiters.

        Parameters:
          claim(Claim): the attempt's claim.
          topic(str): the event's topic.
          key(str): the event's key.
          deadline(float | None): when the wait times out, epoch seconds (``None``: never).

        Raises:
          ClaimLost: another attempt holds the run (C25).
          CancelRequested: the run's cancellation was requested (C34); nothing was written.
          StoreUnavailable: the database cannot be reached.
        """

        def arm(conn: Connection) -> None:
            _, cancel = self._clock_and_cancel(conn, claim.run_key)
            if cancel is not None:
                raise CancelRequested(cancel)
            self._fenced_update(conn, claim, wait_topic=topic, wait_key=key)

        def poll(conn: Connection) -> EventPoll:
            runs = self._t.runs
            run = conn.execute(sa.select(runs.c.created_at).where(runs.c.run_key == claim.run_key)).one()
            result = poll_result(
                self._next_event(conn, claim.run_key, run.created_at, topic, key), self._now(conn), deadline
            )
            if result.event is not None or result.timed_out:
                self._fenced_update(conn, claim, wait_topic=None, wait_key=None)
            return result

        self._write(arm)
        return self._write(poll)

    def _next_event(
        self, conn: Connection, run_key: str, created_at: float, topic: str, key: str
    ) -> EventRecord | None:
        events, steps = self._t.events, self._t.steps
        received = sa.select(steps.c.event_id).where(steps.c.run_key == run_key, steps.c.event_id == events.c.id)
        sent_to_it = sa.or_(
            events.c.run_key == run_key, sa.and_(events.c.run_key.is_(None), events.c.created_at >= created_at)
        )
        query = (
            sa.select(events)
            .where(events.c.topic == topic, events.c.event_key == key, sent_to_it, ~sa.exists(received))
            .order_by(events.c.id)
            .limit(1)
        )
        row = conn.execute(query).first()
        return None if row is None else event_record(row)

    def next_event(self, run_key: str, topic: str, key: str) -> EventRecord | None:
        """The first event ``run_key`` can receive on ``(topic, key)``, or ``None`` (C33).

        Raises:
          StoreUnavailable: the database cannot be reached.
        """
        runs = self._t.runs

        def work(conn: Connection) -> EventRecord | None:
            run = conn.execute(sa.select(runs.c.created_at).where(runs.c.run_key == run_key)).first()
            return None if run is None else self._next_event(conn, run_key, run.created_at, topic, key)

        return self._read(work)

    def add_event(self, topic: str, key: str, payload: bytes | None, *, run_key: str | None = None) -> SentEvent:
        """Store an event (committed first), then read the runs to wake for it (C33).

        Parameters:
          topic(str): the topic (at most 255 characters).
          key(str): the key (at most 255 characters).
          payload(bytes | None): the encoded payload.
          run_key(str | None): send it to this run only.

        Raises:
          StoreUnavailable: the database cannot be reached.
        """

        def insert(conn: Connection) -> EventRecord:
            now = self._now(conn)
            values = {"topic": topic, "event_key": key, "run_key": run_key, "payload": payload, "created_at": now}
            inserted = conn.execute(sa.insert(self._t.events).values(**values)).inserted_primary_key
            assert inserted is not None
            return EventRecord(int(inserted[0]), topic, key, run_key, payload, now)

        event = self._write(insert)
        return SentEvent(event, tuple(self._read(lambda conn: self._waiters(conn, event))))

    def _waiters(self, conn: Connection, event: EventRecord) -> list[RunRecord]:
        runs = self._t.runs
        query = sa.select(runs).where(
            runs.c.wait_topic == event.topic,
            runs.c.wait_key == event.key,
            runs.c.status.in_(WAITER_STATUSES),
            runs.c.run_key == event.run_key if event.run_key is not None else runs.c.created_at <= event.created_at,
        )
        return [run_record(r) for r in conn.execute(query.order_by(runs.c.run_key))]

    def cleanup_events(self, *, older_than: float) -> int:
        """Delete the events sent before ``older_than`` (epoch seconds, database clock); return how many (C33).

        Raises:
          StoreUnavailable: the database cannot be reached.
        """
        events = self._t.events
        return self._write(
            lambda conn: conn.execute(sa.delete(events).where(events.c.created_at < older_than)).rowcount
        )

    # ---------------------------------------------------- cancellation
    def request_cancel(self, run_key: str, reason: str) -> RunRecord:
        """Record that ``run_key`` is to be cancelled with ``reason`` (C34); see :meth:`StepStore.request_cancel`.

        Raises:
          UnknownRun: no run has ``run_key``.
          StoreUnavailable: the database cannot be reached.
        """
        runs = self._t.runs

        def work(conn: Connection) -> RunRecord:
            run = conn.execute(sa.select(runs).where(runs.c.run_key == run_key).with_for_update()).first()
            if run is None:
                raise UnknownRun(f"no run has the run key {run_key!r}")
            if run.status in TERMINAL_STATUSES or run.cancel_reason is not None:
                return run_record(run)
            conn.execute(sa.update(runs).where(runs.c.run_key == run_key).values(cancel_reason=reason))
            return dataclasses.replace(run_record(run), cancel_reason=reason)

        return self._write(work)

    def settle_cancelled(self, run_key: str, *, status: str, attempt: int, outcome: bytes | None = None) -> bool:
        """End a run no attempt holds as ``cancelled`` (C34): a compare-and-set on its locked row.

        Parameters:
          run_key(str): the run.
          status(str): the status it must still have.
          attempt(int): the attempt it must still be at.
          outcome(bytes | None): the run's outcome, written with the status (C37).

        Returns:
          bool: whether it applied.

        Raises:
          StoreUnavailable: the database cannot be reached.
        """
        runs = self._t.runs

        def work(conn: Connection) -> bool:
            run = conn.execute(sa.select(runs).where(runs.c.run_key == run_key).with_for_update()).first()
            now = self._now(conn)
            if run is None or not may_settle_cancelled(run, status=status, attempt=attempt, now=now):
                return False
            ended = {"status": "cancelled", "owner": None, "lease_until": None, "wake_at": None, "updated_at": now}
            conn.execute(sa.update(runs).where(runs.c.run_key == run_key).values(**ended, outcome=outcome))
            return True

        return self._write(work)

    def release_run(
        self, run_key: str, status: RunStatus, *, while_status: Collection[str], outcome: bytes | None = None
    ) -> bool:
        """Set the run's ``status`` and release its claim if its status is one of ``while_status`` (C38).

        One transaction, one conditional ``UPDATE``: the claim and the wake
        time are cleared, ``outcome`` is written (C37), no takeover counted.

        Parameters:
          run_key(str): the run.
          status(str): the new status: ``failed``, ``cancelled`` or ``pending``.
          while_status(Collection[str]): the statuses it applies from.
          outcome(bytes | None): the run's outcome, written with the status (``None`` clears it).

        Returns:
          bool: whether it applied.

        Raises:
          StoreUnavailable: the database cannot be reached.
        """
        runs = self._t.runs
        where = (runs.c.run_key == run_key, runs.c.status.in_(sorted(while_status)))
        return self._write(lambda conn: self._release_where(conn, where, status, outcome))

    def _release_where(
        self, conn: Connection, where: tuple[sa.ColumnElement[bool], ...], status: str, outcome: bytes | None
    ) -> bool:
        """Set ``status`` on the run matching ``where``, its claim and wake time cleared; whether it did."""
        runs = self._t.runs
        result = conn.execute(
            sa.update(runs)
            .where(*where)
            .values(status=status, owner=None, lease_until=None, wake_at=None, outcome=outcome)
            .values(updated_at=self._now(conn))
        )
        return result.rowcount == 1

    def dead_letter_unstarted(self, run_key: str, dead_letter: NewDeadLetter, *, outcome: bytes | None = None) -> bool:
        """Dead-letter a run no attempt started, whose message the framework dropped (C30, C38, C39).

        One transaction: a conditional ``UPDATE`` to ``dead`` with the claim
        and wake time cleared and ``outcome`` written, then, if it applied,
        the dead letter copied from the run (task, envelope, the update's
        clock stamp). The ``UPDATE`` applies to a run ``queued`` or
        ``pending`` with ``attempt`` 0, or to a retried dead letter no attempt
        started since its retry: ``pending``, unowned, and an ``EXISTS`` on
        the dead-letter table finds one of the run's dead letters whose
        ``retried_at`` equals the run's ``updated_at`` (``prepare_retry``
        writes both from one clock reading; a later start, put-back or
        recovery stamps ``updated_at`` anew). Equal, not "not earlier": a
        started run put back while the database's clock was stepped back
        must not match. MySQL/MariaDB accept the subquery: it reads another
        table than the one updated.

        Parameters:
          run_key(str): the run.
          dead_letter(NewDeadLetter): the dead letter to record.
          outcome(bytes | None): the run's outcome (``None`` clears it, C37).

        Returns:
          bool: whether it applied.

        Raises:
          StoreUnavailable: the database cannot be reached.
        """
        runs, dead = self._t.runs, self._t.dead
        retried_since = sa.exists().where(dead.c.run_key == run_key, dead.c.retried_at == runs.c.updated_at)
        retried_unstarted = sa.and_(runs.c.status == "pending", runs.c.owner.is_(None), retried_since)
        where = (
            runs.c.run_key == run_key,
            runs.c.status.in_(sorted(UNSTARTED_STATUSES)),
            sa.or_(runs.c.attempt == 0, retried_unstarted),
        )

        def work(conn: Connection) -> bool:
            if not self._release_where(conn, where, "dead", outcome):
                return False
            self._folded.add_dead_letter(conn, run_key, dead_letter)
            return True

        return self._write(work)

    # ---------------------------------------------------- operators
    def get_run(self, run_key: str) -> RunRecord:
        """Return one run.

        Raises:
          UnknownRun: no run has ``run_key``.
          StoreUnavailable: the database cannot be reached.
        """
        runs = self._t.runs
        row = self._read(lambda conn: conn.execute(sa.select(runs).where(runs.c.run_key == run_key)).first())
        if row is None:
            raise UnknownRun(f"no run has the run key {run_key!r}")
        return run_record(row)

    def list_runs(
        self,
        *,
        status: str | None = None,
        task_name: str | None = None,
        since: float | None = None,
        limit: int = 100,
        job_id: str | None = None,
    ) -> list[RunRecord]:
        """Return runs, newest ``updated_at`` first.

        Parameters:
          status(str | None): only runs in this status.
          task_name(str | None): only runs of this task or actor.
          since(float | None): only runs updated at or after this time, epoch seconds.
          limit(int): at most this many runs.
          job_id(str | None): only the run whose current job (task or message id) is this one;
            not indexed, for an operator's lookup.

        Raises:
          StoreUnavailable: the database cannot be reached.
        """
        runs = self._t.runs
        query = sa.select(runs).order_by(runs.c.updated_at.desc(), runs.c.run_key.desc()).limit(limit)
        if status is not None:
            query = query.where(runs.c.status == status)
        if task_name is not None:
            query = query.where(runs.c.task_name == task_name)
        if since is not None:
            query = query.where(runs.c.updated_at >= since)
        if job_id is not None:
            query = query.where(runs.c.job_id == job_id)
        rows = self._read(lambda conn: conn.execute(query).all())
        return [run_record(r) for r in rows]

    def get_steps(self, run_key: str) -> list[StepRow]:
        """Return the run's step rows ordered by position (empty if none).

        Raises:
          StoreUnavailable: the database cannot be reached.
        """
        return self._read(lambda conn: self._steps_of(conn, run_key))

    def _steps_of(self, conn: Connection, run_key: str) -> list[StepRow]:
        steps = self._t.steps
        rows = conn.execute(sa.select(steps).where(steps.c.run_key == run_key).order_by(steps.c.position))
        return [step_row(r) for r in rows]

    def list_dead_letters(
        self, *, task_name: str | None = None, include_retried: bool = False
    ) -> list[DeadLetterRecord]:
        """Return dead letters, oldest first (C30).

        Parameters:
          task_name(str | None): only dead letters of this task or actor.
          include_retried(bool): include those already retried.

        Raises:
          StoreUnavailable: the database cannot be reached.
        """
        dead = self._t.dead
        query = sa.select(dead).order_by(dead.c.id)
        if task_name is not None:
            query = query.where(dead.c.task_name == task_name)
        if not include_retried:
            query = query.where(dead.c.retried_at.is_(None))
        rows = self._read(lambda conn: conn.execute(query).all())
        return [dead_letter_record(r) for r in rows]

    def get_dead_letter(self, dead_letter_id: int) -> DeadLetterRecord:
        """Return one dead letter.

        Raises:
          UnknownDeadLetter: no dead letter has ``dead_letter_id``.
          StoreUnavailable: the database cannot be reached.
        """
        return self._read(lambda conn: self._dead_letter(conn, dead_letter_id))

    def _dead_letter(self, conn: Connection, dead_letter_id: int) -> DeadLetterRecord:
        dead = self._t.dead
        row = conn.execute(sa.select(dead).where(dead.c.id == dead_letter_id)).first()
        if row is None:
            raise UnknownDeadLetter(f"no dead letter has the id {dead_letter_id!r}")
        return dead_letter_record(row)

    def prepare_retry(self, dead_letter_id: int, *, reset_from: str | None = None) -> DeadLetterRecord:
        """Make a dead-lettered run runnable again, keeping its run key (C11, C30).

        One transaction: the run becomes ``pending`` with its claim and
        takeovers cleared; with ``reset_from`` that step and every later one
        are deleted, without it the last step that failed for good and every
        later one (C31), each with its step attempts; the dead letter's
        ``retried_at`` is set.

        Parameters:
          dead_letter_id(int): the dead letter.
          reset_from(str | None): the step key to replay from.

        Returns:
          DeadLetterRecord: the dead letter with ``retried_at`` set.

        Raises:
          UnknownDeadLetter: no such dead letter.
          UnknownRun: its run is gone, or it has no step ``reset_from``.
          StoreUnavailable: the database cannot be reached.
        """
        return self._write(lambda conn: self._prepare_retry(conn, dead_letter_id, reset_from))

    def _prepare_retry(self, conn: Connection, dead_letter_id: int, reset_from: str | None) -> DeadLetterRecord:
        runs, dead_t = self._t.runs, self._t.dead
        dead = self._dead_letter(conn, dead_letter_id)
        key = dead.run_key
        if conn.execute(sa.select(runs.c.run_key).where(runs.c.run_key == key).with_for_update()).first() is None:
            raise UnknownRun(f"no run has the run key {key!r}")
        kept = self._cut_steps(conn, key, reset_from)
        now = self._now(conn)
        conn.execute(
            sa.update(runs)
            .where(runs.c.run_key == key)
            .values(
                status="pending",
                owner=None,
                lease_until=None,
                takeovers=0,
                step_count=len(kept),
                step_bytes=sum(int(r.size) for r in kept),
                updated_at=now,
            )
        )
        conn.execute(sa.update(dead_t).where(dead_t.c.id == dead_letter_id).values(retried_at=now))
        return dataclasses.replace(dead, retried_at=now)

    def _cut_steps(self, conn: Connection, run_key: str, reset_from: str | None) -> list[Any]:
        """Delete the steps (and their attempts) a retry runs again; return the kept rows with their sizes."""
        steps, attempts = self._t.steps, self._t.attempts
        size = sa.func.coalesce(sa.func.length(steps.c.value), 0).label("size")
        columns = (steps.c.position, steps.c.step_key, steps.c.kind, steps.c.failure, size)
        rows = conn.execute(sa.select(*columns).where(steps.c.run_key == run_key).order_by(steps.c.position)).all()
        cut = retry_cut_position(rows, reset_from, run_key)
        if cut is None:
            return list(rows)
        dropped = [r.step_key for r in rows if r.position >= cut]
        conn.execute(sa.delete(steps).where(steps.c.run_key == run_key, steps.c.position >= cut))
        if dropped:
            conn.execute(sa.delete(attempts).where(attempts.c.run_key == run_key, attempts.c.step_key.in_(dropped)))
        return [r for r in rows if r.position < cut]

    def purge_dead_letters(self, ids: Sequence[int] | None = None) -> int:
        """Delete the given dead letters, all when ``ids`` is ``None`` (C30).

        Returns:
          int: how many were deleted.

        Raises:
          StoreUnavailable: the database cannot be reached.
        """
        dead = self._t.dead
        if ids is not None and not ids:
            return 0
        query = sa.delete(dead)
        if ids is not None:
            query = query.where(dead.c.id.in_(sorted(set(ids))))
        return self._write(lambda conn: conn.execute(query).rowcount)

    def mark_recovered(self, run_key: str, *, status: str, updated_at: float) -> bool:
        """Claim a stranded run for recovery: a compare-and-set on its locked row (C35).

        One transaction: lock the run's row, read the database's clock, and
        set ``updated_at`` to it only if :func:`~flexiq_plugins._store.claims.may_recover`
        allows (``status`` and ``updated_at`` are the ones given and, for a
        ``running`` run, the lease has expired). A concurrent recoverer waits
        on the lock, then reads the new ``updated_at`` and loses.

        Parameters:
          run_key(str): the run.
          status(str): the status the caller read.
          updated_at(float): the ``updated_at`` the caller read, epoch seconds.

        Returns:
          bool: whether this caller won the run.

        Raises:
          StoreUnavailable: the database cannot be reached.
        """
        runs = self._t.runs

        def work(conn: Connection) -> bool:
            run = conn.execute(sa.select(runs).where(runs.c.run_key == run_key).with_for_update()).first()
            now = self._now(conn)
            if run is None or not may_recover(run, status=status, updated_at=updated_at, now=now):
                return False
            conn.execute(sa.update(runs).where(runs.c.run_key == run_key).values(updated_at=now, recovered_at=now))
            return True

        return self._write(work)

    def cleanup(self, *, older_than: float) -> int:
        """Delete succeeded, failed, cancelled and compensated runs (and their steps) updated before ``older_than``.

        Dead-lettered runs are kept so a retry can replay them (C27).

        Parameters:
          older_than(float): epoch seconds, database clock.

        Returns:
          int: how many runs were deleted.

        Raises:
          StoreUnavailable: the database cannot be reached.
        """
        runs, steps, attempts = self._t.runs, self._t.steps, self._t.attempts
        doomed = sa.and_(runs.c.status.in_(sorted(CLEANABLE_STATUSES)), runs.c.updated_at < older_than)

        def work(conn: Connection) -> int:
            for table in (steps, attempts):
                conn.execute(sa.delete(table).where(table.c.run_key.in_(sa.select(runs.c.run_key).where(doomed))))
            return conn.execute(sa.delete(runs).where(doomed)).rowcount

        return self._write(work)
