"""A checkout app for real ``dramatiq`` worker processes, configured by environment variables.

``FLEXIQ_TEST_BROKER`` (``redis``/``rabbitmq``), ``FLEXIQ_TEST_NAMESPACE``,
``FLEXIQ_TEST_QUEUE``, ``FLEXIQ_TEST_STORE`` (a SQLAlchemy URL),
``FLEXIQ_TEST_DIR`` (where calls are recorded) and ``FLEXIQ_TEST_CRASH_IN``
(``charge`` or ``receipt``): the first time that step's body runs it writes
its pid to ``crashed`` and hangs, for the test to SIGKILL the process.
The fake payment service records every call in ``charge_calls`` and charges
once per idempotency key (``charges``).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import dramatiq
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.brokers.redis import MAINTENANCE_SCALE, RedisBroker

from dramatiq_ext import DurableSteps
from flexiq_plugins import current_job

STATE = Path(os.environ["FLEXIQ_TEST_DIR"])
QUEUE = os.environ["FLEXIQ_TEST_QUEUE"]
CRASH_IN = os.environ["FLEXIQ_TEST_CRASH_IN"]

if os.environ["FLEXIQ_TEST_BROKER"] == "redis":
    broker: dramatiq.Broker = RedisBroker(
        host="127.0.0.1",
        namespace=os.environ["FLEXIQ_TEST_NAMESPACE"],
        heartbeat_timeout=1_000,  # ms: a dead worker's unacked messages come back after one second
        maintenance_chance=MAINTENANCE_SCALE,  # every command runs the maintenance that requeues them
    )
else:
    broker = RabbitmqBroker(host="127.0.0.1", heartbeat=0)
broker.add_middleware(DurableSteps(store=os.environ["FLEXIQ_TEST_STORE"], lease_seconds=2, busy_retry_seconds=0.5))
dramatiq.set_broker(broker)


def _record(name: str, line: str) -> None:
    with (STATE / name).open("a") as f:
        f.write(line + "\n")


def _maybe_crash(where: str) -> None:
    marker = STATE / "crashed"
    if where == CRASH_IN and not marker.exists():
        marker.write_text(str(os.getpid()))
        time.sleep(120)  # the test kills us here


def _charge(order_id: str, key: str) -> dict[str, str]:
    _record("charge_calls", key)
    _maybe_crash("charge")
    charges = STATE / "charges"
    known = charges.read_text().split() if charges.exists() else []
    if key not in known:
        _record("charges", key)
    return {"id": f"ch_{key[-8:]}", "order": order_id}


@dramatiq.actor(queue_name=QUEUE, max_retries=3, min_backoff=100, max_backoff=500)
def checkout(order_id: str) -> None:
    """Charge, then send the receipt."""
    step = current_job.step
    charge = step.run("charge", lambda: _charge(order_id, step.idempotency_key))

    def receipt() -> str:
        _maybe_crash("receipt")
        _record("receipts", charge["id"])
        return "sent"

    step.run("receipt", receipt)
