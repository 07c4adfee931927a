"""Runs record their wake time and their last recovery.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01

``wake_at`` is the wake time of a ``sleeping`` run (epoch seconds, database
clock), so recovery decides on the recorded status and wake time, never on the
order of two timestamps (C35). ``recovered_at`` is when a recoverer last
re-published the run; until then no recovery has happened, whatever
``updated_at`` says.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _runs() -> str:
    return f"{context.config.attributes.get('table_prefix', 'flexiq_')}runs"


def upgrade() -> None:
    """Add ``wake_at`` and ``recovered_at`` to ``<prefix>runs``."""
    with op.batch_alter_table(_runs()) as batch:
        batch.add_column(sa.Column("wake_at", sa.Double(asdecimal=False), nullable=True))
        batch.add_column(sa.Column("recovered_at", sa.Double(asdecimal=False), nullable=True))


def downgrade() -> None:
    """Drop the two columns."""
    with op.batch_alter_table(_runs()) as batch:
        batch.drop_column("recovered_at")
        batch.drop_column("wake_at")
