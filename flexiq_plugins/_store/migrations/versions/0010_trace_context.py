"""A run keeps the trace context of its first traced attempt (C53).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-10

- ``<prefix>runs.trace_context``: the W3C ``traceparent`` of the span the
  run's first traced attempt ran under, written by that attempt's claim in
  the claim's own statement (no extra round trip), never changed afterwards.
  Every later attempt of the run (a sleep's wake-up, a step retry, a
  redelivery, a recovery re-publish, a retried dead letter) reads it with its
  claim and links its span to it, so a run that slept an hour is one trace to
  follow, not unrelated ones.

The column is nullable: a run started without tracing has none, and its
first traced attempt then writes it.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

# revision identifiers, used by Alembic.
revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def table_prefix() -> str:
    """The prefix of the store's table names, set by ``upgrade_store``."""
    return str(context.config.attributes.get("table_prefix", "flexiq_"))


def upgrade() -> None:
    """Add ``<prefix>runs.trace_context``."""
    with op.batch_alter_table(f"{table_prefix()}runs") as batch:
        batch.add_column(sa.Column("trace_context", sa.String(255), nullable=True))


def downgrade() -> None:
    """Drop ``<prefix>runs.trace_context`` (SQLite through a batch rebuild)."""
    with op.batch_alter_table(f"{table_prefix()}runs") as batch:
        batch.drop_column("trace_context")
