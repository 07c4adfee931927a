"""The SQL store's seven tables, as SQLAlchemy Core ``Table`` objects.

The schema is created and changed only by the Alembic migrations shipped in
``flexiq_plugins/_store/migrations``; the queries are built on these objects.
They are nevertheless the *complete* definitions of the migrations' head
(types, nullability, server defaults, keys, indexes, MySQL/MariaDB table
options), so the two can be compared: ``tests/store/test_store_schema.py`` runs the
migrations on every backend and asserts that Alembic's autogenerate finds no
difference. A schema change is therefore a new migration *and* a change here.

Times are ``DOUBLE`` epoch seconds on the database's clock (C23). On MySQL and
MariaDB the tables are InnoDB in ``utf8mb4`` with the binary collation, and
values are ``LONGBLOB`` so a 4 MiB step value fits.

Keys (run keys, step keys, a dead letter's run key) are `ExactKey`
columns, compared byte for byte on every backend (C40). SQLite and PostgreSQL
compare text exactly already; on MySQL and MariaDB even the binary collation
``utf8mb4_bin`` is ``PAD SPACE`` (``'x'`` equals ``'x '``), so there a key is
a ``VARBINARY`` of its UTF-8 bytes, which compares as bytes do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql

__all__ = ["DEFAULT_TABLE_PREFIX", "ExactKey", "StoreTables", "store_tables"]

DEFAULT_TABLE_PREFIX = "flexiq_"

_MYSQL: dict[str, Any] = {
    f"{dialect}_{option}": value
    for dialect in ("mysql", "mariadb")  # the MariaDB dialect reads only its own prefix
    for option, value in (("engine", "InnoDB"), ("charset", "utf8mb4"), ("collate", "utf8mb4_bin"))
}


_BINARY_KEY_DIALECTS = frozenset({"mysql", "mariadb"})
_UTF8_MAX_BYTES = 4


class ExactKey(sa.types.TypeDecorator[str]):
    """A key column of at most ``length`` characters that compares byte for byte on every backend (C40).

    ``VARCHAR(length)`` on SQLite and PostgreSQL (whose comparisons are
    exact); on MySQL and MariaDB a ``VARBINARY`` of the key's UTF-8 bytes
    (four bytes a character at most), since their ``PAD SPACE`` collations
    would make ``'rk'`` and ``'rk '`` one key. Python code sees ``str`` either way.

    Parameters:
      length (int): the most characters a key may have.
    """

    impl = sa.String
    cache_ok = True

    def __init__(self, length: int) -> None:
        super().__init__(length)
        self.length = length

    def load_dialect_impl(self, dialect: sa.Dialect) -> sa.types.TypeEngine[Any]:
        """``VARBINARY(4 × length)`` on MySQL/MariaDB, ``VARCHAR(length)`` elsewhere."""
        if dialect.name in _BINARY_KEY_DIALECTS:
            return dialect.type_descriptor(mysql.VARBINARY(self.length * _UTF8_MAX_BYTES))
        return dialect.type_descriptor(sa.String(self.length))

    def bind_processor(self, dialect: sa.Dialect) -> Any:
        """No processing where the column holds the ``str`` itself (one call less per key bound)."""
        if dialect.name in _BINARY_KEY_DIALECTS:
            return super().bind_processor(dialect)
        return self.load_dialect_impl(dialect).bind_processor(dialect)

    def process_bind_param(self, value: str | None, dialect: sa.Dialect) -> Any:
        """A key as the column holds it: UTF-8 bytes on MySQL/MariaDB, else the ``str``."""
        if value is not None and dialect.name in _BINARY_KEY_DIALECTS:
            return value.encode("utf-8")
        return value

    def process_result_value(self, value: Any, dialect: sa.Dialect) -> str | None:
        """The key as ``str``, decoded from the column's bytes where it holds bytes."""
        if isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value).decode("utf-8")
        return value  # type: ignore[no-any-return]


@dataclass(frozen=True)
class StoreTables:
    """The seven tables of one ``table_prefix``, as Core ``Table`` objects.

    Parameters:
      metadata (MetaData): the metadata holding exactly these seven tables.
      runs (Table): ``<prefix>runs``, one row per run key.
      steps (Table): ``<prefix>steps``, the committed steps.
      dead (Table): ``<prefix>dead_letters``.
      attempts (Table): ``<prefix>step_attempts``, the journaled and failed step attempts (C31).
      events (Table): ``<prefix>events``, the events sent for waiting runs (C33).
      sweep (Table): ``<prefix>sweep_lease``, the one recovery lease of all workers (C39).
      tasks (Table): ``<prefix>known_tasks``, the tasks known to take steps (C43).
    """

    metadata: sa.MetaData
    runs: sa.Table
    steps: sa.Table
    dead: sa.Table
    attempts: sa.Table
    events: sa.Table
    sweep: sa.Table
    tasks: sa.Table


def _time() -> sa.Double[float]:
    return sa.Double(asdecimal=False)


def _blob() -> sa.types.TypeEngine[bytes]:
    return sa.LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb")


def _text() -> sa.types.TypeEngine[str]:
    return sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")


def _where(condition: str) -> dict[str, Any]:
    """A partial index's condition on PostgreSQL and SQLite; MySQL and MariaDB index every row."""
    return {"postgresql_where": sa.text(condition), "sqlite_where": sa.text(condition)}


def _event_id() -> sa.types.TypeEngine[int]:
    return sa.BigInteger().with_variant(sa.Integer(), "sqlite")  # SQLite autoincrements only INTEGER keys


def store_tables(prefix: str) -> StoreTables:
    """Return the seven tables of ``prefix``: runs, steps, dead letters, step attempts, events, the sweep lease and
    the known tasks.

    Parameters:
      prefix (str): the store's table prefix (``flexiq_`` by default).
    """
    metadata = sa.MetaData()
    return StoreTables(
        metadata,
        _runs(metadata, prefix),
        _steps(metadata, prefix),
        _dead_letters(metadata, prefix),
        _step_attempts(metadata, prefix),
        _events(metadata, prefix),
        _sweep_lease(metadata, prefix),
        _known_tasks(metadata, prefix),
    )


def _runs(metadata: sa.MetaData, p: str) -> sa.Table:
    return sa.Table(
        f"{p}runs",
        metadata,
        sa.Column("run_key", ExactKey(255), primary_key=True),
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
        sa.Column("wait_topic", ExactKey(255), nullable=True),
        sa.Column("wait_key", ExactKey(255), nullable=True),
        sa.Column("cancel_reason", _text(), nullable=True),
        sa.Column("outcome", _blob(), nullable=True),
        sa.Column("trace_context", sa.String(255), nullable=True),  # the first traced attempt's (C53, migration 0010)
        # Each listing index ends with run_key: list_runs orders by (updated_at, run_key) (migration 0008).
        sa.Index(f"ix_{p}runs_status_updated_key", "status", "updated_at", "run_key"),
        sa.Index(f"ix_{p}runs_wait", "wait_topic", "wait_key"),
        sa.Index(f"ix_{p}runs_updated_key", "updated_at", "run_key"),
        sa.Index(f"ix_{p}runs_task_updated_key", "task_name", "updated_at", "run_key"),
        # The sleeping runs by wake time, for the overdue ones an operator's window shows (migration 0009).
        sa.Index(f"ix_{p}runs_sleeping_wake", "wake_at", "run_key", **_where("status = 'sleeping'")),
        **_MYSQL,
    )


def _steps(metadata: sa.MetaData, p: str) -> sa.Table:
    return sa.Table(
        f"{p}steps",
        metadata,
        sa.Column("run_key", ExactKey(255), nullable=False),
        sa.Column("position", sa.Integer, nullable=False),
        sa.Column("step_key", ExactKey(400), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("value", _blob(), nullable=True),
        sa.Column("wake_at", _time(), nullable=True),
        sa.Column("committed_at", _time(), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("failure", _text(), nullable=True),
        sa.Column("compensate", sa.String(255), nullable=True),
        sa.Column("event_id", sa.BigInteger, nullable=True),
        sa.PrimaryKeyConstraint("run_key", "step_key", name=f"pk_{p}steps"),
        sa.Index(f"ix_{p}steps_run_position", "run_key", "position"),
        # The runs that received an event (migration 0009); only event rows are indexed where a database can.
        sa.Index(f"ix_{p}steps_event", "event_id", **_where("event_id IS NOT NULL")),
        **_MYSQL,
    )


def _dead_letters(metadata: sa.MetaData, p: str) -> sa.Table:
    return sa.Table(
        f"{p}dead_letters",
        metadata,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("run_key", ExactKey(255), nullable=False),
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
        sa.Index(f"ix_{p}dead_letters_created", "created_at"),  # the last day's, by reason (migration 0009)
        sqlite_autoincrement=True,  # ids are never reused after a purge
        **_MYSQL,
    )


def _step_attempts(metadata: sa.MetaData, p: str) -> sa.Table:
    return sa.Table(
        f"{p}step_attempts",
        metadata,
        sa.Column("run_key", sa.String(255), nullable=False),
        sa.Column("step_key", sa.String(400), nullable=False),
        sa.Column("number", sa.Integer, nullable=False),
        sa.Column("run_attempt", sa.Integer, nullable=False),
        sa.Column("started_at", _time(), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=True),  # StepAttempt.ended: lost, failed, exhausted …
        sa.Column("error_type", sa.String(255), nullable=True),
        sa.Column("message", _text(), nullable=True),
        sa.Column("traceback", _text(), nullable=True),
        sa.Column("failed_at", _time(), nullable=True),
        sa.Column("retry_at", _time(), nullable=True),
        sa.PrimaryKeyConstraint("run_key", "step_key", "number", name=f"pk_{p}step_attempts"),
        **_MYSQL,
    )


def _events(metadata: sa.MetaData, p: str) -> sa.Table:
    return sa.Table(
        f"{p}events",
        metadata,
        sa.Column("id", _event_id(), primary_key=True, autoincrement=True),
        sa.Column("topic", ExactKey(255), nullable=False),
        sa.Column("event_key", ExactKey(255), nullable=False),
        sa.Column("run_key", ExactKey(255), nullable=True),
        sa.Column("payload", _blob(), nullable=True),
        sa.Column("created_at", _time(), nullable=False),
        sa.Index(f"ix_{p}events_topic_key", "topic", "event_key"),
        sa.Index(f"ix_{p}events_created", "created_at"),
        sqlite_autoincrement=True,  # ids are never reused after a cleanup: a run's received ids stay its own
        **_MYSQL,
    )


def _sweep_lease(metadata: sa.MetaData, p: str) -> sa.Table:
    return sa.Table(
        f"{p}sweep_lease",
        metadata,
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("owner", sa.String(255), nullable=True),
        sa.Column("lease_until", _time(), nullable=True),
        sa.Column("swept_at", _time(), nullable=True),
        **_MYSQL,
    )


def _known_tasks(metadata: sa.MetaData, p: str) -> sa.Table:
    return sa.Table(
        f"{p}known_tasks",
        metadata,
        sa.Column("framework", sa.String(32), nullable=False),
        sa.Column("task_name", sa.String(255), nullable=False),
        sa.Column("first_seen", _time(), nullable=False),
        sa.PrimaryKeyConstraint("framework", "task_name", name=f"pk_{p}known_tasks"),
        **_MYSQL,
    )
