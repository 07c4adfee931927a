"""Dramatiq: a new message's run is recorded ``queued`` at enqueue, unless the actor or the message opts out
(C39). A ``StubBroker`` with no worker: what the store holds is what the enqueue wrote."""

from __future__ import annotations

from pathlib import Path

import dramatiq
from dramatiq.brokers.stub import StubBroker

from dramatiq_ext import RUN_KEY_OPTION, DurableSteps
from flexiq_plugins import SqlStepStore, UnknownRun


def _status(store: SqlStepStore, run_key: str) -> str | None:
    try:
        return store.get_run(run_key).status
    except UnknownRun:
        return None


def test_c39_a_new_message_is_queued_and_opt_outs_are_honoured(tmp_path: Path) -> None:
    """C39: ``send`` records the run ``queued`` and flags the message; ``record_at_publish=False`` on the actor,
    ``flexiq_record=False`` on the message, or a message that carries a run key already records nothing."""
    store = SqlStepStore(f"sqlite:///{tmp_path / 'steps.db'}")
    broker = StubBroker()
    broker.add_middleware(DurableSteps(store=store))

    @dramatiq.actor(broker=broker, queue_name="orders")
    def ship(order: str) -> str:
        return order

    @dramatiq.actor(broker=broker, queue_name="orders", record_at_publish=False)
    def hot() -> None: ...

    sent = ship.send("A-1")
    run = store.get_run(sent.options[RUN_KEY_OPTION])
    assert (run.status, run.job_id) == ("queued", sent.message_id)
    assert (run.envelope.args, run.envelope.queue) == (["A-1"], "orders")
    assert sent.options["flexiq_recorded"] is True

    for message in (
        hot.send(),
        ship.send_with_options(args=("B-2",), flexiq_record=False),
        ship.send_with_options(args=("C-3",), **{RUN_KEY_OPTION: "an-existing-run"}),
    ):
        assert _status(store, message.options[RUN_KEY_OPTION]) is None
        assert "flexiq_recorded" not in message.options
    broker.close()
    store.close()


def test_c39_a_delay_is_recorded_as_the_runs_due_time(tmp_path: Path) -> None:
    """C39: ``send_with_options(delay=...)`` records when the message is due, so recovery never runs it early."""
    store = SqlStepStore(f"sqlite:///{tmp_path / 'steps.db'}")
    broker = StubBroker()
    broker.add_middleware(DurableSteps(store=store))

    @dramatiq.actor(broker=broker, queue_name="orders")
    def later() -> None: ...

    sent = later.send_with_options(delay=3_600_000)
    run = store.get_run(sent.options[RUN_KEY_OPTION])
    assert run.status == "queued"
    assert run.wake_at is not None
    assert run.wake_at - run.created_at > 3500
    broker.close()
    store.close()
