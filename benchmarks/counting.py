"""Counting the statements a store's engine sends, where they reach the driver.

The store sends a new step's statements straight to pysqlite or psycopg
(``flexiq_plugins/_store/sql/driver.py``), past SQLAlchemy's statement
events, so a count made with ``before_cursor_execute`` would miss them. This
counts what the driver runs instead: SQLite's trace callback, a psycopg
cursor class that reports each ``execute`` (and psycopg's ``RawCursor``,
which the store opens for its own statements, reporting for the connections
counted), and SQLAlchemy's
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
    counting = _counting_cursor(driver, seen)
    ping = engine.dialect.do_ping

    def quiet_ping(dbapi_connection: Any) -> bool:
        _pinging.on = True
        try:
            return ping(dbapi_connection)
        finally:
            _pinging.on = False

    engine.dialect.do_ping = quiet_ping  # type: ignore[method-assign]

    def at_checkout(dbapi_connection: Any, *_: Any) -> None:
        dbapi_connection.cursor_factory = counting
        if driver == "psycopg":
            _raw_reports[dbapi_connection] = counting.reports

    event.listen(engine, "checkout", at_checkout)
    if driver == "psycopg":
        _report_raw_cursors()


_raw_reports: weakref.WeakKeyDictionary[Any, Callable[[Any], None]] = weakref.WeakKeyDictionary()


def _report_raw_cursors() -> None:
    """Make ``psycopg.RawCursor.execute`` report to its connection's counter, if it has one (once per process)."""
    import psycopg

    raw: Any = psycopg.RawCursor
    if getattr(raw, "_counted", False):
        return
    execute = raw.execute

    def counted(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        report = _raw_reports.get(self.connection)
        if report is not None:
            report(query)
        return execute(self, query, *args, **kwargs)

    raw.execute = counted
    raw._counted = True


def _counting_cursor(driver: str, seen: Callable[[str], None]) -> type:
    if driver == "psycopg":
        import psycopg

        base: type = psycopg.Cursor
    else:
        import psycopg2.extensions

        base = psycopg2.extensions.cursor

    def report(query: Any) -> None:
        if not getattr(_pinging, "on", False):
            seen(query if isinstance(query, str) else str(query))

    class Counting(base):  # type: ignore[misc, valid-type]
        reports = staticmethod(report)

        def execute(self, query: Any, *args: Any, **kwargs: Any) -> Any:
            report(query)
            return super().execute(query, *args, **kwargs)

        def executemany(self, query: Any, *args: Any, **kwargs: Any) -> Any:
            report(query)
            return super().executemany(query, *args, **kwargs)

    return Counting
