"""Duplicate deliveries on Dramatiq: never two bodies at once, never a body after the end (C24, C26)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import dramatiq
from dq_support import status_of, wait_until
from dramatiq.middleware import Middleware

from dramatiq_ext import RUN_KEY_OPTION, DurableSteps
from flexiq_plugins import current_job
from flexiq_plugins._store.base import StepStore


class _Observer(Middleware):
    """Records enqueue delays and skipped messages (a real middleware, for observing the worker)."""

    def __init__(self) -> None:
        self.delays: list[int | None] = []
        self.skipped = 0

    def before_enqueue(self, broker: dramatiq.Broker, message: Any, delay: int | None) -> None:
        self.delays.append(delay)

    def after_skip_message(self, broker: dramatiq.Broker, message: Any) -> None:
        self.skipped += 1


def test_c24_same_message_delivered_twice_at_once_runs_the_body_once(
    broker: dramatiq.Broker,
    queue: str,
    sqlite_store: StepStore,
    start_worker: Callable[..., dramatiq.Worker],
) -> None:
    """Two copies of one message in flight together: the second is put back (busy), then acknowledged.

    The second copy is skipped twice: once put back while the first holds the
    claim (C24), once acknowledged without running after the run succeeded (C26).
    The body blocks until the second copy has been put back with a delay, so
    both deliveries really overlap; the body runs once and the run succeeds.
    """
    seen = _Observer()
    broker.add_middleware(seen)
    broker.add_middleware(DurableSteps(store=sqlite_store, busy_retry_seconds=0.2))
    release = threading.Event()
    calls: list[str] = []

    @dramatiq.actor(broker=broker, queue_name=queue)
    def slow(order_id: str) -> None:
        calls.append(current_job.job_id)
        assert release.wait(10)
        current_job.step.run("charge", lambda: order_id)

    start_worker(broker, worker_threads=2)
    message = broker.enqueue(slow.message("o-1"))
    broker.enqueue(message)  # the same message id and run key: a duplicate delivery
    wait_until(lambda: any(d is not None for d in seen.delays), what="the busy copy to be put back")
    release.set()
    wait_until(lambda: status_of(sqlite_store, message.options[RUN_KEY_OPTION]) == "succeeded", what="success")
    wait_until(lambda: seen.skipped == 2, what="the busy copy, then the duplicate, to be acknowledged")

    assert calls == [message.message_id]
    assert next(d for d in seen.delays if d is not None) <= 200


def test_c26_redelivery_of_a_finished_run_is_acknowledged_without_running(
    stub_broker: dramatiq.Broker,
    queue: str,
    sqlite_store: StepStore,
    start_worker: Callable[..., dramatiq.Worker],
) -> None:
    """A message delivered again after its run succeeded is acknowledged; the body is not called."""
    stub_broker.add_middleware(DurableSteps(store=sqlite_store))
    calls: list[int] = []

    @dramatiq.actor(broker=stub_broker, queue_name=queue)
    def once() -> None:
        calls.append(1)

    start_worker(stub_broker)
    message = once.send()
    stub_broker.join(queue, fail_fast=True, timeout=10_000)
    stub_broker.enqueue(message)
    stub_broker.join(queue, fail_fast=True, timeout=10_000)

    assert calls == [1]
    assert status_of(sqlite_store, message.options[RUN_KEY_OPTION]) == "succeeded"
