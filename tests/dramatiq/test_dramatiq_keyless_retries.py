"""A message published without a run key (by a producer without the middleware, or one that declares the
actor ``durable=False``) whose worker's actor is durable: its retries keep its run (C11, C23).

Real Redis, two brokers on one namespace (the producer's and the worker's), a real worker, a real store.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import dramatiq
import pytest
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import Retries

from dramatiq_ext import DurableSteps
from flexiq_plugins import current_job
from flexiq_plugins._store.base import StepStore
from tests.dramatiq.conftest import REDIS, _cleanup
from tests.dramatiq.dq_support import wait_until


@pytest.fixture
def two_brokers(
    namespace: str, queue: str, require_service: Callable[[str, str, int], None]
) -> Iterator[tuple[dramatiq.Broker, dramatiq.Broker]]:
    require_service(*REDIS)
    producer = RedisBroker(host=REDIS[1], port=REDIS[2], namespace=namespace)
    worker = RedisBroker(host=REDIS[1], port=REDIS[2], namespace=namespace)
    worker.emit_after("process_boot")
    try:
        yield producer, worker
    finally:
        _cleanup(worker, namespace, queue)
        producer.close()
        worker.close()


@pytest.mark.parametrize("producer_has_middleware", [True, False], ids=["opted_out_producer", "plain_producer"])
def test_c11_a_retry_of_a_message_without_a_run_key_continues_its_run(
    two_brokers: tuple[dramatiq.Broker, dramatiq.Broker],
    queue: str,
    sqlite_store: StepStore,
    start_worker: Callable[..., dramatiq.Worker],
    producer_has_middleware: bool,
) -> None:
    """C11/C23: the retry of an attempt that committed a step continues its run: the step is a memo hit,
    its idempotency key is the same."""
    producer, worker_broker = two_brokers
    if producer_has_middleware:
        producer.add_middleware(DurableSteps(store=sqlite_store, recovery=False), before=Retries)
    worker_broker.add_middleware(DurableSteps(store=sqlite_store, recovery=False), before=Retries)
    side_effects: list[str] = []
    attempts: list[int] = []

    opted_out = {"durable": False} if producer_has_middleware else {}

    @dramatiq.actor(broker=producer, actor_name="work", queue_name=queue, **opted_out)
    def work_on_producer(n: int) -> None:  # the producer's declaration: not durable
        raise AssertionError("runs on the worker only")

    @dramatiq.actor(broker=worker_broker, actor_name="work", queue_name=queue, min_backoff=10, max_backoff=10)
    def work(n: int) -> None:
        def charge() -> str:
            side_effects.append(current_job.step.idempotency_key)
            return "charged"

        current_job.step.run("charge", charge)
        attempts.append(n)
        if len(attempts) == 1:
            raise ValueError("transient")

    start_worker(worker_broker)
    work_on_producer.send(1)
    wait_until(lambda: len(attempts) == 2, timeout=20, what="the first attempt and its retry")
    assert len(side_effects) == 1, f"the step ran again on the retry, under new keys: {side_effects}"
