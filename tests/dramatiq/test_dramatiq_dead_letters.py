"""Dead letters, failed runs and store outages on Dramatiq (C26, C28–C30).

A divergence on real brokers is in the adapter conformance suite (``tests/conformance``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import dramatiq
from dq_support import status_of, wait_until
from dramatiq.middleware import Middleware, SkipMessage

import flexiq_plugins
from dramatiq_ext import RUN_KEY_OPTION, DurableSteps, republish
from flexiq_plugins import current_job
from flexiq_plugins._store.base import StepStore


def test_c26_run_settled_failed_when_retries_are_exhausted(
    stub_broker: dramatiq.Broker,
    queue: str,
    sqlite_store: StepStore,
    start_worker: Callable[..., dramatiq.Worker],
) -> None:
    """When the Retries middleware gives up, the run is ``failed`` in the store; each retry ran the body."""
    stub_broker.add_middleware(DurableSteps(store=sqlite_store))
    calls: list[int] = []

    @dramatiq.actor(broker=stub_broker, queue_name=queue, max_retries=2, min_backoff=10, max_backoff=20)
    def flaky() -> None:
        calls.append(current_job.attempt)
        raise ValueError("always")

    start_worker(stub_broker)
    run_key = flaky.send().options[RUN_KEY_OPTION]
    stub_broker.join(queue, fail_fast=False, timeout=10_000)

    assert calls == [1, 2, 3]
    assert status_of(sqlite_store, run_key) == "failed"
    assert len(stub_broker.dead_letters_by_queue[queue]) == 1


class _Enqueues(Middleware):
    """Records every enqueue (a real middleware, for observing the broker)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any], int | None]] = []

    def before_enqueue(self, broker: dramatiq.Broker, message: Any, delay: int | None) -> None:
        self.seen.append((message.message_id, dict(message.options), delay))


def test_c28_store_outage_is_retried_even_with_max_retries_zero(
    stub_broker: dramatiq.Broker, queue: str, start_worker: Callable[..., dramatiq.Worker]
) -> None:
    """A store that cannot be reached re-enqueues the message whatever ``max_retries`` says.

    The store is a PostgreSQL URL on a closed port: a real connection refusal,
    met by the actor's first step (its claim, C23). The retry does not use the
    Retries budget (``retries`` stays unset) and the step never runs.
    """
    enqueues = _Enqueues()
    stub_broker.add_middleware(enqueues)
    stub_broker.add_middleware(DurableSteps(store="postgresql+psycopg://postgres@127.0.0.1:9/none"))
    calls: list[int] = []

    @dramatiq.actor(broker=stub_broker, queue_name=queue, max_retries=0)
    def unlucky() -> None:
        current_job.step.run("once", lambda: calls.append(1))

    start_worker(stub_broker)
    sent = unlucky.send()
    again = wait_until(lambda: [e for e in enqueues.seen if e[2] is not None], what="the outage re-enqueue")

    message_id, options, delay = again[0]
    assert message_id == sent.message_id
    assert "retries" not in options
    assert delay == 5000  # store_retry_seconds: 5 s, the core's decision for an outage
    assert calls == []
    assert stub_broker.dead_letters_by_queue[queue] == []


def test_c30_c35_republish_from_the_stored_envelope_keeps_the_run_key(
    stub_broker: dramatiq.Broker,
    queue: str,
    sqlite_store: StepStore,
    start_worker: Callable[..., dramatiq.Worker],
) -> None:
    """A dead-lettered run re-published from its stored envelope gets a new message id, the same run key.

    The envelope holds the actor, queue, arguments and options (C35).
    Its committed step replays from the store (not called again) with the
    same idempotency key (C11), and the run then succeeds.
    """
    stub_broker.add_middleware(DurableSteps(store=sqlite_store))
    keys: list[str] = []
    fixed: list[bool] = []

    @dramatiq.actor(broker=stub_broker, queue_name=queue, max_retries=5)
    def order(order_id: str, *, amount: int) -> None:
        step = current_job.step
        step.run("charge", lambda: keys.append(step.idempotency_key))
        if not fixed:
            step.run("x" * 300, lambda: None)  # an invalid name: dead-lettered (C2, C29)

    start_worker(stub_broker)
    first = order.send("o-9", amount=3)
    stub_broker.join(queue, fail_fast=False, timeout=10_000)
    (dead,) = sqlite_store.list_dead_letters()
    assert dead.envelope.args == ["o-9"]
    assert dead.envelope.kwargs == {"amount": 3}

    fixed.append(True)
    sqlite_store.prepare_retry(dead.id)
    again = republish(stub_broker, dead.envelope, dead.run_key)
    stub_broker.join(queue, fail_fast=False, timeout=10_000)

    assert again.message_id != first.message_id
    assert again.options[RUN_KEY_OPTION] == first.options[RUN_KEY_OPTION]
    assert status_of(sqlite_store, dead.run_key) == "succeeded"
    assert keys == [f"{dead.run_key}:charge#0"]


def test_c20_c21_signals_pass_except_exception_and_swallowing_them_dead_letters(
    stub_broker: dramatiq.Broker,
    queue: str,
    sqlite_store: StepStore,
    start_worker: Callable[..., dramatiq.Worker],
) -> None:
    """``except Exception`` does not catch a sleep (C20); ``except BaseException`` that returns is dead-lettered (C21).

    Dramatiq's worker never sees a step signal: the swallowing job is failed
    to the ``.XQ`` queue with reason ``swallowed_signal``, without a retry.
    """
    stub_broker.add_middleware(DurableSteps(store=sqlite_store))
    woke: list[str] = []

    @dramatiq.actor(broker=stub_broker, queue_name=queue, max_retries=20)
    def polite() -> None:
        try:
            current_job.step.sleep("500ms")
        except Exception:  # a sleep is not an error: this does not catch it
            woke.append("caught")
        woke.append("after sleep")

    @dramatiq.actor(broker=stub_broker, queue_name=queue, max_retries=20)
    def greedy() -> None:
        try:
            current_job.step.sleep("500ms")
        except BaseException:
            woke.append("swallowed")

    start_worker(stub_broker)
    polite.send()
    greedy.send()
    stub_broker.join(queue, fail_fast=False, timeout=10_000)

    assert sorted(woke) == ["after sleep", "swallowed"]
    (dead,) = sqlite_store.list_dead_letters()
    assert (dead.task_name, dead.reason) == ("greedy", "swallowed_signal")
    assert len(stub_broker.dead_letters_by_queue[queue]) == 1


def test_c30_except_dead_lettered_catches_what_dramatiq_raises_for_a_dead_letter(
    stub_broker: dramatiq.Broker,
    queue: str,
    sqlite_store: StepStore,
    start_worker: Callable[..., dramatiq.Worker],
) -> None:
    """What a durable actor call raises for a dead letter is caught by ``except flexiq_plugins.DeadLettered``
    (one error for a dead letter on every adapter, C30), and is still Dramatiq's ``SkipMessage``: no retry,
    the message is failed onto the dead-letter queue. Its message starts with the reason kind."""
    stub_broker.add_middleware(DurableSteps(store=sqlite_store))

    @dramatiq.actor(broker=stub_broker, queue_name=queue, max_retries=5)
    def bad_name() -> None:
        current_job.step.run("x" * 300, lambda: None)  # an invalid name: dead-lettered (C2, C29)

    raised: list[BaseException] = []
    durable = bad_name.fn

    @functools.wraps(durable)
    def watched(*args: Any, **kwargs: Any) -> Any:
        try:
            return durable(*args, **kwargs)
        except BaseException as exc:  # what the worker receives from the actor call
            raised.append(exc)
            raise

    bad_name.fn = watched
    start_worker(stub_broker)
    bad_name.send()
    stub_broker.join(queue, fail_fast=False, timeout=10_000)

    (error,) = raised
    caught: flexiq_plugins.DeadLettered | None = None
    try:
        raise error
    except flexiq_plugins.DeadLettered as exc:
        caught = exc
    assert caught is not None
    assert str(caught).startswith("invalid_step_name: ")
    assert isinstance(error, SkipMessage)
    assert len(stub_broker.dead_letters_by_queue[queue]) == 1
    assert [d.reason for d in sqlite_store.list_dead_letters()] == ["invalid_step_name"]
