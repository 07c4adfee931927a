"""C43: a Dramatiq actor that never takes a step is not touched by ``DurableSteps``; one that does is learned.

An actor that takes no step sends no store statement at enqueue or at the worker and leaves no run row,
succeeding or always failing; a worker shutdown that interrupts it (``notify_shutdown``) ends it exactly as
Dramatiq does without the middleware. An actor is known to take steps once one of its attempts took one,
or when declared ``durable=True``: only then are its messages recorded at enqueue (C39). Statements are
counted with SQLAlchemy's event listeners on the store's engine; real workers.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import dramatiq
from dramatiq.brokers.stub import StubBroker
from dramatiq.message import Message
from dramatiq.middleware import GroupCallbacks, Retries, Shutdown
from dramatiq.rate_limits.backends import StubBackend

from dramatiq_ext import DurableSteps
from flexiq_plugins import SqlStepStore, current_job, operations
from tests.statements import Statements


def test_c43_an_actor_that_takes_no_step_sends_no_statement_and_leaves_no_run(
    stub_broker: dramatiq.Broker, queue: str, sqlite_store: SqlStepStore, start_worker: Callable[..., dramatiq.Worker]
) -> None:
    """C43: after the process has read the known actors once (again at most every
    ``known_tasks_refresh_seconds``, an hour here so the window is exact), step-less messages, succeeding or
    failing until Retries gives up, send no statement at enqueue or at the worker: no run row, no known actor."""
    statements = Statements(sqlite_store.engine)
    middleware = DurableSteps(store=sqlite_store, known_tasks_refresh_seconds=3600, recovery=False)
    stub_broker.add_middleware(middleware, before=Retries)
    done: list[int] = []
    tries: list[int] = []

    @dramatiq.actor(broker=stub_broker, queue_name=queue)
    def idle(n: int) -> None:
        done.append(n)

    @dramatiq.actor(broker=stub_broker, queue_name=queue, max_retries=2, min_backoff=1, max_backoff=1)
    def failing() -> None:
        tries.append(1)
        raise ValueError("always")

    start_worker(stub_broker)
    idle.send(0)
    stub_broker.join(queue)  # the first enqueue read the known actors
    statements.on = True
    sent = [idle.send(n) for n in (1, 2)]
    failing.send()
    stub_broker.join(queue, fail_fast=False)
    statements.on = False
    assert statements.seen == []
    assert (sorted(done), len(tries)) == ([0, 1, 2], 3)
    assert all("flexiq_recorded" not in m.options for m in sent)
    assert sqlite_store.list_runs() == []
    assert sqlite_store.durable_tasks() == []
    assert [m.actor_name for m in stub_broker.dead_letters] == ["failing"]  # Dramatiq's own dead letter


def test_c43_an_actor_that_opts_out_is_sent_as_without_the_middleware(
    stub_broker: dramatiq.Broker, queue: str, sqlite_store: SqlStepStore, start_worker: Callable[..., dramatiq.Worker]
) -> None:
    """C43: a ``durable=False`` actor's message gets no run key, no resume mark and no record, even when the
    actor is known to take steps; a key the producer put on it is left as it is."""
    stub_broker.add_middleware(DurableSteps(store=sqlite_store, recovery=False), before=Retries)
    sqlite_store.note_durable_task("opted", "dramatiq")
    done: list[int] = []

    @dramatiq.actor(broker=stub_broker, queue_name=queue, durable=False)
    def opted(n: int) -> None:
        done.append(n)

    start_worker(stub_broker)
    plain = opted.send(1)
    keyed = opted.send_with_options(args=(2,), flexiq_run_key="order-1")
    stub_broker.join(queue)
    assert plain.options == {}
    assert keyed.options == {"flexiq_run_key": "order-1"}
    assert sorted(done) == [1, 2]
    assert sqlite_store.list_runs() == []


def test_c44_a_group_of_opted_out_actors_gives_its_completion_callback_a_derived_key(
    stub_broker: dramatiq.Broker, queue: str, sqlite_store: SqlStepStore
) -> None:
    """C43, C44: an opted-out member's message gets no ``flexiq_*`` option of its own, but the group's
    completion callback it carries gets the key derived from the group, as a durable member's would."""
    from dramatiq import group

    stub_broker.add_middleware(DurableSteps(store=sqlite_store, recovery=False), before=Retries)
    stub_broker.add_middleware(GroupCallbacks(StubBackend()))

    @dramatiq.actor(broker=stub_broker, queue_name=queue, durable=False)
    def part(n: int) -> None:
        """An opted-out member."""

    @dramatiq.actor(broker=stub_broker, queue_name=queue)
    def summary(tag: str) -> None:
        """A durable completion callback."""

    members = group([part.message(1), part.message(2)])
    members.add_completion_callback(summary.message("g"))
    members.run()
    sent = stub_broker.queues[queue].queue
    options = [Message.decode(raw).options for raw in sent]
    assert len(options) == 2
    for own in options:
        assert not [name for name in own if name.startswith("flexiq_")], own
        (callback,) = own["group_completion_callbacks"]
        assert callback["options"]["flexiq_run_key"].endswith("/group/0")


def test_c43_once_an_actor_took_a_step_its_messages_are_recorded_and_a_lost_one_is_recovered(
    stub_broker: dramatiq.Broker, queue: str, sqlite_store: SqlStepStore, start_worker: Callable[..., dramatiq.Worker]
) -> None:
    """C43, C39: the first message of an actor not known yet is not recorded; its first step notes the actor;
    the next message is recorded at enqueue, so when the broker loses it recovery re-publishes it."""
    stub_broker.add_middleware(DurableSteps(store=sqlite_store, recovery=False), before=Retries)
    labels: list[str] = []

    @dramatiq.actor(broker=stub_broker, queue_name=queue)
    def ship(order: str) -> None:
        labels.append(current_job.step.run("label", lambda: f"label {order}"))

    first = ship.send("A-0")
    assert "flexiq_recorded" not in first.options
    worker = start_worker(stub_broker)
    stub_broker.join(queue)
    worker.join()
    assert [(t.framework, t.name) for t in sqlite_store.durable_tasks()] == [("dramatiq", "ship")]
    worker.stop()

    sent = ship.send("A-1")
    assert sent.options["flexiq_recorded"] is True
    assert sqlite_store.get_run(sent.options["flexiq_run_key"]).status == "queued"
    stub_broker.flush(queue)  # the broker loses it
    report = operations.recover(sqlite_store, operations.publishers_for(stub_broker), grace=0, queued_after=0)
    assert [job_id for _, job_id in report.recovered] == [sent.message_id]
    start_worker(stub_broker)
    stub_broker.join(queue)
    assert labels == ["label A-0", "label A-1"]
    assert sqlite_store.get_run(sent.options["flexiq_run_key"]).status == "succeeded"


def test_c43_an_actor_declared_durable_is_recorded_from_its_first_message(
    stub_broker: dramatiq.Broker, queue: str, sqlite_store: SqlStepStore
) -> None:
    """C43, C39: ``durable=True`` needs no store read: the actor's very first message is recorded ``queued``."""
    stub_broker.add_middleware(DurableSteps(store=sqlite_store, recovery=False), before=Retries)

    @dramatiq.actor(broker=stub_broker, queue_name=queue, durable=True)
    def declared() -> None: ...

    sent = declared.send()
    assert sent.options["flexiq_recorded"] is True
    assert sqlite_store.get_run(sent.options["flexiq_run_key"]).status == "queued"


def _shutdown_of_a_step_less_actor(
    broker: StubBroker, queue: str, statements: Statements | None = None
) -> tuple[list[str], list[str], int]:
    """Run an actor that takes no step until a worker shutdown interrupts it; return what happened.

    The actor notes its start, waits until Dramatiq's ``Shutdown`` interrupts it, notes that and lets it
    propagate. Returns the notes, the actor names in the broker's dead letters, and the messages left in
    the queue (and its delay queue) once the worker has stopped.
    """
    notes: list[str] = []
    started = threading.Event()

    @dramatiq.actor(broker=broker, queue_name=queue, notify_shutdown=True, max_retries=0)
    def long_running() -> None:
        notes.append("started")
        started.set()
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # short sleeps: the interruption lands between two of them
                time.sleep(0.01)
        except Shutdown:
            notes.append("interrupted")
            raise

    worker = dramatiq.Worker(broker, worker_threads=1, worker_timeout=100)
    worker.start()
    if statements is not None:
        statements.on = True  # from the job on: the worker's start reaches the store once (C41)
    try:
        long_running.send()
        assert started.wait(10), "the actor never started"
    finally:
        worker.stop(timeout=10_000)
        if statements is not None:
            statements.on = False
    left = sum(broker.queues[name].qsize() for name in (queue, f"{queue}.DQ") if name in broker.queues)
    return notes, [m.actor_name for m in broker.dead_letters], left


def test_c43_a_worker_shutdown_ends_a_step_less_actor_as_dramatiq_does_without_the_middleware(
    queue: str, sqlite_store: SqlStepStore
) -> None:
    """C43, C38: ``Shutdown`` interrupts an actor that took no step: the middleware hands Dramatiq its own
    ``Shutdown``, so the message fails as it does without the middleware (here to the dead letters, no retry
    left) and is not put back to run the whole body again; nothing is written to the store. The same
    scenario on a broker without the middleware is the reference."""
    plain = StubBroker()  # its default middleware includes ShutdownNotifications
    plain.emit_after("process_boot")
    with_middleware = StubBroker()
    with_middleware.add_middleware(DurableSteps(store=sqlite_store, recovery=False), before=Retries)
    with_middleware.emit_after("process_boot")
    statements = Statements(sqlite_store.engine)

    reference = _shutdown_of_a_step_less_actor(plain, queue)
    observed = _shutdown_of_a_step_less_actor(with_middleware, queue, statements)

    assert reference == (["started", "interrupted"], ["long_running"], 0)
    assert observed == reference
    # the first enqueue of the process reads the known actors (one read, in its own transaction); nothing else
    assert [s for s in statements.seen if "known_tasks" not in s and s != "BEGIN"] == []
    assert sqlite_store.list_runs() == []
