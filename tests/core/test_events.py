"""Waiting for events (C33), unit-level: ``step.wait_for_event`` against an in-memory store on a fake clock.

Driven attempt by attempt with ``flexiq_plugins.testing.DurableRun``:
``run.send_event`` is a sender in another process (no worker is woken here:
the next ``run.attempt()`` is the delivery that would be), ``run.wake()`` lets
a wait's deadline pass. The real-worker proofs are in ``tests/conformance``.
"""

from __future__ import annotations

import asyncio
from decimal import Decimal
from typing import Any

import pytest

from flexiq_plugins import (
    CodecChain,
    DurableConfig,
    InvalidEvent,
    JsonSerializer,
    StepDivergence,
    ZlibCodec,
    current_job,
)
from flexiq_plugins._attempt.decisions import Ack, AckReason, PutBack, PutBackReason
from flexiq_plugins.errors import InvalidStepName
from flexiq_plugins.operations import EventSent, find_stranded, send_event, wake_run
from flexiq_plugins.testing import DurableRun, FakeClock


def checkout(order_id: str, *, timeout: Any = None, log: list[Any] | None = None) -> Any:
    """Charge, wait for the payment of ``order_id``, ship with what the event said."""
    step = current_job.step
    step.run("charge", lambda: "ch_1")
    paid = step.wait_for_event("payment", key=order_id, timeout=timeout)
    step.run("ship", lambda: (log if log is not None else []).append(("ship", paid)))
    return paid


def test_c33_a_wait_suspends_like_a_sleep_and_returns_the_payload_of_the_event_sent_later() -> None:
    """No event yet: the attempt ends (the run is ``waiting`` on the topic and key, no message kept without a
    timeout); the event sent later is what the next attempt's wait returns (C33)."""
    log: list[Any] = []
    run = DurableRun(checkout, "o-1", log=log)
    first = run.attempt()
    assert first.waiting
    assert isinstance(first.decision, Ack)
    assert first.decision.reason is AckReason.WAITING
    record = run.record
    assert (record.status, record.wait_topic, record.wait_key, record.wake_at) == ("waiting", "payment", "o-1", None)
    assert log == []

    run.send_event("payment", "o-1", {"amount": Decimal("12.50"), "ok": True})
    done = run.attempt()
    assert done.completed
    assert done.value == {"amount": Decimal("12.50"), "ok": True}
    assert log == [("ship", {"amount": Decimal("12.50"), "ok": True})]
    assert run.step_keys == []  # succeeded: the rows are dropped


def test_c33_a_replay_returns_the_same_payload_without_waiting_even_once_the_event_is_gone() -> None:
    """The received payload is the step's memo: a replay (after a crash right after it) returns it again without
    polling, even after ``store cleanup`` deleted the event, and the event is not received twice (C5, C9, C33)."""
    run = DurableRun(checkout, "o-1", config=DurableConfig(keep_succeeded_steps=True))
    run.attempt()
    sent = run.send_event("payment", "o-1", "paid")
    crashed = run.attempt(crash_after_steps=1)  # killed right after the event row committed
    assert crashed.crashed
    assert run.step_keys == ["charge#0", "payment#0", "event:payment#0"]
    assert run.steps[-1].event_id == sent.event.id
    assert run.store.cleanup_events(older_than=run.clock() + 1) == 1
    done = run.attempt()
    assert done.completed
    assert done.value == "paid"


def test_c33_an_event_sent_before_the_wait_starts_is_received_at_once() -> None:
    """An event sent after the run was created but before the body reaches the wait is not lost: the wait
    returns it without suspending (C33)."""

    def body() -> Any:
        step = current_job.step
        step.run("prepare", lambda: run.send_event("approval", "doc-1", "yes") and None)  # sent mid-run
        return step.wait_for_event("approval", key="doc-1")

    run = DurableRun(body)
    done = run.attempt()
    assert done.completed
    assert done.value == "yes"


def test_c33_two_events_before_one_wait_the_first_is_returned_and_the_second_waits_for_the_next_wait() -> None:
    """Events are received oldest first, each at most once per run (C33)."""

    def body() -> Any:
        step = current_job.step
        first = step.wait_for_event("scan", key="parcel-9")
        step.run("between", lambda: None)
        return first, step.wait_for_event("scan", key="parcel-9"), step.wait_for_event("scan", key="parcel-9")

    run = DurableRun(body)
    assert run.attempt().waiting
    run.send_event("scan", "parcel-9", "depot")
    run.send_event("scan", "parcel-9", "van")
    third = run.attempt()
    assert third.waiting  # the two events went to the first two waits; the third waits
    run.send_event("scan", "parcel-9", "door")
    assert run.attempt().value == ("depot", "van", "door")


def test_c33_an_event_sent_to_a_run_by_its_key_is_received_even_if_sent_before_the_run_existed(
    flexiq_store: Any, flexiq_clock: FakeClock
) -> None:
    """An event addressed with ``run_key`` reaches that run whenever it was sent; another run does not get it,
    nor does a run created after a broadcast event (C33)."""
    send_event("approval", "doc-1", "for r-2 only", run_key="r-2", store=flexiq_store, publishers={})
    send_event("approval", "doc-1", "sent before r-3 existed", store=flexiq_store, publishers={})
    flexiq_clock.advance(1)

    def body() -> Any:
        return current_job.step.wait_for_event("approval", key="doc-1")

    addressed = DurableRun(body, run_key="r-2", store=flexiq_store, clock=flexiq_clock)
    other = DurableRun(body, run_key="r-3", store=flexiq_store, clock=flexiq_clock)
    assert addressed.attempt().value == "for r-2 only"
    assert other.attempt().waiting


def test_c33_a_wait_times_out_at_its_deadline_and_returns_none() -> None:
    """With ``timeout=`` the job comes back at the deadline (in hops, like a sleep) and the wait returns ``None``;
    the deadline is fixed when the wait first starts (C17, C33)."""
    log: list[Any] = []
    run = DurableRun(checkout, "o-1", timeout="30m", log=log)
    first = run.attempt()
    assert isinstance(first.decision, PutBack)
    assert first.decision.reason is PutBackReason.WAIT
    deadline = first.decision.wake_at
    assert deadline == run.clock() + 1800
    assert run.record.wake_at == deadline
    run.clock.advance(1799)
    early = run.attempt()
    assert early.waiting
    assert isinstance(early.decision, PutBack)
    assert early.decision.wake_at == deadline
    run.wake()
    done = run.attempt()
    assert done.completed
    assert done.value is None
    assert log == [("ship", None)]


def test_c33_a_payload_travels_through_the_runs_codec_chain_and_the_size_limits() -> None:
    """A payload sent as JSON by a bare sender is read by a worker with other codecs; the event row keeps it
    through the run's own chain (C7), and an over-large payload is refused at the sender (C22, C33)."""
    chain = CodecChain(JsonSerializer(), [ZlibCodec()])
    run = DurableRun(checkout, "o-1", config=DurableConfig(codecs=(ZlibCodec(),), keep_succeeded_steps=True))
    run.attempt()
    run.send_event("payment", "o-1", {"items": ["a"] * 3})
    run.attempt(crash_after_steps=1)
    stored = run.steps[-1].value
    assert stored is not None
    assert stored.startswith(b"FQ1|json|zlib\n")
    assert chain.decode(stored) == {"items": ["a", "a", "a"]}
    with pytest.raises(InvalidEvent, match="at most 262144 are accepted"):
        send_event("payment", "o-1", "x" * 300_000, store=run.store, publishers={})


@pytest.mark.parametrize(
    ("topic", "key"),
    [("", "o-1"), ("payment", ""), ("pay\nment", "o-1"), ("payment", "k" * 256), (7, "o-1"), ("payment", None)],
)
def test_c33_a_bad_topic_or_key_is_refused_before_anything_is_stored(topic: Any, key: Any) -> None:
    """Topic and key are non-empty strings of at most 255 characters without control characters (C33)."""
    run = DurableRun(lambda: None)
    with pytest.raises(InvalidEvent, match="non-empty str of at most 255 characters"):
        send_event(topic, key, store=run.store, publishers={})
    assert run.store.next_event("run-1", "payment", "o-1") is None

    def body() -> Any:
        return current_job.step.wait_for_event(topic, key=key, name="wait")

    result = DurableRun(body).attempt()
    assert result.dead_lettered
    assert isinstance(result.error, InvalidEvent)
    assert result.decision.reason == "invalid_event"  # type: ignore[union-attr]


def test_c33_the_wait_step_is_named_after_its_topic_unless_it_cannot_be() -> None:
    """The wait's step name defaults to the topic; a topic that is not a step name needs ``name=`` (C2, C33)."""

    def body(name: str | None) -> Any:
        return current_job.step.wait_for_event("payment:eu", key="o-1", name=name)

    refused = DurableRun(body, None).attempt()
    assert isinstance(refused.error, InvalidStepName)
    assert "pass name=" in str(refused.error)
    named = DurableRun(body, "payment_eu")
    assert named.attempt().waiting
    assert named.step_keys == ["payment_eu#0"]


def test_c33_a_wait_replaced_by_another_step_is_a_divergence() -> None:
    """The wait is a recorded step like any other: a deploy that removes it is a divergence (C12, C33)."""
    version = ["wait"]

    def body() -> Any:
        step = current_job.step
        if version[0] == "wait":
            return step.wait_for_event("payment", key="o-1")
        return step.run("payment", lambda: "polled")

    run = DurableRun(body)
    assert run.attempt().waiting
    version[0] = "poll"
    result = run.attempt()
    assert result.dead_lettered
    assert isinstance(result.error, StepDivergence)


def test_c33_the_async_form_waits_and_receives_the_same_way() -> None:
    """``await step.await_event(...)`` suspends and returns like ``wait_for_event`` (C33)."""

    async def body(order_id: str) -> Any:
        return await current_job.step.await_event("payment", key=order_id, timeout=60)

    run = DurableRun(lambda order_id: asyncio.run(body(order_id)), "o-1")
    assert run.attempt().waiting
    run.send_event("payment", "o-1", [1, 2])
    assert run.attempt().value == [1, 2]


def test_c33_a_sender_wakes_each_waiting_run_once_through_its_publisher(
    flexiq_store: Any, flexiq_clock: FakeClock
) -> None:
    """``send_event`` commits the event, then re-publishes each waiting run of its topic and key through the
    publisher of its framework, keeping its job id; a run with no publisher is left to recovery (C33)."""
    published: list[tuple[str, str | None]] = []

    def publisher(envelope: Any, run_key: str, *, job_id: str | None = None) -> str:
        published.append((run_key, job_id))
        return job_id or "new"

    waiting = DurableRun(checkout, "o-1", run_key="w", store=flexiq_store, clock=flexiq_clock)
    assert waiting.attempt().waiting
    elsewhere = DurableRun(checkout, "o-2", run_key="x", store=flexiq_store, clock=flexiq_clock)
    elsewhere.attempt()
    sent = send_event("payment", "o-1", "paid", store=flexiq_store, publishers={"test": publisher})
    assert isinstance(sent, EventSent)
    job_id = flexiq_store.get_run("w").job_id
    assert published == [("w", job_id)]
    assert sent.woken == [("w", job_id)]
    assert wake_run(flexiq_store, flexiq_store.get_run("w"), {}) is None  # no publisher: recovery's turn
    bare = send_event("payment", "o-2", "paid", store=flexiq_store, publishers={})
    assert bare.left == [("x", "no publisher")]


def test_c33_recovery_wakes_a_waiting_run_whose_event_arrived_and_one_past_its_deadline(
    flexiq_store: Any, flexiq_clock: FakeClock
) -> None:
    """A bare sender wakes nobody: ``find_stranded`` lists the waiting run whose event has arrived (at once) and
    one past its deadline (after the grace), each once until it moves (C33, C35)."""
    no_timeout = DurableRun(checkout, "o-1", run_key="a", store=flexiq_store, clock=flexiq_clock)
    with_timeout = DurableRun(checkout, "o-2", run_key="b", timeout=60, store=flexiq_store, clock=flexiq_clock)
    no_timeout.attempt()
    with_timeout.attempt()
    assert find_stranded(flexiq_store, grace=10) == []
    send_event("payment", "o-1", "paid", store=flexiq_store, publishers={})
    flexiq_clock.advance(71)
    found = {s.run.run_key: s.why for s in find_stranded(flexiq_store, grace=10)}
    assert found == {"a": "event_arrived", "b": "wait_overdue"}
    run = flexiq_store.get_run("a")
    assert flexiq_store.mark_recovered("a", status=run.status, updated_at=run.updated_at)
    assert {s.run.run_key for s in find_stranded(flexiq_store, grace=10)} == {"b"}
