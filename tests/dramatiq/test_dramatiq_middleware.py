"""The ``DurableSteps`` middleware itself: public names, configuration, declaring, encoding (C7)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import dramatiq
import pytest
from dramatiq.middleware import Retries

import dramatiq_ext
from dramatiq_ext import RUN_KEY_OPTION, DurableSteps
from flexiq_plugins import ZlibCodec, current_job
from flexiq_plugins._store.base import StepStore
from flexiq_plugins._store.sql import SqlStepStore
from flexiq_plugins.errors import ConfigurationError


def test_public_names() -> None:
    """``dramatiq_ext`` exports exactly its sorted public API."""
    assert dramatiq_ext.__all__ == [
        "DramatiqAdapter",
        "DurableSteps",
        "InvalidActorOption",
        "RUN_KEY_OPTION",
        "adapter",
        "publisher",
        "republish",
    ]


def test_unknown_option_is_refused_at_construction() -> None:
    """A misspelt option fails at once, naming the accepted ones."""
    with pytest.raises(ConfigurationError, match=r"max_hops.*accepted:\n  max_hop_seconds"):
        DurableSteps(max_hops="5m")


@pytest.mark.parametrize("store", ["postgresql//x", "mongodb://h/db", "", 12345, "postgress://u@h/db"], ids=repr)
def test_c41_a_store_setting_that_can_never_work_is_refused_at_construction(store: Any) -> None:
    """C41: ``DurableSteps(store=…)`` with a malformed URL, an unknown scheme or a non-URL value fails at once,
    naming the value, instead of failing every job of every worker."""
    with pytest.raises(ConfigurationError) as info:
        DurableSteps(store=store)
    assert repr(store) in str(info.value)


def test_store_is_opened_lazily_from_flexiq_store_url(monkeypatch: pytest.MonkeyPatch, sqlite_url: str) -> None:
    """Construction reads nothing; the first use opens ``FLEXIQ_STORE_URL``'s store."""
    monkeypatch.delenv("FLEXIQ_STORE_URL", raising=False)
    middleware = DurableSteps()
    monkeypatch.setenv("FLEXIQ_STORE_URL", sqlite_url)
    store = middleware.store
    assert isinstance(store, SqlStepStore)
    assert store.url == sqlite_url


def test_c5_actors_declared_before_and_after_at_any_position(
    stub_broker: dramatiq.Broker,
    queue: str,
    sqlite_store: StepStore,
    start_worker: Callable[..., dramatiq.Worker],
) -> None:
    """Actors declared before and after the middleware (inserted before Retries) are durable.

    An actor declared with ``durable=False`` runs without a current job.
    """
    seen: dict[str, Any] = {}

    @dramatiq.actor(broker=stub_broker, queue_name=queue)
    def early() -> None:
        seen["early"] = current_job.step.run("x", lambda: "early")

    stub_broker.add_middleware(DurableSteps(store=sqlite_store), before=Retries)

    @dramatiq.actor(broker=stub_broker, queue_name=queue)
    def late() -> None:
        seen["late"] = current_job.step.run("x", lambda: "late")

    @dramatiq.actor(broker=stub_broker, queue_name=queue, durable=False)
    def plain() -> None:
        seen["plain"] = current_job.get()

    start_worker(stub_broker)
    for actor in (early, late, plain):
        actor.send()
    stub_broker.join(queue, fail_fast=True, timeout=10_000)

    assert seen == {"early": "early", "late": "late", "plain": None}


def test_direct_call_runs_the_function_without_durable_steps(stub_broker: dramatiq.Broker, queue: str) -> None:
    """Calling an actor directly (not through a worker) runs its function as Dramatiq would."""
    stub_broker.add_middleware(DurableSteps(store="memory://"))

    @dramatiq.actor(broker=stub_broker, queue_name=queue)
    def add(x: int, y: int) -> tuple[int, bool]:
        return x + y, bool(current_job)

    assert add(1, 2) == (3, False)


def test_c7_values_go_through_the_broker_encoder_and_codecs(
    stub_broker: dramatiq.Broker,
    queue: str,
    sqlite_store: StepStore,
    start_worker: Callable[..., dramatiq.Worker],
) -> None:
    """A tuple comes back a list (JSON encoder) on the first run and on replay; bytes are zlib-encoded.

    An unencodable value dead-letters the job: its body already ran (C29).
    """
    stub_broker.add_middleware(DurableSteps(store=sqlite_store, codecs=[ZlibCodec()]))
    seen: list[Any] = []

    @dramatiq.actor(broker=stub_broker, queue_name=queue)
    def shape() -> None:
        seen.append(current_job.step.run("pair", lambda: (1, 2)))
        current_job.step.sleep("500ms")

    @dramatiq.actor(broker=stub_broker, queue_name=queue)
    def odd() -> None:
        current_job.step.run("obj", object)

    start_worker(stub_broker)
    message = shape.send()
    odd.send()
    stub_broker.join(queue, fail_fast=False, timeout=10_000)

    assert seen == [[1, 2], [1, 2]]
    assert sqlite_store.get_run(message.options[RUN_KEY_OPTION]).status == "succeeded"
    (dead,) = sqlite_store.list_dead_letters()
    assert (dead.task_name, dead.reason) == ("odd", "unencodable_value")
    assert len(stub_broker.dead_letters_by_queue[queue]) == 1
