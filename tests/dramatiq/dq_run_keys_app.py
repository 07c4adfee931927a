"""A pipeline's stages for real ``dramatiq`` worker processes (C44), configured by environment variables.

``FLEXIQ_TEST_NAMESPACE`` (the Redis namespace), ``FLEXIQ_TEST_QUEUE``,
``FLEXIQ_TEST_STORE`` (a SQLAlchemy URL) and ``FLEXIQ_TEST_DIR`` (where each
real call of a step body is appended to ``calls``, one line each, as
``<label>:<what>``). The process dies once while it enqueues a pipeline's next
stage (:class:`DiesWhileEnqueueing`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import dramatiq
from dramatiq.brokers.redis import MAINTENANCE_SCALE, RedisBroker

from dramatiq_ext import DurableSteps
from flexiq_plugins import current_job

STATE = Path(os.environ["FLEXIQ_TEST_DIR"])
QUEUE = os.environ["FLEXIQ_TEST_QUEUE"]


def record(label: str, what: str) -> None:
    """Append one call of ``what`` for ``label``."""
    with (STATE / "calls").open("a") as f:
        f.write(f"{label}:{what}\n")


class DiesWhileEnqueueing(dramatiq.Middleware):
    """Kills the worker process once, while it enqueues the next stage ``noted`` of label ``<label>``.

    Added after ``DurableSteps``, whose ``before_enqueue`` has then recorded
    the stage's run ``queued`` (C39): the process exits (``os._exit``, as a
    SIGKILL would) before the message leaves, after the first stage's run
    committed. ``<label>.died`` is written first, so the redelivered first
    stage does not die again.
    """

    def before_enqueue(self, broker: dramatiq.Broker, message: Any, delay: int | None) -> None:
        """Die the first time a ``noted`` message of a label is enqueued."""
        marker = STATE / f"{message.args[0]}.died" if message.actor_name == "noted" else None
        if marker is not None and not marker.exists():
            marker.write_text(str(os.getpid()))
            os._exit(137)


broker = RedisBroker(
    host="127.0.0.1",
    namespace=os.environ["FLEXIQ_TEST_NAMESPACE"],
    heartbeat_timeout=1_000,  # ms: a dead worker's unacked messages come back after one second
    maintenance_chance=MAINTENANCE_SCALE,  # every command runs the maintenance that requeues them
)
broker.add_middleware(DurableSteps(store=os.environ["FLEXIQ_TEST_STORE"], lease_seconds=2, busy_retry_seconds=0.5))
broker.add_middleware(DiesWhileEnqueueing())
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name=QUEUE)
def total(label: str, x: int) -> int:
    """The first stage: one step."""

    def add() -> int:
        record(label, "total")
        return x + 1

    return int(current_job.step.run("add", add))


@dramatiq.actor(queue_name=QUEUE)
def noted(label: str, value: int) -> None:
    """The next stage: one step that notes the value it was given."""
    current_job.step.run("note", lambda: record(label, f"noted:{value}"))
