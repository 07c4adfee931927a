"""The store's upkeep as an operator runs it: its schema and its retention (``flexiq store``)."""

from __future__ import annotations

from dataclasses import dataclass

from .._model.durations import parse_duration
from .._store.operator_side import OperatorStore
from .._store.sql import SqlStepStore, upgrade_store

__all__ = ["StoreCleaned", "clean_store", "upgrade_schema"]


@dataclass(frozen=True)
class StoreCleaned:
    """What [`clean_store`][flexiq_plugins.operations.clean_store] deleted.

    Parameters:
      runs (int): how many finished runs were deleted, with their steps and step attempts.
      events (int): how many events were deleted.
      older_than (float): the runs' cutoff, epoch seconds on the store's clock.
      events_older_than (float): the events' cutoff, epoch seconds on the store's clock.
    """

    runs: int
    events: int
    older_than: float
    events_older_than: float


def clean_store(
    store: OperatorStore, older_than: str | float, *, events_older_than: str | float | None = None
) -> StoreCleaned:
    """Delete finished runs and old events, as ``flexiq store cleanup`` does (C27, C30, C33).

    Runs are deleted as [`cleanup`][flexiq_plugins.operations.cleanup] deletes
    them (a dead run once its dead letters were purged), events as
    [`cleanup_events`][flexiq_plugins.operations.cleanup_events] does; both
    cutoffs are taken from one reading of the store's clock.

    Args:
      store (OperatorStore): the store.
      older_than (str | float): the runs' retention, a duration (``"7d"``) or seconds.
      events_older_than (str | float | None): the events' retention; ``None`` for ``older_than``.

    Returns:
      StoreCleaned: how many runs and events were deleted, and the cutoffs.

    Raises:
      ValueError: a retention is not a duration.
      StoreUnavailable: the store cannot be reached.
    """
    runs_seconds = parse_duration(older_than)
    events_seconds = runs_seconds if events_older_than is None else parse_duration(events_older_than)
    now = store.now()
    cutoff, events_cutoff = now - runs_seconds, now - events_seconds
    runs = store.cleanup(older_than=cutoff)
    events = store.cleanup_events(older_than=events_cutoff)
    return StoreCleaned(runs, events, cutoff, events_cutoff)


def upgrade_schema(store: OperatorStore) -> str | None:
    """Create or migrate a SQL store's tables to the newest schema, as ``flexiq store upgrade`` does.

    Idempotent and safe when several processes run it at once (see
    [`upgrade_store`][flexiq_plugins.upgrade_store]).

    Args:
      store (OperatorStore): the store.

    Returns:
      str | None: the store's URL (password hidden) once its schema is the newest; ``None`` for a store
        without a schema (the in-memory store), which is left as it is.

    Raises:
      StoreUnavailable: the database cannot be reached.
      StoreError: the migration failed.
    """
    if not isinstance(store, SqlStepStore):
        return None
    upgrade_store(store.engine, table_prefix=store.table_prefix)
    return store.url
