"""Lease renewal: one renewer thread per process keeps every running attempt's claim alive (C23).

A claim lives ``lease_seconds`` (30 s by default) unless it is renewed; while
an attempt's body runs, its :class:`LeaseKeeper` has the claim renewed every
third of the lease (every 10 s by default). Until issue 14 every attempt
started its own renewal thread and joined it at its end; that start and join
cost about 14% of a Dramatiq worker thread's busy time. Now a process has one
renewer daemon thread, started at the first keeper's start, and a schedule of
the claims it keeps (a heap by due time, :func:`time.monotonic` seconds). The
renewer sleeps on a condition until the earliest renewal is due; a keeper that
registers with an earlier due time wakes it.

What sharing one thread costs: a process renews its claims one at a time. One
slow renewal (a black-holed store: a statement or connection attempt that
waits about 20 s for its timeout) delays every other renewal of the process as
long. That is accepted: a process's attempts use the same store in practice,
so a store that cannot renew one claim in time cannot renew the others either.

Connections: the renewer thread holds no connection of its own (an attempt's
held connection stays its thread's): each renewal checks one out of the
store's pool and gives it back, and as one renewal runs at a time, a process
needs at most one connection for all its renewals (its concurrency plus one).

Forks: a Celery prefork child inherits the parent's schedule but not its
thread. :func:`os.register_at_fork` gives the child a fresh renewer, with an
empty schedule and no thread, started at the child's first keeper.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import logging
import math
import os
import threading
import time
from collections.abc import Callable

from ._store.base import Claim, StepStore
from ._store_health import store_health
from .errors import ClaimLost, StoreError

__all__ = ["RENEWER_THREAD_NAME", "LeaseKeeper"]

logger = logging.getLogger("flexiq_plugins")

RENEWER_THREAD_NAME = "flexiq-lease-renewer"
"""The name of a process's one lease renewer thread."""


class LeaseKeeper:
    """Keeps one claim's lease alive while started: renewed every ``lease_seconds / 3`` (C23).

    :meth:`start` registers the claim with the process's renewer, its first
    renewal due a third of the lease later; :meth:`stop` unregisters it and
    returns once no renewal of it is running or will start. A stopped keeper
    can be started again (an attempt's compensation runs after its body, C32).
    Both may be called from any thread, the renewer's included.

    A renewal that finds the claim taken over sets :attr:`lost` and renews no
    more (C25); one that meets the store unavailable is reported to the
    store's health in this process (one WARNING per outage, C28, C41) and
    tried again a third of a lease later.

    Parameters:
      store(StepStore): the store that holds the claim.
      claim(Claim): the claim to keep.
      lease_seconds(float): the lease each renewal gives, in seconds from the renewal.
    """

    def __init__(self, store: StepStore, claim: Claim, lease_seconds: float) -> None:
        self._store = store
        self._claim = claim
        self.lease_seconds = lease_seconds
        self.lost: ClaimLost | None = None
        self._renewing = threading.RLock()  # held by the renewer while it renews this claim; re-entrant for stop()
        self._renewer: _Renewer | None = None  # the process's renewer at the last start

    @property
    def claim(self) -> Claim:
        """The claim kept, as its last successful renewal returned it."""
        return self._claim

    @property
    def interval(self) -> float:
        """Seconds between two renewals: a third of the lease."""
        return self.lease_seconds / 3

    def start(self) -> None:
        """Have the claim renewed every :attr:`interval` seconds from now; nothing if already started."""
        self._renewer = _RENEWER
        self._renewer.register(self)

    def stop(self) -> None:
        """Renew no more; return once a renewal in progress has ended (at once in the renewer's own thread)."""
        renewer = self._renewer
        if renewer is not _RENEWER:  # never started, or started before this process was forked from its parent
            return  # (the parent's renewer has no thread here, and its locks may have been held at the fork)
        renewer.unregister(self)
        with self._renewing:
            pass

    def renew_unless_stopped(self, still_registered: Callable[[], bool]) -> bool:
        """Renew the lease once, unless ``still_registered()`` is false; return whether to renew again.

        Called by the renewer thread, holding this keeper's renewal lock, which
        :meth:`stop` takes after unregistering: a stop waits for this renewal,
        and a renewal that starts after a stop sees it and renews nothing.
        """
        with self._renewing:
            return still_registered() and self._renew()

    def _renew(self) -> bool:
        """One renewal; False once the claim is lost (or renewing it failed in a way a retry will not fix)."""
        health = store_health(self._store)
        try:
            self._claim = self._store.renew(self._claim, self.lease_seconds)
        except ClaimLost as exc:
            self.lost = exc
            return False
        except StoreError as exc:  # one WARNING per outage and process, with the others (C28, C41)
            health.failed("lease renewal of run %s failed (%s); will retry", self._claim.run_key, exc)
            return True
        except Exception:  # a bug: end this claim's renewals (as its own thread's death did), not the others'
            logger.exception("lease renewal of run %s failed; it is no longer renewed", self._claim.run_key)
            return False
        health.answered()
        return True


class _Renewer:
    """A process's schedule of claims to renew, and the one daemon thread that renews them.

    Each start of a keeper gets a ticket (a number, increasing); the heap holds
    ``(due, ticket)``, ``due`` in :func:`time.monotonic` seconds. A stopped
    keeper's ticket is forgotten at once (the schedule does not keep the
    keeper alive); its heap entry is dropped when it comes to the top, or
    when stale entries outnumber the live ones (the heap is then rebuilt).
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._heap: list[tuple[float, int]] = []
        self._tickets: dict[LeaseKeeper, int] = {}  # started keeper -> its ticket
        self._keepers: dict[int, LeaseKeeper] = {}  # live ticket -> its keeper
        self._numbers = itertools.count()
        self._wake_at = math.inf  # when the sleeping renewer wakes; -inf while it is not sleeping
        self._thread: threading.Thread | None = None

    def register(self, keeper: LeaseKeeper) -> None:
        """Schedule ``keeper``'s first renewal ``keeper.interval`` seconds from now, unless it is registered."""
        with self._cond:
            if keeper in self._tickets:
                return
            ticket = next(self._numbers)
            self._tickets[keeper], self._keepers[ticket] = ticket, keeper
            self._schedule(ticket, keeper.interval)
            if self._thread is None:
                thread = threading.Thread(target=self._run, name=RENEWER_THREAD_NAME, daemon=True)
                thread.start()
                self._thread = thread

    def unregister(self, keeper: LeaseKeeper) -> None:
        """Forget ``keeper``'s registration, if any: none of its renewals starts from now on."""
        with self._cond:
            ticket = self._tickets.pop(keeper, None)
            if ticket is not None:
                del self._keepers[ticket]
            if len(self._heap) > 2 * len(self._keepers) + _STALE_SLACK:
                self._heap = [entry for entry in self._heap if entry[1] in self._keepers]
                heapq.heapify(self._heap)

    def holds(self, ticket: int) -> bool:
        """Whether ``ticket`` is still a started keeper's."""
        with self._cond:
            return ticket in self._keepers

    def _schedule(self, ticket: int, delay: float) -> None:
        """Put ``ticket`` on the heap, due ``delay`` seconds from now; wake the renewer if it sleeps past that."""
        due = time.monotonic() + delay
        heapq.heappush(self._heap, (due, ticket))
        if due < self._wake_at:
            self._cond.notify()

    def _run(self) -> None:
        """The renewer thread: renew each claim when due, for the life of the process."""
        while True:
            ticket, keeper = self._next_due()
            again = keeper.renew_unless_stopped(functools.partial(self.holds, ticket))
            self._renewed(ticket, keeper, again)

    def _next_due(self) -> tuple[int, LeaseKeeper]:
        """Sleep until a live ticket is due; return it and its keeper."""
        with self._cond:
            while True:
                while self._heap and self._heap[0][1] not in self._keepers:
                    heapq.heappop(self._heap)  # a stopped keeper's entry
                due = self._heap[0][0] if self._heap else math.inf
                delay = due - time.monotonic()
                if delay <= 0:
                    ticket = heapq.heappop(self._heap)[1]
                    self._wake_at = -math.inf
                    return ticket, self._keepers[ticket]
                self._wake_at = due
                self._cond.wait(None if due == math.inf else delay)

    def _renewed(self, ticket: int, keeper: LeaseKeeper, again: bool) -> None:
        """After a renewal: schedule the next one, or forget a keeper whose claim is no longer renewed."""
        with self._cond:
            if self._keepers.get(ticket) is not keeper:
                return  # stopped during the renewal
            if again:
                self._schedule(ticket, keeper.interval)
            else:
                del self._keepers[ticket], self._tickets[keeper]


_STALE_SLACK = 64
"""Stopped keepers' heap entries tolerated beyond as many as live ones before the heap is rebuilt."""

_RENEWER = _Renewer()


def _reset_in_child() -> None:
    """A forked child renews its own attempts' claims with its own thread, started at its first keeper."""
    global _RENEWER
    _RENEWER = _Renewer()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_in_child)
