"""The hot paths' statements handed straight to the driver (pysqlite, psycopg), built and compiled by SQLAlchemy.

The hot paths are a new step, an attempt start and a finish (the store's
`folded` statements). Why: a new step is one statement on PostgreSQL, two on SQLite, and executing
one through a SQLAlchemy ``Connection`` (execution context, bind and result
processing set-up, event dispatch, result object) costs more of this
process's CPU than the driver's own work: measured with callgrind, that
wrapper was half the instructions of a new step on SQLite and a third on
PostgreSQL, where a step should cost about 0.2 ms on SQLite and about one
committed ``INSERT`` on PostgreSQL. So these statements are still built and compiled
by SQLAlchemy, once, against the store engine's own dialect, and run on the
driver cursor of the connection SQLAlchemy's pool lent and whose
transaction it still begins and commits. What the wrapper did and matters
is kept:

- each parameter goes through its column type's bind processor;
- a driver error is raised as the SQLAlchemy exception SQLAlchemy itself
  raises for it (`sqlalchemy.exc.DBAPIError.instance`), so the store's
  error boundary classifies it exactly as before (a duplicate step key is an
  ``IntegrityError``, a busy SQLite database an ``OperationalError``);
- an error the dialect reads as a lost connection (``Dialect.is_disconnect``)
  invalidates the connection and the pool's older connections, as SQLAlchemy
  does, and the exception says ``connection_invalidated``: the store's rules
  for a dead connection (retry a transaction once on a new connection, never
  an autocommitted step whose result is unknown, C28) apply unchanged;
- an interruption mid-statement (``KeyboardInterrupt``, ``SystemExit``, a
  greenlet's exit) invalidates the connection, whose state is then unknown.

What it does not do: statement events and result processing. So it is used
only where nothing depends on them (`runs_on_driver`): pysqlite,
psycopg and psycopg2, on an engine with no ``before_cursor_execute``
listener (an SQL tracer, a statement rewriter), no ``handle_error`` hook and
no ``schema_translate_map``; anything else keeps SQLAlchemy's execution. An
``after_cursor_execute`` listener alone does not see these statements (count
what the driver runs instead, as ``benchmarks/counting.py`` does). A row
comes back as the driver returns it: use it for numeric and text columns,
whose types have no result processing on these drivers.
"""

from __future__ import annotations

import copy
import operator
import weakref
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection
from sqlalchemy.util import is_exit_exception

__all__ = ["DriverStatement", "run_on_driver", "runs_on_driver"]


class DriverStatement:
    """One Core statement compiled once for a dialect and executed on its driver's cursor.

    Parameters:
      statement (Executable): the statement, e.g. a fenced ``UPDATE … RETURNING``.
      dialect (Dialect): the store engine's dialect (pysqlite binds by position,
        psycopg by name: both are handled).
      as_written (bool): on psycopg, compile with ``$1`` placeholders for a
        ``RawCursor`` (``False``: as SQLAlchemy would, for the connection's cursor).

    On psycopg the statement is compiled with PostgreSQL's own
    ``$1`` placeholders and runs on a ``psycopg.RawCursor``, which sends it as
    written: psycopg's cursor would convert ``%(name)s`` placeholders at every
    execution, and it caches that conversion only for statements of up to
    4,096 bytes, which an attempt start's one statement is not. That is only
    on a connection whose cursor class is psycopg's own ``Cursor``: on one set
    up with another (``cursor_factory`` a ``psycopg.ClientCursor``, which
    prepares nothing on the server, as a transaction-pooling PgBouncer needs;
    a tracing instrumentation's cursor; your own) the statement is compiled as
    SQLAlchemy would (once, at its first such execution) and runs on that
    connection's cursor class, as every other statement does.

    Raises:
      ValueError: the statement needs compiling per call (an ``IN`` list
        expanded at execution, a ``literal_execute`` parameter) or has bind
        names the dialect escapes: keep it on ``Connection.execute``.
    """

    def __init__(self, statement: sa.Executable, dialect: sa.Dialect, *, as_written: bool = True) -> None:
        self._raw = _raw_cursor(dialect) if as_written else None
        self._as_compiled: DriverStatement | None = None  # compiled as SQLAlchemy would, for another cursor class
        if self._raw is not None:
            self._statement, self._dialect = statement, dialect
            self._default_cursor: type = dialect.loaded_dbapi.Cursor
            dialect = _dollar_placeholders(dialect)
        compiled = statement.compile(dialect=dialect)  # type: ignore[attr-defined]
        if compiled.literal_execute_params or compiled.post_compile_params:
            raise ValueError(f"{statement!r} is compiled again at each execution; it cannot run on the driver")
        if compiled.escaped_bind_names:
            raise ValueError(f"{statement!r} has bind names the driver would not see as written")
        self.sql: str = str(compiled)
        dml = compiled.isinsert or compiled.isupdate or compiled.isdelete
        self._rows = "first" if not dml or compiled.effective_returning else "none"  # what it returns, known here
        self._positional = bool(compiled.positional)
        named = dict.fromkeys(compiled.bind_names.values())  # as the SQL names them, each once
        self._names: tuple[str, ...] = tuple(compiled.positiontup if self._positional else named)
        binds = [compiled.binds[name] for name in self._names]
        self._bound: dict[str, Any] = {  # the values bound in the statement; a required bind must be given
            name: bind.effective_value for name, bind in zip(self._names, binds, strict=True) if not bind.required
        }
        processors = [bind.type.bind_processor(dialect) for bind in binds]
        self._processors = [(i, process) for i, process in enumerate(processors) if process is not None]
        self._pick = _picker(self._names)  # the values in the statement's order, from a mapping: one C call
        self._unbounded = tuple(  # the binds whose values have no size limit: a step's value, an envelope
            name for name, bind in zip(self._names, binds, strict=True) if _unbounded(bind.type)
        )

    def first(self, conn: Connection, params: Mapping[str, Any]) -> tuple[Any, ...] | None:
        """Execute with ``params`` (by bind name) on ``conn``'s driver connection; its first row, or ``None``.

        A bind ``params`` does not name keeps the value the statement bound
        (e.g. the ``1`` of ``step_count + 1``).

        Raises:
          sqlalchemy.exc.DBAPIError: the driver's error, as SQLAlchemy wraps it.
          KeyError: a bind the statement leaves without a value is not in ``params``.
        """
        pooled = conn.connection
        driver_connection = pooled.driver_connection
        on = self._on(driver_connection)
        values = on._values(params)
        if on._raw is not None and not on._large(params):  # psycopg's RawCursor: one kept per pooled connection
            return run_on_driver(
                conn, on.sql, values, rows=on._rows, cursor=on._raw, on=driver_connection, keep=pooled.info
            )  # type: ignore[return-value]
        return run_on_driver(conn, on.sql, values, rows=on._rows, cursor=on._raw, on=driver_connection)  # type: ignore[return-value]

    def _large(self, params: Mapping[str, Any]) -> bool:
        """Whether ``params`` hold more than `KEEP_CURSOR_BYTES` in this statement's unbounded binds.

        A kept cursor holds on to its last statement's parameters until the
        next statement on its connection: a large step value or envelope runs
        on a cursor of its own instead, closed and freed after.
        """
        size = 0
        for name in self._unbounded:
            value = params.get(name)
            if value is not None:
                size += len(value)
        return size > KEEP_CURSOR_BYTES

    def all(self, conn: Connection, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        """`first`, returning every row (the statement returns rows).

        Raises:
          sqlalchemy.exc.DBAPIError: the driver's error, as SQLAlchemy wraps it.
          KeyError: a bind the statement leaves without a value is not in ``params``.
        """
        driver_connection = conn.connection.driver_connection
        on = self._on(driver_connection)
        values = on._values(params)
        return run_on_driver(conn, on.sql, values, rows="all", cursor=on._raw, on=driver_connection)  # type: ignore[return-value]

    def _on(self, driver_connection: Any) -> DriverStatement:
        """This statement, or on a driver connection with a cursor class of its own, its SQLAlchemy form."""
        if self._raw is None:
            return self
        if driver_connection.cursor_factory is self._default_cursor:
            return self
        if self._as_compiled is None:
            self._as_compiled = DriverStatement(self._statement, self._dialect, as_written=False)
        return self._as_compiled

    def _values(self, params: Mapping[str, Any]) -> tuple[Any, ...] | dict[str, Any]:
        values: tuple[Any, ...] = self._pick({**self._bound, **params} if self._bound else params)
        if self._processors:
            processed = list(values)
            for i, process in self._processors:
                processed[i] = process(processed[i])
            values = tuple(processed)
        if self._positional:
            return values
        return dict(zip(self._names, values, strict=True))


def run_on_driver(
    conn: Connection,
    sql: str,
    values: tuple[Any, ...] | dict[str, Any] = (),
    *,
    rows: str = "any",
    cursor: Any = None,
    on: Any = None,
    keep: dict[Any, Any] | None = None,
) -> tuple[Any, ...] | list[tuple[Any, ...]] | None:
    """Execute ``sql`` with ``values`` on the driver connection of ``conn``; its first row, or ``None``.

    Parameters:
      conn (Connection): a SQLAlchemy connection whose dialect `runs_on_driver`.
      sql (str): one statement in the driver's parameter style.
      values (tuple | dict): the parameters, already as the driver takes them.
      rows (str): ``first`` (the first row or ``None``), ``all`` (every row:
        the statement returns rows), ``none`` (it returns none: ``None``) or
        ``any`` (the first row if it returns rows, else ``None``).
      cursor (type | None): the driver's cursor class to open on the
        connection (``psycopg.RawCursor``); ``None``: the connection's default.
      on (Any): the driver connection of ``conn``, when the caller has it at
        hand; ``None``: read from ``conn``.
      keep (dict | None): the pooled connection's ``info``, to keep one
        ``cursor`` open there for its next statements instead of opening and
        closing one per statement (psycopg's cursor set-up costs more than a
        few microseconds); ``None``: a cursor of its own, closed after. A kept
        cursor is dropped when a statement on it fails, and its connection's
        ``info`` is cleared by the pool when the driver connection is replaced.

    Raises:
      sqlalchemy.exc.DBAPIError: the driver's error wrapped as SQLAlchemy wraps
        it; ``connection_invalidated`` when the dialect reads it as a lost
        connection (then ``conn`` is invalidated).
    """
    driver_connection: Any = conn.connection.driver_connection if on is None else on
    if keep is not None:
        cursor = _kept_cursor(keep, driver_connection, cursor)
    else:
        cursor = driver_connection.cursor() if cursor is None else cursor(driver_connection)
    closing = keep is None
    try:
        cursor.execute(sql, values)
        if rows == "first":
            return cursor.fetchone()  # type: ignore[no-any-return]
        if rows == "all":
            return cursor.fetchall()  # type: ignore[no-any-return]
        if rows == "none":
            return None
        return cursor.fetchone() if cursor.description is not None else None  # type: ignore[no-any-return]
    except conn.dialect.loaded_dbapi.Error as exc:
        closing = _forget_kept(keep)
        _raise_wrapped(conn, exc, sql, values, cursor)
    except BaseException as exc:
        closing = _forget_kept(keep)
        if is_exit_exception(exc):  # interrupted mid-statement: its state unknown, as SQLAlchemy treats it
            conn.invalidate(exc)
        raise
    finally:
        if closing and not conn.invalidated:
            cursor.close()


KEEP_CURSOR_BYTES = 16 * 1024
"""The most bytes of unbounded parameters (a value, an envelope) a statement may pass on a kept cursor, which
holds them until its connection's next statement."""

_KEPT_CURSOR = "flexiq_kept_cursor"
"""The key of the cursor `run_on_driver` keeps in a pooled connection's ``info``."""


def _kept_cursor(info: dict[Any, Any], driver_connection: Any, cursor_class: type) -> Any:
    """The ``cursor_class`` cursor kept in ``info`` for ``driver_connection``, opened if there is none (or not one
    of this connection, or closed)."""
    kept = info.get(_KEPT_CURSOR)
    if kept is None or kept.closed or kept.connection is not driver_connection or type(kept) is not cursor_class:
        kept = info[_KEPT_CURSOR] = cursor_class(driver_connection)
    return kept


def _forget_kept(info: dict[Any, Any] | None) -> bool:
    """Forget the kept cursor after a failed statement (it is closed then, as an unkept one is); always ``True``."""
    if info is not None:
        info.pop(_KEPT_CURSOR, None)
    return True


def _raise_wrapped(conn: Connection, exc: Exception, sql: str, values: Any, cursor: Any) -> NoReturn:
    """Raise the driver's ``exc`` as SQLAlchemy would, invalidating a lost connection first."""
    dialect = conn.dialect
    lost = bool(dialect.is_disconnect(exc, conn.connection.dbapi_connection, cursor))  # type: ignore[arg-type]
    if lost:
        _invalidate(conn, exc)
    error = sa_exc.DBAPIError.instance(
        sql,
        values,
        exc,
        dialect.loaded_dbapi.Error,
        hide_parameters=conn.engine.hide_parameters,  # a step's value stays out of messages if asked
        connection_invalidated=lost,
        dialect=dialect,
    )
    raise error from exc


def _invalidate(conn: Connection, exc: BaseException) -> None:
    """What SQLAlchemy does on a lost connection: the pool's older connections, then this one, invalidated."""
    conn.engine.pool._invalidate(conn.connection, exc)  # as Connection._handle_dbapi_exception does
    conn.invalidate(exc)


def _unbounded(type_: sa.types.TypeEngine[Any]) -> bool:
    """Whether a bind of ``type_`` takes values of any size (``LargeBinary``, ``Text``, a ``String`` without length)."""
    if isinstance(type_, sa.TypeDecorator):
        type_ = type_.impl_instance
    return isinstance(type_, (sa.LargeBinary, sa.Text)) or (
        isinstance(type_, sa.String) and getattr(type_, "length", None) is None
    )


def _raw_cursor(dialect: sa.Dialect) -> type | None:
    """psycopg's ``RawCursor`` (``$1`` placeholders, sent as written) for a psycopg dialect; else ``None``."""
    if dialect.driver != "psycopg":
        return None
    return dialect.loaded_dbapi.RawCursor  # type: ignore[no-any-return]  # psycopg 3.2 and later


def _dollar_placeholders(dialect: sa.Dialect) -> sa.Dialect:
    """A copy of ``dialect`` whose compiler writes PostgreSQL's ``$1`` placeholders, to compile statements only."""
    dollar = copy.copy(dialect)
    dollar.paramstyle = "numeric_dollar"  # type: ignore[misc]  # what the compiler reads, with positional
    dollar.positional = True
    dollar.identifier_preparer = dollar.preparer(dollar)  # its own: a % in the statement's text stays one %
    dollar._type_memos = weakref.WeakKeyDictionary()  # type: ignore[attr-defined]  # its own types' processors,
    # which may read the dialect's % doubling: one made for the copy must never render the engine's statements
    return dollar


def _picker(names: tuple[str, ...]) -> Callable[[Mapping[str, Any]], tuple[Any, ...]]:
    """A function of a mapping that returns its values of ``names`` as a tuple (``KeyError`` for a missing one)."""
    if not names:
        return lambda _: ()
    pick = operator.itemgetter(*names)
    if len(names) == 1:
        return lambda given: (pick(given),)
    return pick  # type: ignore[return-value]


def runs_on_driver(conn: Connection) -> bool:
    """Whether a new step's statements on ``conn`` go straight to its driver.

    Only on pysqlite, psycopg and psycopg2, and only when nothing is set up on
    the engine that SQLAlchemy's execution would apply: a statement listener
    (``before_cursor_execute``: an SQL tracer, a statement rewriter), a
    ``handle_error`` hook, a ``schema_translate_map``. An engine you pass with
    any of those keeps SQLAlchemy's execution for every statement.
    """
    dialect = conn.dialect
    return (
        (dialect.name, dialect.driver) in _ON_DRIVER
        and not conn.engine.dispatch.before_cursor_execute  # the engine's: cheaper than the connection's
        and not dialect.dispatch.handle_error
        and not conn.get_execution_options().get("schema_translate_map")
    )


_ON_DRIVER = frozenset({("sqlite", "pysqlite"), ("postgresql", "psycopg"), ("postgresql", "psycopg2")})
