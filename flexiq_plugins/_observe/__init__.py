"""Observing runs: the one observer interface the core reports to, and its OpenTelemetry implementation (C53).

The step journal and the attempt report what happens (a step executed, a
memo replayed, a commit, a sleep, a wait, a compensation, a dead letter, a
cancellation, how a run ended) to an `AttemptObservation`;
recovery and the store's outages report to the process's
`Observer`. The OpenTelemetry observer
(`flexiq_plugins._observe.otel`) turns them into spans, links and metrics
using the ``opentelemetry-api`` package only.

Why this layer sits just above `flexiq_plugins._model`: it needs records and
options, nothing that does I/O, and every layer above (the journal, the
attempt, recovery) reports to it.

No observer, no cost: `observer_for` returns ``None`` when both options
are off or the API is not installed; an attempt whose process has configured
neither a tracer nor a meter provider gets no observation, and its journal is
the plain one.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING

from .observer import AttemptObservation, Observer, StepObservation

if TYPE_CHECKING:
    from .._model.config import DurableConfig

__all__ = ["TRACE_HEADER", "AttemptObservation", "Observer", "StepObservation", "observer_for", "publishing_trace"]

TRACE_HEADER = "flexiq_trace"
"""The message header (Celery) or option (Dramatiq) carrying the publishing span's W3C ``traceparent`` (C53)."""

_otel: ModuleType | bool | None = False
"""`flexiq_plugins._observe.otel` once imported, ``None`` when the OpenTelemetry API is missing, ``False`` untried."""


def _otel_module() -> ModuleType | None:
    global _otel
    if _otel is False:
        try:
            from . import otel
        except ImportError:
            _otel = None
        else:
            _otel = otel
    return _otel  # type: ignore[return-value]


def observer_for(config: DurableConfig) -> Observer | None:
    """The observer of a driver with ``config``: OpenTelemetry's, or ``None`` (C53).

    ``None`` when ``tracing`` and ``metrics`` are both off, or when the
    ``opentelemetry-api`` package cannot be imported; then nothing reports
    anything and nothing is paid.
    """
    if not (config.tracing or config.metrics):
        return None
    otel = _otel_module()
    if otel is None:
        return None
    observer: Observer = otel.OtelObserver(
        tracing=config.tracing, metrics=config.metrics, idempotency_keys=config.trace_idempotency_keys
    )
    return observer


def publishing_trace(config: DurableConfig) -> str | None:
    """The W3C ``traceparent`` of the span current where a job is published, to carry in its message (C53).

    ``None`` with ``tracing`` off, without the OpenTelemetry API, without a
    configured tracer provider, or with no span current.
    """
    if not config.tracing:
        return None
    otel = _otel_module()
    return None if otel is None else otel.current_traceparent()  # type: ignore[no-any-return]
