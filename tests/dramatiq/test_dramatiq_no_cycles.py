"""A failed attempt leaves no reference cycle on Dramatiq: its exception is freed at once, as Dramatiq does (C26).

With the cyclic collector off, an actor's exception and its locals are freed
by reference counting once Dramatiq is done with the message, for plain and
``async def`` actors. The core's part is ``tests/core/test_no_cycles.py``;
Celery's is ``tests/celery/test_celery_no_cycles.py``.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import Any

import dramatiq
import pytest
from dramatiq.middleware import AsyncIO, Retries

from dramatiq_ext import DurableSteps
from flexiq_plugins import current_job
from flexiq_plugins._store.base import StepStore
from tests.dramatiq.dq_support import wait_until


class Big:
    """A large local of an actor (weakly referenceable)."""

    def __init__(self) -> None:
        self.payload = bytearray(1_000_000)


@pytest.fixture
def no_gc(monkeypatch: pytest.MonkeyPatch, collector_off: None) -> None:
    """The cyclic garbage collector off for the test: only reference counting frees objects.

    The worker's log records do not reach pytest's capture, which keeps each
    record (and the ``exc_info`` it logs) until the test ends.
    """
    monkeypatch.setattr(logging.getLogger("dramatiq.worker.WorkerThread"), "disabled", True)


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
