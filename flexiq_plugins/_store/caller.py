"""The caller's database transactions around a step (C42).

A plain step commits its memo on the store's own connection, at once. Called
inside a transaction the store does not share (a Django ``atomic`` block, a
SQLAlchemy session that has written), the memo outlives a rollback of that
transaction, and a retry gets the memo of writes that no longer exist. So a
step asks `open_transactions` first and is refused if one is open.

A *transactional* step (``step.transaction(name, fn, using=...)``) commits its
step row on the caller's connection, inside the caller's transaction: the
body's writes and the memo commit or roll back together. `caller_transaction`
turns ``using`` into a `CallerTransaction`, whose `scope`
joins an open transaction (as a savepoint) or opens one that commits at its end.

What is detected, reliably, and what is not:

- Django: an ``atomic`` block on any of this thread's connections (the ones
  Django's ``TestCase`` opens around a test excepted), or autocommit turned off.
- SQLAlchemy: a ``Connection`` of this thread (a ``Session``'s included) whose
  open transaction has executed a statement that writes (INSERT, UPDATE,
  DELETE, MERGE, DDL …), seen through SQLAlchemy's engine events once a worker
  runs durable jobs (`watch_sqlalchemy`). A transaction that has only
  read cannot be rolled back out from under a memo and is not refused.
- Not seen: ORM changes not flushed yet, ``AsyncSession`` / ``AsyncConnection``,
  raw DB-API connections, transactions opened in another thread.

Django is imported only when the process has imported it already (or when
``using`` names a Django database), so the core does not depend on it.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import sys
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy import event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, Engine

from ..errors import InvalidTransaction

__all__ = [
    "CallerConnection",
    "CallerTransaction",
    "OpenTransactionInfo",
    "caller_transaction",
    "ignore_engine",
    "open_transactions",
    "watch_sqlalchemy",
]

_ACCEPTED = "a Django database alias or connection, or a SQLAlchemy Session, scoped_session or Connection"
_WRITE_WORDS = frozenset({"INSERT", "UPDATE", "DELETE", "MERGE", "REPLACE", "UPSERT", "CREATE", "ALTER", "DROP"})
_FAMILY = {"mariadb": "mysql"}


@dataclass(frozen=True)
class OpenTransactionInfo:
    """An open transaction a step can see.

    Parameters:
      key (tuple[str, object]): what it is on, e.g. ``("django", "default")``.
      description (str): how messages name it.
    """

    key: tuple[str, object]
    description: str


def family(dialect_name: str) -> str:
    """The database family of a dialect name: ``mariadb`` is ``mysql``."""
    return _FAMILY.get(dialect_name, dialect_name)


# ------------------------------------------------------------- detection
def open_transactions(exclude: CallerTransaction | None = None) -> list[OpenTransactionInfo]:
    """The open transactions of this thread that a plain step's memo could outlive (C42).

    Parameters:
      exclude (CallerTransaction | None): the transaction a transactional step
        shares; it is not a hazard to that step.
    """
    found = _django_open()
    if _local.writers:  # no SQLAlchemy transaction of this thread has written: none to look at
        found += _sqlalchemy_open()
    if exclude is None or not found:
        return found
    return [t for t in found if not exclude.owns(t.key)]


def _django_open() -> list[OpenTransactionInfo]:
    if "django.db" not in sys.modules:
        return []
    from django.conf import settings
    from django.db import connections

    if not settings.configured:
        return []
    found: list[OpenTransactionInfo] = []
    for db in connections.all(initialized_only=True):
        if any(not getattr(block, "_from_testcase", False) for block in db.atomic_blocks):
            found.append(OpenTransactionInfo(("django", db.alias), f"a Django atomic block on database {db.alias!r}"))
        elif db.connection is not None and not db.in_atomic_block and not db.autocommit:
            found.append(OpenTransactionInfo(("django", db.alias), f"Django database {db.alias!r} with autocommit off"))
    return found


_Writers = dict[int, tuple[weakref.ref[Connection], object]]


class _ThreadState(threading.local):
    """What this module keeps per thread; ``writers`` is ``None`` until a transaction of the thread writes."""

    writers: _Writers | None = None  # a class default: reading it in a thread that never wrote raises nothing


_local = _ThreadState()
_ignored: weakref.WeakSet[Engine] = weakref.WeakSet()
_watch_lock = threading.Lock()
_watching = False


def watch_sqlalchemy() -> None:
    """Start following, per thread, which SQLAlchemy transactions have written (idempotent).

    Listens to three engine events of every engine in the process
    (``after_cursor_execute``, ``commit``, ``rollback``); the cost is one
    function call per statement. Called when a worker's attempt driver is
    made, so a process that only publishes jobs is not touched.
    """
    global _watching
    with _watch_lock:
        if _watching:
            return
        event.listen(Engine, "after_cursor_execute", _after_execute)
        event.listen(Engine, "commit", _ended)
        event.listen(Engine, "rollback", _ended)
        _watching = True


def ignore_engine(engine: Engine) -> None:
    """Never count ``engine``'s transactions: the step store's own."""
    _ignored.add(engine)


def _writers() -> _Writers:
    """This thread's connections whose open transaction has written: ``id → (connection, asyncio task)``."""
    found = _local.writers
    if found is None:
        found = _local.writers = {}
    return found


def _task() -> object:
    """The running asyncio task, or ``None``: tasks of one event loop share its thread, not its transactions."""
    try:
        return asyncio.current_task()
    except RuntimeError:
        return None


def _after_execute(conn: Connection, _cursor: Any, statement: str, _params: Any, context: Any, _many: bool) -> None:
    if conn.engine in _ignored or not _writes(statement, context):
        return
    _writers()[id(conn)] = (weakref.ref(conn), _task())


def _ended(conn: Connection) -> None:
    _writers().pop(id(conn), None)


def _writes(statement: str, context: Any) -> bool:
    if context is not None and (context.isinsert or context.isupdate or context.isdelete):
        return True
    words = statement.lstrip(" \t\r\n(").split(None, 1)
    return bool(words) and words[0].upper() in _WRITE_WORDS


def _sqlalchemy_open() -> list[OpenTransactionInfo]:
    found: list[OpenTransactionInfo] = []
    writers, task = _writers(), _task()
    for key, (ref, owner) in list(writers.items()):
        conn = ref()
        if conn is None or conn.closed or not conn.in_transaction():
            del writers[key]
            continue
        if owner is not task:
            continue
        where = conn.engine.url.render_as_string(hide_password=True)
        found.append(
            OpenTransactionInfo(("sqlalchemy", id(conn)), f"a SQLAlchemy transaction on {where} that has written")
        )
    return found


# ---------------------------------------------------- transactional steps
class CallerConnection:
    """The caller's connection inside a transactional step's scope, as the store uses it.

    ``execute`` runs one SQLAlchemy Core statement in the caller's transaction
    and returns a result with ``rowcount`` and ``scalar_one()``; a database
    error is raised as SQLAlchemy's (``IntegrityError`` …).

    Attributes:
      dialect_name (str): ``"postgresql"``, ``"mysql"``, ``"mariadb"``, ``"sqlite"`` …
      description (str): how messages name the connection.
    """

    dialect_name: str
    description: str

    def execute(self, statement: Any) -> Any:  # pragma: no cover - overridden
        """Run ``statement`` in the caller's transaction."""
        raise NotImplementedError


class CallerTransaction(abc.ABC):
    """The transaction a transactional step commits in (C42).

    Attributes:
      description (str): how messages name it.
      joined (bool): whether the last `scope` joined a transaction that
        was already open (and so stays open after it).
    """

    description: str
    joined: bool = False

    @abc.abstractmethod
    def scope(self) -> contextlib.AbstractContextManager[CallerConnection]:
        """Join the open transaction (a savepoint) or open one that commits at the end of the ``with`` block."""

    @abc.abstractmethod
    def owns(self, key: tuple[str, object]) -> bool:
        """Whether the open transaction ``key`` (`OpenTransactionInfo`) is this one."""

    @abc.abstractmethod
    def is_open(self) -> bool:
        """Whether the caller's transaction is still open."""

    @abc.abstractmethod
    def rollback(self) -> None:
        """Roll the caller's transaction back (when the task body left it open)."""


def caller_transaction(using: object) -> CallerTransaction:
    """The `CallerTransaction` of ``using``.

    Parameters:
      using (str | object): a Django database alias (``"default"``) or
        connection (``django.db.connection``), or a SQLAlchemy ``Session``,
        ``scoped_session`` or ``Connection``.

    Raises:
      InvalidTransaction: anything else, naming it and the accepted forms.
    """
    from sqlalchemy.orm import Session, scoped_session

    if isinstance(using, scoped_session):
        using = using()
    if isinstance(using, Session):
        return _SessionTransaction(using)
    if isinstance(using, Connection):
        return _ConnectionTransaction(using)
    if isinstance(using, str) or type(using).__module__.startswith("django.db.backends"):
        return _DjangoTransaction(using)
    raise InvalidTransaction(f"step.transaction cannot commit in {using!r}; using= takes {_ACCEPTED}")


class _SqlAlchemyConnection(CallerConnection):
    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self.dialect_name = conn.dialect.name
        self.description = f"the SQLAlchemy connection to {conn.engine.url.render_as_string(hide_password=True)}"

    def execute(self, statement: Any) -> Any:
        return self._conn.execute(statement)


def _really_begun(conn: Connection) -> None:
    """Make pysqlite's lazily begun transaction real before a savepoint joins it.

    By default pysqlite sends ``BEGIN`` only before the first write, so a
    ``SAVEPOINT`` issued first would itself be the outermost transaction, and
    its ``RELEASE`` would commit the step for good. PostgreSQL and MySQL need nothing.
    """
    if conn.dialect.name != "sqlite":
        return
    raw: Any = conn.connection.dbapi_connection
    if raw is not None and not raw.in_transaction:
        conn.exec_driver_sql("BEGIN")


class _ConnectionTransaction(CallerTransaction):
    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._held: object = None
        self.description = _SqlAlchemyConnection(conn).description

    @contextlib.contextmanager
    def scope(self) -> Iterator[CallerConnection]:
        self.joined = self._conn.in_transaction()
        if self.joined:
            _really_begun(self._conn)
            self._held = self._conn.get_transaction()
        with self._conn.begin_nested() if self.joined else self._conn.begin():
            yield _SqlAlchemyConnection(self._conn)

    def owns(self, key: tuple[str, object]) -> bool:
        return key == ("sqlalchemy", id(self._conn))

    def is_open(self) -> bool:
        """Whether the transaction the step joined (not a later one) is still open."""
        return not self._conn.closed and self._held is not None and self._conn.get_transaction() is self._held

    def rollback(self) -> None:
        self._conn.rollback()


class _SessionTransaction(CallerTransaction):
    def __init__(self, session: Any) -> None:
        self._session = session
        self._held: object = None
        self.description = f"the SQLAlchemy session {session!r}"

    @contextlib.contextmanager
    def scope(self) -> Iterator[CallerConnection]:
        session = self._session
        self.joined = session.in_transaction()
        if self.joined:
            _really_begun(session.connection())
            self._held = session.get_transaction()
        with session.begin_nested() if self.joined else session.begin():
            yield _SqlAlchemyConnection(session.connection())

    def owns(self, key: tuple[str, object]) -> bool:
        if not self._session.in_transaction():
            return False
        return key == ("sqlalchemy", id(self._session.connection()))

    def is_open(self) -> bool:
        """Whether the transaction the step joined (not a later one) is still open."""
        return self._held is not None and self._session.get_transaction() is self._held

    def rollback(self) -> None:
        self._session.rollback()


class _DjangoTransaction(CallerTransaction):
    def __init__(self, using: object) -> None:
        from django.db import connections

        db: Any = using
        if isinstance(using, str):
            try:
                db = connections[using]
            except Exception as exc:  # ConnectionDoesNotExist, ImproperlyConfigured
                raise InvalidTransaction(f"step.transaction(using={using!r}): no such Django database ({exc})") from exc
        self._db = db
        self._held: object = None
        self.description = f"Django database {self._db.alias!r}"

    @contextlib.contextmanager
    def scope(self) -> Iterator[CallerConnection]:
        from django.db import transaction

        db = self._db
        self.joined = bool(db.in_atomic_block or (db.connection is not None and not db.autocommit))
        self._held = db.atomic_blocks[0] if db.atomic_blocks else "autocommit off"
        with transaction.atomic(using=db.alias):
            yield _DjangoConnection(db, self.description)

    def owns(self, key: tuple[str, object]) -> bool:
        return key == ("django", self._db.alias)

    def is_open(self) -> bool:
        """Whether the transaction the step joined (its outermost ``atomic`` block) is still open."""
        db = self._db
        if isinstance(self._held, str):
            return bool(db.connection is not None and not db.autocommit)
        return any(block is self._held for block in db.atomic_blocks)

    def rollback(self) -> None:
        from django.db import transaction

        if self._db.in_atomic_block:
            transaction.set_rollback(True, using=self._db.alias)
        else:
            transaction.rollback(using=self._db.alias)


class _DjangoConnection(CallerConnection):
    """Runs SQLAlchemy Core statements through a Django connection's cursor (``%s`` placeholders)."""

    def __init__(self, db: Any, description: str) -> None:
        self._db = db
        self.dialect_name = str(db.vendor)
        self.description = description

    def execute(self, statement: Any) -> Any:
        from django.db import DatabaseError

        compiled = statement.compile(dialect=_format_dialect(self.dialect_name))
        values = compiled.construct_params()
        params = [values[name] for name in compiled.positiontup or ()]
        with self._db.cursor() as cursor:
            try:
                cursor.execute(compiled.string, params)
            except DatabaseError as exc:
                raise sa_exc.DBAPIError.instance(compiled.string, params, exc, DatabaseError) from exc
            rows = cursor.fetchall() if cursor.description else []
            return _Rows(cursor.rowcount, rows)


@dataclass(frozen=True)
class _Rows:
    rowcount: int
    rows: list[Any]

    def scalar_one(self) -> Any:
        (row,) = self.rows
        return row[0]


def _format_dialect(vendor: str) -> Any:
    """A SQLAlchemy dialect for ``vendor`` that compiles with ``%s`` placeholders, as Django's cursors take."""
    if vendor == "postgresql":
        from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg

        return PGDialect_psycopg(paramstyle="format")  # type: ignore[no-untyped-call]
    if vendor == "mysql":
        from sqlalchemy.dialects.mysql.mysqldb import MySQLDialect_mysqldb

        return MySQLDialect_mysqldb(paramstyle="format")
    if vendor == "sqlite":
        from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite

        return SQLiteDialect_pysqlite(paramstyle="format")
    raise InvalidTransaction(f"step.transaction does not support Django's {vendor!r} databases")
