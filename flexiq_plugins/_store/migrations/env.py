"""Alembic environment of the step store, shipped inside the package.

``flexiq_plugins._store.sql.upgrade_store`` runs it programmatically: no
``alembic.ini`` is needed. It passes the open connection (already inside a
transaction and holding the migration lock) through
``config.attributes["connection"]`` and the store's table prefix through
``config.attributes["table_prefix"]``. The version table is
``<prefix>alembic_version`` (``flexiq_alembic_version`` by default), so the
store's schema history never mixes with an application's own Alembic history
in the same database.

Run by hand (``alembic -x url=… upgrade head`` with ``script_location`` set to
this folder) it opens its own engine from the ``url`` argument or
``sqlalchemy.url``; ``--sql`` prints the DDL without connecting.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context
from sqlalchemy.engine import Connection

config = context.config
prefix = str(
    config.attributes.get("table_prefix") or context.get_x_argument(as_dictionary=True).get("prefix") or "flexiq_"
)
config.attributes["table_prefix"] = prefix
version_table = f"{prefix}alembic_version"


def _url() -> str:
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("no database: pass -x url=... or set sqlalchemy.url")
    return url


def _migrate(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=None, version_table=version_table)
    with context.begin_transaction():
        context.run_migrations()


def run() -> None:
    """Run the migrations offline (``--sql``), on the given connection or on a new engine."""
    if context.is_offline_mode():
        context.configure(url=_url(), literal_binds=True, version_table=version_table)
        with context.begin_transaction():
            context.run_migrations()
        return
    connection = config.attributes.get("connection")
    if connection is not None:
        _migrate(connection)
        return
    engine = sa.create_engine(_url())
    try:
        with engine.begin() as conn:
            _migrate(conn)
    finally:
        engine.dispose()


run()
