"""The ``DurableSteps`` middleware itself: public names, configuration, declaring, encoding (C7), run keys (C11)."""

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
from flexiq_plugins.errors import ConfigurationError, InvalidDuration


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
    """A misspelt option fails at once with the closest name and the accepted names, without rule ids."""
    with pytest.raises(ConfigurationError) as info:
        DurableSteps(max_hops="5m")
    message = str(info.value)
    assert message.startswith("DurableSteps(): unknown option 'max_hops'; did you mean 'max_hop_seconds'? ")
    assert "Accepted options: max_hop_seconds, lease_seconds, " in message
    assert "docs/configuration.md" in message
    assert "C18" not in message  # the names only; their help is in the docs
    assert "\n" not in message


def test_c19_a_duration_option_that_does_not_parse_names_the_option_and_the_accepted_forms() -> None:
    """``DurableSteps(max_hop_seconds="2x")`` says which option holds the bad duration, and what is accepted."""
    with pytest.raises(InvalidDuration) as info:
        DurableSteps(max_hop_seconds="2x")
    message = str(info.value)
    assert message.startswith("option max_hop_seconds: invalid duration '2x'")
    assert "'500ms', '30s', '5m', '1h30m'" in message


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


def test_c11_a_run_key_option_that_is_not_a_str_is_refused() -> None:
    """C11: a run key must be a str; a dict or number would only be a ``repr`` that another producer
    could spell differently, so it is refused instead of coerced."""
    import pytest

    from dramatiq_ext._envelope import run_key_of
    from flexiq_plugins import InvalidRunKey

    message = dramatiq.Message(queue_name="q", actor_name="a", args=(), kwargs={}, options={})
    assert run_key_of(message) == message.message_id
    assert run_key_of(message.copy(options={RUN_KEY_OPTION: "rk-1"})) == "rk-1"
    with pytest.raises(InvalidRunKey, match="is not a str"):
        run_key_of(message.copy(options={RUN_KEY_OPTION: {"a": 1.5}}))
