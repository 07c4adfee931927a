"""A finished run keeps its outcome (C37).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-04

- ``<prefix>runs.outcome``: a terminal run's outcome, written in the same
  statement as its terminal status: the return value encoded with the
  run's codec chain, or the error (class name, message), or a marker for a
  value over the step value cap. A duplicate delivery of the finished run,
  or a new job with its run key, replays it through the framework's normal
  path instead of running the body (C37).

The column is nullable: runs that finished before this revision keep none,
and a duplicate of one of them is acknowledged as before.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op
from sqlalchemy.dialects import mysql

# revision identifiers, used by Alembic.
revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def table_prefix() -> str:
    """The prefix of the store's table names, set by ``upgrade_store``."""
    return str(context.config.attributes.get("table_prefix", "flexiq_"))


def _blob() -> sa.types.TypeEngine[bytes]:
    return sa.LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb")


def upgrade() -> None:
    """Add ``<prefix>runs.outcome``."""
    with op.batch_alter_table(f"{table_prefix()}runs") as batch:
        batch.add_column(sa.Column("outcome", _blob(), nullable=True))


def downgrade() -> None:
    """Drop ``<prefix>runs.outcome`` (SQLite through a batch rebuild)."""
    with op.batch_alter_table(f"{table_prefix()}runs") as batch:
        batch.drop_column("outcome")
