"""A duplicate of a finished run replays its outcome through Dramatiq's own path (C37).

A message whose run is already finished (a redelivery after the worker died
between the store's end of the run and Dramatiq's result, or a new message
published with a finished run's key) does not run the actor's body: the
actor call returns the stored value, so ``Results`` stores it and a
pipeline (``|``) goes on; or it raises the stored error, which ``Retries``
fails at once (no retry of a delivery that would only replay it again), so
``Results`` stores the error and the message goes to the dead-letter queue.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import dramatiq
import pytest
from dq_support import dead_letter_count, wait_until
from dramatiq.results import ResultFailure, Results
from dramatiq.results.backends import RedisBackend

from dramatiq_ext import RUN_KEY_OPTION, DurableSteps
from flexiq_plugins import current_job
from flexiq_plugins._store.base import StepStore

REDIS = ("Redis", "127.0.0.1", 6379)

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]


@pytest.fixture
def results(broker: dramatiq.Broker, namespace: str, sqlite_store: StepStore, require_service: Any) -> RedisBackend:
    """A Redis ``Results`` backend and the durable-steps middleware on the test's broker."""
    require_service(*REDIS)
    backend = RedisBackend(host=REDIS[1], port=REDIS[2], namespace=f"{namespace}:results")
    broker.add_middleware(Results(backend=backend))
    broker.add_middleware(DurableSteps(store=sqlite_store))
    return backend


def test_c37_dramatiq_a_message_with_a_finished_runs_key_returns_its_value_to_results_and_the_pipeline(
    broker: dramatiq.Broker,
    queue: str,
    results: RedisBackend,
    sqlite_store: StepStore,
    start_worker: Callable[..., dramatiq.Worker],
) -> None:
    """C37: a second message with a succeeded run's key: ``get_result`` is the stored 21, and ``total | double`` is 42.

    The body ran once; before, the message was acknowledged without a
    result, so ``get_result(block=True)`` timed out and the pipeline stopped.
    """
    ran: list[int] = []

    @dramatiq.actor(broker=broker, queue_name=queue, store_results=True)
    def total(x: int) -> int:
        ran.append(x)
        return int(current_job.step.run("add", lambda: x + 1))

    @dramatiq.actor(broker=broker, queue_name=queue, store_results=True)
    def double(x: int) -> int:
        return x * 2

    start_worker(broker)
    first = total.send(20)
    run_key = first.options[RUN_KEY_OPTION]
    assert first.get_result(backend=results, block=True, timeout=20_000) == 21
    again = total.message_with_options(args=(99,), **{RUN_KEY_OPTION: run_key})
    broker.enqueue(again)
    assert again.get_result(backend=results, block=True, timeout=20_000) == 21
    piped = total.message_with_options(args=(99,), **{RUN_KEY_OPTION: run_key}) | double.message()
    piped.run()
    assert piped.get_result(block=True, timeout=20_000) == 42
    assert ran == [20]
    assert sqlite_store.get_run(run_key).attempt == 1


def test_c37_dramatiq_a_message_with_a_failed_runs_key_stores_its_error_and_is_not_retried(  # noqa: PLR0917
    broker: dramatiq.Broker,
    queue: str,
    namespace: str,
    results: RedisBackend,
    sqlite_store: StepStore,
    start_worker: Callable[..., dramatiq.Worker],
) -> None:
    """C37: a new message with a failed run's key: ``Results`` stores the same ``ValueError``; it is not retried.

    The message allows retries (``max_retries=3``), yet the replayed error
    is failed at once: the message is in the dead-letter queue beside the
    first one (a retry would have gone to the delay queue), and the body ran
    exactly once.
    """
    ran: list[str] = []

    @dramatiq.actor(broker=broker, queue_name=queue, store_results=True, max_retries=0)
    def declines(label: str) -> None:
        ran.append(label)
        current_job.step.run("reserve", lambda: "r-1")
        raise ValueError(f"card declined for {label}")

    start_worker(broker)
    first = declines.send("a-1")
    with pytest.raises(ResultFailure, match="card declined for a-1"):
        first.get_result(backend=results, block=True, timeout=20_000)
    run_key = first.options[RUN_KEY_OPTION]
    wait_until(lambda: dead_letter_count(broker, queue, namespace) == 1, what="the first message dead-lettered")
    again = declines.message_with_options(args=("a-2",), max_retries=3, **{RUN_KEY_OPTION: run_key})
    broker.enqueue(again)
    with pytest.raises(ResultFailure, match="card declined for a-1") as replayed:
        again.get_result(backend=results, block=True, timeout=20_000)
    assert replayed.value.orig_exc_type == "ValueError"
    wait_until(lambda: dead_letter_count(broker, queue, namespace) == 2, what="the replay failed, not retried")
    assert ran == ["a-1"]
    assert sqlite_store.get_run(run_key).status == "failed"
