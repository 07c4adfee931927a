"""Dramatiq: a new message's run is recorded ``queued`` at enqueue, unless the actor or the message opts out
(C39), whether the middleware minted its run key or the producer chose it (C46). A ``StubBroker`` with no
worker: what the store holds is what the enqueue wrote."""

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
    """C39: ``send`` records the run ``queued`` and flags the message; ``record_at_publish=False`` on the actor
    or ``flexiq_record=False`` on the message records nothing (C46: not even with a run key of its own)."""
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
        ship.send_with_options(args=("C-3",), flexiq_record=False, **{RUN_KEY_OPTION: "order-C-3"}),
        hot.send_with_options(**{RUN_KEY_OPTION: "order-hot"}),
    ):
        assert _status(store, message.options[RUN_KEY_OPTION]) is None
        assert "flexiq_recorded" not in message.options
    broker.close()
    store.close()


def test_c46_a_message_with_its_own_run_key_is_queued_unless_its_run_exists(tmp_path: Path) -> None:
    """C46: ``send_with_options(flexiq_run_key=...)`` records the run ``queued`` and flags the message, as a
    minted key does; a second message with that key leaves the run as it is; a message the middleware
    publishes again for a run (a run key and the resume mark) is never recorded."""
    store = SqlStepStore(f"sqlite:///{tmp_path / 'steps.db'}")
    broker = StubBroker()
    broker.add_middleware(DurableSteps(store=store))

    @dramatiq.actor(broker=broker, queue_name="orders")
    def ship(order: str) -> str:
        return order

    sent = ship.send_with_options(args=("A-1",), **{RUN_KEY_OPTION: "order-A-1"})
    run = store.get_run("order-A-1")
    assert (run.status, run.job_id, run.envelope.args) == ("queued", sent.message_id, ["A-1"])
    assert sent.options["flexiq_recorded"] is True
    again = ship.send_with_options(args=("B-2",), **{RUN_KEY_OPTION: "order-A-1"})
    assert again.options[RUN_KEY_OPTION] == "order-A-1"
    assert store.get_run("order-A-1") == run
    hop = ship.send_with_options(args=("C-3",), **{RUN_KEY_OPTION: "run-C-3", "flexiq_resume": True})
    assert _status(store, "run-C-3") is None
    assert "flexiq_recorded" not in hop.options
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


def test_c39_a_recovery_copy_does_not_run_a_job_its_original_handed_to_retries(tmp_path: Path) -> None:
    """C39: a recorded message waits in a backlog past ``recovery_queued_seconds``, so recovery publishes a
    copy; the original then runs first and fails, and ``Retries`` schedules its retry. The copy, marked to
    run only while the run never started, is dropped: the body runs twice (the original and its one
    retry), not three or four times."""
    from dramatiq.middleware import Retries

    from flexiq_plugins import operations

    store = SqlStepStore(f"sqlite:///{tmp_path / 'steps.db'}")
    broker = StubBroker()
    broker.add_middleware(DurableSteps(store=store, recovery=False), before=Retries)
    ran: list[str] = []

    @dramatiq.actor(broker=broker, queue_name="orders", max_retries=1, min_backoff=200, max_backoff=200)
    def charge(order: str) -> None:
        ran.append(order)
        raise ValueError("card declined")

    run_key = charge.send("o-1").options[RUN_KEY_OPTION]
    report = operations.recover(store, operations.publishers_for(broker), grace=0, queued_after=0)
    assert [why for stranded, _ in report.recovered for why in [stranded.why]] == ["never_started"]
    worker = dramatiq.Worker(broker, worker_threads=1, worker_timeout=100)
    worker.start()
    try:
        broker.join("orders", fail_fast=False)
        worker.join()
    finally:
        worker.stop()
    assert ran == ["o-1", "o-1"]
    assert store.get_run(run_key).status == "failed"
    broker.close()
    store.close()
