"""Forking a run from a step (C50): a new run replays the copied steps and runs the rest once.

The operation is driven with a publisher that records what it is asked to
publish (the real brokers are in ``tests/conformance/test_conformance_deploys.py``);
the new run is then run with the shipped ``DurableRun`` helper, as the worker
receiving that job would.
"""

from __future__ import annotations

from typing import Any

import pytest

from flexiq_plugins import InvalidForkStep, JobEnvelope, MemoryStepStore, UnknownRun, UnknownStep, current_job
from flexiq_plugins.errors import NoPublisher, PublishFailed
from flexiq_plugins.operations import fork_run
from flexiq_plugins.testing import DurableRun, FakeClock

CALLS: list[tuple[str, str]] = []


def checkout(order: str) -> str:
    """Charge, send a receipt, wait for the shipment."""
    step = current_job.step
    step.run("charge", lambda: _call("charge"))
    step.run("receipt", lambda: _call("receipt"))
    step.sleep("1h")
    return "done"


def _call(what: str) -> str:
    CALLS.append((what, current_job.step.idempotency_key))
    return what


class RecordingPublisher:
    """Publishes nothing: records each (envelope, run key) it is given and returns a job id."""

    def __init__(self, fail: bool = False) -> None:
        self.published: list[tuple[JobEnvelope, str]] = []
        self.fail = fail

    def __call__(self, envelope: JobEnvelope, run_key: str, **options: Any) -> str:
        if self.fail:
            raise ConnectionError("broker down")
        self.published.append((envelope, run_key))
        return f"job-{len(self.published)}"


@pytest.fixture
def clock() -> FakeClock:
    """The store's clock."""
    CALLS.clear()
    return FakeClock()


@pytest.fixture
def store(clock: FakeClock) -> MemoryStepStore:
    """A store holding the run ``old``: charged, receipt sent, asleep."""
    store = MemoryStepStore(clock=clock)
    DurableRun(checkout, "order-1", run_key="old", store=store, clock=clock, task_name="checkout").attempt()
    return store


def test_c50_a_forked_run_replays_its_copied_steps_and_runs_the_rest_once(store, clock):
    """C50: forked from ``receipt#0``, the new run is published as a job of the same task with the same
    arguments and a new run key; it replays ``charge`` (no second call) and sends the receipt once, under a new
    idempotency key; the old run is unchanged."""
    before = (store.get_run("old"), store.get_steps("old"))
    publisher = RecordingPublisher()

    forked = fork_run(store, "old", "receipt#0", {"test": publisher})

    assert (forked.run_key, forked.from_step, forked.copied, forked.job_id) == ("old", "receipt#0", 1, "job-1")
    [(envelope, run_key)] = publisher.published
    assert run_key == forked.new_run_key != "old"
    assert (envelope.task_name, list(envelope.args)) == ("checkout", ["order-1"])
    assert store.get_run(forked.new_run_key).status == "queued"
    CALLS.clear()
    new = DurableRun(checkout, "order-1", run_key=forked.new_run_key, store=store, clock=clock)
    assert new.attempt().sleeping
    assert [("receipt", f"{forked.new_run_key}:receipt#0")] == CALLS
    assert (store.get_run("old"), store.get_steps("old")) == before


def test_c50_bad_input_writes_nothing_and_names_the_valid_steps(store, clock):
    """C50: an unknown run, an unknown step, a step of another kind and a missing publisher are refused before
    anything is written: no new run, nothing published."""
    publisher = RecordingPublisher()
    with pytest.raises(UnknownRun):
        fork_run(store, "nobody", "receipt#0", {"test": publisher})
    with pytest.raises(UnknownStep, match="fork it from one of: charge#0, receipt#0, sleep#0"):
        fork_run(store, "old", "receipt#1", {"test": publisher})
    with pytest.raises(NoPublisher):
        fork_run(store, "old", "receipt#0", {})
    assert publisher.published == []
    assert [r.run_key for r in store.list_runs()] == ["old"]

    def patched(order: str) -> None:
        step = current_job.step
        step.patched("v2")
        step.sleep("1h")

    DurableRun(patched, "o", run_key="marked", store=store, clock=clock).attempt()
    with pytest.raises(InvalidForkStep, match="fork it from one of: sleep#0"):
        fork_run(store, "marked", "patch:v2", {"test": publisher})


def test_c50_a_failed_publish_leaves_the_new_run_queued_for_recovery(store):
    """C50, C39: the steps are copied before the publish; if the broker refuses it the new run stays ``queued``
    (recovery publishes it) and the error says so."""
    with pytest.raises(PublishFailed, match="recorded queued: `flexiq recover` publishes it"):
        fork_run(store, "old", "receipt#0", {"test": RecordingPublisher(fail=True)}, new_key="forked-1")
    assert store.get_run("forked-1").status == "queued"
    assert [r.step_key for r in store.get_steps("forked-1")] == ["charge#0"]
