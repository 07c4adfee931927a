"""Regressions of the Dramatiq adapter found in review: direct actor calls, a failing re-enqueue."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import dramatiq
from dq_support import status_of, wait_until
from dramatiq.middleware import CurrentMessage

from dramatiq_ext import RUN_KEY_OPTION, DurableSteps
from flexiq_plugins import current_job
from flexiq_plugins._store.base import StepStore


def test_c10_an_actor_called_as_a_function_inside_a_job_has_no_current_job(
    stub_broker: dramatiq.Broker,
    queue: str,
    sqlite_store: StepStore,
    start_worker: Callable[..., dramatiq.Worker],
) -> None:
    """C10: calling an actor directly (``inner(1)``, not ``.send``) inside another actor's body is a
    plain function call.

    ``current_job`` is falsy in it and it records no step in the outer run:
    the outer run's step rows (kept with ``keep_succeeded_steps=True``) are
    only its own.
    """
    stub_broker.add_middleware(DurableSteps(store=sqlite_store, keep_succeeded_steps=True))
    inside: list[bool] = []
    results: list[int] = []

    @dramatiq.actor(broker=stub_broker, queue_name=queue, max_retries=0)
    def inner(x: int) -> int:
        inside.append(bool(current_job))
        if current_job:  # the old behaviour: the outer job leaked into the direct call
            return current_job.step.run("inner", lambda: x + 100)  # type: ignore[no-any-return]
        return x + 100

    @dramatiq.actor(broker=stub_broker, queue_name=queue, max_retries=0)
    def outer(x: int) -> None:
        step = current_job.step
        before = step.run("before", lambda: x)
        middle = inner(before)
        results.append(step.run("after", lambda: middle + 1))

    start_worker(stub_broker)
    message = outer.send(1)
    stub_broker.join(queue, fail_fast=True, timeout=10_000)

    run_key = message.options[RUN_KEY_OPTION]
    assert results == [102]
    assert inside == [False]
    assert status_of(sqlite_store, run_key) == "succeeded"
    assert [row.step_key for row in sqlite_store.get_steps(run_key)] == ["before#0", "after#0"]


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


def test_c35_non_json_arguments_under_a_pickle_encoder_run_and_republish(
    stub_broker: dramatiq.Broker,
    queue: str,
    sqlite_store: StepStore,
    start_worker: Callable[..., dramatiq.Worker],
) -> None:
    """C35/C7: with ``PickleEncoder`` an actor may take a ``datetime``; the run's envelope keeps the
    arguments encoded by the broker's encoder, so the actor runs and ``republish`` restores them."""
    from datetime import datetime, timezone

    from dramatiq.encoder import JSONEncoder, PickleEncoder

    from dramatiq_ext import republish

    dramatiq.set_encoder(PickleEncoder())
    try:
        stub_broker.add_middleware(DurableSteps(store=sqlite_store, keep_succeeded_steps=True))
        seen: list[Any] = []

        @dramatiq.actor(broker=stub_broker, queue_name=queue, max_retries=0)
        def remind(when: datetime) -> None:
            seen.append(current_job.step.run("note", when.isoformat))

        start_worker(stub_broker)
        when = datetime(2030, 1, 2, 3, 4, tzinfo=timezone.utc)
        message = remind.send(when)
        stub_broker.join(queue, fail_fast=True, timeout=10_000)
        run = sqlite_store.get_run(message.options[RUN_KEY_OPTION])
        assert (run.status, seen) == ("succeeded", [when.isoformat()])
        again = republish(stub_broker, run.envelope, "another-run")
        assert again.args == (when,)
        # The worker consumes the re-published message under the pickle encoder, before it is reset.
        stub_broker.join(queue, fail_fast=True, timeout=10_000)
        assert sqlite_store.get_run("another-run").status == "succeeded"
    finally:
        dramatiq.set_encoder(JSONEncoder())


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
