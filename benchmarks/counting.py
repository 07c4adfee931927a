"""Counting the statements a store's engine sends, where they reach the driver.

The store sends a new step's statements straight to pysqlite or psycopg
(``flexiq_plugins/_store/sql/driver.py``), past SQLAlchemy's statement
events, so a count made with ``before_cursor_execute`` would miss them. This
counts what the driver runs instead: SQLite's trace callback, psycopg's
``Cursor`` class (a ``RawCursor``'s too, which the store opens for its own
statements) reporting each ``execute`` of the connections counted, a
psycopg2 cursor class that reports each ``execute``, and SQLAlchemy's
``before_cursor_execute`` for the other drivers (PyMySQL), which always
execute through SQLAlchemy. Transaction control is left to the engine's
``begin``/``commit``/``rollback`` events: SQLite's traced ``COMMIT`` and
``ROLLBACK`` are not reported, and psycopg sends its ``BEGIN`` and ``COMMIT``
without a cursor. Neither is the dialect's liveness ping.

Used by ``bench_store``, ``throughput_apps`` and the store's tests.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine

__all__ = ["on_statements"]

_pinging = threading.local()


def on_statements(engine: Engine, seen: Callable[[str], None], *, active: Callable[[], bool] | None = None) -> None:
    """Call ``seen(sql)`` for each statement ``engine``'s connections run from their next checkout on.

    Parameters:
      engine(Engine): the store's engine.
      seen(Callable[[str], None]): called with each statement's SQL.
      active(Callable[[], bool] | None): SQLite only: trace a connection only
        when this is true at its checkout (a trace expands every statement's
        parameters into its text, which costs time in a timed loop).
    """
    name, driver = engine.dialect.name, engine.dialect.driver
    if name == "sqlite":
        _trace_sqlite(engine, seen, active)
    elif driver in ("psycopg", "psycopg2"):
        _count_psycopg_cursors(engine, seen, driver)
    else:
        event.listen(engine, "before_cursor_execute", lambda _conn, _cursor, statement, *_: seen(statement))


def _trace_sqlite(engine: Engine, seen: Callable[[str], None], active: Callable[[], bool] | None) -> None:
    def traced(sql: str) -> None:
        if not sql.startswith(("COMMIT", "ROLLBACK")):
            seen(sql)

    def at_checkout(dbapi_connection: Any, *_: Any) -> None:
        dbapi_connection.set_trace_callback(traced if active is None or active() else None)

    event.listen(engine, "checkout", at_checkout)


def _count_psycopg_cursors(engine: Engine, seen: Callable[[str], None], driver: str) -> None:
    report = _reporter(seen)
    ping = engine.dialect.do_ping

    def quiet_ping(dbapi_connection: Any) -> bool:
        _pinging.on = True
        try:
            return ping(dbapi_connection)
        finally:
            _pinging.on = False

    engine.dialect.do_ping = quiet_ping  # type: ignore[method-assign]
    if driver == "psycopg":
        # psycopg: the connection keeps its own cursor class (the store sends its hot statements on a
        # RawCursor only where that class is psycopg's Cursor); the Cursor class reports for it instead
        _report_psycopg_cursors()

        def at_checkout(dbapi_connection: Any, *_: Any) -> None:
            _reports[dbapi_connection] = report

    else:
        counting = _counting_psycopg2_cursor(report)

        def at_checkout(dbapi_connection: Any, *_: Any) -> None:
            dbapi_connection.cursor_factory = counting

    event.listen(engine, "checkout", at_checkout)


_reports: weakref.WeakKeyDictionary[Any, Callable[[Any], None]] = weakref.WeakKeyDictionary()
"""Each counted psycopg connection's reporter."""


def _report_psycopg_cursors() -> None:
    """Make ``psycopg.Cursor``'s ``execute`` and ``executemany`` (a ``RawCursor``'s too) report to their
    connection's counter, if it has one (once per process)."""
    import psycopg

    cursor: Any = psycopg.Cursor
    if getattr(cursor, "_counted", False):
        return
    for name in ("execute", "executemany"):
        original = getattr(cursor, name)

        def counted(self: Any, query: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            report = _reports.get(self.connection)
            if report is not None:
                report(query)
            return _original(self, query, *args, **kwargs)

        setattr(cursor, name, counted)
    cursor._counted = True


def _reporter(seen: Callable[[str], None]) -> Callable[[Any], None]:
    def report(query: Any) -> None:
        if not getattr(_pinging, "on", False):
            seen(query if isinstance(query, str) else str(query))

    return report


def _counting_psycopg2_cursor(report: Callable[[Any], None]) -> type:
    import psycopg2.extensions

    class Counting(psycopg2.extensions.cursor):  # type: ignore[misc]
        def execute(self, query: Any, *args: Any, **kwargs: Any) -> Any:
            report(query)
            return super().execute(query, *args, **kwargs)

        def executemany(self, query: Any, *args: Any, **kwargs: Any) -> Any:
            report(query)
            return super().executemany(query, *args, **kwargs)

    return Counting
