"""The SQL step store: SQLAlchemy Core on SQLite, PostgreSQL and MySQL/MariaDB.

One module per concern, each with its reasons in its docstring:

- :mod:`.engine`: store URLs, engine creation, per-database session set-up,
  the fork hook;
- :mod:`.tables`: the three tables, as the migrations create them;
- :mod:`.migrate`: :func:`upgrade_store` and the migration lock;
- :mod:`.errors`: the one boundary where database errors become
  :class:`~flexiq_plugins.errors.StoreError` types;
- :mod:`.mapping`: rows to records and back;
- :mod:`.store`: :class:`SqlStepStore`, one transaction per interface call.
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
