"""Store URLs and engines: which driver, how each database is set up, what a fork does.

Why it is built the way it is:

- **Our drivers, unless you name one.** A URL without a driver gets psycopg 3
  (PostgreSQL) or PyMySQL (MySQL/MariaDB, ``charset=utf8mb4``), the drivers
  this package's extras install. A relative SQLite path is made absolute when
  the URL is read, so a worker that changes directory keeps the same file.
- **SQLite writers queue instead of deadlocking.** pysqlite's own transaction
  handling is switched off and every write transaction starts with ``BEGIN
  IMMEDIATE``; the file opens in WAL mode with a 30 s busy timeout.
- **SQLite commits without an fsync each (``synchronous=NORMAL``).** Under WAL
  this is safe against a crashed *process* (a committed step is in the WAL
  file, which the next opener replays); only a power loss or an OS crash may
  lose the last commits (never corrupt the file). ``?synchronous=full`` in the
  URL restores an fsync per commit.
- **No pre-ping per step.** A ping is a round trip, as much as a step's own
  statement. At checkout a pooled connection is checked locally instead: input
  waiting on its idle socket means the server closed it (it is replaced before
  use); one idle in the pool for more than 10 seconds is pinged as well. A connection the server dropped while in steady
  use fails its statement instead (a connection an attempt holds, see
  ``SqlStepStore.held``, is checked the same way before each use: it is not
  in the pool between its calls); the store then retries the transaction
  once on a fresh connection, unless the failure hit its ``COMMIT`` (or an
  autocommitted statement), whose result is then unknown
  ([`StoreUnavailable`][flexiq_plugins.errors.StoreUnavailable], C28). MySQL/MariaDB connections are also
  recycled after an hour, below the server's default ``wait_timeout``, and
  rolled back on return to the pool only when a transaction is open (PyMySQL
  would otherwise send a ``ROLLBACK`` round trip after every commit).
- **MySQL/MariaDB sessions.** Our engines run ``READ COMMITTED`` (no gap locks)
  with the session time zone at UTC so ``UNIX_TIMESTAMP(NOW(6))`` is exact.
- **A connection per thread that uses the store, kept.** The pool has no size
  limit (SQLAlchemy's ``pool_size=0``) and keeps every connection it opened:
  a worker process holds as many connections as it ran store calls at once,
  its concurrency plus its background threads (the sweeper, the lease renewer).
  SQLAlchemy's default (keep 5, open up to 10 more and close those on return,
  wait 30 s beyond 15) made a Dramatiq process of 8 threads open and close a
  connection for most jobs, and a worker of more than 15 threads wait on the
  pool.
- **Processes and forks.** Celery prefork and Dramatiq fork worker processes; a
  pooled connection shared by parent and child corrupts both. A fork hook calls
  ``engine.dispose(close=False)`` in the child, the pattern SQLAlchemy
  documents, so the child opens its own connections and the parent's stay
  untouched.
- **A silent network is an outage, not a hang.** A database whose packets are
  dropped without a reset (a firewall, a dead host, a partition) would leave
  a statement waiting forever on its established connection, and a new
  connection waiting on its SYN. Our PostgreSQL and MySQL/MariaDB engines
  therefore add client-side timeouts that only a silent network reaches: a
  10 s connect timeout, and TCP keepalives (first probe after 10 s of
  silence, then every 5 s) with a 20 s TCP user timeout, so a dead
  connection fails its statement with an operational error after about 20 s
  ([`StoreUnavailable`][flexiq_plugins.errors.StoreUnavailable], the outage handling of C28). A slow statement
  is never cut: while the server works, its kernel answers the keepalive
  probes and acknowledges our data. PostgreSQL takes these as libpq
  parameters (``connect_timeout``, ``keepalives``, ``keepalives_idle``,
  ``keepalives_interval``, ``keepalives_count``, ``tcp_user_timeout`` in ms),
  each overridable in the URL's query; for MySQL/MariaDB, PyMySQL has only a
  wall-clock ``read_timeout`` (which would cut a slow statement, so it is
  not set) and the keepalive options are set on its socket when it connects,
  from the same names in the URL's query (``keepalives=0`` turns them off).
  The other side of the same cut: a client that gave up mid-transaction
  sends no reset, so its server session would keep its locks (a run's
  claim) until the server's TCP keepalive notices, two hours by default.
  PostgreSQL sessions therefore run with ``idle_in_transaction_session_timeout``
  of one minute (libpq ``options``, unless the URL sets ``options``).
- **Construction never connects.** Creating an engine only checks the URL and
  that its driver is installed; an unreachable server shows at first use.
"""

from __future__ import annotations

import os
import select
import socket
import sqlite3
import time
import urllib.parse
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.pool import StaticPool

from ...errors import ConfigurationError
from .driver import run_on_driver, runs_on_driver

__all__ = [
    "ACCEPTED_STORE_FORMS",
    "NETWORK_TIMEOUTS",
    "READ_ONLY",
    "bad_store_message",
    "create_engine",
    "dead_after_idle",
    "normalize_url",
    "register_fork_hook",
    "safe_url",
    "sqlite_file",
    "sqlite_read_only",
]

ACCEPTED_STORE_FORMS = (
    "sqlite:///path, postgresql://…, mysql://… (or mariadb://…), memory://, a sqlalchemy Engine or a StepStore"
)
"""The store specifications accepted, for error messages."""

READ_ONLY = "flexiq_read_only"
"""The execution option that marks a read-only transaction (SQLite then takes no write lock)."""

_SQLITE_BUSY_TIMEOUT_MS = 30_000
SQLITE_SYNCHRONOUS = "synchronous"
"""The SQLite URL option choosing ``PRAGMA synchronous`` (``normal``, the default, or ``full``/``extra``)."""
_SQLITE_SYNCHRONOUS_LEVELS = ("normal", "full", "extra")
_MYSQL_POOL_RECYCLE_S = 3600
_POOL_SIZE_UNLIMITED = 0
"""SQLAlchemy's ``QueuePool`` without a size limit: it opens on demand and keeps every connection it opened."""
_PING_IF_IDLE_S = 10.0
_IN_TRANSACTION = 1  # the MySQL protocol's SERVER_STATUS_IN_TRANS flag
_IDLE_SINCE = "flexiq_idle_since"
_CONNECT_TIMEOUT_S = 10
NETWORK_TIMEOUTS: dict[str, int] = {
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 20_000,
}
"""The client-side network timeouts our PostgreSQL and MySQL/MariaDB engines add unless the URL sets them.

libpq's parameter names and units: ``keepalives`` (1 on, 0 off),
``keepalives_idle`` and ``keepalives_interval`` (seconds), ``keepalives_count``
(probes), ``tcp_user_timeout`` (milliseconds). With them a connection whose
packets vanish fails after about 20 s (``tcp_user_timeout`` bounds both the
unacknowledged data and the unanswered probes); a slow statement is never cut.
"""
_IDLE_IN_TRANSACTION_TIMEOUT_MS = 60_000
_POSTGRES_SESSION_OPTIONS = f"-c idle_in_transaction_session_timeout={_IDLE_IN_TRANSACTION_TIMEOUT_MS}"
"""libpq ``options`` for our PostgreSQL sessions unless the URL sets ``options``: the server ends a session idle
inside a transaction for a minute. A client cut off by a silent network mid-transaction vanishes without a reset,
and its session would otherwise hold its row locks (a run's claim) until the server's own TCP keepalive notices,
two hours by default; the store's own transactions never idle between statements."""
_DRIVERS = {
    "postgresql": "postgresql+psycopg",
    "postgres": "postgresql+psycopg",
    "mysql": "mysql+pymysql",
    "mariadb": "mariadb+pymysql",
    "sqlite": "sqlite",
}
_DRIVER_PACKAGES = {
    "psycopg": "psycopg (pip install 'flexiq-plugins[postgres]')",
    "psycopg2": "psycopg2 (pip install psycopg2-binary, or psycopg2 to build it against your libpq)",
    "pymysql": "pymysql (pip install 'flexiq-plugins[mysql]')",
    "mysqldb": "mysqlclient (pip install mysqlclient)",
}
"""The package that provides each driver a store URL may name, for the missing-driver message."""

T = TypeVar("T")


def normalize_url(raw: str | URL) -> URL:
    """Parse a store URL and pick this package's driver when none is named.

    ``postgresql://`` (and ``postgres://``) become ``postgresql+psycopg://``,
    ``mysql://`` becomes ``mysql+pymysql://`` and ``mariadb://`` becomes
    ``mariadb+pymysql://`` (with ``charset=utf8mb4`` unless given). A relative
    SQLite path is made absolute against the current working directory now,
    so a worker that changes directory later keeps the same file.

    Parameters:
      raw (str | URL): a SQLAlchemy URL.

    Raises:
      ConfigurationError: the URL cannot be parsed or names another database.
    """
    try:
        url = make_url(raw)
    except (sa_exc.ArgumentError, ValueError) as exc:
        raise ConfigurationError(bad_store_message(raw)) from exc
    backend, _, driver = url.drivername.partition("+")
    if backend not in _DRIVERS:
        raise ConfigurationError(bad_store_message(raw))
    if not driver:
        url = url.set(drivername=_DRIVERS[backend])
    if url.get_backend_name() in ("mysql", "mariadb") and "charset" not in url.query:
        url = url.update_query_dict({"charset": "utf8mb4"})
    if url.get_backend_name() == "sqlite" and not _is_memory_sqlite(url) and "uri" not in url.query:
        url = url.set(database=os.path.abspath(str(url.database)))
    return url


def bad_store_message(raw: object) -> str:
    """The message for a store specification we cannot use, listing the accepted forms."""
    return f"cannot use {raw!r} as a step store; accepted forms: {ACCEPTED_STORE_FORMS}"


def safe_url(url: URL) -> str:
    """``url`` as text with its password hidden, for messages."""
    return url.render_as_string(hide_password=True)


def _is_memory_sqlite(url: URL) -> bool:
    return url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:")


_TRUE = frozenset({"true", "1", "yes", "on", "y", "t"})


def _sqlite_uri_options(url: URL) -> dict[str, str] | None:
    """The options of a SQLite URL given as an SQLite URI (``uri=true``): the URI's own and the URL's; else ``None``.

    Without ``uri=true`` pysqlite takes the database as a plain file name and ignores ``mode`` and the like.
    """
    if str(url.query.get("uri", "")).lower() not in _TRUE:
        return None
    _, _, query = str(url.database or "").partition("?")
    return {**dict(urllib.parse.parse_qsl(query)), **{key: str(value) for key, value in url.query.items()}}


def sqlite_file(url: URL) -> str | None:
    """The file a SQLite URL opens, or ``None`` for an in-memory database (or another backend).

    With ``uri=true`` the database part is an SQLite URI (``file:/path/x.db``,
    ``file:///path/x.db``, ``file:x.db``, percent-encoded), whose path is the
    file; ``mode=memory`` or ``file::memory:`` is in memory.

    Parameters:
      url (URL): a store URL.
    """
    if url.get_backend_name() != "sqlite" or _is_memory_sqlite(url):
        return None
    database = str(url.database)
    options = _sqlite_uri_options(url)
    if options is None or not database.startswith("file:"):
        return database
    path = urllib.parse.unquote(urllib.parse.urlsplit(database).path)
    return None if path in ("", ":memory:") or options.get("mode") == "memory" else path


def sqlite_read_only(url: URL) -> str | None:
    """The option that opens a SQLite URL's database read-only (``mode=ro``, ``immutable=1``), or ``None``.

    Parameters:
      url (URL): a store URL; only an SQLite URI (``uri=true``) can carry those options.
    """
    options = _sqlite_uri_options(url) if url.get_backend_name() == "sqlite" else None
    if options is None:
        return None
    if options.get("mode", "").lower() == "ro":
        return "mode=ro"
    if options.get("immutable", "").lower() in _TRUE:
        return f"immutable={options['immutable']}"
    return None


def create_engine(url: URL) -> Engine:
    """Create an engine configured for the store (does not connect).

    Parameters:
      url (URL): a URL from `normalize_url`.

    Raises:
      ConfigurationError: the driver is not installed, or the URL's options are unusable.
    """
    backend = url.get_backend_name()
    kwargs: dict[str, Any] = {}
    synchronous = _sqlite_synchronous(url) if backend == "sqlite" else None
    url = url.difference_update_query([SQLITE_SYNCHRONOUS]) if backend == "sqlite" else url
    if backend == "sqlite" and _is_memory_sqlite(url):
        kwargs.update(poolclass=StaticPool, connect_args={"check_same_thread": False})
    else:
        kwargs["pool_size"] = _POOL_SIZE_UNLIMITED  # keep every connection opened: one per thread using the store
    if backend == "postgresql":
        defaults = {"connect_timeout": _CONNECT_TIMEOUT_S, **NETWORK_TIMEOUTS, "options": _POSTGRES_SESSION_OPTIONS}
        kwargs["connect_args"] = {key: value for key, value in defaults.items() if key not in url.query}
    mysql_keepalive: dict[str, int] = {}
    if backend in ("mysql", "mariadb"):
        mysql_keepalive = _mysql_network_timeouts(url)
        url = url.difference_update_query(list(NETWORK_TIMEOUTS))
        if "connect_timeout" not in url.query:
            kwargs["connect_args"] = {"connect_timeout": _CONNECT_TIMEOUT_S}
        kwargs.update(isolation_level="READ COMMITTED", pool_recycle=_MYSQL_POOL_RECYCLE_S, pool_reset_on_return=None)
    try:
        engine = sa.create_engine(url, **kwargs)
    except ImportError as exc:
        raise ConfigurationError(f"the step store {safe_url(url)} needs {_missing_driver(url, exc)}") from exc
    except (sa_exc.ArgumentError, TypeError) as exc:
        raise ConfigurationError(f"cannot create an engine for {safe_url(url)}: {exc}") from exc
    if backend == "sqlite":
        _install_sqlite_events(engine, wal=not _is_memory_sqlite(url), synchronous=synchronous or "normal")
    else:
        _install_idle_ping(engine)
    if backend in ("mysql", "mariadb"):
        event.listen(engine, "connect", _on_mysql_connect)
        event.listen(engine, "connect", _mysql_keepalive_hook(mysql_keepalive))
        event.listen(engine.pool, "reset", _reset_mysql_if_in_transaction)
    return engine


def _missing_driver(url: URL, exc: ImportError) -> str:
    """The package to install for the driver ``url`` names (``postgresql+psycopg2://`` needs psycopg2)."""
    driver = url.get_driver_name()
    package = _DRIVER_PACKAGES.get(driver, f"that provides the module {exc.name or driver!r}")
    return f"the package {package} for its driver {driver!r}, which cannot be imported ({exc})"


def _mysql_network_timeouts(url: URL) -> dict[str, int]:
    """`NETWORK_TIMEOUTS` with the URL's own values of those names, checked (MySQL/MariaDB)."""
    options = dict(NETWORK_TIMEOUTS)
    for key in NETWORK_TIMEOUTS:
        raw = url.query.get(key)
        if raw is None:
            continue
        try:
            value = int(str(raw))
        except ValueError:
            value = -1
        if value < 0:
            raise ConfigurationError(f"the option {key}={raw!r} in {safe_url(url)} is not a whole number >= 0")
        options[key] = value
    return options


def _mysql_keepalive_hook(options: dict[str, int]) -> Callable[[Any, Any], None]:
    """A ``connect`` listener setting TCP keepalive and user timeout on a PyMySQL connection's socket.

    Options the platform lacks (``TCP_USER_TIMEOUT``, ``TCP_KEEPIDLE`` outside
    Linux) are skipped; a Unix-domain socket has none of them.
    """
    keepalive = [
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPIDLE", None), options["keepalives_idle"]),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPINTVL", None), options["keepalives_interval"]),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPCNT", None), options["keepalives_count"]),
    ]
    settings = [
        (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1 if options["keepalives"] else 0),
        *(keepalive if options["keepalives"] else []),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_USER_TIMEOUT", None), options["tcp_user_timeout"]),
    ]

    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        sock = getattr(dbapi_connection, "_sock", None)
        if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
            return
        for level, name, value in settings:
            if name is not None and (value or name == socket.SO_KEEPALIVE):
                sock.setsockopt(level, name, value)

    return on_connect


def _install_idle_ping(engine: Engine) -> None:
    """Check a pooled connection at checkout without a round trip; ping it only if it sat idle long.

    A connection whose socket has input waiting while no statement is in
    flight was closed by the server (it sent its goodbye, or EOF): a local
    ``poll`` with no timeout sees that. One idle for more than
    ``_PING_IF_IDLE_S`` is also pinged. Either way a dead one raises
    `DisconnectionError`, on which the pool discards
    it and checks out (or opens) another: SQLAlchemy's pessimistic recipe,
    without a round trip per step.
    """

    def on_checkin(_dbapi_connection: Any, record: Any) -> None:
        record.info[_IDLE_SINCE] = time.monotonic()

    def on_checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        dead = dead_after_idle(engine, dbapi_connection, record.info.pop(_IDLE_SINCE, None))
        if dead is not None:
            raise sa_exc.DisconnectionError(f"{dead} (a pooled connection)")

    event.listen(engine, "checkin", on_checkin)
    event.listen(engine, "checkout", on_checkout)


def dead_after_idle(engine: Engine, dbapi_connection: Any, idle_since: float | None) -> str | None:
    """Why an idle connection must not be used, or ``None`` if it may; a round trip only after a long idle.

    The check made at a pool checkout (`_install_idle_ping`) and before
    each use of a connection an attempt holds (``SqlStepStore.held``): input
    waiting on its socket means the server closed it; one idle since
    ``idle_since`` (``time.monotonic()`` seconds) for more than 10 seconds
    is pinged as well. ``None`` for ``idle_since`` skips the ping.

    Parameters:
      engine (Engine): the engine the connection belongs to (its dialect pings).
      dbapi_connection (Any): the driver's connection.
      idle_since (float | None): when it was last used, ``time.monotonic()`` seconds.

    Returns:
      str | None: the reason it is dead, or ``None``.
    """
    if _closed_by_server(dbapi_connection):
        return "the server closed this connection"
    if idle_since is None or time.monotonic() - idle_since <= _PING_IF_IDLE_S:
        return None
    try:
        alive = engine.dialect.do_ping(dbapi_connection)
    except Exception as exc:
        return f"an idle connection is dead: {exc}"
    return None if alive else "an idle connection is dead"


def _closed_by_server(dbapi_connection: Any) -> bool:
    """Whether an idle connection's socket has input waiting (the server closed it); no round trip."""
    sock = getattr(dbapi_connection, "_sock", None)  # PyMySQL
    try:
        fd = sock.fileno() if sock is not None else dbapi_connection.fileno()  # psycopg
    except Exception:
        return False
    if fd < 0:
        return True
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(0))
    readable, _, _ = select.select([fd], [], [], 0)
    return bool(readable)


def _sqlite_synchronous(url: URL) -> str | None:
    """The ``synchronous`` URL option, checked; ``None`` when absent."""
    raw = url.query.get(SQLITE_SYNCHRONOUS)
    if raw is None:
        return None
    value = str(raw).lower()
    if value not in _SQLITE_SYNCHRONOUS_LEVELS:
        raise ConfigurationError(
            f"the SQLite option {SQLITE_SYNCHRONOUS}={raw!r} in {safe_url(url)} is not one of "
            f"{', '.join(_SQLITE_SYNCHRONOUS_LEVELS)}"
        )
    return value


def _install_sqlite_events(engine: Engine, *, wal: bool, synchronous: str) -> None:
    """The pysqlite ``BEGIN IMMEDIATE`` recipe, WAL mode, ``PRAGMA synchronous`` and a busy timeout.

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
                cursor.execute(f"PRAGMA synchronous = {synchronous.upper()}")
        finally:
            cursor.close()

    def on_begin(conn: Connection) -> None:
        sql = "BEGIN" if conn.get_execution_options().get(READ_ONLY, False) else "BEGIN IMMEDIATE"
        if runs_on_driver(conn):  # SQLAlchemy's execution would cost 5× the BEGIN (see .driver)
            run_on_driver(conn, sql)
        else:
            conn.exec_driver_sql(sql)

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


def _reset_mysql_if_in_transaction(dbapi_connection: Any, _record: Any, _state: Any) -> None:
    """Roll back a connection returned to the pool only if the server says a transaction is open.

    The pool's own reset (``reset_on_return``, off for our MySQL/MariaDB
    engines) would send a ``ROLLBACK`` at every return, a round trip even after
    a commit; PyMySQL keeps the server's in-transaction flag from its last reply.
    """
    if getattr(dbapi_connection, "server_status", _IN_TRANSACTION) & _IN_TRANSACTION:
        dbapi_connection.rollback()


def _on_mysql_connect(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("SET time_zone = '+00:00'")
    finally:
        cursor.close()


def register_fork_hook(target: T, hook: Callable[[T], None]) -> None:
    """Call ``hook(target)`` in every forked child while ``target`` is alive.

    Only a weak reference to ``target`` is kept, so the hook never keeps a
    store (and its engine) alive.

    Parameters:
      target (T): the object the child must reset, e.g. a store.
      hook (Callable[[T], None]): what resets it, e.g. dropping the parent's
        pooled connections without closing them.
    """
    ref = weakref.ref(target)

    def after_fork_in_child() -> None:
        alive = ref()
        if alive is not None:
            hook(alive)

    os.register_at_fork(after_in_child=after_fork_in_child)
