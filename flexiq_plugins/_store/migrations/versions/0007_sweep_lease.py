"""The recovery lease of the workers (C39).

Revision ID: 0007
Revises: 0006
Create Date: 2027-01-10

- ``<prefix>sweep_lease``: one row per lease (``name``: ``"recovery"``), the
  worker process holding it (``owner``) and until when (``lease_until``,
  epoch seconds on the database's clock). Every worker runs the sweeper; the
  one holding the lease sweeps, so one sweep runs at a time across them all.

Runs recorded at publish need no schema change: ``queued`` is a new value of
``<prefix>runs.status`` (``VARCHAR(16)``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import context, op

# revision identifiers, used by Alembic.
revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
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
    """Create ``<prefix>sweep_lease``."""
    op.create_table(
        f"{table_prefix()}sweep_lease",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("owner", sa.String(255), nullable=True),
        sa.Column("lease_until", sa.Double(asdecimal=False), nullable=True),
        **_MYSQL,
    )


def downgrade() -> None:
    """Drop ``<prefix>sweep_lease``."""
    op.drop_table(f"{table_prefix()}sweep_lease")
