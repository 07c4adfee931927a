"""Step attempts (C31) and the step columns of failures and compensations (C32).

Revision ID: 0003
Revises: 0002
Create Date: 2025-02-01

- ``<prefix>step_attempts``: each attempt of a step with a retry budget,
  journaled before its body runs, and each failed step attempt with its error
  (type, message, truncated traceback), outcome and retry time.
- ``<prefix>steps.failure``: a step that failed for good (its error, JSON), or
  the row recording why a run is being compensated.
- ``<prefix>steps.compensate``: the name of the undo a committed step registered.

Both new columns are nullable, so existing rows need no rewrite.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import context, op
from sqlalchemy.dialects import mysql

# revision identifiers, used by Alembic.
revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_MYSQL: dict[str, Any] = {
    f"{dialect}_{option}": value
    for dialect in ("mysql", "mariadb")  # the MariaDB dialect reads only its own prefix
    for option, value in (("engine", "InnoDB"), ("charset", "utf8mb4"), ("collate", "utf8mb4_bin"))
}


def table_prefix() -> str:
    """The prefix of the store's table names, set by ``upgrade_store``."""
    return str(context.config.attributes.get("table_prefix", "flexiq_"))


def _time() -> sa.Double[float]:
    return sa.Double(asdecimal=False)


def _text() -> sa.types.TypeEngine[str]:
    return sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")


def upgrade() -> None:
    """Add ``steps.failure`` and ``steps.compensate``; create ``<prefix>step_attempts``."""
    p = table_prefix()
    op.add_column(f"{p}steps", sa.Column("failure", _text(), nullable=True))
    op.add_column(f"{p}steps", sa.Column("compensate", sa.String(255), nullable=True))
    op.create_table(
        f"{p}step_attempts",
        sa.Column("run_key", sa.String(255), nullable=False),
        sa.Column("step_key", sa.String(400), nullable=False),
        sa.Column("number", sa.Integer, nullable=False),
        sa.Column("run_attempt", sa.Integer, nullable=False),
        sa.Column("started_at", _time(), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=True),
        sa.Column("error_type", sa.String(255), nullable=True),
        sa.Column("message", _text(), nullable=True),
        sa.Column("traceback", _text(), nullable=True),
        sa.Column("failed_at", _time(), nullable=True),
        sa.Column("retry_at", _time(), nullable=True),
        sa.PrimaryKeyConstraint("run_key", "step_key", "number", name=f"pk_{p}step_attempts"),
        **_MYSQL,
    )


def downgrade() -> None:
    """Drop ``<prefix>step_attempts`` and the two step columns (SQLite through a batch rebuild)."""
    p = table_prefix()
    op.drop_table(f"{p}step_attempts")
    with op.batch_alter_table(f"{p}steps") as batch:
        batch.drop_column("compensate")
        batch.drop_column("failure")
