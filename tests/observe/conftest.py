"""Fixtures of the observability tests: the OpenTelemetry SDK's in-memory span exporter and metric reader.

See ``otel_support.py``: the providers are set once for the test process.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.observe.otel_support import METRICS, Telemetry, process_telemetry


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    """The in-memory span exporter and metric reader, emptied of spans, counters noted, for this test."""
    found = process_telemetry()
    found.start(METRICS)
    yield found
    found.exporter.clear()
