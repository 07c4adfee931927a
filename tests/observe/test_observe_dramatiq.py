"""Spans, links and metrics of a real Dramatiq worker on Redis (C53).

Dramatiq has no OpenTelemetry instrumentation of its own: no span is current
when an actor runs, so each delivery opens ``flexiq.attempt``, linked to the
span that sent the message (carried in its options) on the first delivery
and to the first delivery's span afterwards. The worker runs in this process
so the SDK's in-memory exporter and reader see what it records.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.redis import RedisBroker
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from dramatiq_ext import RUN_KEY_OPTION, DurableSteps
from flexiq_plugins import NonRetryableError, SqlStepStore, current_job
from tests.conftest import require_service
from tests.observe.otel_support import Telemetry
from tests.polling import wait_for

pytestmark = [pytest.mark.redis]


@pytest.fixture
def redis_broker() -> Iterator[RedisBroker]:
    """A Redis broker in its own namespace, set as the global broker for the test."""
    require_service("Redis", "127.0.0.1", 6379)
    namespace = f"flexiq-otel-{uuid.uuid4().hex[:10]}"
    broker = RedisBroker(host="127.0.0.1", port=6379, namespace=namespace)
    broker.emit_after("process_boot")
    dramatiq.set_broker(broker)
    yield broker
    keys = list(broker.client.scan_iter(f"{namespace}:*"))
    if keys:
        broker.client.delete(*keys)
    broker.close()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqlStepStore]:
    """A SQLite step store."""
    sqlite = SqlStepStore(f"sqlite:///{tmp_path / 'steps.db'}")
    yield sqlite
    sqlite.close()


def test_c53_dramatiq_attempts_are_spans_with_their_steps_and_the_woken_one_links_to_the_first(
    telemetry: Telemetry, redis_broker: RedisBroker, store: SqlStepStore
) -> None:
    """Three steps and a sleep on a real worker: two ``flexiq.attempt`` spans (``CONSUMER``) holding the four
    step spans, none for the replayed steps; the first links to the sender's span, the woken one to the first;
    metric points for each step (C53)."""
    redis_broker.add_middleware(DurableSteps(store=store))
    actor_name = f"checkout_{uuid.uuid4().hex[:8]}"

    @dramatiq.actor(broker=redis_broker, actor_name=actor_name, queue_name=f"q{uuid.uuid4().hex[:8]}", durable=True)
    def checkout(order: str) -> str:
        step = current_job.step
        charge = step.run("charge", lambda: f"ch-{order}")
        step.sleep("1s")
        step.run("receipt", lambda: f"receipt for {charge}")
        return step.run("notify", lambda: "sent")

    worker = dramatiq.Worker(redis_broker, worker_threads=1, worker_timeout=100)
    worker.start()
    try:
        with trace.get_tracer("tests").start_as_current_span("web request") as request_span:
            message = checkout.send("A-1")
        run_key = message.options[RUN_KEY_OPTION]
        wait_for(lambda: store.get_run(run_key).status == "succeeded", 60, "the run to succeed")
        attempts = wait_for(lambda: _ended(telemetry, "flexiq.attempt", 2), 30, "two ended attempt spans")
    finally:
        worker.stop()
    first, woken = sorted(attempts, key=lambda s: s.start_time or 0)
    assert {first.kind, woken.kind} == {SpanKind.CONSUMER}
    assert [(link.attributes["flexiq.link"], link.context.span_id) for link in first.links] == [
        ("publish", request_span.get_span_context().span_id)
    ]
    assert [(link.attributes["flexiq.link"], link.context.span_id) for link in woken.links] == [
        ("first_attempt", first.context.span_id)
    ]
    steps = telemetry.named("flexiq.step")
    assert [s.attributes["flexiq.step.key"] for s in steps] == ["charge#0", "sleep#0", "receipt#0", "notify#0"]
    parents = [s.parent.span_id if s.parent else None for s in steps]
    assert parents == [first.context.span_id] * 2 + [woken.context.span_id] * 2
    assert woken.attributes["flexiq.steps.replayed"] == 2
    assert (first.attributes["flexiq.outcome"], woken.attributes["flexiq.outcome"]) == ("put_back:sleep", "completed")
    task = {"flexiq.task": actor_name}
    assert telemetry.moved("flexiq.steps", **task, **{"flexiq.step.outcome": "committed"}) == 4
    assert telemetry.moved("flexiq.steps", **task, **{"flexiq.step.outcome": "replayed"}) == 2
    assert telemetry.moved("flexiq.runs.finished", **task, **{"flexiq.run.status": "succeeded"}) == 1
    for name in ("charge", "sleep", "receipt", "notify"):
        assert telemetry.moved("flexiq.step.duration", **task, **{"flexiq.step.name": name}) == 1


def test_c53_dramatiq_a_compensation_and_its_dead_letter_are_visible(
    telemetry: Telemetry, redis_broker: RedisBroker, store: SqlStepStore
) -> None:
    """A run that fails for good on a real worker: the undo is a ``compensation`` step span, the attempt shows
    ``flexiq.compensation`` and ``flexiq.dead_letter``, and the dead-letter counter moves by one (C32, C53)."""
    redis_broker.add_middleware(DurableSteps(store=store))
    actor_name = f"booking_{uuid.uuid4().hex[:8]}"
    undone: list[str] = []

    @dramatiq.actor(
        broker=redis_broker, actor_name=actor_name, queue_name=f"q{uuid.uuid4().hex[:8]}", max_retries=0, durable=True
    )
    def booking() -> None:
        step = current_job.step
        step.run("reserve", lambda: "seat-1", compensate=undone.append)

        def pay() -> None:
            raise NonRetryableError("card stolen")

        step.run("pay", pay)

    worker = dramatiq.Worker(redis_broker, worker_threads=1, worker_timeout=100)
    worker.start()
    try:
        run_key = booking.send().options[RUN_KEY_OPTION]
        wait_for(lambda: store.get_run(run_key).status == "compensated", 60, "the run to be compensated")
        (attempt,) = wait_for(lambda: _ended(telemetry, "flexiq.attempt", 1), 30, "the attempt's span")
    finally:
        worker.stop()
    assert undone == ["seat-1"]
    (undo,) = telemetry.named("flexiq.step compensate")
    assert (undo.attributes["flexiq.step.kind"], undo.attributes["flexiq.step.outcome"]) == (
        "compensation",
        "committed",
    )
    assert undo.parent is not None
    assert undo.parent.span_id == attempt.context.span_id
    events = {event.name: event for event in attempt.events}
    assert events["flexiq.dead_letter"].attributes["flexiq.reason"] == "non_retryable"
    assert "flexiq.compensation" in events
    assert telemetry.moved("flexiq.dead_letters", **{"flexiq.task": actor_name, "flexiq.reason": "non_retryable"}) == 1


def _ended(telemetry: Telemetry, name: str, count: int) -> list[Any] | None:
    found = [s for s in telemetry.spans() if s.name == name]
    return found if len(found) >= count else None
