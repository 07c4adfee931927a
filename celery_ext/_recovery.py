"""Recovery in every Celery worker: a worker bootstep that runs the core's sweeper (C39).

A bootstep of the worker's blueprint starts in the worker's main process
(never in a prefork child) for ``celery worker`` and for workers embedded
with ``app.Worker`` or ``celery.contrib.testing.worker.start_worker`` alike,
and stops with the worker, giving the recovery lease up.

A step of the consumer's blueprint after its ``Connection`` step is started
each time the consumer connects to the broker: Celery's ``Consumer.start``
counts each start in ``restart_count`` and, after a lost connection, restarts
the same blueprint. On a reconnection (not the first connection, when the
worker is only starting) it makes the sweeper tick at once, so what a
restarted broker lost is found without waiting for the next interval.
"""

from __future__ import annotations

from typing import Any

from celery import bootsteps

from flexiq_plugins.integration import start_recovery

from ._adapter import publisher
from ._runtime import runtime_of

__all__ = ["ReconnectSweep", "RecoveryStep"]


class RecoveryStep(bootsteps.StartStopStep):  # type: ignore[misc]
    """Runs this worker's recovery sweeper unless the app was installed with ``recovery=False`` (C39)."""

    label = "flexiq recovery"

    def start(self, parent: Any) -> None:
        """Start the sweeper of the worker's app (one per worker; one sweep at a time across workers)."""
        runtime = runtime_of(parent.app)
        if runtime is None or runtime.sweeper is not None:
            return
        name = f"celery worker of app {parent.app.main!r}"
        runtime.sweeper = start_recovery(
            lambda: runtime.driver().store, {"celery": publisher(parent.app)}, runtime.config, name=name
        )

    def stop(self, parent: Any) -> None:
        """Stop the sweeper and give the recovery lease up."""
        runtime = runtime_of(parent.app)
        sweeper = runtime.sweeper if runtime is not None else None
        if runtime is not None and sweeper is not None:
            runtime.sweeper = None
            sweeper.stop(timeout=5)

    shutdown = stop
    terminate = stop  # an embedded worker (celery.contrib.testing) and a cold shutdown end through terminate


class ReconnectSweep(bootsteps.StartStopStep):  # type: ignore[misc]
    """Makes the worker's sweeper tick when its consumer (re)connects to the broker (C39)."""

    label = "flexiq sweep on connect"
    requires = ("celery.worker.consumer.connection:Connection",)

    def start(self, parent: Any) -> None:
        """Wake the sweeper of the consumer's app, if it runs one and this is a reconnection."""
        if getattr(parent, "restart_count", 1) <= 1:
            return  # the worker's first connection: its sweeper has just started
        runtime = runtime_of(parent.app)
        sweeper = runtime.sweeper if runtime is not None else None
        if sweeper is not None:
            sweeper.wake()
