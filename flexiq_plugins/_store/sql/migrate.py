"""Bringing a store's tables up to date with the shipped Alembic migrations.

The migrations live in ``flexiq_plugins/_store/migrations`` and run
programmatically (no ``alembic.ini``). Workers that start together must not
race to create the tables, so the whole upgrade runs under a lock released
only after it has committed: a PostgreSQL advisory lock, a MySQL/MariaDB
``GET_LOCK``, or on SQLite the ``BEGIN IMMEDIATE`` that already serializes
writers. A process that waited then finds the new version row and does
nothing. A process that finds the schema already at the newest revision
takes no lock at all: it neither waits behind an upgrade nor behind a
session that holds the lock for long (one cut off mid-upgrade, say).

Quiet by design: every worker process checks the schema the first time it
touches the store, and Alembic would log seven to ten INFO lines each time,
even when there is nothing to do. Its records below WARNING are dropped while
this module runs it (only in the thread that runs it, so an application's own
Alembic keeps its logs); an actual upgrade is logged as one line of ours.
"""

from __future__ import annotations

import logging
import threading
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import URL, Connection, Engine

from ...errors import StoreUnavailable
from .engine import READ_ONLY, create_engine, normalize_url
from .errors import translated
from .tables import DEFAULT_TABLE_PREFIX

__all__ = ["migrate", "schema_revision", "upgrade_store"]

logger = logging.getLogger("flexiq_plugins")

_MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"
_quiet = threading.local()
_LOCK_WAIT_S = 120
"""How long MySQL/MariaDB's ``GET_LOCK`` waits for the migration lock, seconds (PostgreSQL's lock waits on)."""


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
      url_or_engine (str | URL | Engine): the store's URL or an engine.
      revision (str): the Alembic revision, ``"head"`` for the newest.
      table_prefix (str): the prefix of the store's table names.

    Raises:
      ConfigurationError: an unusable URL.
      StoreUnavailable: the database cannot be reached, or (MySQL/MariaDB)
        another session held the migration lock for 120 s.
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


def migrate(engine: Engine, revision: str, prefix: str) -> str | None:
    """Run the migrations up to ``revision`` under the migration lock; errors are not translated.

    For ``"head"``, a schema already at the newest revision is read without
    the lock and left as it is. Nothing is logged when the schema is already
    there; an upgrade logs one INFO line naming both revisions.

    Parameters:
      engine (Engine): the store's engine.
      revision (str): the Alembic revision, ``"head"`` for the newest.
      prefix (str): the prefix of the store's table names.

    Returns:
      str | None: the schema revision now (``None``: no tables).
    """
    with _quiet_alembic():
        from alembic import command
        from alembic.config import Config

        config = Config()
        config.set_main_option("script_location", str(_MIGRATIONS))
        config.attributes["table_prefix"] = prefix
        newest = _head(config) if revision == "head" else None  # None: no revision counts as up to date
        if newest is not None:  # up to date: no lock to wait for (whoever holds it, for however long)
            with engine.connect() as conn:
                conn.execution_options(**{READ_ONLY: True})  # SQLite: a plain BEGIN, not BEGIN IMMEDIATE
                current = _revision_of(conn, prefix)
            if current == newest:
                return current
    with _quiet_alembic(), engine.connect() as conn, _migration_lock(conn, prefix), conn.begin():
        before = _revision_of(conn, prefix)  # again, under the lock: another process may have upgraded meanwhile
        if newest is not None and before == newest:
            return before
        config.attributes["connection"] = conn
        command.upgrade(config, revision)
        after = _revision_of(conn, prefix)
    if after != before:
        logger.info("step store %s upgraded from schema revision %s to %s", _where(engine), before, after)
    return after


def schema_revision(conn: Connection, prefix: str) -> str | None:
    """The store's schema revision read on ``conn`` (``None``: no tables yet); logs nothing."""
    with _quiet_alembic():
        return _revision_of(conn, prefix)


def _revision_of(conn: Connection, prefix: str) -> str | None:
    from alembic.runtime.migration import MigrationContext

    context = MigrationContext.configure(conn, opts={"version_table": f"{prefix}alembic_version"})
    return context.get_current_revision()


def _head(config: object) -> str | None:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(config).get_current_head()  # type: ignore[arg-type]


def _where(engine: Engine) -> str:
    return engine.url.render_as_string(hide_password=True)


class _DropAlembicInfo(logging.Filter):
    """Drops Alembic's records below WARNING in a thread running our migrations."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or not getattr(_quiet, "on", False)


_FILTER = _DropAlembicInfo()


@contextmanager
def _quiet_alembic() -> Iterator[None]:
    was, _quiet.on = getattr(_quiet, "on", False), True
    try:
        _filter_alembic(["alembic.runtime.plugins", "alembic.runtime.migration"])  # they log on import, too
        import alembic.command  # noqa: F401 - creates the rest of Alembic's loggers

        _filter_alembic([n for n in logging.root.manager.loggerDict if n.startswith("alembic")])
        yield
    finally:
        _quiet.on = was


def _filter_alembic(names: list[str]) -> None:
    for name in names:
        log = logging.getLogger(name)
        if _FILTER not in log.filters:
            log.addFilter(_FILTER)


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
        lock, unlock = sa.func.get_lock(key[:64], _LOCK_WAIT_S), sa.func.release_lock(key[:64])
    else:
        yield
        return
    granted = conn.execute(sa.select(lock)).scalar()
    conn.commit()
    if name != "postgresql" and granted != 1:  # GET_LOCK: 0 after its timeout, NULL on an error
        raise StoreUnavailable(
            f"the migration lock of the step store's tables {prefix}* was not granted within {_LOCK_WAIT_S} s: another "
            "session holds it (an upgrade in progress, or one cut off); nothing was migrated, try again"
        )
    try:
        yield
    finally:
        conn.execute(sa.select(unlock))
        conn.commit()
