"""The store's upkeep as ``flexiq store`` runs it, from Python: ``clean_store`` and ``upgrade_schema`` (C27, C33).

Runs are driven through the real core on an in-memory store with a fake clock.
"""

from __future__ import annotations

import pytest

from flexiq_plugins import DurableConfig, MemoryStepStore, current_job, operations
from flexiq_plugins.errors import UnknownRun
from flexiq_plugins.testing import DurableRun, FakeClock


def test_c27_c33_clean_store_deletes_old_runs_and_events_each_by_its_own_retention() -> None:
    """Runs older than ``older_than`` and events older than ``events_older_than`` go; the cutoffs are reported."""
    clock = FakeClock()
    store = MemoryStepStore(clock=clock)
    old = DurableRun(lambda: current_job.step.run("work", lambda: 1), run_key="old", store=store)
    old.attempt()
    store.add_event("payment", "o-1", None)
    clock.advance(3600)
    recent = DurableRun(lambda: current_job.step.run("work", lambda: 1), run_key="recent", store=store)
    recent.attempt()

    kept_events = operations.clean_store(store, "30m", events_older_than="2h")
    assert (kept_events.runs, kept_events.events) == (1, 0)
    assert (kept_events.older_than, kept_events.events_older_than) == (store.now() - 1800, store.now() - 7200)
    assert store.get_run("recent").status == "succeeded"
    with pytest.raises(UnknownRun):
        store.get_run("old")

    both = operations.clean_store(store, "30m")
    assert (both.runs, both.events, both.events_older_than) == (0, 1, both.older_than)


def test_upgrade_schema_leaves_a_store_without_a_schema_as_it_is() -> None:
    """An in-memory store has no tables: ``upgrade_schema`` says so with ``None`` and changes nothing."""
    store = MemoryStepStore()
    DurableRun(lambda: 1, run_key="r", store=store, config=DurableConfig(keep_succeeded_steps=True)).attempt()
    assert operations.upgrade_schema(store) is None
    assert store.get_run("r").status == "succeeded"
