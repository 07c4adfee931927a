"""Step maps in Dramatiq actors: ``step.map`` in a plain actor, ``await step.amap`` in an ``async def`` one (C51).

The behaviour every adapter shares (a task retry, a SIGKILL mid-map, a crash
loop, 1,000 items) is proven in ``tests/conformance``; here, what is Dramatiq's
own: an async actor under the ``AsyncIO`` middleware fans out as tasks on its
event loop and replays its map across a sleep.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import dramatiq
from dramatiq.middleware import AsyncIO

from dramatiq_ext import RUN_KEY_OPTION, DurableSteps
from flexiq_plugins import current_job
from flexiq_plugins._store.base import StepStore


def test_c51_an_async_actor_fans_out_with_amap_and_replays_it_after_a_sleep(
    stub_broker: dramatiq.Broker,
    queue: str,
    sqlite_store: StepStore,
    start_worker: Callable[..., dramatiq.Worker],
) -> None:
    """An ``async def`` actor awaits ``step.amap`` over three items (all three bodies in flight at once), then
    sleeps; the second attempt replays the map from the store without calling a body and stores the values."""
    stub_broker.add_middleware(AsyncIO())
    stub_broker.add_middleware(DurableSteps(store=sqlite_store, keep_succeeded_steps=True))
    calls: list[str] = []
    stored: list[list[int]] = []
    everyone = asyncio.Event()  # bound to the actors' event loop at its first use (Python 3.10+)

    async def fetch(n: int) -> int:
        calls.append(current_job.step.idempotency_key)
        if len(calls) == 3:
            everyone.set()
        await asyncio.wait_for(everyone.wait(), 10)
        return n * 10

    @dramatiq.actor(broker=stub_broker, queue_name=queue)
    async def enrich() -> None:
        step = current_job.step
        values = await step.amap("fetch", fetch, [1, 2, 3], key=int)
        step.sleep("200ms")
        await step.arun("store", lambda: stored.append(values))

    start_worker(stub_broker)
    message = enrich.send()
    stub_broker.join(queue, fail_fast=True, timeout=10_000)

    run_key = message.options[RUN_KEY_OPTION]
    assert sorted(calls) == [f"{run_key}:fetch:{n}" for n in (1, 2, 3)]
    assert stored == [[10, 20, 30]]
    run = sqlite_store.get_run(run_key)
    assert (run.status, run.attempt) == ("succeeded", 2)
    assert [r.step_key for r in sqlite_store.get_steps(run_key)][:1] == ["fetch#0"]
