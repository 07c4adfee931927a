"""Indexes and a column an operator's window reads at any size of history (C52).

Revision ID: 0009
Revises: 0008
Create Date: 2027-02-01

The dashboard (and ``flexiq``) answer from a store of a million runs in a few
milliseconds only if each listing walks an index in its own order:

- ``runs (wake_at, run_key) WHERE status = 'sleeping'``: the sleeping runs
  past their wake time, soonest first. Partial on PostgreSQL and SQLite, so
  only a sleeping run's row is in it and a step's run update of any other
  run adds no index entry; MySQL and MariaDB index every row.
- ``steps (event_id) WHERE event_id IS NOT NULL``: the runs that received an
  event, and the pending events (none did). Partial likewise: an ordinary
  step row adds no entry where a database can leave it out.
- ``dead_letters (created_at)``: the last day's dead letters by reason.
- ``sweep_lease.swept_at``: when the lease was last taken or renewed, which a
  sweeper does right before each sweep: "recovery last swept at".

Every other listing uses the indexes of revision 0008 (runs by last update,
by status, by task) and the primary keys (dead letters and events by id).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import context, op

# revision identifiers, used by Alembic.
revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def table_prefix() -> str:
    """The prefix of the store's table names, set by ``upgrade_store``."""
    return str(context.config.attributes.get("table_prefix", "flexiq_"))


def _where(condition: str) -> dict[str, Any]:
    return {"postgresql_where": sa.text(condition), "sqlite_where": sa.text(condition)}


def upgrade() -> None:
    """Add the three indexes and ``sweep_lease.swept_at``."""
    p = table_prefix()
    op.create_index(f"ix_{p}runs_sleeping_wake", f"{p}runs", ["wake_at", "run_key"], **_where("status = 'sleeping'"))
    op.create_index(f"ix_{p}steps_event", f"{p}steps", ["event_id"], **_where("event_id IS NOT NULL"))
    op.create_index(f"ix_{p}dead_letters_created", f"{p}dead_letters", ["created_at"])
    with op.batch_alter_table(f"{p}sweep_lease") as batch:
        batch.add_column(sa.Column("swept_at", sa.Double(asdecimal=False), nullable=True))


def downgrade() -> None:
    """Back to revision 0008."""
    p = table_prefix()
    with op.batch_alter_table(f"{p}sweep_lease") as batch:
        batch.drop_column("swept_at")
    op.drop_index(f"ix_{p}dead_letters_created", table_name=f"{p}dead_letters")
    op.drop_index(f"ix_{p}steps_event", table_name=f"{p}steps")
    op.drop_index(f"ix_{p}runs_sleeping_wake", table_name=f"{p}runs")
