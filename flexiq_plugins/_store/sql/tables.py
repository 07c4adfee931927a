"""The SQL store's three tables, as SQLAlchemy Core ``Table`` objects.

The schema is created and changed only by the Alembic migrations shipped in
``flexiq_plugins/_store/migrations``; the queries are built on these objects.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa

__all__ = ["DEFAULT_TABLE_PREFIX", "StoreTables", "store_tables"]

DEFAULT_TABLE_PREFIX = "flexiq_"


@dataclass(frozen=True)
class StoreTables:
    """The three tables of one ``table_prefix``, as Core ``Table`` objects.

    The DDL lives in the migrations; these declare only what queries need
    (names and types for binding and result processing).
    """

    runs: sa.Table
    steps: sa.Table
    dead: sa.Table


def _time() -> sa.Double[float]:
    return sa.Double(asdecimal=False)


def store_tables(prefix: str) -> StoreTables:
    """Return the tables named ``<prefix>runs``, ``<prefix>steps`` and ``<prefix>dead_letters``."""
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
    return StoreTables(runs, steps, dead)
