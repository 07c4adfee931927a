"""The OpenTelemetry observer: spans, links and metrics through ``opentelemetry-api`` only (C53).

Importing this module imports ``opentelemetry``; `flexiq_plugins._observe.observer_for`
imports it only when asked and treats an ``ImportError`` as "no observer".

**When something is recorded.** The process's tracer and meter providers are
looked at once per attempt: while the application has configured neither
(the API's default proxy providers, which record nothing), the attempt gets
no observation at all, so a step costs what it costs without this module.
A provider configured later (an SDK set up after the worker started) is
seen by the next attempt.

**Spans.** An attempt runs under the span current when it starts: Celery's
``run/<task>`` span when ``opentelemetry-instrumentation-celery`` is
installed, or a span of the caller's. When none is current, the attempt
opens its own, ``flexiq.attempt`` (kind ``CONSUMER``: it processes a
message). Each executed step is a ``flexiq.step <name>`` span (kind
``INTERNAL``), a child of the span current when it starts, and current
while its body runs, so the body's own spans nest under it. A memo hit makes
no span; the attempt's span counts them (``flexiq.steps.replayed``). A step
map is a ``flexiq.step <name>`` span of kind ``map``, and each item that runs
a child span of its own, current in the thread or task its body runs in.

**Links.** The attempt's span carries a link to the run's first traced
attempt (``flexiq.link = first_attempt``, read with the claim) or, on that
first attempt, to the span that published the job when its message carries
one (``flexiq.link = publish``). Links on a span the attempt did not open
are added with ``Span.add_link``.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.metrics import _internal as _metrics_internal
from opentelemetry.trace import Span, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from .._model.identity import StepId
from ..errors import StepRetrySignal
from .observer import Attribute, CountRuns, StepKindName, StepOutcome

__all__ = ["GAUGE_SAMPLE_SECONDS", "OtelAttempt", "OtelObserver", "OtelStep", "format_traceparent", "parse_traceparent"]

_SCOPE = "flexiq_plugins"
GAUGE_SAMPLE_SECONDS = 30.0
"""The store is read for the suspended-runs gauge at most this often per process, seconds."""

_SUSPENDED = ("sleeping", "waiting")
_FAILED_OUTCOMES = frozenset({"failed", "exhausted", "refused"})
_FAILED_ATTEMPTS = frozenset({"failure", "dead_letter"})
_SECONDS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_NO_RECORDING_PROVIDERS: tuple[type, ...] = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)


def _meter_provider_types() -> tuple[type, ...]:
    from opentelemetry.metrics import _internal

    proxy = getattr(_internal, "_ProxyMeterProvider", None)  # the API's default until a provider is set
    return (metrics.NoOpMeterProvider,) if proxy is None else (metrics.NoOpMeterProvider, proxy)


_NO_METERING_PROVIDERS = _meter_provider_types()


def _provider_global(module: Any, name: str, env_var: str) -> Callable[[], object]:
    """A cheap read of the API's global provider ``name`` of ``module``: ``None`` while none is set.

    Asked at every attempt and publish, so it reads the global instead of the
    API's getter, which looks ``env_var`` up in the environment each time it
    finds none set. A process started with ``env_var`` set (a provider the API
    loads from the environment), or an API without that global, uses the getter.
    """
    if env_var in os.environ or not hasattr(module, name):
        getter = module.get_tracer_provider if module is trace else metrics.get_meter_provider
        return getter  # type: ignore[no-any-return]
    return lambda: getattr(module, name)


_tracer_provider = _provider_global(trace, "_TRACER_PROVIDER", "OTEL_PYTHON_TRACER_PROVIDER")
_meter_provider = _provider_global(_metrics_internal, "_METER_PROVIDER", "OTEL_PYTHON_METER_PROVIDER")


def tracing_configured() -> bool:
    """Whether the application has set a tracer provider (the API's default proxy records nothing)."""
    provider = _tracer_provider()
    return provider is not None and not isinstance(provider, _NO_RECORDING_PROVIDERS)


def metrics_configured() -> bool:
    """Whether the application has set a meter provider."""
    provider = _meter_provider()
    return provider is not None and not isinstance(provider, _NO_METERING_PROVIDERS)


# ------------------------------------------------------------ trace context
def format_traceparent(context: SpanContext) -> str | None:
    """The W3C ``traceparent`` of ``context`` (``00-<trace id>-<span id>-<flags>``), ``None`` if it is invalid."""
    if not context.is_valid:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def parse_traceparent(value: object) -> SpanContext | None:
    """The remote span context a W3C ``traceparent`` names, ``None`` for anything else."""
    if not isinstance(value, str):
        return None
    parts = value.strip().split("-")
    if len(parts) != 4 or [len(p) for p in parts] != [2, 32, 16, 2]:
        return None
    try:
        version, trace_id, span_id, flags = (int(p, 16) for p in parts)
    except ValueError:
        return None
    if version == 0xFF:
        return None
    context = SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(flags & 0xFF))
    return context if context.is_valid else None


def current_traceparent() -> str | None:
    """The ``traceparent`` of the span current in the calling context, ``None`` without one or without a provider."""
    if not tracing_configured():
        return None
    return format_traceparent(trace.get_current_span().get_span_context())


# ---------------------------------------------------------------- metrics
class _Instruments:
    """The process's instruments, made once on first use (a provider set later still gets their measurements)."""

    def __init__(self) -> None:
        meter = metrics.get_meter(_SCOPE)
        self.step_duration = _histogram(
            meter, "flexiq.step.duration", "Duration of each executed step, from its start to its commit or failure"
        )
        self.commit_duration = _histogram(
            meter, "flexiq.store.commit.duration", "Duration of each step commit in the step store"
        )
        self.steps = meter.create_counter("flexiq.steps", "{step}", "Steps by outcome, memo hits as 'replayed'")
        self.runs_finished = meter.create_counter("flexiq.runs.finished", "{run}", "Runs that ended, by status")
        self.dead_letters = meter.create_counter("flexiq.dead_letters", "{dead_letter}", "Dead letters by reason")
        self.republished = meter.create_counter(
            "flexiq.recovery.republished", "{run}", "Runs re-published by recovery, by reason"
        )
        self.store_unavailable = meter.create_counter(
            "flexiq.store.unavailable", "{attempt}", "Attempts put back because the step store was unavailable"
        )
        self._watched: list[_Watched] = []
        self._lock = threading.Lock()
        meter.create_observable_gauge(
            "flexiq.runs.suspended",
            callbacks=[self._suspended],
            unit="{run}",
            description="Runs sleeping or waiting for an event, read from the step store at most every 30 s",
        )

    def watch(self, count_runs: CountRuns) -> None:
        with self._lock:
            if not any(w.reads(count_runs) for w in self._watched):
                self._watched.append(_Watched(count_runs))

    def _suspended(self, options: Any) -> Iterable[metrics.Observation]:
        totals = dict.fromkeys(_SUSPENDED, 0)
        with self._lock:
            self._watched = [w for w in self._watched if w.alive]
            watched = list(self._watched)
        for store in watched:
            for status, count in store.sample().items():
                totals[status] = totals.get(status, 0) + count
        return [metrics.Observation(count, {"flexiq.run.status": status}) for status, count in totals.items()]


class _Watched:
    """One store sampled for the gauge: held weakly (a closed store's driver goes away), read at most every 30 s."""

    def __init__(self, count_runs: CountRuns) -> None:
        self._ref: Callable[[], CountRuns | None]
        try:
            self._ref = weakref.WeakMethod(count_runs)  # type: ignore[arg-type]
        except TypeError:  # a plain function: held as it is
            self._ref = lambda: count_runs
        self._sampled_at: float | None = None
        self._counts: Mapping[str, int] = {}

    @property
    def alive(self) -> bool:
        return self._ref() is not None

    def reads(self, count_runs: CountRuns) -> bool:
        return self._ref() == count_runs

    def sample(self) -> Mapping[str, int]:
        """The store's counts, read again when the last sample is older than `GAUGE_SAMPLE_SECONDS`."""
        count_runs = self._ref()
        now = time.monotonic()
        if count_runs is None or (self._sampled_at is not None and now - self._sampled_at < GAUGE_SAMPLE_SECONDS):
            return self._counts
        try:
            self._counts = dict(count_runs(_SUSPENDED))
        except Exception:  # a store outage: the last sample stands, the next collection tries again
            return self._counts
        self._sampled_at = now
        return self._counts


def _histogram(meter: metrics.Meter, name: str, description: str) -> metrics.Histogram:
    try:
        return meter.create_histogram(name, "s", description, explicit_bucket_boundaries_advisory=_SECONDS_BUCKETS)
    except TypeError:  # an API older than the bucket advisory
        return meter.create_histogram(name, "s", description)


_instruments: _Instruments | None = None
_instruments_lock = threading.Lock()


def instruments() -> _Instruments:
    """This process's instruments (made on first use)."""
    global _instruments
    if _instruments is None:
        with _instruments_lock:
            if _instruments is None:
                _instruments = _Instruments()
    return _instruments


# --------------------------------------------------------------- observer
class OtelObserver:
    """`Observer` over OpenTelemetry.

    Parameters:
      tracing (bool): make spans and links (the ``tracing`` option).
      metrics (bool): record metrics (the ``metrics`` option).
      idempotency_keys (bool): put each step's idempotency key on its span.
    """

    def __init__(self, *, tracing: bool, metrics: bool, idempotency_keys: bool = False) -> None:
        self.tracing = tracing
        self.metrics = metrics
        self.idempotency_keys = idempotency_keys

    def attempt(self, *, run_key: str, job_id: str, task: str, publish_trace: str | None) -> OtelAttempt | None:
        """An observation of one attempt, or ``None`` while no provider that records is configured."""
        tracing = self.tracing and tracing_configured()
        metering = self.metrics and metrics_configured()
        if not (tracing or metering):
            return None
        return OtelAttempt(self, run_key, job_id, task, publish_trace, tracing=tracing, metering=metering)

    def republished(self, why: str, task: str) -> None:
        """Count one recovery re-publish (``flexiq.recovery.republished``)."""
        if self.metrics:
            instruments().republished.add(1, {"flexiq.reason": why, "flexiq.task": task})

    def store_unavailable(self) -> None:
        """Count one put-back for a store outage (``flexiq.store.unavailable``)."""
        if self.metrics:
            instruments().store_unavailable.add(1)

    def watch(self, count_runs: CountRuns) -> None:
        """Sample the store's sleeping and waiting runs for ``flexiq.runs.suspended``."""
        if self.metrics:
            instruments().watch(count_runs)


class OtelAttempt:
    """`AttemptObservation` over OpenTelemetry.

    Opens ``flexiq.attempt`` when no span is current; otherwise the current span is the attempt's.
    """

    def __init__(
        self,
        observer: OtelObserver,
        run_key: str,
        job_id: str,
        task: str,
        publish_trace: str | None,
        *,
        tracing: bool,
        metering: bool,
    ) -> None:
        self.observer = observer
        self.attributes: dict[str, Attribute] = {
            "flexiq.run_key": run_key,
            "flexiq.job_id": job_id,
            "flexiq.task": task,
        }
        self.task = task
        self.run_key = run_key
        self.metering = metering
        self.instruments = instruments() if metering else None
        self.replays = 0
        self._publish_trace = publish_trace
        self._tracer = trace.get_tracer(_SCOPE) if tracing else None
        self.span: Span | None = None
        self.owned = False
        self.trace_context: str | None = None
        if tracing:
            self._open()

    def _open(self) -> None:
        current = trace.get_current_span()
        if current.get_span_context().is_valid:
            self.span = current
            for name, value in self.attributes.items():
                current.set_attribute(name, value)
        else:
            assert self._tracer is not None
            self.span = self._tracer.start_span("flexiq.attempt", kind=SpanKind.CONSUMER, attributes=self.attributes)
            self.owned = True
        self.trace_context = format_traceparent(self.span.get_span_context())

    # ------------------------------------------------------------ the body
    def activate(self) -> object:
        """Make ``flexiq.attempt`` current for the body (nothing to do under a span the attempt did not open)."""
        if not self.owned:
            return None
        assert self.span is not None
        return otel_context.attach(trace.set_span_in_context(self.span))

    def deactivate(self, token: object) -> None:
        """Undo `activate`."""
        if token is not None:
            otel_context.detach(token)  # type: ignore[arg-type]

    def claimed(self, attempt: int, first_trace: str | None) -> None:
        """Name the attempt on its span and link it to the run's first trace, or the first attempt to its publisher."""
        self.attributes["flexiq.attempt"] = attempt
        span = self.span
        if span is None:
            return
        span.set_attribute("flexiq.attempt", attempt)
        first = parse_traceparent(first_trace)
        if first is not None:
            if first.span_id != span.get_span_context().span_id:
                _link(span, first, "first_attempt")
            return
        published = parse_traceparent(self._publish_trace)
        if published is not None:
            _link(span, published, "publish")

    # ------------------------------------------------------------- steps
    def step(self, step: StepId, kind: StepKindName, position: int, *, current: bool = True) -> OtelStep:
        """Start the step's span (current until it ends, unless ``current`` is false) and its clock."""
        return OtelStep(self, step, kind, position, current=current)

    def replayed(self, step: StepId) -> None:
        """Count a memo hit."""
        self.replays += 1
        if self.instruments is not None:
            self.instruments.steps.add(1, {"flexiq.task": self.task, "flexiq.step.outcome": "replayed"})

    def committed(self, seconds: float) -> None:
        """Record one commit's duration."""
        if self.instruments is not None:
            self.instruments.commit_duration.record(seconds, {"flexiq.task": self.task})

    def event(self, name: str, attributes: Mapping[str, Attribute]) -> None:
        """Add an event to the attempt's span."""
        if self.span is not None:
            self.span.add_event(name, dict(attributes))

    # ------------------------------------------------------------ the end
    def finished(self, status: str, *, reason: str | None = None, message: str | None = None) -> None:
        """Count the run's end and its dead letter; show them on the attempt's span."""
        if self.span is not None:
            self.span.set_attribute("flexiq.run.status", status)
            described = {k: v for k, v in (("flexiq.reason", reason), ("flexiq.message", message)) if v is not None}
            if status in ("dead", "compensated") and reason is not None:
                self.span.add_event("flexiq.dead_letter", described)
            elif status == "cancelled":
                self.span.add_event("flexiq.cancelled", described)
        if self.instruments is None:
            return
        if status in ("succeeded", "failed", "dead", "cancelled", "compensated"):
            self.instruments.runs_finished.add(1, {"flexiq.task": self.task, "flexiq.run.status": status})
        if status in ("dead", "compensated") and reason is not None:
            self.instruments.dead_letters.add(1, {"flexiq.task": self.task, "flexiq.reason": reason})

    def ended(self, outcome: str, error: BaseException | None = None) -> None:
        """Put the outcome and the memo hits on the span; end it if the attempt opened it."""
        span = self.span
        if span is None:
            return
        span.set_attribute("flexiq.outcome", outcome)
        span.set_attribute("flexiq.steps.replayed", self.replays)
        if not self.owned:
            return
        if error is not None:
            span.set_attribute("error.type", _error_type(error))
        if error is not None or outcome in _FAILED_ATTEMPTS:
            described = outcome if error is None else f"{type(error).__name__}: {error}"
            span.set_status(Status(StatusCode.ERROR, described[:512]))
        span.end()


class OtelStep:
    """`StepObservation`: one step's span and clock."""

    def __init__(
        self, attempt: OtelAttempt, step: StepId, kind: StepKindName, position: int, *, current: bool = True
    ) -> None:
        self._attempt = attempt
        self._name = step.name
        self._kind = kind
        self._started = time.perf_counter()
        self._span: Span | None = None
        self._token: object = None
        tracer = attempt._tracer
        if tracer is None:
            return
        attributes: dict[str, Attribute] = {
            **attempt.attributes,
            "flexiq.step.key": step.step_key,
            "flexiq.step.name": step.name,
            "flexiq.step.kind": kind,
            "flexiq.step.position": position,
        }
        if attempt.observer.idempotency_keys and kind in ("run", "transaction", "compensation"):
            attributes["flexiq.step.idempotency_key"] = f"{attempt.run_key}:{step.step_key}"
        self._span = tracer.start_span(f"flexiq.step {step.name}", kind=SpanKind.INTERNAL, attributes=attributes)
        if current:
            self._token = self.activate()

    def activate(self) -> object:
        """Make the step's span current in the calling context; return the token for `deactivate`."""
        if self._span is None:
            return None
        return otel_context.attach(trace.set_span_in_context(self._span))

    def deactivate(self, token: object) -> None:
        """Undo `activate`."""
        if token is not None:
            otel_context.detach(token)  # type: ignore[arg-type]

    def event(self, name: str, attributes: Mapping[str, Attribute]) -> None:
        """Add an event to the step's span."""
        if self._span is not None:
            self._span.add_event(name, dict(attributes))

    def end(self, outcome: StepOutcome, *, size: int = 0, error: BaseException | None = None) -> None:
        """End the span with the outcome, and record the step's duration and outcome."""
        attempt = self._attempt
        if attempt.instruments is not None:
            labels = {"flexiq.task": attempt.task, "flexiq.step.name": self._name, "flexiq.step.outcome": outcome}
            attempt.instruments.step_duration.record(time.perf_counter() - self._started, labels)
            attempt.instruments.steps.add(1, {"flexiq.task": attempt.task, "flexiq.step.outcome": outcome})
        span = self._span
        if span is None:
            return
        self.deactivate(self._token)
        span.set_attribute("flexiq.step.outcome", outcome)
        span.set_attribute("flexiq.step.bytes", size)
        failure = _failure_of(error)
        if failure is not None and outcome != "committed":
            span.set_attribute("error.type", _error_type(failure))
            if outcome in _FAILED_OUTCOMES:
                span.record_exception(failure)
                span.set_status(Status(StatusCode.ERROR, f"{type(failure).__name__}: {failure}"[:512]))
        span.end()


def _link(span: Span, target: SpanContext, kind: str) -> None:
    """Link ``span`` to ``target`` (``Span.add_link``: a span already started, possibly not the attempt's own)."""
    add_link = getattr(span, "add_link", None)  # an API older than Span.add_link cannot link after the start
    if add_link is not None:
        add_link(target, {"flexiq.link": kind})


def _failure_of(error: BaseException | None) -> BaseException | None:
    """The error a step's span names: a retry signal's cause (the body's error), else the error itself."""
    if isinstance(error, StepRetrySignal) and error.__cause__ is not None:
        return error.__cause__
    return error


def _error_type(error: BaseException) -> str:
    kind = type(error)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
