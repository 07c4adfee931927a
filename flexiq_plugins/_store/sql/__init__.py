"""The SQL step store: SQLAlchemy Core on SQLite, PostgreSQL and MySQL/MariaDB.

One module per concern, each with its reasons in its docstring:

- `engine`: store URLs, engine creation, per-database session set-up,
  the fork hook;
- `tables`: the three tables, as the migrations create them;
- `migrate`: [`upgrade_store`][flexiq_plugins.upgrade_store] and the migration lock;
- `errors`: the one boundary where database errors become
  [`StoreError`][flexiq_plugins.errors.StoreError] types;
- `mapping`: rows to records and back;
- `store`: [`SqlStepStore`][flexiq_plugins.SqlStepStore], one transaction per interface call.
"""

from __future__ import annotations

from .engine import ACCEPTED_STORE_FORMS, normalize_url
from .migrate import upgrade_store
from .store import SqlStepStore
from .tables import DEFAULT_TABLE_PREFIX

__all__ = ["ACCEPTED_STORE_FORMS", "DEFAULT_TABLE_PREFIX", "SqlStepStore", "normalize_url", "upgrade_store"]
