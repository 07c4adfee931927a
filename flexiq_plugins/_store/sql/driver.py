"""SQLite's hot statements handed straight to pysqlite: a new step's ``BEGIN IMMEDIATE``, ``UPDATE`` and ``INSERT``.

Why: on SQLite a statement costs the database a few microseconds, and
executing it through a SQLAlchemy ``Connection`` (execution context, bind and
result processing set-up, event dispatch, result object) costs about 25 more
on a 2-core server: measured with callgrind, that wrapper was half the
instructions of a new step (issue 14's target is 0.2 ms a step). So these
statements are still built and compiled by SQLAlchemy, once, against the
store engine's own dialect, and run on the pysqlite cursor of the
connection SQLAlchemy's pool lent and whose transaction it still begins and
commits. What the wrapper did and matters is kept: each parameter goes
through its column type's bind processor, and a driver error is raised as
the SQLAlchemy exception SQLAlchemy itself raises for it
(:meth:`sqlalchemy.exc.DBAPIError.instance`), so the store's error boundary
classifies it exactly as before (a duplicate step key is an
``IntegrityError``, a busy database an ``OperationalError``).

What it does not do: connection-event dispatch (``before_cursor_execute`` and
``after_cursor_execute`` do not see these statements; SQLite's own
``set_trace_callback`` does) and result processing (a row comes back as the
driver returns it, so use it for numeric and text columns, whose SQLite types
have none). pysqlite only (:func:`runs_on_driver`; another SQLite driver
named in the URL keeps SQLAlchemy's execution): there is no network
connection whose loss the wrapper would have to detect.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection

__all__ = ["DriverStatement", "run_on_driver", "runs_on_driver"]


class DriverStatement:
    """One Core statement compiled once for SQLite and executed on the pysqlite cursor.

    Parameters:
      statement(Executable): the statement, e.g. a fenced ``UPDATE … RETURNING``.
      dialect(Dialect): the store engine's SQLite dialect.

    Raises:
      ValueError: the statement needs compiling per call (an ``IN`` list
        expanded at execution, a ``literal_execute`` parameter): keep it on
        ``Connection.execute``.
    """

    def __init__(self, statement: sa.Executable, dialect: sa.Dialect) -> None:
        compiled = statement.compile(dialect=dialect)  # type: ignore[attr-defined]
        if compiled.literal_execute_params or compiled.post_compile_params:
            raise ValueError(f"{statement!r} is compiled again at each execution; it cannot run on the driver")
        if not compiled.positional:
            raise ValueError(f"the {dialect.name}+{dialect.driver} dialect binds by name; only positional ones are run")
        self.sql: str = str(compiled)
        self._names: tuple[str, ...] = tuple(compiled.positiontup or ())
        binds = [compiled.binds[name] for name in self._names]
        self._bound: dict[str, Any] = {name: bind.value for name, bind in zip(self._names, binds, strict=True)}
        processors = [bind.type.bind_processor(dialect) for bind in binds]
        self._processors = [(i, process) for i, process in enumerate(processors) if process is not None]

    def first(self, conn: Connection, params: Mapping[str, Any]) -> tuple[Any, ...] | None:
        """Execute with ``params`` (by bind name) on ``conn``'s driver connection; its first row, or ``None``.

        A bind ``params`` does not name keeps the value the statement bound
        (e.g. the ``1`` of ``step_count + 1``).

        Raises:
          sqlalchemy.exc.DBAPIError: the driver's error, as SQLAlchemy wraps it.
          KeyError: a parameter the statement needs is in neither.
        """
        given = {**self._bound, **params}
        values = [given[name] for name in self._names]
        for i, process in self._processors:
            values[i] = process(values[i])
        return run_on_driver(conn, self.sql, tuple(values))


def run_on_driver(conn: Connection, sql: str, values: tuple[Any, ...] = ()) -> tuple[Any, ...] | None:
    """Execute ``sql`` with ``values`` on the pysqlite connection of ``conn``; its first row, or ``None``.

    Parameters:
      conn(Connection): a SQLAlchemy connection of a SQLite engine.
      sql(str): one statement, ``?`` placeholders.
      values(tuple): the placeholders' values, already as the driver takes them.

    Raises:
      sqlalchemy.exc.DBAPIError: ``sqlite3.Error`` wrapped as SQLAlchemy wraps it.
    """
    dialect = conn.dialect
    cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
    try:
        cursor.execute(sql, values)
        return cursor.fetchone()  # type: ignore[no-any-return]
    except dialect.loaded_dbapi.Error as exc:
        raise sa_exc.DBAPIError.instance(sql, values, exc, dialect.loaded_dbapi.Error, dialect=dialect) from exc
    finally:
        cursor.close()


def runs_on_driver(dialect: sa.Dialect) -> bool:
    """Whether the store sends its hot statements straight to this dialect's driver: only pysqlite's (the default)."""
    return dialect.name == "sqlite" and dialect.driver == "pysqlite"
