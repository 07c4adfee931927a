"""Recovery of runs no broker message will wake (C35): find them, re-publish each exactly once.

Besides lost sleepers and dead workers, recovery re-publishes a run recorded
at publish that stayed ``queued`` without a start (C39: its message was lost
before any worker took it; the claim makes a late original harmless), wakes a ``waiting`` run
whose event has arrived when no sender could (C33: a sender without the run's
integration in its process), and runs a cancellation no attempt carried out
yet (C34: its undos to run, or a run that suspended as it was cancelled).

**Exactly once per stranded state.** Each candidate is claimed with
`OperatorStore.mark_recovered`, a compare-and-set on the run's status and
``updated_at``: of two recoverers running at once, one publishes. The claim
moves ``updated_at`` past the run's due time, so a recovered run is not
recovered again until ``stale_after`` has passed without it starting. A
duplicate would still be harmless (the core's claim lets one delivery run the
body), but it is avoided.

**What the framework already ended stays ended (C47).** Before a run that
never started is re-published, its framework's result store is read for the
job's id (`reported_state`: Celery's
result backend, Dramatiq's ``Results``). A job the framework reports finished
(a worker without the integration ran it) settles the run to match instead:
the body is never run a second time.

**The original job id.** A run is re-published under the job id it has
(its Celery task id, its Dramatiq message id), so whoever waits on the
original ``AsyncResult`` or ``message.get_result()`` gets the outcome; the
run's claim still lets one delivery run the body (C24, C37). A cancelled
run's undos go out under a new id (its old one may be revoked).

**A publish that fails** (the broker is down) undoes the run's recovery
mark, so the next sweep tries it again; after three failures in a row a
sweep stops publishing and leaves the rest to the next one.

**One sweep at a time (C39).** Every worker runs a [`Sweeper`][flexiq_plugins.integration.Sweeper] by
default; each tick it asks the store for the one recovery lease
(`OperatorStore.acquire_sweep_lease`, on the database's clock) and sweeps
only while it holds it. The holder renews it at every tick; when it dies, the
lease expires after two intervals and another worker takes over.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .._attempt.store_health import store_health
from .._model.durations import parse_duration
from .._model.records import RunRecord, StepAttempt, StepRow
from .._observe import Observer
from .._store.operator_side import OperatorStore
from ..errors import ConfigurationError, PublishFailed, StoreUnavailable
from .publishing import publish
from .registry import Publisher, reported_state

__all__ = [
    "DEFAULT_GRACE_SECONDS",
    "DEFAULT_INTERVAL_SECONDS",
    "DEFAULT_QUEUED_SECONDS",
    "DEFAULT_STALE_SECONDS",
    "RecoveryReport",
    "Stranded",
    "Sweeper",
    "find_stranded",
    "recover",
]

logger = logging.getLogger("flexiq_plugins.operations")

DEFAULT_GRACE_SECONDS = 10.0
"""How long past its wake time or deadline a run may be before [`recover`][flexiq_plugins.operations.recover] takes it,
seconds.

Short: a wake-up re-published while the original was only late is a
duplicate the run's claim makes harmless (C24, C37)."""

DEFAULT_STALE_SECONDS = 3600.0
"""How long a ``pending`` or ``retrying`` run may go without an update before
[`recover`][flexiq_plugins.operations.recover] takes it, seconds."""

DEFAULT_QUEUED_SECONDS = 30.0
"""How long a run recorded at publish may stay ``queued`` without a start before
[`recover`][flexiq_plugins.operations.recover] takes it, seconds.

A job waiting in a backlog longer than this gets one copy (marked to run
only while its run never started, C39): the claim makes it a no-op, so a
short wait costs a little work, and a lost queue is run again within about
this long plus one interval."""

DEFAULT_INTERVAL_SECONDS = 10.0
"""Time between two ticks of a [`Sweeper`][flexiq_plugins.integration.Sweeper], seconds."""

_SCAN_LIMIT = 100_000
_FAILURES_BEFORE_PAUSE = 3
"""Publishes failing in a row after which a sweep leaves the rest to the next one (the broker is down)."""
_NEW_JOB_ID = frozenset({"cancel_requested"})
"""Why a run is re-published under a new job id: its undos' job must not meet a revoke of its old id."""
_STALE_STATUSES = ("pending", "retrying")
_SCANNED = ("queued", "pending", "running", "sleeping", "waiting", "retrying")


@dataclass(frozen=True)
class Stranded:
    """A run that no broker message will wake (C35).

    Parameters:
      run (RunRecord): the run as read.
      why (str): ``"never_started"``, ``"sleep_overdue"``, ``"wait_overdue"``, ``"event_arrived"``,
        ``"cancel_requested"``, ``"lease_expired"`` or ``"stale"``.
      due_at (float): when it should have moved on: its publish, the wake time, the wait's
        deadline, the event's arrival, the lease expiry or the last update,
        epoch seconds.
    """

    run: RunRecord
    why: str
    due_at: float


@dataclass
class RecoveryReport:
    """What [`recover`][flexiq_plugins.operations.recover] did.

    Parameters:
      dry_run (bool): nothing was changed or published.
      recovered (list[tuple[Stranded, str]]): re-published runs with their job id ('' in a dry run).
      skipped (list[tuple[Stranded, str]]): runs left alone, with why.
      failed (list[tuple[Stranded, str]]): runs whose publish failed, with the error.
      settled (list[tuple[Stranded, str]]): runs never started whose job the framework reported
        finished, with the status they were settled with (C47; in a dry run, the status they would get).
    """

    dry_run: bool
    recovered: list[tuple[Stranded, str]] = field(default_factory=list)
    skipped: list[tuple[Stranded, str]] = field(default_factory=list)
    failed: list[tuple[Stranded, str]] = field(default_factory=list)
    settled: list[tuple[Stranded, str]] = field(default_factory=list)


def find_stranded(
    store: OperatorStore,
    *,
    grace: str | float = DEFAULT_GRACE_SECONDS,
    stale_after: str | float = DEFAULT_STALE_SECONDS,
    queued_after: str | float = DEFAULT_QUEUED_SECONDS,
) -> list[Stranded]:
    """Return the runs [`recover`][flexiq_plugins.operations.recover] would re-publish, oldest due first (C35, C39).

    - ``queued`` (recorded at publish, C39) and not started ``queued_after``
      after it was due (its publish, or the end of its countdown or ETA):
      its message was lost before any worker took it;
    - ``sleeping`` past its recorded wake time (a sleep's, or a step retry's time, C31)
      by more than ``grace``; ``waiting`` past its deadline by more than ``grace``;
    - ``waiting`` for an event that has arrived (C33), at once;
    - not held by a live attempt, with a cancellation requested (C34), at once;
    - ``running`` whose claim lease has expired (its worker died), at once: the
      lease, renewed every third of it, is its own grace;
    - ``pending`` or ``retrying`` not updated for more than ``stale_after``
      (at least ``grace``).

    A run the framework ended by itself (``failed``, ``cancelled``: C38) is
    terminal and never a candidate.

    The decision reads the recorded status, wake time and lease, and the
    run's ``recovered_at``, never the order of two timestamps: a short sleep
    whose ``sleeping`` record landed after its own wake time is overdue all
    the same. A run recovered after it fell due is a candidate again only
    once that recovery is older than ``stale_after`` (its job never started,
    e.g. no worker consumes the queue), so a cron job or a sweeper does not
    pile up copies of one job.

    Parameters:
      store (OperatorStore): the store.
      grace (str | float): a duration (``"60s"``) or seconds.
      stale_after (str | float): a duration (``"1h"``) or seconds.
      queued_after (str | float): a duration (``"10m"``) or seconds.

    Raises:
      ValueError: a duration cannot be parsed.
      StoreUnavailable: the store cannot be reached.
    """
    queued_before = store.now() - parse_duration(queued_after)
    grace_s = parse_duration(grace)
    stale_s = max(parse_duration(stale_after), grace_s)
    now = store.now()
    due, stale = now - grace_s, now - stale_s
    runs = {status: store.list_runs(status=status, limit=_SCAN_LIMIT) for status in _SCANNED}
    found = [
        *_never_started(runs["queued"], queued_before, stale),
        *_overdue_sleepers(store, runs["sleeping"], due, stale),
        *_waiters(store, runs["waiting"], due, stale),
        *_lost_claims(runs["running"], now, stale),
        *_cancel_requested([r for status in _SCANNED for r in runs[status]], now, stale),
    ]
    for status in _STALE_STATUSES:
        found += [Stranded(r, "stale", r.updated_at) for r in runs[status] if r.updated_at < stale]
    first: dict[str, Stranded] = {}
    for stranded in sorted(found, key=lambda s: s.due_at):  # a run once, for its earliest reason
        first.setdefault(stranded.run.run_key, stranded)
    return list(first.values())


def _unclaimed_since(run: RunRecord, due_at: float, stale: float) -> bool:
    """Not recovered since it fell due at ``due_at``, or recovered longer than ``stale`` ago."""
    return run.recovered_at is None or run.recovered_at < due_at or run.recovered_at < stale


def _never_started(queued: list[RunRecord], before: float, stale: float) -> list[Stranded]:
    """Runs recorded at publish, due to start before ``before`` (their publish, or their countdown's end),
    that no attempt started (C39)."""
    found = []
    for run in queued:
        due = max(run.created_at, run.wake_at or 0.0)
        if due < before and _unclaimed_since(run, due, stale):
            found.append(Stranded(run, "never_started", due))
    return found


def _overdue_sleepers(store: OperatorStore, sleeping: list[RunRecord], due: float, stale: float) -> list[Stranded]:
    found = []
    for run in sleeping:
        wake_at = run.wake_at
        if wake_at is None:  # a run recorded before wake times were kept on the run
            wake_at = latest_wake_at(store.get_steps(run.run_key), store.get_step_attempts(run.run_key))
        if wake_at is not None and wake_at < due and _unclaimed_since(run, wake_at, stale):
            found.append(Stranded(run, "sleep_overdue", wake_at))
    return found


def _waiters(store: OperatorStore, waiting: list[RunRecord], due: float, stale: float) -> list[Stranded]:
    """Waiting runs past their deadline, or whose event has arrived (C33)."""
    found = []
    for run in waiting:
        if run.wake_at is not None and run.wake_at < due and _unclaimed_since(run, run.wake_at, stale):
            found.append(Stranded(run, "wait_overdue", run.wake_at))
        elif run.wait_topic is not None and run.wait_key is not None:
            event = store.next_event(run.run_key, run.wait_topic, run.wait_key)
            if event is not None and _unclaimed_since(run, event.created_at, stale):
                found.append(Stranded(run, "event_arrived", event.created_at))
    return found


def _cancel_requested(live: list[RunRecord], now: float, stale: float) -> list[Stranded]:
    """Runs no live attempt holds whose cancellation was requested and not carried out (C34)."""
    found = []
    for run in live:
        held = run.owner is not None and run.lease_until is not None and run.lease_until > now
        if run.cancel_reason is not None and not held and _unclaimed_since(run, run.updated_at, stale):
            found.append(Stranded(run, "cancel_requested", run.updated_at))
    return found


def _lost_claims(running: list[RunRecord], due: float, stale: float) -> list[Stranded]:
    found = []
    for run in running:
        expired = run.lease_until if run.lease_until is not None else run.updated_at
        if expired < due and _unclaimed_since(run, expired, stale):
            found.append(Stranded(run, "lease_expired", expired))
    return found


def recover(
    store: OperatorStore,
    publishers: Mapping[str, Publisher],
    *,
    grace: str | float = DEFAULT_GRACE_SECONDS,
    stale_after: str | float = DEFAULT_STALE_SECONDS,
    queued_after: str | float = DEFAULT_QUEUED_SECONDS,
    dry_run: bool = False,
) -> RecoveryReport:
    """Re-publish stranded runs, each exactly once even with several recoverers at once (C35, C39, C47).

    Each candidate of [`find_stranded`][flexiq_plugins.operations.find_stranded] is won with
    [`OperatorStore.mark_recovered`][flexiq_plugins.OperatorStore.mark_recovered], then re-published through its
    framework's publisher under the job id it has (a cancelled run's undos:
    a new one), carrying its run key. A run that never started is first
    looked up in its framework's result store: one its framework reports
    finished is settled to match ([`OperatorStore.settle_reported`][flexiq_plugins.OperatorStore.settle_reported]),
    never re-published (C47); one whose result store cannot be read now is
    skipped until the next sweep. A failed publish undoes the run's mark
    ([`OperatorStore.unmark_recovered`][flexiq_plugins.OperatorStore.unmark_recovered]); after three in a row the rest
    are skipped (the broker is down).

    Parameters:
      store (OperatorStore): the store.
      publishers (Mapping[str, Publisher]): a publisher per framework name;
        runs of another framework are skipped.
      grace (str | float): see [`find_stranded`][flexiq_plugins.operations.find_stranded].
      stale_after (str | float): see [`find_stranded`][flexiq_plugins.operations.find_stranded].
      queued_after (str | float): see [`find_stranded`][flexiq_plugins.operations.find_stranded].
      dry_run (bool): only report what would be re-published or settled.

    Raises:
      ValueError: a duration cannot be parsed.
      StoreUnavailable: the store cannot be reached.
    """
    report = RecoveryReport(dry_run=dry_run)
    failures = 0
    for stranded in find_stranded(store, grace=grace, stale_after=stale_after, queued_after=queued_after):
        if failures >= _FAILURES_BEFORE_PAUSE:
            report.skipped.append((stranded, "the broker refused the last publishes: left to the next sweep"))
            continue
        before = len(report.failed)
        _recover_one(store, publishers, stranded, report)
        failures = failures + 1 if len(report.failed) > before else 0
    return report


def _recover_one(
    store: OperatorStore, publishers: Mapping[str, Publisher], stranded: Stranded, report: RecoveryReport
) -> None:
    run = stranded.run
    publisher = publishers.get(run.framework)
    if publisher is None:
        report.skipped.append((stranded, f"no publisher for {run.framework!r} jobs"))
    elif run.envelope.corrupt:
        report.skipped.append((stranded, run.envelope.corrupt))
    elif _settled_by_framework(store, publisher, stranded, report):
        return
    elif report.dry_run:
        report.recovered.append((stranded, ""))
    elif not store.mark_recovered(run.run_key, status=run.status, updated_at=run.updated_at):
        report.skipped.append((stranded, "changed meanwhile, or recovered by another process"))
    else:
        _publish_recovered(store, publisher, stranded, report)


def _settled_by_framework(
    store: OperatorStore, publisher: Publisher, stranded: Stranded, report: RecoveryReport
) -> bool:
    """Settle a never-started run whose job the framework reports finished; whether the run is dealt with (C47).

    Only a run that never started: its job id is the one it was published
    with, so what the result store holds for it is that job's end. (A run
    that started may have handed its job id on, e.g. to a compensation
    re-published under the failed job's id, C32.)
    """
    run = stranded.run
    if stranded.why != "never_started" or not run.job_id:
        return False
    try:
        state = reported_state(publisher, run.job_id, run.envelope)
    except Exception as exc:  # the result store cannot be read now: never re-publish blind (C47)
        report.skipped.append((stranded, f"its job's state cannot be read ({type(exc).__name__}: {exc}); left"))
        return True
    if state is None:
        return False
    if report.dry_run or store.settle_reported(run.run_key, state):
        logger.info("run %s: its job %s was reported %s by its framework; settled", run.run_key, run.job_id, state)
        report.settled.append((stranded, state))
    else:
        report.skipped.append((stranded, "changed meanwhile"))
    return True


def _publish_recovered(store: OperatorStore, publisher: Publisher, stranded: Stranded, report: RecoveryReport) -> None:
    run = stranded.run
    job_id = None if stranded.why in _NEW_JOB_ID else run.job_id
    try:
        unstarted_only = stranded.why == "never_started"  # the original may still be in a backlog (C39)
        published = publish(publisher, run.envelope, run.run_key, job_id=job_id, unstarted_only=unstarted_only)
    except PublishFailed as exc:
        report.failed.append((stranded, str(exc)))
        try:
            store.unmark_recovered(run.run_key, recovered_at=run.recovered_at)
        except StoreUnavailable as unreachable:  # stays marked: recovered again after stale_after
            logger.debug("run %s: could not undo its recovery mark: %s", run.run_key, unreachable)
        return
    logger.info("recovered run %s (%s) as job %s", run.run_key, stranded.why, published)
    report.recovered.append((stranded, published))


class Sweeper:
    """A daemon thread that calls [`recover`][flexiq_plugins.operations.recover] every ``interval`` seconds (C35, C39).

    Safe to run in every worker at once: with ``lease`` (the default) a tick
    sweeps only while this sweeper holds the store's one recovery lease, so
    one sweep runs at a time across all workers; and
    `OperatorStore.mark_recovered` lets one recoverer re-publish each
    stranded run in any case. A store that cannot be reached is logged once
    as a WARNING when it starts failing (unless another part of the process
    already reported that outage) and once at INFO when it is back;
    other errors are logged and the next tick goes on.

    Parameters:
      store (OperatorStore): the store.
      publishers (Mapping[str, Publisher]): a publisher per framework name.
      interval (str | float): time between ticks (``"1m"`` or seconds).
      grace (str | float): see [`find_stranded`][flexiq_plugins.operations.find_stranded].
      stale_after (str | float): see [`find_stranded`][flexiq_plugins.operations.find_stranded].
      queued_after (str | float): see [`find_stranded`][flexiq_plugins.operations.find_stranded].
      lease (bool): sweep only while holding the store's recovery lease of
        these publishers' frameworks (``recovery:celery``, held for two
        intervals, renewed at every tick): a Dramatiq worker never holds up
        the recovery of Celery runs sharing the store.
      name (str): names this sweeper in log lines (e.g. ``"celery worker"``).
      observer (Observer | None): counts each re-publish (``flexiq.recovery.republished``, C53).

    Raises:
      ConfigurationError: (a ``ValueError``) a duration cannot be parsed, or ``interval`` is zero.
    """

    def __init__(
        self,
        store: OperatorStore,
        publishers: Mapping[str, Publisher],
        *,
        interval: str | float = DEFAULT_INTERVAL_SECONDS,
        grace: str | float = DEFAULT_GRACE_SECONDS,
        stale_after: str | float = DEFAULT_STALE_SECONDS,
        queued_after: str | float = DEFAULT_QUEUED_SECONDS,
        lease: bool = True,
        name: str = "sweeper",
        observer: Observer | None = None,
    ) -> None:
        self.store = store
        self.observer = observer
        self.publishers = dict(publishers)
        self.interval = parse_duration(interval)
        if self.interval <= 0:
            raise ConfigurationError(f"the sweeper's interval must be positive, got {interval!r}")
        self.grace = parse_duration(grace)
        self.stale_after = parse_duration(stale_after)
        self.queued_after = parse_duration(queued_after)
        self.lease = lease
        self.name = name
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.lease_name = "recovery:" + "+".join(sorted(self.publishers))
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._unreachable = False

    def start(self) -> Sweeper:
        """Start the thread (once); return ``self``."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="flexiq-sweeper", daemon=True)
            self._thread.start()
        return self

    def wake(self) -> None:
        """Tick now instead of at the end of the interval (a worker just reconnected to its broker, C39).

        The tick still takes the lease first: a sweeper that does not hold
        it does nothing. Thread-safe; a no-op before [`start`][flexiq_plugins.integration.Sweeper.start].
        """
        self._wake.set()

    def stop(self, timeout: float | None = None) -> None:
        """Ask the thread to stop, wait for it up to ``timeout`` seconds, and give the lease up."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self.lease:
            try:
                self.store.release_sweep_lease(self.owner, name=self.lease_name)
            except Exception as exc:  # the lease then expires by itself
                logger.debug("%s: could not release the recovery lease: %s", self.name, exc)

    def sweep(self) -> RecoveryReport:
        """Run one recovery now, whether or not this sweeper holds the lease, and return its report."""
        report = recover(
            self.store,
            self.publishers,
            grace=self.grace,
            stale_after=self.stale_after,
            queued_after=self.queued_after,
        )
        if self.observer is not None:
            for stranded, _job_id in report.recovered:
                self.observer.republished(stranded.why, stranded.run.task_name)
        return report

    def tick(self) -> RecoveryReport | None:
        """One tick: take or renew the lease, then sweep; ``None`` when another process holds the lease.

        Raises:
          StoreUnavailable: the store cannot be reached.
        """
        if self.lease and not self.store.acquire_sweep_lease(self.owner, 2 * self.interval, name=self.lease_name):
            return None
        return self.sweep()

    def _loop(self) -> None:
        while True:
            self._wake.wait(self.interval)
            self._wake.clear()
            if self._stop.is_set():
                return
            since = store_health(self.store).generation
            try:
                report = self.tick()
            except StoreUnavailable as exc:
                self._note_unreachable(exc, since)
                continue
            except Exception:
                logger.exception("%s: recovery sweep failed; the next one runs in %s s", self.name, self.interval)
                continue
            self._note_reachable()
            if report is not None and (report.recovered or report.failed or report.settled):
                logger.info(
                    "%s: recovery sweep: %d re-published, %d failed, %d settled as their framework reported",
                    self.name,
                    len(report.recovered),
                    len(report.failed),
                    len(report.settled),
                )

    def _note_unreachable(self, exc: StoreUnavailable, since: int) -> None:
        health = store_health(self.store)
        if not self._unreachable or not health.down:  # a WARNING only if no other part reported this outage (C41)
            health.failed("%s: recovery paused, the step store cannot be reached: %s", self.name, exc, since=since)
        self._unreachable = True

    def _note_reachable(self) -> None:
        store_health(self.store).answered()
        if self._unreachable:
            logger.debug("%s: the step store is reachable again; recovery resumes", self.name)
        self._unreachable = False


def latest_wake_at(steps: Iterable[StepRow], attempts: Iterable[StepAttempt] = ()) -> float | None:
    """When a waiting run is due: its latest sleep's wake time, or a later step retry's (C15, C31), epoch seconds."""
    steps = list(steps)
    sleeps = [s for s in steps if s.kind == "sleep" and s.wake_at is not None]
    times = [max(sleeps, key=lambda s: s.position).wake_at] if sleeps else []
    committed = {s.step_key for s in steps}
    times += [a.retry_at for a in attempts if a.ended == "failed" and a.step_key not in committed]
    known = [t for t in times if t is not None]
    return max(known) if known else None
