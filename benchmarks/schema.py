"""Drop a SQL store's tables: the benchmarks and the tests share server databases between runs.

One place that knows which tables a store has: the store's own table
definitions, plus Alembic's revision table of the same prefix.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from flexiq_plugins._store.sql.tables import store_tables

__all__ = ["drop_prefixed_tables"]


def drop_prefixed_tables(engine: Any, prefix: str) -> None:
    """Drop every store table named with ``prefix`` and its ``alembic_version``, where they exist.

    Args:
        engine (sqlalchemy.engine.Engine): the database's engine.
        prefix (str): the store's table prefix (``flexiq_`` by default).
    """
    store_tables(prefix).metadata.drop_all(engine, checkfirst=True)
    with engine.begin() as conn:
        conn.execute(sa.text(f"DROP TABLE IF EXISTS {prefix}alembic_version"))
