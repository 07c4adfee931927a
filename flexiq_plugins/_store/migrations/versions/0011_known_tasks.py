"""The tasks known to take steps (C43).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-12

- ``<prefix>known_tasks``: one row per task or actor that has taken a step
  (``framework``, ``task_name``), with when it first did (``first_seen``,
  epoch seconds on the database's clock). The first attempt of a task that
  takes a step inserts it, if absent; producers and workers read the table
  (at most every ``known_tasks_refresh_seconds``) and record at publish only
  the jobs of the tasks it names (C39), so a task that never takes a step
  costs no store statement; ``flexiq tasks`` lists it.

A store upgraded from an earlier revision starts with the table empty: each
durable task is learned again from its next job that takes a step, whose run
is claimed at that step (C23) until then.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import context, op

# revision identifiers, used by Alembic.
revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
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


def upgrade() -> None:
    """Create ``<prefix>known_tasks``."""
    prefix = table_prefix()
    op.create_table(
        f"{prefix}known_tasks",
        sa.Column("framework", sa.String(32), nullable=False),
        sa.Column("task_name", sa.String(255), nullable=False),
        sa.Column("first_seen", sa.Double(asdecimal=False), nullable=False),
        sa.PrimaryKeyConstraint("framework", "task_name", name=f"pk_{prefix}known_tasks"),
        **_MYSQL,
    )


def downgrade() -> None:
    """Drop ``<prefix>known_tasks``."""
    op.drop_table(f"{table_prefix()}known_tasks")
