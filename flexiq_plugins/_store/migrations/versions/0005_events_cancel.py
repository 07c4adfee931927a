"""Events for waiting runs (C33) and cancellation (C34).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03

- ``<prefix>events``: each event sent with ``send_event`` (topic, key, the
  run it was sent to if any, the encoded payload, when). Ids are never
  reused, so a run's received ids stay its own after a cleanup.
- ``<prefix>runs.wait_topic`` / ``wait_key``: the event a waiting run waits
  for, indexed, so a sender finds the runs to wake in one query.
- ``<prefix>runs.cancel_reason``: a cancelled run's reason, or a requested
  cancellation an attempt has not carried out yet.
- ``<prefix>steps.event_id``: the event an ``event`` row received: each event
  is received at most once per run.

Topics, event keys and run keys compare byte for byte (C40): on MySQL and
MariaDB they are ``VARBINARY`` of their UTF-8 bytes, as the keys of 0004.
Every new column is nullable, so existing rows need no rewrite.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import context, op
from sqlalchemy.dialects import mysql

# revision identifiers, used by Alembic.
revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
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


def _blob() -> sa.types.TypeEngine[bytes]:
    return sa.LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb")


def _key() -> sa.types.TypeEngine[str]:
    """A topic, event key or run key of at most 255 characters, compared byte for byte (C40)."""
    if op.get_bind().dialect.name in ("mysql", "mariadb"):
        return mysql.VARBINARY(255 * 4)  # type: ignore[return-value]
    return sa.String(255)


def upgrade() -> None:
    """Create ``<prefix>events``; add the wait and cancellation columns of runs and ``steps.event_id``."""
    p = table_prefix()
    with op.batch_alter_table(f"{p}runs") as batch:
        batch.add_column(sa.Column("wait_topic", _key(), nullable=True))
        batch.add_column(sa.Column("wait_key", _key(), nullable=True))
        batch.add_column(sa.Column("cancel_reason", _text(), nullable=True))
    op.create_index(f"ix_{p}runs_wait", f"{p}runs", ["wait_topic", "wait_key"])
    op.add_column(f"{p}steps", sa.Column("event_id", sa.BigInteger, nullable=True))
    op.create_table(
        f"{p}events",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("topic", _key(), nullable=False),
        sa.Column("event_key", _key(), nullable=False),
        sa.Column("run_key", _key(), nullable=True),
        sa.Column("payload", _blob(), nullable=True),
        sa.Column("created_at", _time(), nullable=False),
        sqlite_autoincrement=True,
        **_MYSQL,
    )
    op.create_index(f"ix_{p}events_topic_key", f"{p}events", ["topic", "event_key"])
    op.create_index(f"ix_{p}events_created", f"{p}events", ["created_at"])


def downgrade() -> None:
    """Drop ``<prefix>events`` and the new columns (SQLite through a batch rebuild)."""
    p = table_prefix()
    op.drop_table(f"{p}events")
    with op.batch_alter_table(f"{p}steps") as batch:
        batch.drop_column("event_id")
    op.drop_index(f"ix_{p}runs_wait", table_name=f"{p}runs")
    with op.batch_alter_table(f"{p}runs") as batch:
        batch.drop_column("cancel_reason")
        batch.drop_column("wait_key")
        batch.drop_column("wait_topic")
