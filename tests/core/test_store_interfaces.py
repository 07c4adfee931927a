"""The store interface split by who calls it: an attempt's side, an operator's side, and the reads both make.

``StepStore`` is ``AttemptStore`` plus ``OperatorStore``, both over
``StoreReads``. Each method is declared in exactly one of them, so a caller
typed against one side cannot reach the other's methods, and moving a method
between sides is a deliberate change of this test.
"""

from __future__ import annotations

import inspect

import pytest

from flexiq_plugins import AttemptStore, MemoryStepStore, OperatorStore, SqlStepStore, StepStore
from flexiq_plugins._store.reads import StoreReads

READS = {"now", "get_run", "get_steps", "durable_tasks"}
ATTEMPT_SIDE = {
    "begin",
    "renew",
    "record_queued",
    "note_durable_task",
    "commit_step",
    "commit_steps",
    "commit_step_on",
    "begin_step_attempt",
    "fail_step_attempt",
    "poll_event",
    "finish",
    "start_compensation",
    "settle_failed",
    "release_run",
    "dead_letter_unstarted",
    "request_cancel",
    "settle_cancelled",
    "local_clock",
    "held",
}
OPERATOR_SIDE = {
    "list_runs",
    "count_runs",
    "count_statuses",
    "iter_runs",
    "get_steps_of",
    "get_step_attempts",
    "list_dead_letters",
    "get_dead_letter",
    "prepare_retry",
    "fork_run",
    "purge_dead_letters",
    "cleanup",
    "cleanup_events",
    "acquire_sweep_lease",
    "release_sweep_lease",
    "mark_recovered",
    "unmark_recovered",
    "settle_reported",
    "add_event",
    "next_event",
    "find_runs",
    "find_dead_letters",
    "count_dead_letters",
    "find_events",
    "sweep_leases",
}
STORE_OBJECT = {"describe", "check_writable", "close"}
"""What ``StepStore`` itself adds: its description, its writability check at a worker's start, and its close."""


def _declared(cls: type) -> set[str]:
    """The public methods ``cls`` itself defines (not those it inherits)."""
    return {name for name, value in vars(cls).items() if not name.startswith("_") and inspect.isfunction(value)}


def _abstract_declared(cls: type) -> set[str]:
    """The abstract methods ``cls`` itself declares."""
    return {name for name in _declared(cls) if getattr(vars(cls)[name], "__isabstractmethod__", False)}


def test_store_interfaces_each_side_declares_exactly_its_methods():
    """The reads, the attempt side, the operator side and ``StepStore`` itself declare exactly the listed methods."""
    assert _declared(StoreReads) == READS
    assert _declared(AttemptStore) == ATTEMPT_SIDE
    assert _declared(OperatorStore) == OPERATOR_SIDE
    assert _declared(StepStore) == STORE_OBJECT


def test_store_interfaces_share_no_method_and_together_are_the_step_store():
    """No method is declared on two sides; the abstract methods of the three parts are exactly ``StepStore``'s."""
    parts = [_abstract_declared(cls) for cls in (StoreReads, AttemptStore, OperatorStore)]
    assert ATTEMPT_SIDE.isdisjoint(OPERATOR_SIDE)
    assert READS.isdisjoint(ATTEMPT_SIDE | OPERATOR_SIDE)
    assert sum(len(part) for part in parts) == len(set().union(*parts))
    assert set().union(*parts) == set(StepStore.__abstractmethods__)
    assert set(AttemptStore.__abstractmethods__) == parts[0] | parts[1]
    assert set(OperatorStore.__abstractmethods__) == parts[0] | parts[2]
    assert _abstract_declared(StepStore) == set()


@pytest.mark.parametrize("make", [MemoryStepStore, lambda: SqlStepStore("sqlite://")], ids=["memory", "sql"])
def test_store_interfaces_both_stores_implement_both_sides(make):
    """The memory and the SQL store are each an ``AttemptStore``, an ``OperatorStore`` and a ``StepStore``."""
    store = make()
    try:
        assert isinstance(store, AttemptStore)
        assert isinstance(store, OperatorStore)
        assert isinstance(store, StepStore)
        assert not inspect.isabstract(type(store))
    finally:
        store.close()
