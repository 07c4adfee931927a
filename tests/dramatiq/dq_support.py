"""Helpers for the Dramatiq tests: fake outside services that count every real call, polling, a supervised CLI."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
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


class Supervisor:
    """Keeps one ``dramatiq <app>`` CLI (one process, one thread) running, restarting it when it exits, until stopped.

    The CLI shuts down when its worker process dies, as it does in production
    under a process manager; the supervisor starts a new one.

    Parameters:
      app(str): the module the CLI imports, in this directory.
      env(dict[str, str]): the CLI's environment.
      log(Path): the file the CLI's output is appended to.
    """

    def __init__(self, app: str, env: dict[str, str], log: Path) -> None:
        self.app = app
        self.env = env
        self.log = log
        self.starts = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._keep_running, name="dramatiq-supervisor", daemon=True)

    def start(self) -> None:
        """Start the first CLI and the thread that restarts it."""
        self._thread.start()

    def _keep_running(self) -> None:
        """Run a CLI and wait for it, again and again, until :meth:`stop`."""
        while not self._stop.is_set():
            with self.log.open("ab") as log:
                self._proc = subprocess.Popen(
                    [sys.executable, "-m", "dramatiq", self.app, "--processes", "1", "--threads", "1"],
                    env=self.env,
                    cwd=Path(__file__).parent,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            self.starts += 1
            self._proc.wait()

    def stop(self) -> None:
        """Stop restarting; SIGTERM (then SIGKILL) the running CLI's process group."""
        self._stop.set()
        proc = self._proc
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self._thread.join(20)
