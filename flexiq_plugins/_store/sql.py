"""The durable step store on SQLAlchemy Core: SQLite, PostgreSQL, MySQL/MariaDB.

Why it is built the way it is:

- **The database's clock, not the worker's (C23).** Every method that stamps or
  compares a time first reads the clock *inside its transaction*, after any row
  lock it needs is held (PostgreSQL ``clock_timestamp()``, MySQL/MariaDB
  ``NOW(6)``, SQLite ``julianday('now')``). A worker whose own clock runs an hour
  ahead therefore cannot see a live lease as expired and steal the claim.
- **One transaction per interface call (C9, C25).** ``begin`` inserts the run if
  absent and locks its row (``SELECT … FOR UPDATE``; SQLite serializes writers
  with ``BEGIN IMMEDIATE`` instead), so two deliveries of one job decide
  Finished / Busy / claim one after the other. ``renew``, ``commit_step`` and
  ``finish`` open with an ``UPDATE … WHERE run_key AND owner AND attempt``: a
  zero row count means another attempt took the run over, and the transaction
  is rolled back before anything is written (:class:`ClaimLost`).
- **MySQL's insert-if-absent takes the row lock itself.** ``INSERT … ON
  DUPLICATE KEY UPDATE`` X-locks an existing row, where ``INSERT IGNORE`` would
  take a shared lock that two concurrent ``FOR UPDATE`` readers then deadlock
  on. Our MySQL engines also run ``READ COMMITTED`` (no gap locks) with the
  session time zone at UTC so ``UNIX_TIMESTAMP(NOW(6))`` is exact. A deadlock
  the server reports anyway (the whole transaction was rolled back) is retried
  a few times before it surfaces as :class:`StoreUnavailable`.
- **Processes and forks.** Celery prefork and Dramatiq fork worker processes; a
  pooled connection shared by parent and child corrupts both. A fork hook calls
  ``engine.dispose(close=False)`` in the child, the pattern SQLAlchemy
  documents, so the child opens its own connections and the parent's stay
  untouched. SQLite opens in WAL mode with a 30 s busy timeout.
- **Lazy schema.** Construction never connects. The first call runs the Alembic
  migrations shipped in ``migrations/`` once per store object (thread-safe),
  under a PostgreSQL advisory lock / MySQL ``GET_LOCK`` so workers starting
  together do not race to create the tables.
- **One error boundary.** Nothing from SQLAlchemy or a driver leaves a public
  method: connection failures, timeouts and other operational errors become
  :class:`StoreUnavailable` (retryable, C28), everything else
  :class:`StoreError`, each ``from`` the original and naming the URL with its
  password hidden.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sqlite3
import threading
import time
import weakref
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.pool import StaticPool

from ..errors import ClaimLost, ConfigurationError, StoreError, StoreUnavailable, UnknownDeadLetter, UnknownRun
from .base import (
    CLEANABLE_STATUSES,
    TERMINAL_STATUSES,
    BeginResult,
    Begun,
    Busy,
    Claim,
    DeadLetterRecord,
    Finished,
    JobEnvelope,
    NewDeadLetter,
    RunRecord,
    RunStatus,
    StepRow,
    StepStore,
)

__all__ = ["ACCEPTED_STORE_FORMS", "DEFAULT_TABLE_PREFIX", "SqlStepStore", "normalize_url", "upgrade_store"]

DEFAULT_TABLE_PREFIX = "flexiq_"
ACCEPTED_STORE_FORMS = (
    "sqlite:///path, postgresql://…, mysql://… (or mariadb://…), memory://, a sqlalchemy Engine or a StepStore"
)
"""The store specifications accepted, for error messages."""

_MIGRATIONS = Path(__file__).with_name("migrations")
_SQLITE_BUSY_TIMEOUT_MS = 30_000
_CONNECT_TIMEOUT_S = 10
_DEADLOCK_RETRIES = 3
_READ_ONLY = "flexiq_read_only"
_DRIVERS = {
    "postgresql": "postgresql+psycopg",
    "postgres": "postgresql+psycopg",
    "mysql": "mysql+pymysql",
    "mariadb": "mariadb+pymysql",
    "sqlite": "sqlite",
}
_DRIVER_PACKAGES = {"postgresql": "psycopg (extra 'postgres')", "mysql": "pymysql (extra 'mysql')"}
_CLOCKS = {
    "postgresql": "extract(epoch from clock_timestamp())",
    "mysql": "UNIX_TIMESTAMP(NOW(6))",
    "mariadb": "UNIX_TIMESTAMP(NOW(6))",
    "sqlite": "((julianday('now') - 2440587.5) * 86400.0)",
}
_DRIVER_MODULES = frozenset({"psycopg", "psycopg2", "pymysql", "MySQLdb", "sqlite3", "alembic"})
_UNAVAILABLE = (
    sa_exc.OperationalError,
    sa_exc.InterfaceError,
    sa_exc.DisconnectionError,
    sa_exc.TimeoutError,
    OSError,
)

T = TypeVar("T")


# ----------------------------------------------------------------- tables
@dataclass(frozen=True)
class _Tables:
    """The three tables of one ``table_prefix``, as Core ``Table`` objects.

    The DDL lives in the migrations; these declare only what queries need
    (names and types for binding and result processing).
    """

    runs: sa.Table
    steps: sa.Table
    dead: sa.Table


def _time() -> sa.Double[float]:
    return sa.Double(asdecimal=False)


def _tables(prefix: str) -> _Tables:
    md = sa.MetaData()
    runs = sa.Table(
        f"{prefix}runs",
        md,
        sa.Column("run_key", sa.String(255), primary_key=True),
        sa.Column("task_name", sa.String(255)),
        sa.Column("framework", sa.String(32)),
        sa.Column("queue", sa.String(255)),
        sa.Column("status", sa.String(16)),
        sa.Column("owner", sa.String(255)),
        sa.Column("attempt", sa.Integer),
        sa.Column("lease_until", _time()),
        sa.Column("takeovers", sa.Integer),
        sa.Column("job_id", sa.String(255)),
        sa.Column("envelope", sa.Text),
        sa.Column("step_count", sa.Integer),
        sa.Column("step_bytes", sa.BigInteger),
        sa.Column("created_at", _time()),
        sa.Column("updated_at", _time()),
    )
    steps = sa.Table(
        f"{prefix}steps",
        md,
        sa.Column("run_key", sa.String(255), primary_key=True),
        sa.Column("step_key", sa.String(400), primary_key=True),
        sa.Column("position", sa.Integer),
        sa.Column("kind", sa.String(16)),
        sa.Column("value", sa.LargeBinary),
        sa.Column("wake_at", _time()),
        sa.Column("committed_at", _time()),
        sa.Column("attempt", sa.Integer),
    )
    dead = sa.Table(
        f"{prefix}dead_letters",
        md,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("run_key", sa.String(255)),
        sa.Column("job_id", sa.String(255)),
        sa.Column("task_name", sa.String(255)),
        sa.Column("reason", sa.String(64)),
        sa.Column("message", sa.Text),
        sa.Column("traceback", sa.Text),
        sa.Column("envelope", sa.Text),
        sa.Column("created_at", _time()),
        sa.Column("retried_at", _time()),
    )
    return _Tables(runs, steps, dead)


# ------------------------------------------------------------ URLs, engines
def normalize_url(raw: str | URL) -> URL:
    """Parse a store URL and pick this package's driver when none is named.

    ``postgresql://`` (and ``postgres://``) become ``postgresql+psycopg://``,
    ``mysql://`` becomes ``mysql+pymysql://`` and ``mariadb://`` becomes
    ``mariadb+pymysql://`` (with ``charset=utf8mb4`` unless given). A relative
    SQLite path is made absolute against the current working directory now,
    so a worker that changes directory later keeps the same file.

    Parameters:
      raw(str | URL): a SQLAlchemy URL.

    Raises:
      ConfigurationError: the URL cannot be parsed or names another database.
    """
    try:
        url = make_url(raw)
    except (sa_exc.ArgumentError, ValueError) as exc:
        raise ConfigurationError(_bad_store_message(raw)) from exc
    backend, _, driver = url.drivername.partition("+")
    if backend not in _DRIVERS:
        raise ConfigurationError(_bad_store_message(raw))
    if not driver:
        url = url.set(drivername=_DRIVERS[backend])
    if url.get_backend_name() in ("mysql", "mariadb") and "charset" not in url.query:
        url = url.update_query_dict({"charset": "utf8mb4"})
    if url.get_backend_name() == "sqlite" and not _is_memory_sqlite(url) and "uri" not in url.query:
        url = url.set(database=os.path.abspath(str(url.database)))
    return url


def _bad_store_message(raw: object) -> str:
    return f"cannot use {raw!r} as a step store; accepted forms: {ACCEPTED_STORE_FORMS}"


def _is_memory_sqlite(url: URL) -> bool:
    return url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:")


def _create_engine(url: URL) -> Engine:
    """Create an engine configured for the store (does not connect)."""
    backend = url.get_backend_name()
    kwargs: dict[str, Any] = {}
    if backend == "sqlite" and _is_memory_sqlite(url):
        kwargs.update(poolclass=StaticPool, connect_args={"check_same_thread": False})
    elif backend != "sqlite":
        kwargs["pool_pre_ping"] = True
    if backend == "postgresql" and "connect_timeout" not in url.query:
        kwargs["connect_args"] = {"connect_timeout": _CONNECT_TIMEOUT_S}
    if backend in ("mysql", "mariadb"):
        kwargs["isolation_level"] = "READ COMMITTED"
    try:
        engine = sa.create_engine(url, **kwargs)
    except ImportError as exc:
        package = _DRIVER_PACKAGES.get("mysql" if backend == "mariadb" else backend, "its driver")
        raise ConfigurationError(f"the step store {_safe(url)} needs the package {package}") from exc
    except (sa_exc.ArgumentError, TypeError) as exc:
        raise ConfigurationError(f"cannot create an engine for {_safe(url)}: {exc}") from exc
    if backend == "sqlite":
        _install_sqlite_events(engine, wal=not _is_memory_sqlite(url))
    elif backend in ("mysql", "mariadb"):
        event.listen(engine, "connect", _on_mysql_connect)
    return engine


def _safe(url: URL) -> str:
    return url.render_as_string(hide_password=True)


def _install_sqlite_events(engine: Engine, *, wal: bool) -> None:
    """The pysqlite ``BEGIN IMMEDIATE`` recipe, WAL mode and a busy timeout.

    pysqlite's own transaction handling is switched off (``isolation_level =
    None``) and every write transaction starts with ``BEGIN IMMEDIATE``, which
    takes SQLite's write lock up front: two processes can never both read and
    then both try to upgrade to writing (the "database is locked" deadlock).
    Read-only calls use a plain deferred ``BEGIN`` and do not block writers.
    """

    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {_SQLITE_BUSY_TIMEOUT_MS}")
            if wal:
                _enable_wal(cursor)
        finally:
            cursor.close()

    def on_begin(conn: Connection) -> None:
        read_only = conn.get_execution_options().get(_READ_ONLY, False)
        conn.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")

    event.listen(engine, "connect", on_connect)
    event.listen(engine, "begin", on_begin)


def _enable_wal(cursor: Any) -> None:
    """Switch the file to WAL (persistent), retrying while another connection holds a lock.

    SQLite answers a journal-mode change with "database is locked" at once,
    without waiting on the busy timeout, when another connection is inside a
    transaction: several workers opening a fresh file together hit exactly that.
    """
    deadline = time.monotonic() + _SQLITE_BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            cursor.execute("PRAGMA journal_mode")
            if str(cursor.fetchone()[0]).lower() != "wal":
                cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def _on_mysql_connect(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("SET time_zone = '+00:00'")
    finally:
        cursor.close()


def _register_fork_hook(store: SqlStepStore) -> None:
    """Make a forked child drop (without closing) the parent's pooled connections."""
    ref = weakref.ref(store)

    def after_fork_in_child() -> None:
        alive = ref()
        if alive is not None:
            alive._after_fork()

    os.register_at_fork(after_in_child=after_fork_in_child)


# ------------------------------------------------------------- migrations
def upgrade_store(
    url_or_engine: str | URL | Engine,
    revision: str = "head",
    *,
    table_prefix: str = DEFAULT_TABLE_PREFIX,
) -> None:
    """Bring the store's tables to ``revision`` with the shipped Alembic migrations.

    Idempotent, and safe when several processes call it at once: PostgreSQL
    takes an advisory lock and MySQL/MariaDB a ``GET_LOCK``, both held until
    the upgrade has committed; SQLite's ``BEGIN IMMEDIATE`` serializes it.

    Parameters:
      url_or_engine(str | URL | Engine): the store's URL or an engine.
      revision(str): the Alembic revision, ``"head"`` for the newest.
      table_prefix(str): the prefix of the store's table names.

    Raises:
      ConfigurationError: an unusable URL.
      StoreUnavailable: the database cannot be reached.
      StoreError: the migration failed.
    """
    if isinstance(url_or_engine, Engine):
        engine, owned = url_or_engine, False
    else:
        engine, owned = _create_engine(normalize_url(url_or_engine)), True
    try:
        with _translated(engine):
            _upgrade(engine, revision, table_prefix)
    finally:
        if owned:
            engine.dispose()


def _upgrade(engine: Engine, revision: str, prefix: str) -> None:
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(_MIGRATIONS))
    config.attributes["table_prefix"] = prefix
    with engine.connect() as conn, _migration_lock(conn, prefix), conn.begin():
        config.attributes["connection"] = conn
        command.upgrade(config, revision)


@contextmanager
def _migration_lock(conn: Connection, prefix: str) -> Iterator[None]:
    """Hold a session-level lock across the whole upgrade, released only after its commit.

    Released after the commit so a second process waiting on it sees the new
    version row and does nothing. SQLite needs none: ``BEGIN IMMEDIATE``
    already serializes the upgrade's transaction.
    """
    name = conn.dialect.name
    key = f"flexiq-migrate:{prefix}"
    if name == "postgresql":
        number = zlib.crc32(key.encode())
        lock, unlock = sa.func.pg_advisory_lock(number), sa.func.pg_advisory_unlock(number)
    elif name in ("mysql", "mariadb"):
        lock, unlock = sa.func.get_lock(key[:64], 120), sa.func.release_lock(key[:64])
    else:
        yield
        return
    conn.execute(sa.select(lock))
    conn.commit()
    try:
        yield
    finally:
        conn.execute(sa.select(unlock))
        conn.commit()


# ------------------------------------------------------- error translation
@contextmanager
def _translated(engine: Engine) -> Iterator[None]:
    """Turn SQLAlchemy, driver and Alembic errors into :class:`StoreError` types."""
    try:
        yield
    except (sa_exc.SQLAlchemyError, OSError) as exc:
        raise _translate(exc, engine) from exc
    except Exception as exc:
        if type(exc).__module__.split(".")[0] not in _DRIVER_MODULES:
            raise
        raise _translate(exc, engine) from exc


def _translate(exc: BaseException, engine: Engine) -> StoreError:
    where = _safe(engine.url)
    detail = _detail(exc)
    if _is_missing_table(exc):
        return StoreError(
            f"the step store at {where} has no tables ({detail}): run `flexiq store upgrade` "
            "or open the store with auto_upgrade=True"
        )
    unavailable = isinstance(exc, _UNAVAILABLE) or (isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated)
    if unavailable:
        return StoreUnavailable(f"the step store at {where} is unavailable: {detail}")
    return StoreError(f"the step store at {where} failed: {detail}")


def _detail(exc: BaseException) -> str:
    origin = exc.orig if isinstance(exc, sa_exc.DBAPIError) and exc.orig is not None else exc
    lines = str(origin).strip().splitlines()
    text = lines[0] if lines else type(origin).__name__
    return text[:300]


def _is_missing_table(exc: BaseException) -> bool:
    """An undefined table: SQLite's wording, PostgreSQL's SQLSTATE 42P01, MySQL's error 1146."""
    if not isinstance(exc, sa_exc.DBAPIError):
        return False
    origin = exc.orig
    args: tuple[Any, ...] = getattr(origin, "args", ())
    return (
        getattr(origin, "sqlstate", None) == "42P01"
        or (bool(args) and args[0] == 1146)
        or "no such table" in str(origin)
    )


def _is_deadlock(exc: sa_exc.DBAPIError) -> bool:
    """A deadlock or serialization failure: the server rolled the transaction back."""
    origin = exc.orig
    if getattr(origin, "sqlstate", None) in ("40P01", "40001"):
        return True
    args: tuple[Any, ...] = getattr(origin, "args", ())
    return bool(args) and args[0] == 1213


# ------------------------------------------------------------------ store
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
            self._engine = _create_engine(normalize_url(url_or_engine))
        self._dialect = self._engine.dialect.name
        if self._dialect not in _CLOCKS:
            raise ConfigurationError(_bad_store_message(_safe(self._engine.url)))
        self._clock: sa.ColumnElement[float] = sa.literal_column(
            _CLOCKS[self._dialect], type_=sa.Double(asdecimal=False)
        )
        self._t = _tables(table_prefix)
        self._prefix = table_prefix
        self._schema_ready = not auto_upgrade
        # One shared connection (in-memory SQLite) must not run two transactions at once.
        self._shared_connection = isinstance(self._engine.pool, StaticPool)
        self._make_locks()
        _register_fork_hook(self)

    def __repr__(self) -> str:
        return f"SqlStepStore({_safe(self._engine.url)!r}, table_prefix={self._prefix!r})"

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
        return _safe(self._engine.url)

    def close(self) -> None:
        """Dispose of the engine's connections (only if the store created the engine)."""
        if self._owns_engine:
            self._engine.dispose()

    # ---------------------------------------------------- plumbing
    def _make_locks(self) -> None:
        self._schema_lock = threading.Lock()
        self._serial = threading.RLock()

    def _after_fork(self) -> None:
        self._make_locks()
        if not self._shared_connection:
            self._engine.dispose(close=False)

    def _ensure_schema(self) -> None:
        if self._schema_ready:
            return
        with self._schema_lock:
            if not self._schema_ready:
                _upgrade(self._engine, "head", self._prefix)
                self._schema_ready = True

    def _write(self, work: Callable[[Connection], T]) -> T:
        """Run ``work`` in one write transaction (committed unless it raises)."""
        return self._run(work, read_only=False)

    def _read(self, work: Callable[[Connection], T]) -> T:
        """Run ``work`` in one read-only transaction."""
        return self._run(work, read_only=True)

    def _run(self, work: Callable[[Connection], T], *, read_only: bool) -> T:
        retries = _DEADLOCK_RETRIES
        while True:
            try:
                with _translated(self._engine):
                    return self._once(work, read_only=read_only)
            except StoreUnavailable as exc:
                cause = exc.__cause__
                if not (retries and isinstance(cause, sa_exc.DBAPIError) and _is_deadlock(cause)):
                    raise
                retries -= 1
                time.sleep(0.01 * (_DEADLOCK_RETRIES - retries))

    def _once(self, work: Callable[[Connection], T], *, read_only: bool) -> T:
        guard: AbstractContextManager[Any] = self._serial if self._shared_connection else nullcontext()
        with guard:
            self._ensure_schema()
            if read_only:
                with self._engine.connect() as conn:
                    conn.execution_options(**{_READ_ONLY: True})
                    return work(conn)
            with self._engine.begin() as conn:
                return work(conn)

    def _now(self, conn: Connection) -> float:
        return float(conn.execute(sa.select(self._clock)).scalar_one())

    def _fenced_update(self, conn: Connection, claim: Claim, **values: Any) -> None:
        """Update the run only while ``claim`` holds it, else raise :class:`ClaimLost` (C25)."""
        runs = self._t.runs
        result = conn.execute(
            sa.update(runs)
            .where(
                runs.c.run_key == claim.run_key,
                runs.c.owner == claim.owner,
                runs.c.attempt == claim.attempt,
            )
            .values(**values)
        )
        if result.rowcount != 1:
            raise ClaimLost(f"attempt {claim.attempt} of run {claim.run_key!r} no longer holds its claim")

    def now(self) -> float:
        """Return the database's clock, epoch seconds (C23).

        Raises:
          StoreUnavailable: the database cannot be reached.
        """
        return self._read(self._now)

    # ---------------------------------------------------- attempts
    def begin(self, run_key: str, job_id: str, envelope: JobEnvelope, owner: str, lease_seconds: float) -> BeginResult:
        """Claim the run for a new attempt and read its snapshot (C23–C26).

        One transaction: insert the run if absent, lock its row, read the
        database clock, then decide as :meth:`StepStore.begin` states.

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
        envelope_json = _dump_envelope(envelope)
        return self._write(
            lambda conn: self._begin(
                conn,
                run_key=run_key,
                job_id=job_id,
                envelope=envelope,
                envelope_json=envelope_json,
                owner=owner,
                lease_seconds=lease_seconds,
            )
        )

    def _begin(
        self,
        conn: Connection,
        *,
        run_key: str,
        job_id: str,
        envelope: JobEnvelope,
        envelope_json: str,
        owner: str,
        lease_seconds: float,
    ) -> BeginResult:
        runs = self._t.runs
        conn.execute(self._insert_run_if_absent(run_key, envelope, envelope_json))
        run = conn.execute(sa.select(runs).where(runs.c.run_key == run_key).with_for_update()).one()
        now = self._now(conn)
        if run.status in TERMINAL_STATUSES:
            return Finished(run.status)
        held = run.owner is not None and run.lease_until is not None
        if held and run.lease_until > now:
            return Busy(run.lease_until - now)
        claim = Claim(run_key, owner, run.attempt + 1, now + lease_seconds)
        takeovers = run.takeovers + (1 if held else 0)
        conn.execute(
            sa.update(runs)
            .where(runs.c.run_key == run_key)
            .values(
                status="running",
                owner=owner,
                attempt=claim.attempt,
                lease_until=claim.lease_until,
                takeovers=takeovers,
                job_id=job_id,
                updated_at=now,
            )
        )
        snapshot = tuple(self._steps_of(conn, run_key))
        return Begun(claim, snapshot, now, takeovers, _load_envelope(run.envelope))

    def _insert_run_if_absent(self, run_key: str, envelope: JobEnvelope, envelope_json: str) -> sa.Insert:
        values = {
            "run_key": run_key,
            "task_name": envelope.task_name,
            "framework": envelope.framework,
            "queue": envelope.queue,
            "status": "pending",
            "attempt": 0,
            "takeovers": 0,
            "envelope": envelope_json,
            "step_count": 0,
            "step_bytes": 0,
            "created_at": self._clock,
            "updated_at": self._clock,
        }
        runs = self._t.runs
        if self._dialect == "postgresql":
            return postgresql.insert(runs).values(values).on_conflict_do_nothing(index_elements=["run_key"])
        if self._dialect == "sqlite":
            return sqlite.insert(runs).values(values).on_conflict_do_nothing(index_elements=["run_key"])
        stmt = mysql.insert(runs).values(values)
        # Unlike INSERT IGNORE, this X-locks an existing row: no S→X upgrade deadlock.
        return stmt.on_duplicate_key_update(run_key=stmt.inserted.run_key)

    def renew(self, claim: Claim, lease_seconds: float) -> Claim:
        """Extend the lease to the database's ``now + lease_seconds`` (C23).

        One transaction, fenced on ``(run_key, owner, attempt)``.

        Parameters:
          claim(Claim): the attempt's claim.
          lease_seconds(float): the new lease, in seconds from now.

        Raises:
          ClaimLost: another attempt holds the run (C25); nothing was written.
          StoreUnavailable: the database cannot be reached.
        """

        def work(conn: Connection) -> Claim:
            until = self._now(conn) + lease_seconds
            self._fenced_update(conn, claim, lease_until=until)
            return dataclasses.replace(claim, lease_until=until)

        return self._write(work)

    def commit_step(self, claim: Claim, row: StepRow) -> StepRow:
        """Insert one step row and update the run's step totals (C5, C9).

        One transaction, fenced on the claim.

        Parameters:
          claim(Claim): the attempt's claim.
          row(StepRow): the step to store; ``committed_at`` and ``attempt`` are set here.

        Returns:
          StepRow: the stored row, ``committed_at`` on the database's clock.

        Raises:
          ClaimLost: another attempt holds the run, or the step key is already
            committed (C25); nothing was written.
          StoreUnavailable: the database cannot be reached.
        """
        return self._write(lambda conn: self._commit_step(conn, claim, row))

    def _commit_step(self, conn: Connection, claim: Claim, row: StepRow) -> StepRow:
        runs = self._t.runs
        now = self._now(conn)
        self._fenced_update(
            conn,
            claim,
            step_count=runs.c.step_count + 1,
            step_bytes=runs.c.step_bytes + row.size,
            updated_at=now,
        )
        stored = dataclasses.replace(row, committed_at=now, attempt=claim.attempt)
        try:
            conn.execute(sa.insert(self._t.steps).values(run_key=claim.run_key, **_step_values(stored)))
        except sa_exc.IntegrityError as exc:
            raise ClaimLost(f"step {row.step_key!r} of run {claim.run_key!r} is already committed") from exc
        return stored

    def finish(
        self,
        claim: Claim,
        status: RunStatus,
        *,
        drop_steps: bool = False,
        dead_letter: NewDeadLetter | None = None,
    ) -> None:
        """End the attempt: set ``status`` and release the claim (C26, C27, C30).

        One transaction, fenced on the claim.

        Parameters:
          claim(Claim): the attempt's claim.
          status(str): ``sleeping``, ``retrying``, ``succeeded``, ``failed``,
            ``dead`` or ``cancelled``.
          drop_steps(bool): delete the run's step rows (C27).
          dead_letter(NewDeadLetter | None): record a dead letter carrying the
            run's envelope (C30).

        Raises:
          ClaimLost: another attempt holds the run (C25); nothing was written.
          StoreUnavailable: the database cannot be reached.
        """

        def work(conn: Connection) -> None:
            now = self._now(conn)
            values: dict[str, Any] = {"status": status, "owner": None, "lease_until": None, "updated_at": now}
            if drop_steps:
                values.update(step_count=0, step_bytes=0)
            self._fenced_update(conn, claim, **values)
            if drop_steps:
                steps = self._t.steps
                conn.execute(sa.delete(steps).where(steps.c.run_key == claim.run_key))
            if dead_letter is not None:
                self._add_dead_letter(conn, claim.run_key, dead_letter, now)

        self._write(work)

    def _add_dead_letter(self, conn: Connection, run_key: str, dead: NewDeadLetter, now: float) -> None:
        runs = self._t.runs
        run = conn.execute(sa.select(runs.c.task_name, runs.c.envelope).where(runs.c.run_key == run_key)).one()
        conn.execute(
            sa.insert(self._t.dead).values(
                run_key=run_key,
                job_id=dead.job_id,
                task_name=run.task_name,
                reason=dead.reason,
                message=dead.message,
                traceback=dead.traceback,
                envelope=run.envelope,
                created_at=now,
            )
        )

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
        return _run_record(row)

    def list_runs(
        self,
        *,
        status: str | None = None,
        task_name: str | None = None,
        since: float | None = None,
        limit: int = 100,
    ) -> list[RunRecord]:
        """Return runs, newest ``updated_at`` first.

        Parameters:
          status(str | None): only runs in this status.
          task_name(str | None): only runs of this task or actor.
          since(float | None): only runs updated at or after this time, epoch seconds.
          limit(int): at most this many runs.

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
        rows = self._read(lambda conn: conn.execute(query).all())
        return [_run_record(r) for r in rows]

    def get_steps(self, run_key: str) -> list[StepRow]:
        """Return the run's step rows ordered by position (empty if none).

        Raises:
          StoreUnavailable: the database cannot be reached.
        """
        return self._read(lambda conn: self._steps_of(conn, run_key))

    def _steps_of(self, conn: Connection, run_key: str) -> list[StepRow]:
        steps = self._t.steps
        rows = conn.execute(sa.select(steps).where(steps.c.run_key == run_key).order_by(steps.c.position))
        return [_step_row(r) for r in rows]

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
        return [_dead_letter_record(r) for r in rows]

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
        return _dead_letter_record(row)

    def prepare_retry(self, dead_letter_id: int, *, reset_from: str | None = None) -> DeadLetterRecord:
        """Make a dead-lettered run runnable again, keeping its run key (C11, C30).

        One transaction: the run becomes ``pending`` with its claim and
        takeovers cleared; with ``reset_from`` that step and every later one
        are deleted; the dead letter's ``retried_at`` is set.

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
        runs, steps, dead_t = self._t.runs, self._t.steps, self._t.dead
        dead = self._dead_letter(conn, dead_letter_id)
        key = dead.run_key
        if conn.execute(sa.select(runs.c.run_key).where(runs.c.run_key == key).with_for_update()).first() is None:
            raise UnknownRun(f"no run has the run key {key!r}")
        size = sa.func.coalesce(sa.func.length(steps.c.value), 0)
        kept = conn.execute(
            sa.select(steps.c.position, steps.c.step_key, size).where(steps.c.run_key == key).order_by(steps.c.position)
        ).all()
        if reset_from is not None:
            cut = _reset_position([(r[0], r[1]) for r in kept], reset_from, key)
            conn.execute(sa.delete(steps).where(steps.c.run_key == key, steps.c.position >= cut))
            kept = [r for r in kept if r[0] < cut]
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
                step_bytes=sum(int(r[2]) for r in kept),
                updated_at=now,
            )
        )
        conn.execute(sa.update(dead_t).where(dead_t.c.id == dead_letter_id).values(retried_at=now))
        return dataclasses.replace(dead, retried_at=now)

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
        """Claim a stranded run for recovery with one conditional ``UPDATE`` (C35).

        Sets ``updated_at`` to the database's clock only while ``status`` and
        ``updated_at`` are the ones given and, for a ``running`` run, the lease
        has expired; the row count says who won.

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
            now = self._now(conn)
            query = sa.update(runs).where(
                runs.c.run_key == run_key, runs.c.status == status, runs.c.updated_at == updated_at
            )
            if status == "running":
                query = query.where(sa.or_(runs.c.lease_until.is_(None), runs.c.lease_until <= now))
            return conn.execute(query.values(updated_at=now)).rowcount == 1

        return self._write(work)

    def cleanup(self, *, older_than: float) -> int:
        """Delete succeeded, failed and cancelled runs (and their steps) updated before ``older_than``.

        Dead-lettered runs are kept so a retry can replay them (C27).

        Parameters:
          older_than(float): epoch seconds, database clock.

        Returns:
          int: how many runs were deleted.

        Raises:
          StoreUnavailable: the database cannot be reached.
        """
        runs, steps = self._t.runs, self._t.steps
        doomed = sa.and_(runs.c.status.in_(sorted(CLEANABLE_STATUSES)), runs.c.updated_at < older_than)

        def work(conn: Connection) -> int:
            conn.execute(sa.delete(steps).where(steps.c.run_key.in_(sa.select(runs.c.run_key).where(doomed))))
            return conn.execute(sa.delete(runs).where(doomed)).rowcount

        return self._write(work)


# ---------------------------------------------------------------- mapping
def _dump_envelope(envelope: JobEnvelope) -> str:
    try:
        return json.dumps(envelope.to_dict(), separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise StoreError(f"the job envelope of {envelope.task_name!r} is not JSON-compatible: {exc}") from exc


def _load_envelope(text: str) -> JobEnvelope:
    return JobEnvelope.from_dict(json.loads(text))


def _step_values(row: StepRow) -> dict[str, Any]:
    return {
        "position": row.position,
        "step_key": row.step_key,
        "kind": row.kind,
        "value": row.value,
        "wake_at": row.wake_at,
        "committed_at": row.committed_at,
        "attempt": row.attempt,
    }


def _step_row(r: sa.Row[Any]) -> StepRow:
    return StepRow(
        position=r.position,
        step_key=r.step_key,
        kind=r.kind,
        value=bytes(r.value) if r.value is not None else None,
        wake_at=r.wake_at,
        committed_at=r.committed_at,
        attempt=r.attempt,
    )


def _run_record(r: sa.Row[Any]) -> RunRecord:
    return RunRecord(
        run_key=r.run_key,
        task_name=r.task_name,
        framework=r.framework,
        queue=r.queue,
        status=r.status,
        owner=r.owner,
        attempt=r.attempt,
        lease_until=r.lease_until,
        takeovers=r.takeovers,
        job_id=r.job_id,
        envelope=_load_envelope(r.envelope),
        step_count=r.step_count,
        step_bytes=int(r.step_bytes),
        created_at=r.created_at,
        updated_at=r.updated_at,
    )


def _dead_letter_record(r: sa.Row[Any]) -> DeadLetterRecord:
    return DeadLetterRecord(
        id=r.id,
        run_key=r.run_key,
        job_id=r.job_id,
        task_name=r.task_name,
        reason=r.reason,
        message=r.message,
        traceback=r.traceback,
        envelope=_load_envelope(r.envelope),
        created_at=r.created_at,
        retried_at=r.retried_at,
    )


def _reset_position(steps: Sequence[tuple[int, str]], reset_from: str, run_key: str) -> int:
    for position, step_key in steps:
        if step_key == reset_from:
            return position
    keys = ", ".join(step_key for _, step_key in steps) or "(none)"
    raise UnknownRun(f"run {run_key!r} has no step {reset_from!r}; its steps are: {keys}")
