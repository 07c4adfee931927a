"""Bringing a store's tables up to date with the shipped Alembic migrations.

The migrations live in ``flexiq_plugins/_store/migrations`` and run
programmatically (no ``alembic.ini``). Workers that start together must not
race to create the tables, so the whole upgrade runs under a lock released
only after it has committed: a PostgreSQL advisory lock, a MySQL/MariaDB
``GET_LOCK``, or on SQLite the ``BEGIN IMMEDIATE`` that already serializes
writers. A process that waited then finds the new version row and does
nothing.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import URL, Connection, Engine

from .engine import create_engine, normalize_url
from .errors import translated
from .tables import DEFAULT_TABLE_PREFIX

__all__ = ["migrate", "upgrade_store"]

_MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"


def upgrade_store(
    url_or_engine: str | URL | Engine,
    revision: str = "head",
    *,
    table_prefix: str = DEFAULT_TABLE_PREFIX,
) -> None:
    """Bring the store's tables to ``revision`` with the shipped Alembic migrations.

    Idempotent, and safe when several processes call it at once: PostgreSQL
    takes an advisory lock and MySQL/MariaDB a ``GET_LOCK``, both held until
    the upgrade has committed; SQLite's ``BEGIN IMMEDIATE`` serializes it.

    Parameters:
      url_or_engine(str | URL | Engine): the store's URL or an engine.
      revision(str): the Alembic revision, ``"head"`` for the newest.
      table_prefix(str): the prefix of the store's table names.

    Raises:
      ConfigurationError: an unusable URL.
      StoreUnavailable: the database cannot be reached.
      StoreError: the migration failed.
    """
    if isinstance(url_or_engine, Engine):
        engine, owned = url_or_engine, False
    else:
        engine, owned = create_engine(normalize_url(url_or_engine)), True
    try:
        with translated(engine):
            migrate(engine, revision, table_prefix)
    finally:
        if owned:
            engine.dispose()


def migrate(engine: Engine, revision: str, prefix: str) -> None:
    """Run the migrations up to ``revision`` under the migration lock; errors are not translated.

    Parameters:
      engine(Engine): the store's engine.
      revision(str): the Alembic revision, ``"head"`` for the newest.
      prefix(str): the prefix of the store's table names.
    """
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(_MIGRATIONS))
    config.attributes["table_prefix"] = prefix
    with engine.connect() as conn, _migration_lock(conn, prefix), conn.begin():
        config.attributes["connection"] = conn
        command.upgrade(config, revision)


@contextmanager
def _migration_lock(conn: Connection, prefix: str) -> Iterator[None]:
    """Hold a session-level lock across the whole upgrade, released only after its commit.

    Released after the commit so a second process waiting on it sees the new
    version row and does nothing. SQLite needs none: ``BEGIN IMMEDIATE``
    already serializes the upgrade's transaction.
    """
    name = conn.dialect.name
    key = f"flexiq-migrate:{prefix}"
    if name == "postgresql":
        number = zlib.crc32(key.encode())
        lock, unlock = sa.func.pg_advisory_lock(number), sa.func.pg_advisory_unlock(number)
    elif name in ("mysql", "mariadb"):
        lock, unlock = sa.func.get_lock(key[:64], 120), sa.func.release_lock(key[:64])
    else:
        yield
        return
    conn.execute(sa.select(lock))
    conn.commit()
    try:
        yield
    finally:
        conn.execute(sa.select(unlock))
        conn.commit()
