"""Helpers for the Dramatiq tests: fake outside services that count every real call, polling."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.brokers.redis import RedisBroker
from dramatiq.brokers.stub import StubBroker
from dramatiq.common import xq_name

from flexiq_plugins._store.base import StepStore
from flexiq_plugins.errors import UnknownRun


class Payments:
    """A payment service that deduplicates on the idempotency key, like a real one."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.charges: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def charge(self, order_id: str, amount: int, *, key: str) -> dict[str, Any]:
        """Charge once per idempotency key; every call is counted."""
        with self._lock:
            self.calls.append(key)
            if key not in self.charges:
                self.charges[key] = {"id": f"ch_{len(self.charges) + 1}", "order": order_id, "amount": amount}
            return self.charges[key]


class Receipts:
    """A mail service whose first ``failures`` sends raise ``ConnectionError``."""

    def __init__(self, failures: int = 1) -> None:
        self.calls = 0
        self.sent: list[str] = []
        self._failures = failures

    def send(self, charge_id: str) -> str:
        """Send a receipt, failing the first ``failures`` times."""
        self.calls += 1
        if self.calls <= self._failures:
            raise ConnectionError("SMTP server unreachable")
        self.sent.append(charge_id)
        return f"receipt for {charge_id}"


def status_of(store: StepStore, run_key: str) -> str | None:
    """The run's status, ``None`` before it exists."""
    try:
        return store.get_run(run_key).status
    except UnknownRun:
        return None


def wait_until(predicate: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    """Poll ``predicate`` every 50 ms until it is truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def dead_letter_count(broker: dramatiq.Broker, queue: str, namespace: str) -> int:
    """How many messages the broker holds in ``queue``'s dead-letter queue (``.XQ``)."""
    if isinstance(broker, RedisBroker):
        return int(broker.client.zcard(f"{namespace}:{xq_name(queue)}"))
    if isinstance(broker, RabbitmqBroker):
        return int(broker.get_queue_message_counts(queue)[2])
    assert isinstance(broker, StubBroker)
    return len(broker.dead_letters_by_queue[queue])
