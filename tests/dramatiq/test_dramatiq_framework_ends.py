"""When Dramatiq itself ends, skips or interrupts a durable job, the store agrees; a waiter gets an answer (C38, C45).

Time limits inside a step and worker shutdowns, which need worker
processes, are in the adapter conformance suite
(``tests/conformance/test_conformance_framework_ends.py``); here are the
paths only Dramatiq has: the ``Results`` middleware, ``AgeLimit`` and other
middleware skips, and a time limit that strikes while a sleep's hand-off
waits for the broker.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import dramatiq
import pytest
from dq_support import status_of, wait_until
from dramatiq.errors import ConnectionClosed
from dramatiq.middleware import CurrentMessage, Middleware, SkipMessage
from dramatiq.results import ResultFailure, ResultMissing, Results
from dramatiq.results.backends import RedisBackend

from dramatiq_ext import RUN_KEY_OPTION, DurableSteps
from flexiq_plugins import current_job
from flexiq_plugins._store.base import StepStore
from flexiq_plugins.operations import cancel_run, find_stranded, publishers_for

REDIS = ("Redis", "127.0.0.1", 6379)

pytestmark = pytest.mark.timeout(120)


def stranded(store: StepStore) -> set[str]:
    """Run keys recovery would re-publish now, with no grace at all."""
    return {s.run.run_key for s in find_stranded(store, grace=0, stale_after=0)}


def test_c39_a_result_waiter_gets_the_value_of_the_attempt_after_the_sleep(  # noqa: PLR0917 - fixtures
    broker: dramatiq.Broker,
    queue: str,
    namespace: str,
    sqlite_store: StepStore,
    start_worker: Callable[..., dramatiq.Worker],
    require_service: Callable[[str, str, int], None],
) -> None:
    """C39: ``store_results=True``: a step, a 1 s sleep, then ``return 42``; the waiter gets 42.

    While the job sleeps no result exists (the first attempt's skip stored
    no ``None``), and ``get_result(block=True)`` returns the value of the
    attempt that completed after the wake-up.
    """
    require_service(*REDIS)
    backend = RedisBackend(host=REDIS[1], port=REDIS[2], namespace=f"{namespace}:results")
    broker.add_middleware(Results(backend=backend))
    broker.add_middleware(DurableSteps(store=sqlite_store))

    @dramatiq.actor(broker=broker, queue_name=queue, store_results=True)
    def answer() -> int:
        step = current_job.step
        base = step.run("base", lambda: 40)
        step.sleep("1s")
        return base + 2

    start_worker(broker)
    message = answer.send()
    run_key = message.options[RUN_KEY_OPTION]
    wait_until(lambda: status_of(sqlite_store, run_key) == "sleeping", what="the job to sleep")
    with pytest.raises(ResultMissing):
        message.get_result(backend=backend)
    assert message.get_result(backend=backend, block=True, timeout=20_000) == 42
    assert sqlite_store.get_run(run_key).status == "succeeded"


def test_c38_a_sleeping_job_its_age_limit_drops_fails_its_run(
    broker: dramatiq.Broker, queue: str, sqlite_store: StepStore, start_worker: Callable[..., dramatiq.Worker]
) -> None:
    """C38: ``AgeLimit`` fails the next hop of a job that slept past its ``max_age``; the run is ``failed``.

    The body after the sleep never runs, and recovery does not count the run
    as stranded once its wake time is past.
    """
    broker.add_middleware(DurableSteps(store=sqlite_store))
    after: list[str] = []

    @dramatiq.actor(broker=broker, queue_name=queue, max_age=1500, max_retries=0)
    def late() -> None:
        step = current_job.step
        step.run("before", lambda: 1)
        step.sleep("2s")
        after.append(current_job.run_key)

    start_worker(broker)
    run_key = late.send().options[RUN_KEY_OPTION]
    wait_until(
        lambda: status_of(sqlite_store, run_key) not in (None, "queued", "running", "sleeping"), what="the run to end"
    )
    assert status_of(sqlite_store, run_key) == "failed"
    assert run_key not in stranded(sqlite_store)
    assert after == []


class _SkipWakeUps(Middleware):
    """Skips (without failing) every delivery of a run the store says is sleeping: a user's own middleware."""

    def __init__(self, store: StepStore) -> None:
        self.store = store

    def before_process_message(self, broker: dramatiq.Broker, message: Any) -> None:
        if status_of(self.store, message.options.get(RUN_KEY_OPTION, "")) == "sleeping":
            raise SkipMessage("not today")


def test_c38_a_sleeping_job_another_middleware_skips_is_cancelled(
    broker: dramatiq.Broker, queue: str, sqlite_store: StepStore, start_worker: Callable[..., dramatiq.Worker]
) -> None:
    """C38: a middleware skips a sleeping job's wake-up (acknowledged, not failed); the run is ``cancelled``."""
    broker.add_middleware(DurableSteps(store=sqlite_store))
    broker.add_middleware(_SkipWakeUps(sqlite_store))
    after: list[str] = []

    @dramatiq.actor(broker=broker, queue_name=queue)
    def nap() -> None:
        current_job.step.sleep("200ms")
        after.append(current_job.run_key)

    start_worker(broker)
    run_key = nap.send().options[RUN_KEY_OPTION]
    wait_until(
        lambda: status_of(sqlite_store, run_key) not in (None, "queued", "running", "sleeping"), what="the run to end"
    )
    assert status_of(sqlite_store, run_key) == "cancelled"
    assert run_key not in stranded(sqlite_store)
    assert after == []


@pytest.mark.parametrize("broker_kind", [pytest.param("redis", marks=pytest.mark.redis)], indirect=True)
def test_c16_a_time_limit_while_a_sleep_hand_off_waits_for_the_broker_never_reaches_retries(
    broker: dramatiq.Broker, queue: str, sqlite_store: StepStore, start_worker: Callable[..., dramatiq.Worker]
) -> None:
    """C16: the broker refuses a sleep's re-enqueue until after the actor's 700 ms time limit has struck.

    On Redis only: the path is the worker thread's, whatever the broker.

    ``TimeLimitExceeded`` is raised in the worker thread while the hand-off
    waits; the hand-off goes on holding the message instead of handing the
    sleep to ``Retries``. The job wakes, finishes once, and no delivery ever
    carries a retry count.
    """
    broker.add_middleware(CurrentMessage())
    broker.add_middleware(DurableSteps(store=sqlite_store))
    seen: list[int] = []
    after: list[str] = []

    @dramatiq.actor(broker=broker, queue_name=queue, time_limit=700, max_retries=3, min_backoff=10, max_backoff=50)
    def nap() -> None:
        message = CurrentMessage.get_current_message()
        assert message is not None
        seen.append(int(message.options.get("retries", 0)))
        current_job.step.sleep("100ms")
        after.append(current_job.run_key)

    refusals = _refuse_delayed_enqueues(broker, 4)
    start_worker(broker)
    run_key = nap.send().options[RUN_KEY_OPTION]
    wait_until(lambda: status_of(sqlite_store, run_key) == "succeeded", timeout=30, what="the run to succeed")
    assert refusals == [4]
    assert seen == [0, 0]
    assert after == [run_key]


def _refuse_delayed_enqueues(broker: dramatiq.Broker, count: int) -> list[int]:
    """Make ``broker.enqueue`` raise ``ConnectionClosed`` for the next ``count`` delayed enqueues; count them."""
    real = broker.enqueue
    refused = [0]

    def enqueue(message: Any, *, delay: int | None = None) -> Any:
        if delay is not None and refused[0] < count:
            refused[0] += 1
            raise ConnectionClosed("refused by the test: the broker is down")
        return real(message, delay=delay)

    broker.enqueue = enqueue  # type: ignore[method-assign]
    return refused


def _results(broker: dramatiq.Broker, namespace: str) -> RedisBackend:
    """A Redis ``Results`` backend added to ``broker`` (before ``DurableSteps``, as a project declares it)."""
    backend = RedisBackend(host=REDIS[1], port=REDIS[2], namespace=f"{namespace}:results")
    broker.add_middleware(Results(backend=backend))
    return backend


def test_c45_c32_an_age_limit_that_drops_a_sleeping_jobs_wake_up_runs_its_undo(  # noqa: PLR0917 - fixtures
    broker: dramatiq.Broker,
    queue: str,
    namespace: str,
    sqlite_store: StepStore,
    start_worker: Callable[..., dramatiq.Worker],
    require_service: Callable[[str, str, int], None],
) -> None:
    """C45, C32, C38: ``AgeLimit`` drops the wake-up of a job that slept past its ``max_age`` after ``reserve``.

    The core hears of it as an age limit: the run fails, and the undo of
    ``reserve`` runs once in a new message (the old one's age would drop it
    again); the run is ``compensated``, the step after the sleep never
    runs, and the result waiter gets the failure ``Results`` stored.
    """
    require_service(*REDIS)
    backend = _results(broker, namespace)
    broker.add_middleware(DurableSteps(store=sqlite_store))
    undone: list[str] = []
    after: list[str] = []

    @dramatiq.actor(broker=broker, queue_name=queue, max_age=1500, max_retries=0, store_results=True)
    def late() -> None:
        step = current_job.step
        step.run("reserve", lambda: "r-1", compensate=undone.append)
        step.sleep("2s")
        step.run("after", lambda: after.append(current_job.run_key))

    start_worker(broker)
    message = late.send()
    run_key = message.options[RUN_KEY_OPTION]
    wait_until(lambda: status_of(sqlite_store, run_key) == "compensated", timeout=30, what="the undo to run")
    assert (undone, after) == (["r-1"], [])
    with pytest.raises(ResultFailure, match="age limit"):
        message.get_result(backend=backend, block=True, timeout=10_000)
    assert run_key not in stranded(sqlite_store)


def test_c45_a_result_waiter_of_a_running_job_that_is_cancelled_gets_job_cancelled(  # noqa: PLR0917 - fixtures
    broker: dramatiq.Broker,
    queue: str,
    namespace: str,
    sqlite_store: StepStore,
    start_worker: Callable[..., dramatiq.Worker],
    require_service: Callable[[str, str, int], None],
) -> None:
    """C45, C34: ``cancel_run`` while the actor's ``work`` step runs; the attempt stops at its next step boundary.

    Its undo runs once, the run is ``cancelled``, and
    ``message.get_result(block=True)`` raises ``ResultFailure`` naming
    ``JobCancelled`` instead of waiting until its timeout.
    """
    require_service(*REDIS)
    backend = _results(broker, namespace)
    broker.add_middleware(DurableSteps(store=sqlite_store))
    working, release = threading.Event(), threading.Event()
    undone: list[str] = []

    def work() -> str:
        working.set()
        release.wait(30)  # the workload: runs until the test releases it
        return "worked"

    @dramatiq.actor(broker=broker, queue_name=queue, store_results=True)
    def cancellable() -> str:
        step = current_job.step
        step.run("charge", lambda: "c-1", compensate=undone.append)
        step.run("work", work)
        return step.run("ship", lambda: "shipped")

    start_worker(broker)
    message = cancellable.send()
    run_key = message.options[RUN_KEY_OPTION]
    assert working.wait(30)
    done = cancel_run(run_key, reason="order abandoned", store=sqlite_store, publishers=publishers_for(broker))
    assert done.effect == "requested"
    release.set()
    with pytest.raises(ResultFailure, match="JobCancelled: the run was cancelled: order abandoned") as failed:
        message.get_result(backend=backend, block=True, timeout=20_000)
    assert failed.value.orig_exc_type == "JobCancelled"
    assert status_of(sqlite_store, run_key) == "cancelled"
    assert undone == ["c-1"]


def test_c45_cancelling_a_sleeping_job_from_a_process_with_the_integration_answers_its_waiter_at_once(  # noqa: PLR0917
    broker: dramatiq.Broker,
    queue: str,
    namespace: str,
    sqlite_store: StepStore,
    start_worker: Callable[..., dramatiq.Worker],
    require_service: Callable[[str, str, int], None],
) -> None:
    """C45, C34: a job sleeping for an hour is cancelled with the broker's publisher: ``get_result`` raises
    ``ResultFailure`` naming ``JobCancelled`` at once (its wake-up is an hour away), and its undo runs once
    in the message published to compensate it, which ends the run ``cancelled``."""
    require_service(*REDIS)
    backend = _results(broker, namespace)
    broker.add_middleware(DurableSteps(store=sqlite_store))
    undone: list[str] = []

    @dramatiq.actor(broker=broker, queue_name=queue, store_results=True)
    def napper() -> str:
        step = current_job.step
        step.run("charge", lambda: "c-1", compensate=undone.append)
        step.sleep("1h")
        return step.run("ship", lambda: "shipped")

    start_worker(broker)
    message = napper.send()
    run_key = message.options[RUN_KEY_OPTION]
    wait_until(lambda: status_of(sqlite_store, run_key) == "sleeping", what="the job to sleep")
    done = cancel_run(run_key, reason="customer left", store=sqlite_store, publishers=publishers_for(broker))
    assert done.effect == "compensating"
    with pytest.raises(ResultFailure, match="JobCancelled: the run was cancelled: customer left"):
        message.get_result(backend=backend, block=True, timeout=5_000)
    wait_until(lambda: status_of(sqlite_store, run_key) == "cancelled", what="the undo to run")
    assert undone == ["c-1"]
