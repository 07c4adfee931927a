"""Keys compare byte for byte on MySQL and MariaDB too.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02

Even the binary collation ``utf8mb4_bin`` is ``PAD SPACE``: ``'x'`` and
``'x '`` are one key there, so a step keyed ``x `` was refused as already
committed and a run key ``rk `` found the finished run ``rk`` (C40). On MySQL
and MariaDB every key column (run keys, step keys, a dead letter's run key)
becomes a ``VARBINARY`` of the key's UTF-8 bytes (four bytes a character at
most); the stored keys keep their bytes. SQLite and PostgreSQL already
compare text exactly: nothing changes there.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op
from sqlalchemy.dialects import mysql

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_KEYS = (("runs", "run_key", 255), ("steps", "run_key", 255), ("steps", "step_key", 400), ("dead_letters", "run_key", 255))


def _binary_keys() -> bool:
    return op.get_bind().dialect.name in ("mysql", "mariadb")


def _table(name: str) -> str:
    return f"{context.config.attributes.get('table_prefix', 'flexiq_')}{name}"


def upgrade() -> None:
    """On MySQL/MariaDB, turn each key column into ``VARBINARY(4 × its characters)``."""
    if not _binary_keys():
        return
    for table, column, length in _KEYS:
        op.alter_column(
            _table(table),
            column,
            type_=mysql.VARBINARY(length * 4),
            existing_type=sa.String(length),
            existing_nullable=False,
        )


def downgrade() -> None:
    """Back to ``VARCHAR`` in the tables' ``utf8mb4_bin`` collation (keys that differ only by trailing spaces collide)."""
    if not _binary_keys():
        return
    for table, column, length in _KEYS:
        op.alter_column(
            _table(table),
            column,
            type_=sa.String(length, collation="utf8mb4_bin"),
            existing_type=mysql.VARBINARY(length * 4),
            existing_nullable=False,
        )
