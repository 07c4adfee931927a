"""Actors whose steps fail, for real ``dramatiq`` worker processes (C31, C32), configured by environment variables.

``FLEXIQ_TEST_NAMESPACE`` (the Redis namespace), ``FLEXIQ_TEST_QUEUE``,
``FLEXIQ_TEST_STORE`` (a SQLAlchemy URL) and ``FLEXIQ_TEST_DIR`` (where each
real call of a step body or undo is appended to ``calls``, one line each, as
``<label>:<what>``). Each actor takes a ``label`` so that the tests of one
module can share a worker.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import dramatiq
from dramatiq.brokers.redis import MAINTENANCE_SCALE, RedisBroker

from dramatiq_ext import DurableSteps
from flexiq_plugins import NonRetryableError, RetryPolicy, current_job

STATE = Path(os.environ["FLEXIQ_TEST_DIR"])
QUEUE = os.environ["FLEXIQ_TEST_QUEUE"]

broker = RedisBroker(
    host="127.0.0.1",
    namespace=os.environ["FLEXIQ_TEST_NAMESPACE"],
    heartbeat_timeout=1_000,  # ms: a dead worker's unacked messages come back after one second
    maintenance_chance=MAINTENANCE_SCALE,  # every command runs the maintenance that requeues them
)
broker.add_middleware(DurableSteps(store=os.environ["FLEXIQ_TEST_STORE"], lease_seconds=2, busy_retry_seconds=0.5))
dramatiq.set_broker(broker)


def record(label: str, what: str) -> int:
    """Append one call of ``what``; return how many calls of it ``label`` has now."""
    line = f"{label}:{what}"
    with (STATE / "calls").open("a") as f:
        f.write(line + "\n")
    return (STATE / "calls").read_text().split().count(line)


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def always_fails(label: str) -> None:
    """A step that always raises, with a budget of five attempts."""

    def ship() -> None:
        raise ConnectionError(f"carrier down (call {record(label, 'ship')})")

    current_job.step.run("ship", ship, retry=RetryPolicy(max_attempts=5, initial_delay=0.2, multiplier=1))


@dramatiq.actor(queue_name=QUEUE, max_retries=3, min_backoff=100, max_backoff=200)
def exits_in_step(label: str) -> None:
    """A step whose worker process dies inside the body, with a budget of three attempts."""

    def charge() -> None:
        record(label, "charge")
        os._exit(137)

    current_job.step.run("charge", charge, retry=RetryPolicy(max_attempts=3))


@dramatiq.actor(queue_name=QUEUE, max_retries=5, min_backoff=100, max_backoff=200)
def non_retryable(label: str) -> None:
    """A step that fails for good."""

    def charge() -> None:
        record(label, "charge")
        raise NonRetryableError("card expired")

    current_job.step.run("charge", charge, retry=RetryPolicy(max_attempts=5, initial_delay=0))


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def saga(label: str) -> None:
    """Reserve, charge, then ship, which fails for good; the reservation's undo hangs on its first call."""
    step = current_job.step

    def undo(what: str):  # type: ignore[no-untyped-def]
        def run(value: int) -> None:
            if what == "reserve" and record(label, "started:undo_reserve") == 1:
                (STATE / f"{label}.pid").write_text(str(os.getpid()))
                time.sleep(60)  # killed here by the test, between the two undos
            record(label, f"undo_{what}")

        return run

    step.run("reserve", lambda: record(label, "reserve"), compensate=undo("reserve"))
    step.run("charge", lambda: record(label, "charge"), compensate=undo("charge"))

    def ship() -> None:
        record(label, "ship")
        raise NonRetryableError("the carrier refused the parcel")

    step.run("ship", ship)
