"""The SQL step store: SQLAlchemy Core on SQLite, PostgreSQL and MySQL/MariaDB.

One module per concern, each with its reasons in its docstring:

- :mod:`.engine`: store URLs, engine creation, per-database session set-up,
  the fork hook;
- :mod:`.tables`: the three tables, as the migrations create them;
- :mod:`.migrate`: :func:`upgrade_store` and the migration lock;
- :mod:`.errors`: the one boundary where database errors become
  :class:`~flexiq_plugins.errors.StoreError` types;
- :mod:`.mapping`: rows to records and back;
- :mod:`.folded`: the hot paths in as few statements as each database allows,
  and :mod:`.driver`: some of them handed straight to the driver;
- :mod:`.connections`: held connections, one transaction per interface call,
  retries of dropped connections and deadlocks, the database's clock;
- :mod:`.reads`, :mod:`.attempt_side`, :mod:`.operator_side`: the store's
  methods, by the interface they implement;
- :mod:`.store`: :class:`SqlStepStore`, composed of them.
"""

from __future__ import annotations

from .engine import ACCEPTED_STORE_FORMS, normalize_url
from .migrate import upgrade_store
from .store import SqlStepStore
from .tables import DEFAULT_TABLE_PREFIX

__all__ = ["ACCEPTED_STORE_FORMS", "DEFAULT_TABLE_PREFIX", "SqlStepStore", "normalize_url", "upgrade_store"]
