"""The SQL store's three tables, as SQLAlchemy Core ``Table`` objects.

The schema is created and changed only by the Alembic migrations shipped in
``flexiq_plugins/_store/migrations``; the queries are built on these objects.
They are nevertheless the *complete* definitions of the migrations' head
(types, nullability, server defaults, keys, indexes, MySQL/MariaDB table
options), so the two can be compared: ``tests/test_store_schema.py`` runs the
migrations on every backend and asserts that Alembic's autogenerate finds no
difference. A schema change is therefore a new migration *and* a change here.

Times are ``DOUBLE`` epoch seconds on the database's clock (C23). On MySQL and
MariaDB the tables are InnoDB in ``utf8mb4`` with the binary collation, so run
keys and step keys compare exactly as Python strings do, and values are
``LONGBLOB`` so a 4 MiB step value fits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql

__all__ = ["DEFAULT_TABLE_PREFIX", "StoreTables", "store_tables"]

DEFAULT_TABLE_PREFIX = "flexiq_"

_MYSQL: dict[str, Any] = {
    f"{dialect}_{option}": value
    for dialect in ("mysql", "mariadb")  # the MariaDB dialect reads only its own prefix
    for option, value in (("engine", "InnoDB"), ("charset", "utf8mb4"), ("collate", "utf8mb4_bin"))
}


@dataclass(frozen=True)
class StoreTables:
    """The three tables of one ``table_prefix``, as Core ``Table`` objects.

    Parameters:
      metadata(MetaData): the metadata holding exactly these three tables.
      runs(Table): ``<prefix>runs``, one row per run key.
      steps(Table): ``<prefix>steps``, the committed steps.
      dead(Table): ``<prefix>dead_letters``.
    """

    metadata: sa.MetaData
    runs: sa.Table
    steps: sa.Table
    dead: sa.Table


def _time() -> sa.Double[float]:
    return sa.Double(asdecimal=False)


def _blob() -> sa.types.TypeEngine[bytes]:
    return sa.LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb")


def _text() -> sa.types.TypeEngine[str]:
    return sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")


def store_tables(prefix: str) -> StoreTables:
    """Return the tables named ``<prefix>runs``, ``<prefix>steps`` and ``<prefix>dead_letters``.

    Parameters:
      prefix(str): the store's table prefix (``flexiq_`` by default).
    """
    metadata = sa.MetaData()
    return StoreTables(metadata, _runs(metadata, prefix), _steps(metadata, prefix), _dead_letters(metadata, prefix))


def _runs(metadata: sa.MetaData, p: str) -> sa.Table:
    return sa.Table(
        f"{p}runs",
        metadata,
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
        sa.Column("wake_at", _time(), nullable=True),
        sa.Column("recovered_at", _time(), nullable=True),
        sa.Index(f"ix_{p}runs_status_updated", "status", "updated_at"),
        sa.Index(f"ix_{p}runs_updated", "updated_at"),
        sa.Index(f"ix_{p}runs_task_name", "task_name"),
        **_MYSQL,
    )


def _steps(metadata: sa.MetaData, p: str) -> sa.Table:
    return sa.Table(
        f"{p}steps",
        metadata,
        sa.Column("run_key", sa.String(255), nullable=False),
        sa.Column("position", sa.Integer, nullable=False),
        sa.Column("step_key", sa.String(400), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("value", _blob(), nullable=True),
        sa.Column("wake_at", _time(), nullable=True),
        sa.Column("committed_at", _time(), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.PrimaryKeyConstraint("run_key", "step_key", name=f"pk_{p}steps"),
        sa.Index(f"ix_{p}steps_run_position", "run_key", "position"),
        **_MYSQL,
    )


def _dead_letters(metadata: sa.MetaData, p: str) -> sa.Table:
    return sa.Table(
        f"{p}dead_letters",
        metadata,
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
        sa.Index(f"ix_{p}dead_letters_run_key", "run_key"),
        sa.Index(f"ix_{p}dead_letters_task_name", "task_name"),
        sqlite_autoincrement=True,  # ids are never reused after a purge
        **_MYSQL,
    )
