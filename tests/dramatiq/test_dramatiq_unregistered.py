"""Dramatiq: a durable job sent for an actor the worker does not have is dead-lettered, not left ``queued``
(C30, C39).

A real worker consumes the queue (it has another actor on it) and receives a
message for an actor it does not declare: Dramatiq logs ``Received message for
undefined actor`` and rejects the message to the queue's dead-letter queue, as
it does without the middleware. The run recorded at publish is dead-lettered
once with the reason ``unregistered_task``, recovery leaves it alone, and a
dead-letter retry runs it once the worker has the actor.
"""

from __future__ import annotations

from collections.abc import Callable

import dramatiq
from dq_support import dead_letter_count, status_of, wait_until

from dramatiq_ext import RUN_KEY_OPTION, DurableSteps
from flexiq_plugins import current_job, operations
from flexiq_plugins._store.base import StepStore


def _send(broker: dramatiq.Broker, queue: str, actor_name: str, *args: object, **options: object) -> str:
    """Enqueue a message for ``actor_name`` as a producer that declares it would; return its run key."""
    message: dramatiq.Message[object] = dramatiq.Message(
        queue_name=queue, actor_name=actor_name, args=args, kwargs={}, options=dict(options)
    )
    return str(broker.enqueue(message).options[RUN_KEY_OPTION])


def test_c39_a_job_of_an_undeclared_actor_is_dead_lettered_once_and_retried_once_deployed(
    broker: dramatiq.Broker,
    queue: str,
    namespace: str,
    sqlite_store: StepStore,
    start_worker: Callable[..., dramatiq.Worker],
) -> None:
    """C39, C30: a message for a misspelt actor records the run ``queued``; recovery publishes a copy (an
    actor it does not have either) before any worker runs. The worker rejects both to the dead-letter queue
    as usual and the run becomes ``dead`` with one dead letter (reason ``unregistered_task``, naming the
    actor and the worker's closest actor). Recovery no longer re-publishes it; a retry before the actor is
    deployed is dead-lettered again; once the actor is declared, a retry runs it under the same run key."""
    broker.add_middleware(DurableSteps(store=sqlite_store, recovery=False))
    ran: list[str] = []

    @dramatiq.actor(broker=broker, queue_name=queue)
    def checkout(order: str) -> None:
        ran.append(f"checkout {order}")

    sqlite_store.note_durable_task("chekcout", "dramatiq")  # C43: a name known to take steps (an earlier deploy's)
    run_key = _send(broker, queue, "chekcout", "A-1")
    assert status_of(sqlite_store, run_key) == "queued"
    publishers = operations.publishers_for(broker)
    copied = operations.recover(sqlite_store, publishers, grace=0, queued_after=0)  # before any worker runs
    assert [s.run.run_key for s, _ in copied.recovered] == [run_key]
    start_worker(broker)
    wait_until(lambda: status_of(sqlite_store, run_key) == "dead", 30, "the run to be dead-lettered")
    wait_until(lambda: dead_letter_count(broker, queue, namespace) == 2, 30, "Dramatiq's own dead letters")

    [dead] = sqlite_store.list_dead_letters(task_name="chekcout")
    assert (dead.run_key, dead.reason, dead.envelope.args) == (run_key, "unregistered_task", ["A-1"])
    assert "does not have the actor 'chekcout' (did you mean 'checkout'?)" in dead.message

    report = operations.recover(sqlite_store, operations.publishers_for(broker), grace=0, queued_after=0, stale_after=0)
    assert report.recovered == []
    assert status_of(sqlite_store, run_key) == "dead"

    operations.retry_dead_letter(sqlite_store, dead.id, publishers)  # too early: the actor is not deployed yet
    wait_until(sqlite_store.list_dead_letters, 30, "the early retry to be dead-lettered again")
    [again] = sqlite_store.list_dead_letters()
    assert (again.run_key, again.reason) == (run_key, "unregistered_task")
    assert status_of(sqlite_store, run_key) == "dead"

    @dramatiq.actor(broker=broker, queue_name=queue, actor_name="chekcout")
    def deployed(order: str) -> None:
        ran.append(f"deployed {order}")

    operations.retry_dead_letter(sqlite_store, again.id, publishers)
    wait_until(lambda: status_of(sqlite_store, run_key) == "succeeded", 30, "the retried run to succeed")
    assert ran == ["deployed A-1"]
    assert len(sqlite_store.list_dead_letters(include_retried=True)) == 2


def test_c39_a_late_copy_at_a_worker_without_the_actor_leaves_a_started_run_alone(
    stub_broker: dramatiq.Broker,
    queue: str,
    sqlite_store: StepStore,
    start_worker: Callable[..., dramatiq.Worker],
) -> None:
    """C39, C25: the run of a job that ran and succeeded is not dead-lettered when a copy of its message
    (same run key) reaches a worker without the actor; a job of that actor whose run is still ``queued`` is."""
    stub_broker.add_middleware(DurableSteps(store=sqlite_store, recovery=False))

    @dramatiq.actor(broker=stub_broker, queue_name=queue, durable=True)  # recorded from its first job (C43)
    def ship(order: str) -> str:
        return order

    sqlite_store.note_durable_task("gone", "dramatiq")  # C43: known to take steps, gone from the worker
    done = ship.send("B-2").options[RUN_KEY_OPTION]
    start_worker(stub_broker)
    wait_until(lambda: status_of(sqlite_store, done) == "succeeded", 30, "the run to succeed")
    _send(stub_broker, queue, "gone", **{RUN_KEY_OPTION: done})
    fresh = _send(stub_broker, queue, "gone")
    stub_broker.join(queue, fail_fast=False, timeout=30_000)
    assert len(stub_broker.dead_letters_by_queue[queue]) == 2  # Dramatiq rejected both, as it always does
    assert status_of(sqlite_store, done) == "succeeded"
    assert [(d.run_key, d.reason) for d in sqlite_store.list_dead_letters()] == [(fresh, "unregistered_task")]


def test_c39_a_retried_dead_letter_of_a_started_run_is_dead_lettered_again_by_a_worker_without_the_actor(
    stub_broker: dramatiq.Broker,
    queue: str,
    sqlite_store: StepStore,
    start_worker: Callable[..., dramatiq.Worker],
) -> None:
    """C39, C30: a run that ran (one step committed) and was dead-lettered is retried after its actor was
    removed from the workers: the worker rejects the retried message as usual, and the run, which no attempt
    started since the retry, is dead-lettered again (``unregistered_task``) instead of staying ``pending``."""
    stub_broker.add_middleware(DurableSteps(store=sqlite_store, recovery=False))
    charged: list[str] = []

    @dramatiq.actor(broker=stub_broker, queue_name=queue, max_retries=5)
    def order(order_id: str) -> None:
        current_job.step.run("charge", lambda: charged.append(order_id))
        current_job.step.run("x" * 300, lambda: None)  # an invalid name: dead-lettered (C2, C29)

    @dramatiq.actor(broker=stub_broker, queue_name=queue)
    def ping() -> None:  # the worker keeps consuming the queue once ``order`` is gone
        pass

    start_worker(stub_broker)
    run_key = order.send("o-1").options[RUN_KEY_OPTION]
    stub_broker.join(queue, fail_fast=False, timeout=10_000)
    [first] = sqlite_store.list_dead_letters()
    assert (first.run_key, sqlite_store.get_run(run_key).attempt, charged) == (run_key, 1, ["o-1"])

    del stub_broker.actors["order"]  # a deploy that dropped the actor
    operations.retry_dead_letter(sqlite_store, first.id, operations.publishers_for(stub_broker))
    stub_broker.join(queue, fail_fast=False, timeout=10_000)

    assert status_of(sqlite_store, run_key) == "dead"
    [again] = sqlite_store.list_dead_letters()
    assert (again.run_key, again.reason) == (run_key, "unregistered_task")
    assert "does not have the actor 'order'" in again.message
    assert len(stub_broker.dead_letters_by_queue[queue]) == 2  # Dramatiq's own reject, both times
    assert (sqlite_store.get_run(run_key).attempt, charged) == (1, ["o-1"])
