"""One WARNING line per store outage per process, and one INFO line when it ends (C28, C41).

Several parts of a worker process meet a store outage on their own: an
attempt's claim or step (its job is put back), the lease renewer thread, the
recovery sweeper, a publish that records its run (C39). Each logging its own
WARNING gave an operator several lines per process for one outage, each
repeated by every process. `StoreHealth` is what they share instead:
the first part to find the store unreachable logs its line at WARNING, and
every other failure until the store answers again is logged at DEBUG; the
first part to reach the store again logs ``step store reachable again`` at
INFO, once.

A failure can come back after the store does: a statement sent during the
outage ends in its network timeout seconds after another part found the
store answering again. Such a failure says nothing about the store now, so a
part that knows when its operation began passes the `StoreHealth.generation`
it read then (``since``): a failure begun before the store came back is
logged at DEBUG and starts no new outage.

One `StoreHealth` per store object and process (`store_health`):
a process that talks to two stores has two outages to report.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref

__all__ = ["StoreHealth", "store_health"]

logger = logging.getLogger("flexiq_plugins")

BACK_MESSAGE = "step store reachable again"


class StoreHealth:
    """Whether this process finds one store reachable, as its parts report it (C28, C41).

    Thread-safe. Reporting success while the store is reachable is one
    attribute read (no lock): every claim and publish reports it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._down = False
        self._returns = 0

    @property
    def down(self) -> bool:
        """Whether an outage is being reported (a failure seen, no success since)."""
        return self._down

    @property
    def generation(self) -> int:
        """How many outages have ended: read it before an operation, pass it to `failed` as ``since``."""
        return self._returns

    def failed(self, message: str, *args: object, since: int | None = None) -> bool:
        """Report a failure: ``message % args`` at WARNING if it starts an outage, else at DEBUG.

        Parameters:
          message (str): a ``logging`` format string naming what failed and what follows from it.
          args (object): its arguments.
          since (int | None): the `generation` read when the failed
            operation began; if an outage ended since, the failure belongs to
            it (DEBUG, and the store is not marked down). ``None``: unknown.

        Returns:
          bool: whether this failure started the outage (its line was the WARNING).
        """
        with self._lock:
            stale = since is not None and since != self._returns
            first = not (stale or self._down)
            self._down = self._down or not stale
        logger.log(logging.WARNING if first else logging.DEBUG, message, *args)
        return first

    def answered(self) -> bool:
        """Report that the store answered; return whether that ended an outage (logged once at INFO)."""
        if not self._down:
            return False
        with self._lock:
            was, self._down = self._down, False
            self._returns += was
        if was:
            logger.info(BACK_MESSAGE)
        return was


_HEALTH: weakref.WeakKeyDictionary[object, StoreHealth] = weakref.WeakKeyDictionary()
_HEALTH_LOCK = threading.Lock()


def _forget_in_child() -> None:
    """A forked child (a Celery pool process) reports its own outages from a clean slate."""
    _HEALTH.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def store_health(store: object) -> StoreHealth:
    """The `StoreHealth` of ``store`` (a store, or the callable that opens one) in this process."""
    health = _HEALTH.get(store)
    if health is None:
        with _HEALTH_LOCK:
            health = _HEALTH.setdefault(store, StoreHealth())
    return health
