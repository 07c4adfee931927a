"""Sleeps on Dramatiq: re-enqueued with a delay, no retry counted, nothing logged (C15–C18)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import dramatiq
import pytest
from dq_support import status_of, wait_until
from dramatiq.middleware import AsyncIO, CurrentMessage, Middleware

from dramatiq_ext import RUN_KEY_OPTION, DurableSteps
from flexiq_plugins import current_job
from flexiq_plugins._store.base import StepStore


class _Delays(Middleware):
    """Records the delay of every enqueue (a real middleware, observing the broker)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int | None]] = []

    def before_enqueue(self, broker: dramatiq.Broker, message: Any, delay: int | None) -> None:
        self.seen.append((message.message_id, delay))


def test_c16_c18_sleep_hops_wake_on_time_without_retries_or_warnings(
    broker: dramatiq.Broker,
    queue: str,
    sqlite_store: StepStore,
    start_worker: Callable[..., dramatiq.Worker],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A 1.2 s sleep with 0.4 s hops: several hops, wakes at its wake time, same message id.

    Every delivery carries the same message id and run key and no ``retries``
    count (C15, C16); the wait is cut into hops no longer than ``max_hop_seconds``
    (C18), read from the delays the re-enqueues asked the broker for, not from
    wall-clock gaps; no WARNING or ERROR record is logged by Dramatiq or by us (C16).
    """
    caplog.set_level(logging.INFO)
    delays = _Delays()
    broker.add_middleware(delays)
    broker.add_middleware(CurrentMessage())
    broker.add_middleware(DurableSteps(store=sqlite_store, max_hop_seconds=0.4))
    seen: list[dict[str, Any]] = []
    finished: list[float] = []

    @dramatiq.actor(broker=broker, queue_name=queue, max_retries=0)
    def nap() -> None:
        message = CurrentMessage.get_current_message()
        assert message is not None
        seen.append({"id": message.message_id, "retries": message.options.get("retries", 0), "at": time.time()})
        current_job.step.sleep("1200ms")
        finished.append(time.time())

    start_worker(broker)
    sent = nap.send()
    run_key = sent.options[RUN_KEY_OPTION]
    wait_until(lambda: status_of(sqlite_store, run_key) == "succeeded", timeout=20, what="the nap to end")

    first = seen[0]["at"]
    hops = [d for message_id, d in delays.seen if message_id == sent.message_id and d is not None]
    assert len(seen) == len(hops) + 1 >= 3  # the first attempt, then one delivery per hop
    assert hops[0] == 400  # the first hop is cut to max_hop_seconds (C18)
    assert all(0 < d <= 400 for d in hops)
    assert {s["id"] for s in seen} == {sent.message_id}
    assert {s["retries"] for s in seen} == {0}
    assert finished[0] - first >= 1.2  # never woken before its wake time (C17)
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert loud == [], [r.getMessage() for r in loud]


def test_c15_async_actor_runs_arun_and_sleep(
    stub_broker: dramatiq.Broker,
    queue: str,
    sqlite_store: StepStore,
    start_worker: Callable[..., dramatiq.Worker],
) -> None:
    """An ``async def`` actor (AsyncIO middleware) memoizes ``await step.arun`` across a sleep.

    The first attempt fetches then sleeps; the second replays the fetch from
    the store (its coroutine is not awaited again, C5) and stores the result.
    """
    stub_broker.add_middleware(AsyncIO())
    stub_broker.add_middleware(DurableSteps(store=sqlite_store))
    calls: list[str] = []

    async def fetch(n: int) -> dict[str, Any]:
        await asyncio.sleep(0.01)
        calls.append("fetch")
        return {"n": n, "pair": (n, n + 1)}

    @dramatiq.actor(broker=stub_broker, queue_name=queue)
    async def enrich(n: int) -> None:
        step = current_job.step
        data = await step.arun("fetch", lambda: fetch(n))
        step.sleep("200ms")
        await step.arun("store", lambda: calls.append(f"store {data['pair']}"))

    start_worker(stub_broker)
    message = enrich.send(7)
    stub_broker.join(queue, fail_fast=True, timeout=10_000)

    assert calls == ["fetch", "store [7, 8]"]
    run = sqlite_store.get_run(message.options[RUN_KEY_OPTION])
    assert (run.status, run.attempt) == ("succeeded", 2)


def test_c17_a_sleep_woken_early_goes_back_to_sleep(
    stub_broker: dramatiq.Broker,
    queue: str,
    sqlite_store: StepStore,
    start_worker: Callable[..., dramatiq.Worker],
) -> None:
    """A duplicate of a sleeping message delivered before the wake time sleeps again for the remainder.

    The wake time fixed by the first commit is kept: the code after the sleep
    runs once, not before the wake time, and the run succeeds.
    """
    stub_broker.add_middleware(DurableSteps(store=sqlite_store))
    after: list[float] = []
    slept = threading.Event()

    @dramatiq.actor(broker=stub_broker, queue_name=queue)
    def nap() -> None:
        slept.set()
        current_job.step.sleep("600ms")
        after.append(time.time())

    start_worker(stub_broker)
    message = nap.send()
    started = time.time()
    assert slept.wait(5)
    wait_until(lambda: status_of(sqlite_store, message.options[RUN_KEY_OPTION]) == "sleeping", what="the sleep")
    stub_broker.enqueue(message)  # an early duplicate delivery
    stub_broker.join(queue, fail_fast=True, timeout=10_000)

    assert len(after) == 1
    assert after[0] - started >= 0.6
    assert status_of(sqlite_store, message.options[RUN_KEY_OPTION]) == "succeeded"


def test_c15_c16_a_sleep_survives_one_failed_re_enqueue_without_a_retry(
    stub_broker: dramatiq.Broker,
    queue: str,
    sqlite_store: StepStore,
    start_worker: Callable[..., dramatiq.Worker],
) -> None:
    """C15, C16: the broker refuses the sleep's delayed re-enqueue once (a blip injected by wrapping
    ``broker.enqueue``).

    The sleep is still re-enqueued (the adapter tries again shortly), it is
    not turned into a retry: every delivery has ``retries`` 0, and the actor,
    declared with ``max_retries=0``, wakes and finishes; the run succeeded.
    """
    stub_broker.add_middleware(CurrentMessage())
    stub_broker.add_middleware(DurableSteps(store=sqlite_store))
    real_enqueue = stub_broker.enqueue
    refused: list[str] = []
    delayed: list[str] = []
    lock = threading.Lock()

    def flaky_enqueue(message: Any, *, delay: int | None = None) -> Any:
        if delay is not None:
            with lock:
                if not refused:
                    refused.append(message.message_id)
                    raise ConnectionError("injected broker blip")
                delayed.append(message.message_id)
        return real_enqueue(message, delay=delay)

    stub_broker.enqueue = flaky_enqueue  # type: ignore[method-assign]
    seen: list[dict[str, Any]] = []
    finished: list[str] = []

    @dramatiq.actor(broker=stub_broker, queue_name=queue, max_retries=0)
    def nap() -> None:
        message = CurrentMessage.get_current_message()
        assert message is not None
        seen.append({"id": message.message_id, "retries": message.options.get("retries", 0)})
        current_job.step.sleep("200ms")
        finished.append(message.message_id)

    start_worker(stub_broker)
    sent = nap.send()
    run_key = sent.options[RUN_KEY_OPTION]
    wait_until(lambda: status_of(sqlite_store, run_key) == "succeeded", timeout=20, what="the nap to end")

    assert refused == [sent.message_id]
    assert delayed == [sent.message_id]  # the adapter's second try went through
    assert finished == [sent.message_id]
    assert len(seen) == 2  # the first attempt and the wake
    assert {s["id"] for s in seen} == {sent.message_id}
    assert {s["retries"] for s in seen} == {0}
    assert stub_broker.dead_letters_by_queue[queue] == []
