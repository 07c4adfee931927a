"""The OpenTelemetry SDK's in-memory span exporter and metric reader, set once for the test process.

OpenTelemetry's tracer and meter providers are process-wide and set once, so
``telemetry`` sets both the first time a test of this folder asks for them and
keeps them for the test process; each test starts with no finished span, and
reads counters as the difference from where they stood when it started.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

Labels = frozenset[tuple[str, Any]]


@dataclass
class Telemetry:
    """The process's in-memory span exporter and metric reader, as one test sees them."""

    exporter: InMemorySpanExporter
    reader: InMemoryMetricReader
    baseline: dict[str, dict[Labels, float]] = field(default_factory=dict)

    def spans(self) -> list[ReadableSpan]:
        """The spans finished since the test started, in the order they ended."""
        return list(self.exporter.get_finished_spans())

    def named(self, prefix: str) -> list[ReadableSpan]:
        """The finished spans whose name starts with ``prefix``."""
        return [s for s in self.spans() if s.name.startswith(prefix)]

    def points(self, name: str) -> dict[Labels, float]:
        """The metric ``name``'s points by attributes: a sum's value, a histogram's count, a gauge's value."""
        found: dict[Labels, float] = {}
        data = self.reader.get_metrics_data()
        for resource in data.resource_metrics if data is not None else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name != name:
                        continue
                    for point in metric.data.data_points:
                        labels = frozenset((point.attributes or {}).items())
                        found[labels] = float(getattr(point, "count", None) or getattr(point, "value", 0))
        return found

    def moved(self, name: str, **labels: Any) -> float:
        """How much the metric ``name`` moved since the test started, over the points carrying ``labels``."""
        wanted = set(labels.items())
        before = self.baseline.get(name, {})
        return sum(value - before.get(key, 0.0) for key, value in self.points(name).items() if wanted <= set(key))

    def start(self, names: Mapping[str, None] | list[str]) -> None:
        """Note where the metrics ``names`` stand, and forget the finished spans."""
        self.exporter.clear()
        self.baseline = {name: self.points(name) for name in names}


_PROCESS: Telemetry | None = None

METRICS = [
    "flexiq.step.duration",
    "flexiq.store.commit.duration",
    "flexiq.steps",
    "flexiq.runs.finished",
    "flexiq.dead_letters",
    "flexiq.recovery.republished",
    "flexiq.store.unavailable",
]


def process_telemetry() -> Telemetry:
    """Set the SDK's providers for this test process (once), with in-memory export."""
    global _PROCESS
    if _PROCESS is None:
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        _PROCESS = Telemetry(exporter, reader)
    return _PROCESS
