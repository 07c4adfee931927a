"""Invisible until used: Dramatiq's own behaviour is unchanged by ``DurableSteps`` (issue 16).

A failed attempt frees its exception at once, as Dramatiq does (no reference
cycle left for the cyclic collector); an actor that takes no step does no
store I/O; the frameworks' own features keep working for durable actors.
"""

from __future__ import annotations

import gc
import logging
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import dramatiq
import pytest
from dramatiq.middleware import AsyncIO, Retries

from dramatiq_ext import DurableSteps
from flexiq_plugins import current_job
from flexiq_plugins._model.records import TERMINAL_STATUSES
from flexiq_plugins._store.base import StepStore
from tests.dramatiq.dq_support import wait_until


class Big:
    """A large local of an actor (weakly referenceable)."""

    def __init__(self) -> None:
        self.payload = bytearray(1_000_000)


@pytest.fixture
def no_gc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The cyclic garbage collector off for the test: only reference counting frees objects.

    The worker's log records do not reach pytest's capture, which keeps each
    record (and the ``exc_info`` it logs) until the test ends.
    """
    monkeypatch.setattr(logging.getLogger("dramatiq.worker.WorkerThread"), "disabled", True)
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class Boom(RuntimeError):
    """The actor's error (a subclass: built-in exceptions take no weak reference)."""


def _boom(refs: list[weakref.ref[Any]]) -> Boom:
    """A new error, weakly referenced in ``refs`` (made here so the actor's frame holds no local of it)."""
    error = Boom("boom")
    refs.append(weakref.ref(error))
    return error


REAL_BROKERS = pytest.mark.parametrize(
    "broker_kind",
    [pytest.param("redis", marks=pytest.mark.redis), pytest.param("rabbitmq", marks=pytest.mark.rabbitmq)],
    indirect=True,
)
"""The StubBroker keeps every exception on purpose (for ``join(fail_fast=True)``): real brokers only."""


def _all_dead(refs: list[weakref.ref[Any]], count: int) -> bool:
    return len(refs) == count and all(r() is None for r in refs)


@REAL_BROKERS
@pytest.mark.parametrize("steps", [False, True], ids=["no_step", "step"])
def test_c26_a_failed_attempt_frees_its_exception_without_the_cyclic_collector(  # noqa: PLR0917
    broker: dramatiq.Broker,
    queue: str,
    sqlite_store: StepStore,
    start_worker: Callable[..., dramatiq.Worker],
    no_gc: None,
    steps: bool,
) -> None:
    """C26: an actor that raises leaves no reference cycle: its exception and its 1 MB local are freed by
    reference counting once Dramatiq is done with the message, with ``gc`` disabled (as plain Dramatiq)."""
    broker.add_middleware(DurableSteps(store=sqlite_store), before=Retries)
    refs: list[weakref.ref[Any]] = []

    @dramatiq.actor(broker=broker, queue_name=queue, max_retries=0)
    def fails() -> None:
        big = Big()
        if steps:
            current_job.step.run("one", lambda: 1)
        refs.append(weakref.ref(big))
        raise _boom(refs)

    start_worker(broker)
    fails.send()
    wait_until(lambda: _all_dead(refs, 2), timeout=15, what="the failed attempt's exception and local to be freed")


@pytest.mark.parametrize("broker_kind", [pytest.param("redis", marks=pytest.mark.redis)], indirect=True)
def test_c26_a_failed_async_attempt_frees_its_exception_without_the_cyclic_collector(
    broker: dramatiq.Broker,
    queue: str,
    sqlite_store: StepStore,
    start_worker: Callable[..., dramatiq.Worker],
    no_gc: None,
) -> None:
    """C26: the same for an ``async def`` actor run on the AsyncIO middleware's loop."""
    broker.add_middleware(AsyncIO())
    broker.add_middleware(DurableSteps(store=sqlite_store), before=Retries)
    broker.emit_after("process_boot")
    refs: list[weakref.ref[Any]] = []

    @dramatiq.actor(broker=broker, queue_name=queue, max_retries=0)
    async def fails() -> None:
        big = Big()
        refs.append(weakref.ref(big))
        raise _boom(refs)

    start_worker(broker)
    fails.send()
    wait_until(lambda: _all_dead(refs, 2), timeout=15, what="the failed attempt's exception and local to be freed")


@pytest.mark.parametrize("steps", [False, True], ids=["no_step", "step"])
def test_c10_a_durable_actor_calling_itself_directly_is_a_plain_call(
    broker: dramatiq.Broker,
    queue: str,
    sqlite_store: StepStore,
    start_worker: Callable[..., dramatiq.Worker],
    steps: bool,
) -> None:
    """C10: an actor calling itself as a function inside its body runs the body in-process, as plain Dramatiq
    does: the inner call has no ``current_job``, the outer attempt completes with the value."""
    broker.add_middleware(DurableSteps(store=sqlite_store), before=Retries)
    seen: list[Any] = []

    @dramatiq.actor(broker=broker, queue_name=queue, max_retries=0)
    def countdown(n: int, outer: bool = True) -> int:
        if n == 0:
            seen.append(("inner job", bool(current_job)))
            return 0
        if steps and outer:
            current_job.step.run("outer", lambda: n)
        value = 1 + countdown(n - 1, outer=False)
        if outer:
            seen.append(("value", value))
        return value

    start_worker(broker)
    countdown.send(3)
    wait_until(lambda: ("value", 3) in seen, timeout=15, what="the outer call to return 3")
    assert seen == [("inner job", False), ("value", 3)]
    if steps:
        wait_until(lambda: [r.status for r in sqlite_store.list_runs()] == ["succeeded"], what="the run to succeed")
    else:  # recorded at publish (C39), so claimed before the body (C23): one attempt, no second for the inner call
        wait_until(
            lambda: [(r.status, r.attempt) for r in sqlite_store.list_runs()] == [("succeeded", 1)],
            what="the recorded run to succeed",
        )


def test_c23_an_actor_that_takes_no_step_runs_without_its_store(
    broker: dramatiq.Broker, queue: str, start_worker: Callable[..., dramatiq.Worker]
) -> None:
    """C23: an actor that takes no step never claims a run: it runs, fails and is retried by Dramatiq's own
    Retries exactly as without the middleware, even with its step store unreachable (a closed port)."""
    broker.add_middleware(DurableSteps(store="postgresql+psycopg://postgres@127.0.0.1:9/none"), before=Retries)
    calls: list[int] = []

    @dramatiq.actor(broker=broker, queue_name=queue, max_retries=2, min_backoff=1, max_backoff=1)
    def flaky(n: int) -> None:
        calls.append(n)
        if len(calls) < 3:
            raise ValueError("not yet")

    start_worker(broker)
    flaky.send(7)
    wait_until(lambda: len(calls) == 3, timeout=15, what="two retries by Dramatiq's Retries")
    assert calls == [7, 7, 7]


@pytest.mark.parametrize("recorded", [False, True], ids=["not_recorded", "recorded"])
def test_c23_a_step_less_actor_leaves_no_run_and_a_stepping_one_does(
    broker: dramatiq.Broker,
    queue: str,
    sqlite_store: StepStore,
    start_worker: Callable[..., dramatiq.Worker],
    recorded: bool,
) -> None:
    """C23, C39: only a job that took a step claims a run; a failure of a step-less job is Dramatiq's:
    dead-lettered by the broker when its retries are spent, no dead letter of the library's. Without
    recording at publish a step-less job leaves no run at all; with it, the job claims its recorded run
    before its body and ends it ``succeeded`` or, once Retries gives up, ``failed``, so recovery never
    publishes it again."""
    broker.add_middleware(DurableSteps(store=sqlite_store, record_at_publish=recorded), before=Retries)
    done: list[str] = []

    @dramatiq.actor(broker=broker, queue_name=queue, max_retries=0)
    def plain(fail: bool) -> None:
        done.append("plain")
        if fail:
            raise ValueError("boom")

    @dramatiq.actor(broker=broker, queue_name=queue, max_retries=0)
    def stepping() -> None:
        current_job.step.run("one", lambda: 1)
        done.append("stepping")

    start_worker(broker)
    plain.send(False)
    plain.send(True)
    stepping.send()
    wait_until(lambda: len(done) == 3, timeout=15, what="the three jobs")
    if recorded:
        expected = [("plain", "failed", 1), ("plain", "succeeded", 1), ("stepping", "succeeded", 1)]
    else:
        expected = [("stepping", "succeeded", 1)]

    def runs() -> list[tuple[str, str, int]]:
        return sorted((r.task_name, r.status, r.attempt) for r in sqlite_store.list_runs())

    wait_until(lambda: runs() == expected, what=f"the runs {expected}")
    assert sqlite_store.list_dead_letters() == []


@pytest.mark.parametrize("broker_kind", [pytest.param("redis", marks=pytest.mark.redis)], indirect=True)
@pytest.mark.parametrize("steps", [False, True], ids=["no_step", "step"])
def test_c26_dramatiq_features_work_for_durable_actors(  # noqa: PLR0917
    broker: dramatiq.Broker,
    queue: str,
    namespace: str,
    sqlite_store: StepStore,
    start_worker: Callable[..., dramatiq.Worker],
    steps: bool,
) -> None:
    """C26: pipelines, groups, ``on_success`` / ``on_failure`` callbacks, ``Retries`` counts, ``Results``,
    ``TimeLimit`` and ``AgeLimit`` behave for durable actors, with and without steps, as in plain Dramatiq."""
    from dramatiq import group, pipeline
    from dramatiq.middleware import CurrentMessage
    from dramatiq.results import ResultFailure, Results
    from dramatiq.results.backends import RedisBackend

    broker.add_middleware(Results(backend=RedisBackend(client=broker.client, namespace=f"{namespace}-r")))
    broker.add_middleware(CurrentMessage())
    broker.add_middleware(DurableSteps(store=sqlite_store), before=Retries)
    seen: list[Any] = []

    def stepped(name: str, value: Any) -> Any:
        return current_job.step.run(name, lambda: value) if steps else value

    @dramatiq.actor(broker=broker, queue_name=queue, store_results=True)
    def add(x: int, y: int) -> int:
        return int(stepped("add", x + y))

    @dramatiq.actor(broker=broker, queue_name=queue, store_results=True, max_retries=3, min_backoff=10, max_backoff=10)
    def flaky() -> int:
        stepped("before", 1)
        retries = CurrentMessage.get_current_message().options.get("retries", 0)
        if retries < 2:
            raise ValueError("not yet")
        return int(retries)

    @dramatiq.actor(broker=broker, queue_name=queue, max_retries=0)
    def fails() -> None:
        stepped("before", 1)
        raise KeyError("nope")

    @dramatiq.actor(broker=broker, queue_name=queue)
    def succeeded(message: dict[str, Any], result: Any) -> None:
        seen.append(("success", result))

    @dramatiq.actor(broker=broker, queue_name=queue)
    def failed(message: dict[str, Any], exception: dict[str, Any]) -> None:
        seen.append(("failure", exception["type"]))

    @dramatiq.actor(broker=broker, queue_name=queue, time_limit=300, max_retries=0, store_results=True)
    def slow() -> None:
        stepped("before", 1)
        for _ in range(100):  # TimeLimit interrupts between bytecodes
            time.sleep(0.05)
        seen.append("slow finished")

    @dramatiq.actor(broker=broker, queue_name=queue, max_retries=0, store_results=True)
    def aged() -> None:
        seen.append("aged ran")

    start_worker(broker)
    assert pipeline([add.message(1, 2), add.message(3)]).run().get_result(block=True, timeout=20_000) == 6
    assert list(group([add.message(i, i) for i in range(3)]).run().get_results(block=True, timeout=20_000)) == [0, 2, 4]
    add.send_with_options(args=(2, 2), on_success=succeeded)
    fails.send_with_options(on_failure=failed)
    wait_until(lambda: len(seen) == 2, timeout=20, what="the callbacks")
    assert sorted(seen) == [("failure", "KeyError"), ("success", 4)]
    assert flaky.send().get_result(block=True, timeout=20_000) == 2
    with pytest.raises(ResultFailure) as limited:
        slow.send().get_result(block=True, timeout=20_000)
    assert limited.value.orig_exc_type == "TimeLimitExceeded"
    with pytest.raises(ResultFailure):
        aged.send_with_options(max_age=1, delay=200).get_result(block=True, timeout=20_000)
    assert "slow finished" not in seen
    assert "aged ran" not in seen
    # every run was recorded at publish (C39); each one ends, none is left for recovery to publish again
    wait_until(
        lambda: all(r.status in TERMINAL_STATUSES for r in sqlite_store.list_runs()),
        what="every recorded run to end",
    )
