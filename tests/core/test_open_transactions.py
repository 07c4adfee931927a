"""C42: which open transactions a plain step sees: its own thread's (and asyncio task's) that have written.

A SQLite database in memory stands in for the application's; the real-database
halves of C42 are in ``tests/transactions``.
"""

from __future__ import annotations

import asyncio
import threading

import sqlalchemy as sa
from sqlalchemy.pool import StaticPool

from flexiq_plugins._store.caller import open_transactions, watch_sqlalchemy


def _engine() -> sa.Engine:
    engine = sa.create_engine("sqlite://", poolclass=StaticPool, connect_args={"check_same_thread": False})
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE t (a INTEGER)"))
    return engine


def test_c42_a_transaction_is_seen_once_it_has_written_and_until_it_ends() -> None:
    """Reading leaves it unseen; an INSERT makes it open; the commit ends it."""
    watch_sqlalchemy()
    engine = _engine()
    with engine.connect() as conn:
        conn.execute(sa.text("SELECT * FROM t"))
        assert open_transactions() == []
        conn.execute(sa.text("INSERT INTO t VALUES (1)"))
        (seen,) = open_transactions()
        assert seen.description == "a SQLAlchemy transaction on sqlite:// that has written"
        conn.commit()
        assert open_transactions() == []


def test_c42_another_threads_open_transaction_is_not_this_steps() -> None:
    """A transaction left open by another thread is no hazard to this thread's steps."""
    watch_sqlalchemy()
    engine = _engine()
    conn = engine.connect()
    thread = threading.Thread(target=lambda: conn.execute(sa.text("INSERT INTO t VALUES (1)")))
    thread.start()
    thread.join()
    try:
        assert open_transactions() == []
    finally:
        conn.close()


def test_c42_another_asyncio_tasks_open_transaction_is_not_this_steps() -> None:
    """Tasks of one event loop share a thread (Dramatiq's async actors); each sees only its own writes."""
    watch_sqlalchemy()
    engine = _engine()
    conn = engine.connect()
    wrote, checked = asyncio.Event(), asyncio.Event()
    seen: dict[str, int] = {}

    async def writer() -> None:
        conn.execute(sa.text("INSERT INTO t VALUES (1)"))
        wrote.set()
        await checked.wait()
        seen["writer"] = len(open_transactions())

    async def other() -> None:
        await wrote.wait()
        seen["other"] = len(open_transactions())
        checked.set()

    async def main() -> None:
        await asyncio.gather(writer(), other())

    try:
        asyncio.run(main())
    finally:
        conn.close()
    assert seen == {"writer": 1, "other": 0}
