"""Observing runs: the one observer interface the core reports to, and its OpenTelemetry implementation (C53).

The step journal and the attempt report what happens (a step executed, a
memo replayed, a commit, a sleep, a wait, a compensation, a dead letter, a
cancellation, how a run ended) to an [`AttemptObservation`][flexiq_plugins._observe.observer.AttemptObservation];
recovery and the store's outages report to the process's
[`Observer`][flexiq_plugins._observe.observer.Observer]. The OpenTelemetry observer
(`flexiq_plugins._observe.otel`) turns them into spans, links and metrics
using the ``opentelemetry-api`` package only.

Why this layer sits just above `flexiq_plugins._model`: it needs records and
options, nothing that does I/O, and every layer above (the journal, the
attempt, recovery) reports to it.

No observer, no cost: [`observer_for`][flexiq_plugins._observe.observer_for] returns ``None`` when both options
are off or the API is not installed; an attempt whose process has configured
neither a tracer nor a meter provider gets no observation, and its journal is
the plain one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .observer import AttemptObservation, Observer, StepObservation

if TYPE_CHECKING:
    from .._model.config import DurableConfig

__all__ = ["AttemptObservation", "Observer", "StepObservation", "observer_for"]


def observer_for(config: DurableConfig) -> Observer | None:
    """The observer of a driver with ``config``: OpenTelemetry's, or ``None`` (C53).

    ``None`` when ``tracing`` and ``metrics`` are both off, or when the
    ``opentelemetry-api`` package cannot be imported; then nothing reports
    anything and nothing is paid.
    """
    if not (config.tracing or config.metrics):
        return None
    try:
        from .otel import OtelObserver
    except ImportError:
        return None
    return OtelObserver(tracing=config.tracing, metrics=config.metrics, idempotency_keys=config.trace_idempotency_keys)
