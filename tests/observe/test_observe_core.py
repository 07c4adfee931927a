"""Spans, links and metrics of runs driven attempt by attempt in this process (C53).

Each run here is a :class:`flexiq_plugins.testing.DurableRun` on the memory
store with the OpenTelemetry SDK configured (see ``conftest.py``); the
framework tests (``test_observe_celery.py``, ``test_observe_dramatiq.py``) run
the same kind of job on real workers.
"""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.trace import SpanKind, StatusCode

from flexiq_plugins import Compensation, DurableConfig, NonRetryableError, RetryPolicy, current_job
from flexiq_plugins.testing import DurableRun
from tests.observe.otel_support import Telemetry


def checkout(order: str) -> str:
    """Three steps with a sleep between the first and the others."""
    step = current_job.step
    charge = step.run("charge", lambda: f"ch-{order}")
    step.sleep("1h")
    step.run("receipt", lambda: f"receipt for {charge}")
    return step.run("notify", lambda: "sent")


def by_name(telemetry: Telemetry) -> dict[str, list[Any]]:
    found: dict[str, list[Any]] = {}
    for span in telemetry.spans():
        found.setdefault(span.name, []).append(span)
    return found


def test_c53_each_executed_step_is_one_span_under_its_attempt(telemetry: Telemetry) -> None:
    """A three-step run with a sleep: one span per executed step, children of ``flexiq.attempt``, none for a
    replayed step; the woken attempt links to the first one (C53)."""
    run = DurableRun(checkout, "A-1", task_name="shop.checkout")
    assert run.attempt().sleeping
    run.clock.advance("1h")
    assert run.attempt().completed
    spans = by_name(telemetry)
    attempts = spans["flexiq.attempt"]
    assert len(attempts) == 2
    first, woken = attempts
    assert first.kind is SpanKind.CONSUMER
    assert [s.attributes["flexiq.step.key"] for s in telemetry.named("flexiq.step")] == [
        "charge#0",
        "sleep#0",
        "receipt#0",
        "notify#0",
    ]
    for span in spans["flexiq.step charge"] + spans["flexiq.step sleep"]:
        assert span.parent is not None
        assert span.parent.span_id == first.context.span_id
        assert span.kind is SpanKind.INTERNAL
    for span in spans["flexiq.step receipt"] + spans["flexiq.step notify"]:
        assert span.parent is not None
        assert span.parent.span_id == woken.context.span_id
    assert [(link.context.span_id, link.attributes["flexiq.link"]) for link in woken.links] == [
        (first.context.span_id, "first_attempt")
    ]
    assert first.links == ()
    assert woken.attributes["flexiq.steps.replayed"] == 2  # charge and the sleep: no span of their own
    assert (first.attributes["flexiq.outcome"], woken.attributes["flexiq.outcome"]) == ("put_back:sleep", "completed")
    assert (first.attributes["flexiq.attempt"], woken.attributes["flexiq.attempt"]) == (1, 2)
    assert woken.attributes["flexiq.run.status"] == "succeeded"


def test_c53_a_step_span_names_the_run_the_step_and_its_outcome(telemetry: Telemetry) -> None:
    """A step span carries the run key, job id, task, attempt, key, kind, position, outcome and bytes (C53)."""
    run = DurableRun(checkout, "A-2", task_name="shop.checkout", run_key="run-attrs")
    run.attempt()
    (charge,) = telemetry.named("flexiq.step charge")
    attributes = dict(charge.attributes)
    assert attributes["flexiq.run_key"] == "run-attrs"
    assert attributes["flexiq.task"] == "shop.checkout"
    assert attributes["flexiq.job_id"].startswith("job-")
    assert attributes["flexiq.attempt"] == 1
    assert attributes["flexiq.step.kind"] == "run"
    assert attributes["flexiq.step.position"] == 0
    assert attributes["flexiq.step.outcome"] == "committed"
    assert attributes["flexiq.step.bytes"] == len(run.steps[0].value or b"")
    assert "flexiq.step.idempotency_key" not in attributes
    (sleep,) = telemetry.named("flexiq.step sleep")
    assert sleep.attributes["flexiq.step.kind"] == "sleep"
    assert [event.name for event in sleep.events] == ["flexiq.sleep"]
    assert sleep.events[0].attributes["flexiq.sleep.seconds"] == pytest.approx(3600, abs=1)


def test_c53_the_idempotency_key_is_on_the_span_only_when_asked_for(telemetry: Telemetry) -> None:
    """``trace_idempotency_keys=True`` puts ``flexiq.step.idempotency_key`` on a step's span (C53)."""
    config = DurableConfig(trace_idempotency_keys=True)
    DurableRun(checkout, "A-3", run_key="run-keys", config=config).attempt()
    (charge,) = telemetry.named("flexiq.step charge")
    assert charge.attributes["flexiq.step.idempotency_key"] == "run-keys:charge#0"


def test_c53_step_spans_nest_under_the_current_span_and_the_body_nests_under_them(telemetry: Telemetry) -> None:
    """Under a span current when the attempt starts, no ``flexiq.attempt`` is opened; a span the step body
    starts is the step span's child (C53)."""
    tracer = trace.get_tracer("tests")

    def body() -> str:
        def charge() -> str:
            with tracer.start_as_current_span("payment-call"):
                return "ok"

        return current_job.step.run("charge", charge)

    with tracer.start_as_current_span("run/shop.checkout") as task_span:
        assert DurableRun(body, run_key="run-nested").attempt().completed
    spans = by_name(telemetry)
    assert "flexiq.attempt" not in spans
    (step,) = spans["flexiq.step charge"]
    (call,) = spans["payment-call"]
    assert step.parent is not None
    assert step.parent.span_id == task_span.get_span_context().span_id
    assert call.parent is not None
    assert call.parent.span_id == step.context.span_id
    (task,) = spans["run/shop.checkout"]
    assert task.attributes["flexiq.run_key"] == "run-nested"
    assert task.attributes["flexiq.outcome"] == "completed"


def test_c53_a_step_retry_and_its_exhaustion_show_as_outcomes(telemetry: Telemetry) -> None:
    """A failing step with a budget: ``retry_scheduled`` with the body's error type, then ``exhausted`` (C31, C53)."""

    def flaky() -> None:
        def fail() -> None:
            raise ValueError("card declined")

        current_job.step.run("charge", fail, retry=RetryPolicy(max_attempts=2, initial_delay=1))

    run = DurableRun(flaky, run_key="run-retry")
    assert run.attempt().step_retrying
    run.clock.advance(5)
    run.attempt()
    outcomes = [
        (s.attributes["flexiq.step.outcome"], s.attributes["error.type"]) for s in telemetry.named("flexiq.step")
    ]
    assert outcomes == [("retry_scheduled", "ValueError"), ("exhausted", "flexiq_plugins.errors.StepRetryExhausted")]
    exhausted = telemetry.named("flexiq.step")[-1]
    assert exhausted.status.status_code is StatusCode.ERROR
    assert telemetry.moved("flexiq.steps", **{"flexiq.step.outcome": "retry_scheduled"}) == 1
    assert telemetry.moved("flexiq.steps", **{"flexiq.step.outcome": "exhausted"}) == 1


def test_c53_a_compensation_and_its_dead_letter_are_visible(telemetry: Telemetry) -> None:
    """A run that fails for good after a step with an undo: a ``compensation`` step span, a
    ``flexiq.compensation`` and a ``flexiq.dead_letter`` event, the dead-letter counter moved (C32, C53)."""
    undone: list[str] = []

    def booking() -> None:
        step = current_job.step
        step.run("reserve", lambda: "seat-1", compensate=Compensation(undone.append))

        def pay() -> None:
            raise NonRetryableError("card stolen")

        step.run("pay", pay)

    run = DurableRun(booking, run_key="run-undo", task_name="travel.book")
    assert run.attempt().dead_lettered
    assert undone == ["seat-1"]
    (undo,) = telemetry.named("flexiq.step compensate")
    assert undo.attributes["flexiq.step.kind"] == "compensation"
    assert undo.attributes["flexiq.step.key"] == "compensate:reserve#0"
    (pay,) = telemetry.named("flexiq.step pay")
    assert pay.attributes["flexiq.step.outcome"] == "failed"
    (attempt,) = telemetry.named("flexiq.attempt")
    events = {event.name: event for event in attempt.events}
    assert "flexiq.compensation" in events
    assert events["flexiq.dead_letter"].attributes["flexiq.reason"] == "non_retryable"
    assert attempt.attributes["flexiq.run.status"] == "compensated"
    assert attempt.status.status_code is StatusCode.ERROR
    assert (
        telemetry.moved("flexiq.dead_letters", **{"flexiq.reason": "non_retryable", "flexiq.task": "travel.book"}) == 1
    )
    assert telemetry.moved("flexiq.runs.finished", **{"flexiq.run.status": "compensated"}) == 1


def test_c53_a_divergence_shows_on_the_attempt(telemetry: Telemetry) -> None:
    """A body whose steps changed since they were recorded: a ``flexiq.divergence`` event, a dead letter (C12, C53)."""
    version = {"name": "charge"}

    def body() -> None:
        step = current_job.step
        step.run(version["name"], lambda: 1)
        step.sleep("1m")

    run = DurableRun(body, run_key="run-diverge")
    run.attempt()
    version["name"] = "bill"
    run.clock.advance("1m")
    assert run.attempt().dead_lettered
    woken = telemetry.named("flexiq.attempt")[-1]
    names = [event.name for event in woken.events]
    assert "flexiq.divergence" in names
    assert "flexiq.dead_letter" in names
    assert telemetry.moved("flexiq.dead_letters", **{"flexiq.reason": "divergence"}) == 1


def test_c53_a_wait_notes_its_topic_and_key(telemetry: Telemetry) -> None:
    """A wait that finds no event ends its step ``suspended`` with a ``flexiq.wait`` event; the event's arrival
    commits it (C33, C53)."""

    def body() -> Any:
        return current_job.step.wait_for_event("payment", key="order-7", timeout="1h")

    run = DurableRun(body, run_key="run-wait")
    assert run.attempt().waiting
    run.send_event("payment", "order-7", {"paid": True})
    assert run.attempt().completed
    steps = telemetry.named("flexiq.step")
    assert [(s.attributes["flexiq.step.key"], s.attributes["flexiq.step.outcome"]) for s in steps] == [
        ("payment#0", "committed"),
        ("event:payment#0", "suspended"),
        ("event:payment#0", "committed"),
    ]
    assert {s.attributes["flexiq.step.kind"] for s in steps} == {"wait"}
    (wait,) = steps[1].events
    assert (wait.name, wait.attributes["flexiq.wait.topic"], wait.attributes["flexiq.wait.key"]) == (
        "flexiq.wait",
        "payment",
        "order-7",
    )


def test_c53_metrics_count_steps_replays_and_finished_runs(telemetry: Telemetry) -> None:
    """The counters move by what the run did: 4 executed steps, 2 replayed, one run succeeded; each executed
    step has a duration point and each commit a store duration (C53)."""
    run = DurableRun(checkout, "A-9", task_name="metrics.checkout")
    run.attempt()
    run.clock.advance("1h")
    run.attempt()
    task = {"flexiq.task": "metrics.checkout"}
    assert telemetry.moved("flexiq.steps", **task, **{"flexiq.step.outcome": "committed"}) == 4
    assert telemetry.moved("flexiq.steps", **task, **{"flexiq.step.outcome": "replayed"}) == 2
    assert telemetry.moved("flexiq.runs.finished", **task, **{"flexiq.run.status": "succeeded"}) == 1
    for name in ("charge", "sleep", "receipt", "notify"):
        assert telemetry.moved("flexiq.step.duration", **task, **{"flexiq.step.name": name}) == 1
    assert telemetry.moved("flexiq.store.commit.duration", **task) == 4


def test_c53_tracing_false_and_metrics_false_turn_each_off(telemetry: Telemetry) -> None:
    """``tracing=False`` makes no span (metrics still move); ``metrics=False`` moves no metric (spans still made)."""
    DurableRun(checkout, "A", task_name="off.tracing", config=DurableConfig(tracing=False)).attempt()
    assert telemetry.spans() == []
    assert telemetry.moved("flexiq.steps", **{"flexiq.task": "off.tracing"}) == 2
    DurableRun(checkout, "B", task_name="off.metrics", config=DurableConfig(metrics=False)).attempt()
    assert len(telemetry.named("flexiq.step")) == 2
    assert telemetry.moved("flexiq.steps", **{"flexiq.task": "off.metrics"}) == 0
    run = DurableRun(checkout, "C", config=DurableConfig(tracing=False, metrics=False))
    assert run.driver.observer is None


def test_c53_recovery_counts_each_re_publish_by_reason(telemetry: Telemetry) -> None:
    """A sweep that re-publishes an overdue sleeper counts it under its reason and task (C35, C53)."""
    from flexiq_plugins._delivery.recovery import Sweeper
    from flexiq_plugins._observe import observer_for

    run = DurableRun(checkout, "R-1", task_name="shop.recover", run_key="run-lost-sleeper")
    assert run.attempt().sleeping
    run.clock.advance("2h")  # its wake-up message was lost: nothing woke it
    published: list[str] = []

    def publish(envelope: Any, run_key: str, **_: Any) -> str:
        published.append(run_key)
        return "job-again"

    sweeper = Sweeper(run.store, {"test": publish}, observer=observer_for(DurableConfig()))
    report = sweeper.sweep()
    assert [stranded.why for stranded, _ in report.recovered] == ["sleep_overdue"]
    assert published == ["run-lost-sleeper"]
    labels = {"flexiq.reason": "sleep_overdue", "flexiq.task": "shop.recover"}
    assert telemetry.moved("flexiq.recovery.republished", **labels) == 1


def test_c53_a_store_outage_is_counted(telemetry: Telemetry) -> None:
    """An attempt put back because the store is unavailable moves ``flexiq.store.unavailable`` (C28, C53)."""
    from flexiq_plugins import MemoryStepStore, StoreUnavailable

    class DownStore(MemoryStepStore):
        def begin(self, *args: Any, **kwargs: Any) -> Any:
            raise StoreUnavailable("the database is down")

    result = DurableRun(checkout, "S-1", store=DownStore()).attempt()
    assert result.decision is not None
    assert telemetry.moved("flexiq.store.unavailable") == 1


def test_c53_the_suspended_runs_gauge_reads_the_store(telemetry: Telemetry) -> None:
    """``flexiq.runs.suspended`` reports the store's sleeping runs, read at most every 30 s (C53)."""
    from flexiq_plugins import MemoryStepStore
    from flexiq_plugins.testing import FakeClock

    reads: list[int] = []

    class CountingStore(MemoryStepStore):
        def count_statuses(self, statuses: Any) -> dict[str, int]:
            reads.append(1)
            return super().count_statuses(statuses)

    clock = FakeClock()
    store = CountingStore(clock=clock)
    for key in ("g-1", "g-2"):
        assert DurableRun(checkout, key, run_key=f"run-{key}", store=store, clock=clock).attempt().sleeping
    points = telemetry.points("flexiq.runs.suspended")
    assert points[frozenset({("flexiq.run.status", "sleeping")})] >= 2
    sampled = len(reads)
    telemetry.points("flexiq.runs.suspended")
    assert len(reads) == sampled  # the next collection, within 30 s, reuses the sample
