"""The SQL step store: SQLAlchemy Core on SQLite, PostgreSQL and MySQL/MariaDB.

One module per concern, each with its reasons in its docstring:

- `engine`: store URLs, engine creation, per-database session set-up,
  the fork hook;
- `tables`: the three tables, as the migrations create them;
- `migrate`: [`upgrade_store`][flexiq_plugins.upgrade_store] and the migration lock;
- `errors`: the one boundary where database errors become
  [`StoreError`][flexiq_plugins.errors.StoreError] types;
- `mapping`: rows to records and back;
- `folded`: the hot paths in as few statements as each database allows,
  and `driver`: some of them handed straight to the driver;
- `connections`: held connections, one transaction per interface call,
  retries of dropped connections and deadlocks, the database's clock;
- `reads`, `attempt_side`, `operator_side`: the store's
  methods, by the interface they implement;
- `store`: [`SqlStepStore`][flexiq_plugins.SqlStepStore], composed of them.
"""

from __future__ import annotations

from .engine import ACCEPTED_STORE_FORMS, normalize_url, sqlite_file
from .migrate import upgrade_store
from .store import SqlStepStore
from .tables import DEFAULT_TABLE_PREFIX

__all__ = [
    "ACCEPTED_STORE_FORMS",
    "DEFAULT_TABLE_PREFIX",
    "SqlStepStore",
    "normalize_url",
    "sqlite_file",
    "upgrade_store",
]
