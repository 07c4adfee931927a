"""The three tables of the step store: runs, steps, dead letters.

Revision ID: 0001
Revises:
Create Date: 2025-01-01

Times are ``DOUBLE`` epoch seconds on the database's clock (C23). On MySQL and
MariaDB the tables are InnoDB (row locks for ``SELECT … FOR UPDATE``) in
``utf8mb4`` with the binary collation, so step keys and run keys compare
exactly as Python strings do (``charge#0`` and ``Charge#0`` are two steps), and
values are ``LONGBLOB`` so a 4 MiB step value fits.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import context, op
from sqlalchemy.dialects import mysql

# revision identifiers, used by Alembic.
revision: str = "0001"
down_revision: str | Sequence[str] | None = None
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


def _blob() -> sa.types.TypeEngine[bytes]:
    return sa.LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb")


def _text() -> sa.types.TypeEngine[str]:
    return sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")


def upgrade() -> None:
    """Create ``<prefix>runs``, ``<prefix>steps`` and ``<prefix>dead_letters``."""
    p = table_prefix()
    op.create_table(
        f"{p}runs",
        sa.Column("run_key", sa.String(255), primary_key=True),
        sa.Column("task_name", sa.String(255), nullable=False),
        sa.Column("framework", sa.String(32), nullable=False),
        sa.Column("queue", sa.String(255), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("owner", sa.String(255), nullable=True),
        sa.Column("attempt", sa.Integer, nullable=False, server_default="0"),
        sa.Column("lease_until", _time(), nullable=True),
        sa.Column("takeovers", sa.Integer, nullable=False, server_default="0"),
        sa.Column("job_id", sa.String(255), nullable=True),
        sa.Column("envelope", _text(), nullable=False),
        sa.Column("step_count", sa.Integer, nullable=False, server_default="0"),
        sa.Column("step_bytes", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("created_at", _time(), nullable=False),
        sa.Column("updated_at", _time(), nullable=False),
        **_MYSQL,
    )
    op.create_index(f"ix_{p}runs_status_updated", f"{p}runs", ["status", "updated_at"])
    op.create_index(f"ix_{p}runs_updated", f"{p}runs", ["updated_at"])
    op.create_index(f"ix_{p}runs_task_name", f"{p}runs", ["task_name"])
    op.create_table(
        f"{p}steps",
        sa.Column("run_key", sa.String(255), nullable=False),
        sa.Column("position", sa.Integer, nullable=False),
        sa.Column("step_key", sa.String(400), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("value", _blob(), nullable=True),
        sa.Column("wake_at", _time(), nullable=True),
        sa.Column("committed_at", _time(), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.PrimaryKeyConstraint("run_key", "step_key", name=f"pk_{p}steps"),
        **_MYSQL,
    )
    op.create_index(f"ix_{p}steps_run_position", f"{p}steps", ["run_key", "position"])
    op.create_table(
        f"{p}dead_letters",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("run_key", sa.String(255), nullable=False),
        sa.Column("job_id", sa.String(255), nullable=False),
        sa.Column("task_name", sa.String(255), nullable=False),
        sa.Column("reason", sa.String(64), nullable=False),
        sa.Column("message", _text(), nullable=False),
        sa.Column("traceback", _text(), nullable=False),
        sa.Column("envelope", _text(), nullable=False),
        sa.Column("created_at", _time(), nullable=False),
        sa.Column("retried_at", _time(), nullable=True),
        sqlite_autoincrement=True,  # ids are never reused after a purge
        **_MYSQL,
    )
    op.create_index(f"ix_{p}dead_letters_run_key", f"{p}dead_letters", ["run_key"])
    op.create_index(f"ix_{p}dead_letters_task_name", f"{p}dead_letters", ["task_name"])


def downgrade() -> None:
    """Drop the three tables."""
    p = table_prefix()
    op.drop_table(f"{p}dead_letters")
    op.drop_table(f"{p}steps")
    op.drop_table(f"{p}runs")
