"""Spans, links and metrics of a real Celery worker with ``opentelemetry-instrumentation-celery`` (C53).

The worker runs in a thread of this process (``celery.contrib.testing``) on
the Redis broker, so the SDK's in-memory exporter and reader see what it
records; the instrumentation makes a ``run/<task>`` span per delivery, and the
step spans must be its children.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
from celery import Celery
from opentelemetry import trace
from opentelemetry.instrumentation.celery import CeleryInstrumentor

import celery_ext
from flexiq_plugins import SqlStepStore, current_job
from tests.conftest import require_service
from tests.observe.otel_support import Telemetry
from tests.polling import wait_for
from tests.workers import celery_thread_worker

pytestmark = [pytest.mark.redis]

BROKER = "redis://127.0.0.1:6379/12"
BACKEND = "redis://127.0.0.1:6379/13"


@pytest.fixture
def instrumented() -> Iterator[None]:
    """Celery's own OpenTelemetry instrumentation, for this test only."""
    instrumentor = CeleryInstrumentor()
    instrumentor.instrument()
    try:
        yield
    finally:
        instrumentor.uninstrument()


@pytest.fixture
def app(tmp_path: Path) -> Iterator[Celery]:
    """A Celery app on its own Redis queue, with durable steps on a SQLite store."""
    require_service("Redis", "127.0.0.1", 6379)
    name = f"fqo{uuid4().hex[:10]}"
    app = Celery(name, broker=BROKER, backend=BACKEND, set_as_current=False)
    app.conf.update(task_default_queue=name, broker_connection_retry_on_startup=True, worker_hijack_root_logger=False)
    store = SqlStepStore(f"sqlite:///{tmp_path / 'steps.db'}")
    celery_ext.install(app, store=store)

    @app.task(name=f"{name}.checkout")  # a name of its own: the core keeps one task per name
    def checkout(order: str) -> str:
        step = current_job.step
        charge = step.run("charge", lambda: f"ch-{order}")
        step.sleep("1s")
        step.run("receipt", lambda: f"receipt for {charge}")
        return step.run("notify", lambda: "sent")

    yield app
    with app.connection_for_write() as conn:
        conn.default_channel.queue_delete(name)
    store.close()


def test_c53_celery_step_spans_are_children_of_the_task_spans_and_the_woken_attempt_links_to_the_first(
    telemetry: Telemetry, instrumented: None, app: Celery
) -> None:
    """Three steps and a sleep on a real worker: four step spans, each a child of its delivery's ``run/<task>``
    span, none for the two replayed steps; the woken delivery's span links to the first's; metric points for
    each step (C53)."""
    tracer = trace.get_tracer("tests")
    with celery_thread_worker(app):
        with tracer.start_as_current_span("web request") as request_span:
            result = app.tasks[f"{app.main}.checkout"].delay("A-1")
        assert result.get(timeout=60) == "sent"
        runs = wait_for(lambda: _ended(telemetry, f"run/{app.main}.checkout", 2), 30, "two ended run/ spans")
    first, woken = sorted(runs, key=lambda s: s.start_time or 0)
    steps = telemetry.named("flexiq.step")
    assert [s.attributes["flexiq.step.key"] for s in steps] == ["charge#0", "sleep#0", "receipt#0", "notify#0"]
    parents = [s.parent.span_id if s.parent else None for s in steps]
    assert parents == [first.context.span_id] * 2 + [woken.context.span_id] * 2
    assert "flexiq.attempt" not in {s.name for s in telemetry.spans()}  # the task's span is the attempt's
    assert woken.context.trace_id == first.context.trace_id  # the wake-up was published under the first's span
    links = {link.attributes["flexiq.link"]: link.context.span_id for link in woken.links}
    assert links == {"first_attempt": first.context.span_id}
    assert first.attributes["flexiq.run_key"] == woken.attributes["flexiq.run_key"]
    assert (first.attributes["flexiq.attempt"], woken.attributes["flexiq.attempt"]) == (1, 2)
    assert woken.attributes["flexiq.steps.replayed"] == 2
    # the job was published under the web request: the first delivery runs in (or links to) its trace
    published = {link.context.trace_id for link in first.links} | {first.context.trace_id}
    assert request_span.get_span_context().trace_id in published
    task = {"flexiq.task": f"{app.main}.checkout"}
    assert telemetry.moved("flexiq.steps", **task, **{"flexiq.step.outcome": "committed"}) == 4
    assert telemetry.moved("flexiq.steps", **task, **{"flexiq.step.outcome": "replayed"}) == 2
    assert telemetry.moved("flexiq.runs.finished", **task, **{"flexiq.run.status": "succeeded"}) == 1
    for name in ("charge", "sleep", "receipt", "notify"):
        assert telemetry.moved("flexiq.step.duration", **task, **{"flexiq.step.name": name}) == 1


def _ended(telemetry: Telemetry, name: str, count: int) -> list[Any] | None:
    found = [s for s in telemetry.spans() if s.name == name]
    return found if len(found) >= count else None


def test_c53_without_celerys_instrumentation_the_attempt_opens_its_span_linked_to_the_publisher(
    telemetry: Telemetry, app: Celery
) -> None:
    """No ``run/<task>`` span: each delivery opens ``flexiq.attempt``; the first links to the span that
    published the job (carried in the message), the woken one to the first (C53)."""
    tracer = trace.get_tracer("tests")
    with celery_thread_worker(app):
        with tracer.start_as_current_span("web request") as request_span:
            result = app.tasks[f"{app.main}.checkout"].delay("A-2")
        assert result.get(timeout=60) == "sent"
        attempts = wait_for(lambda: _ended(telemetry, "flexiq.attempt", 2), 30, "two ended attempt spans")
    first, woken = sorted(attempts, key=lambda s: s.start_time or 0)
    assert [(link.attributes["flexiq.link"], link.context.span_id) for link in first.links] == [
        ("publish", request_span.get_span_context().span_id)
    ]
    assert [(link.attributes["flexiq.link"], link.context.span_id) for link in woken.links] == [
        ("first_attempt", first.context.span_id)
    ]
    steps = telemetry.named("flexiq.step")
    assert [s.parent.span_id if s.parent else None for s in steps] == [first.context.span_id] * 2 + [
        woken.context.span_id
    ] * 2
