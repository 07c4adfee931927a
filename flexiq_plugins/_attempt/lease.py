"""Lease renewal: one renewer thread per process keeps every running attempt's claim alive (C23).

A claim lives ``lease_seconds`` (30 s by default) unless it is renewed; while
an attempt's body runs, its `LeaseKeeper` has the claim renewed every
third of the lease (every 10 s by default). A process has one renewer
daemon thread, started at the first keeper's start (a thread started and
joined per attempt would cost about 14% of a Dramatiq worker thread's busy
time), and a schedule of the claims it keeps (a heap by due time, `time.monotonic` seconds). The
renewer sleeps until the earliest renewal is due; a keeper that registers with
an earlier due time wakes it (as every keeper's first renewal is a third of a
lease away, that is rare: a busy worker's starts do not wake it).

What sharing one thread costs: a process renews its claims one at a time. One
slow renewal (a black-holed store: a statement or connection attempt that
waits about 20 s for its timeout) delays every other renewal of the process as
long. That is accepted: a process's attempts use the same store in practice,
so a store that cannot renew one claim in time cannot renew the others either.
A claim whose run's row another transaction holds is different: a
transactional step's write holds it until its caller's transaction ends
(C42), while the other claims could be renewed. So a renewal does not wait
for a row lock (PostgreSQL and MySQL/MariaDB lock with ``NOWAIT``): refused
([`RunLocked`][flexiq_plugins.errors.RunLocked]), it is tried again every
``_LOCKED_RETRY_S`` seconds, and the renewer goes on with the others
(measured before: one such transaction let another attempt's lease expire
and be taken over while its keeper ran). On SQLite, whose lock is the whole
database's, every writer waits for that transaction alike.

Connections: the renewer thread holds no connection of its own (an attempt's
held connection stays its thread's): each renewal checks one out of the
store's pool and gives it back, and as one renewal runs at a time, a process
needs at most one connection for all its renewals (its concurrency plus one).

Interrupted callers: a task's thread can be interrupted anywhere by an
exception it did not raise itself: Celery's soft time limit raises
``SoftTimeLimitExceeded`` from a signal handler in the prefork child's main
thread, Dramatiq's ``TimeLimit`` and shutdown raise asynchronous exceptions
in worker threads. Had such an exception landed while the thread held a lock
of the renewer taken by Python code (``threading.Condition.__enter__``
returns after acquiring), the lock would stay held for good: the renewer
thread, and every later attempt of the process, would wait on it forever
(measured: SIGALRM raising in a loop of keeper starts and stops leaked it
within milliseconds). So a keeper's `start` and
`stop` take no lock but the keeper's own ``RLock`` (the
renewer takes it only around that keeper's renewal) and, once per process,
the lock that guards the thread's start, each a C lock entered by ``with``
directly (CPython leaves no gap between acquiring it and the protected
block, so an exception in the block releases it); they hand the
registration over through a `collections.deque` and wake the renewer
through a `queue.SimpleQueue`, both implemented in C (one call, no
lock left behind), and the renewer thread is started by
`_thread.start_new_thread`, one C call (``threading.Thread.start`` can be
interrupted after the thread was started and before it was recorded). The
schedule (the heap) is the renewer thread's alone. A start interrupted while
it hands its registration over leaves the keeper stopped (its entry, if handed
over, is stale), never marked started with nothing scheduled: a later start
registers it. A stop interrupted before it took effect leaves the claim
renewed until the next stop: an attempt stops its keeper when its body ends
and again when it concludes.

Forks: a Celery prefork child inherits the parent's schedule but not its
thread. `os.register_at_fork` gives the child a fresh renewer, with an
empty schedule and no thread, started at the child's first keeper.
"""

from __future__ import annotations

import _thread
import collections
import contextlib
import heapq
import itertools
import logging
import math
import os
import queue
import threading
import time

from .._model.records import Claim
from .._store.attempt_side import AttemptStore
from ..errors import ClaimLost, RunLocked, StoreError
from .store_health import store_health

__all__ = ["RENEWER_THREAD_NAME", "LeaseKeeper"]

logger = logging.getLogger("flexiq_plugins")

RENEWER_THREAD_NAME = "flexiq-lease-renewer"
"""The name of a process's one lease renewer thread."""

_tickets = itertools.count(1)
"""Each start of a keeper gets the next number (``next`` of a C iterator: one call, safe from any thread)."""


class LeaseKeeper:
    """Keeps one claim's lease alive while started: renewed every ``lease_seconds / 3`` (C23).

    `start` registers the claim with the process's renewer, its first
    renewal due a third of the lease later; `stop` unregisters it and
    returns once no renewal of it is running or will start. A stopped keeper
    can be started again (an attempt's compensation runs after its body, C32).
    Both may be called from any thread, the renewer's included, and an
    exception that interrupts either (a time limit's) leaves the renewer
    working (see the module's documentation).

    A renewal that finds the claim taken over sets `lost` and renews no
    more (C25); one that meets the store unavailable is reported to the
    store's health in this process (one WARNING per outage, C28, C41) and
    tried again a third of a lease later.

    Parameters:
      store (AttemptStore): the store that holds the claim.
      claim (Claim): the claim to keep.
      lease_seconds (float): the lease each renewal gives, in seconds from the renewal.
    """

    def __init__(self, store: AttemptStore, claim: Claim, lease_seconds: float) -> None:
        self._store = store
        self._claim = claim
        self.lease_seconds = lease_seconds
        self.lost: ClaimLost | None = None
        self._renewing = threading.RLock()  # held by a renewal, a start and a stop; re-entrant for stop()
        self._ticket: int | None = None  # the registration in force; None while stopped
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
        """Have the claim renewed every `interval` seconds from now; nothing if already started."""
        renewer = _RENEWER
        with self._renewing:
            if self._ticket is not None and self._renewer is renewer:
                return
            try:
                self._renewer, self._ticket = renewer, next(_tickets)
                renewer.submit(self, self._ticket)
            except BaseException:  # interrupted (a time limit) before its entry was handed over, or the renewer
                self._ticket = None  # woken or started: not started, so that a later start registers it again
                raise

    def stop(self) -> None:
        """Renew no more; return once a renewal in progress has ended (at once in the renewer's own thread)."""
        if self._renewer is not _RENEWER:  # never started, or started before this process was forked from its parent
            return  # (the parent's renewer has no thread here, and this lock may have been held at the fork)
        with self._renewing:
            self._ticket = None

    def is_current(self, ticket: int) -> bool:
        """Whether ``ticket`` is the registration in force (a lock-free read: the renewer drops stale entries)."""
        return self._ticket == ticket

    def renew_if_current(self, ticket: int) -> float | None:
        """Renew the lease once if ``ticket`` is still in force; return the seconds until the next renewal.

        Called by the renewer thread, holding this keeper's lock, which
        `stop` takes to end the registration: a stop waits for this
        renewal, and a renewal after a stop renews nothing.

        Returns:
          float | None: seconds until the next renewal (`interval`, or
          sooner after [`RunLocked`][flexiq_plugins.errors.RunLocked]); ``None``: renew it no more.
        """
        with self._renewing:
            if self._ticket != ticket:
                return None
            delay = self._renew()
            if delay is None:
                self._ticket = None  # renewed no more: a later start registers it again
            return delay

    def _renew(self) -> float | None:
        """One renewal; the seconds until the next, or None once the claim is lost (or a retry will not fix it)."""
        health = store_health(self._store)
        since = health.generation
        try:
            self._claim = self._store.renew(self._claim, self.lease_seconds)
        except ClaimLost as exc:
            self.lost = exc
            return None
        except RunLocked:  # its row is held by an open transaction, its own step's (C42): soon again, not waiting
            return min(self.interval, _LOCKED_RETRY_S)
        except StoreError as exc:  # one WARNING per outage and process, with the others (C28, C41)
            health.failed("lease renewal of run %s failed (%s); will retry", self._claim.run_key, exc, since=since)
            return self.interval
        except BaseException:  # a bug, or a driver's BaseException (gevent.Timeout is one): end this claim's
            # renewals (as its own thread's death did), not the others' (the renewer thread must not die of it)
            logger.exception("lease renewal of run %s failed; it is no longer renewed", self._claim.run_key)
            return None
        health.answered()
        return self.interval


_Entry = tuple[float, int, LeaseKeeper]
"""A scheduled renewal: due (`time.monotonic` seconds), the keeper's ticket, the keeper."""


class _Renewer:
    """A process's schedule of claims to renew, and the one daemon thread that renews them.

    Keepers hand their registrations over through `_submitted` (a
    deque: ``append`` and ``popleft`` are atomic); only the renewer thread
    touches the heap. A stopped keeper's entries are dropped when they come
    to the top, when they are taken from the deque, or when entries outnumber
    twice the live ones (the heap is then rebuilt).
    """

    def __init__(self) -> None:
        self._submitted: collections.deque[_Entry] = collections.deque()
        self._doorbell: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._heap: list[_Entry] = []
        self._live_at_rebuild = 0
        self._wake_at = -math.inf  # when the sleeping renewer wakes; -inf while it is awake (no need to wake it)
        self._starting = threading.Lock()
        self._started = False

    def submit(self, keeper: LeaseKeeper, ticket: int) -> None:
        """Schedule ``keeper``'s renewal under ``ticket`` ``keeper.interval`` seconds from now (any thread)."""
        due = time.monotonic() + keeper.interval
        self._submitted.append((due, ticket, keeper))
        if due < self._wake_at or len(self._submitted) % _DRAIN_EVERY == 0:
            self._doorbell.put(None)  # it sleeps past this renewal, or starts to hold many: wake it
        if not self._started:
            self._start_thread()

    def _start_thread(self) -> None:
        """Start the renewer thread once: one C call, so an interrupting exception cannot leave it half started."""
        with self._starting:
            if not self._started:
                self._started = True
                try:
                    _thread.start_new_thread(self._run, ())
                except RuntimeError:  # could not start a thread (what it raises then): the next start tries again
                    self._started = False  # (not on any exception: one raised by a signal handler or an
                    raise  # asynchronous exception right after the call finds the thread started)

    def _run(self) -> None:
        """The renewer thread: renew each claim when due, for the life of the process."""
        threading.current_thread().name = RENEWER_THREAD_NAME
        while True:
            try:
                self._turn()
            except BaseException:  # a bug of the renewer's own: log it and go on renewing the others (nothing
                # interrupts this thread on purpose: no signal handler runs in it, no time limit targets it)
                logger.exception("the lease renewer failed; it goes on")

    def _turn(self) -> None:
        """Sleep until the earliest renewal is due (or a keeper wakes it), then make every renewal that is due."""
        taken_until = self._take_submitted()
        # with no live keeper, it sleeps until the last renewal it took was due: the keepers that follow
        # are due later and need not wake it (an attempt shorter than its interval never does)
        due = self._heap[0][0] if self._heap else taken_until
        self._wake_at = due
        if self._submitted:  # handed over before it announced its sleep: a submitter may not have woken it
            self._wake_at = -math.inf
            return
        delay = due - time.monotonic()
        if delay > 0:
            with contextlib.suppress(queue.Empty):
                # a lease of years sleeps at most TIMEOUT_MAX at a time (a longer timeout raises OverflowError)
                self._doorbell.get(timeout=None if due == math.inf else min(delay, threading.TIMEOUT_MAX))
            self._wake_at = -math.inf
            return
        self._wake_at = -math.inf
        if not self._heap:  # the stopped keepers' renewals it slept for are past: nothing to renew
            return
        _, ticket, keeper = heapq.heappop(self._heap)
        next_in = keeper.renew_if_current(ticket)
        if next_in is not None:
            heapq.heappush(self._heap, (time.monotonic() + next_in, ticket, keeper))

    def _take_submitted(self) -> float:
        """Move the keepers' registrations onto the heap, dropping stopped ones; rebuild a heap gone mostly stale.

        Returns when the last registration taken was due (``inf`` if none was taken).
        """
        taken_until = math.inf
        while self._submitted:
            entry = self._submitted.popleft()
            taken_until = entry[0]
            if entry[2].is_current(entry[1]):
                heapq.heappush(self._heap, entry)
        while self._heap and not self._heap[0][2].is_current(self._heap[0][1]):
            heapq.heappop(self._heap)
        if len(self._heap) > 2 * self._live_at_rebuild + _STALE_SLACK:
            self._heap = [entry for entry in self._heap if entry[2].is_current(entry[1])]
            heapq.heapify(self._heap)
            self._live_at_rebuild = len(self._heap)
        return taken_until


_LOCKED_RETRY_S = 0.1
"""Seconds until a renewal refused with [`RunLocked`][flexiq_plugins.errors.RunLocked] is tried again (at most the
keeper's interval)."""

_STALE_SLACK = 64
"""Entries tolerated on the heap beyond twice the live ones at the last rebuild."""

_DRAIN_EVERY = 256
"""Registrations handed over between two wake-ups after which a keeper wakes the renewer to take them."""

_RENEWER = _Renewer()


def _reset_in_child() -> None:
    """A forked child renews its own attempts' claims with its own thread, started at its first keeper."""
    global _RENEWER
    _RENEWER = _Renewer()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_in_child)
