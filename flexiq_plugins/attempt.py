"""The attempt driver: the only thing the framework adapters talk to.

An adapter turns a framework message into a :class:`JobInfo` and hands it,
with the task body, to :meth:`AttemptDriver.run_job` (or ``arun_job`` for an
``async def`` body). The driver claims the run and reads its snapshot in one
transaction (before the body, or, for a ``lazy`` job, at the body's first
step: a body that takes no step does no store I/O), runs the body with
``current_job`` set, commits the run's state (if it claimed one), and returns
exactly one :mod:`~flexiq_plugins.outcomes` value. Every decision
that does not depend on the framework is made here, once, for every adapter:

- classification of what the body raised, before any retry filter (C28, C29);
- a store outage is put back whatever the task's filters say, and counts no
  retry (C28); the delay starts at ``store_retry_seconds`` and doubles while
  the outage lasts, up to ``store_retry_max_seconds``, each longer delay
  logged, and the outage's end once (C41);
- a run busy elsewhere is put back for at most ``busy_retry_seconds`` (C24);
- a sleep is put back for its time left, capped at one hop (C15–C18), and so
  is a step retry (C31);
- a run past its takeover limit is dead-lettered ``worker_lost`` (C25);
- a run that fails for good is compensated (C32, :mod:`flexiq_plugins.compensation`);
- a wait for an event ends the attempt ``waiting``: put back for its deadline,
  or acknowledged without a deadline, the sender waking it (C33);
- a cancelled run (on request, or over a cap of its task) is compensated and
  ends ``cancelled`` (C34, :mod:`flexiq_plugins.cancellation`).

The step protocol itself lives in :mod:`flexiq_plugins.steps`; the driver
gives it a writer fenced on the attempt's claim.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import socket
import threading
import time
import traceback
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from . import cancellation, compensation, outcomes, replays
from ._lease import LeaseKeeper
from ._store import base
from ._store.base import (
    EventPoll,
    JobEnvelope,
    NewDeadLetter,
    StepAttemptBegin,
    StepAttemptFailed,
    StepAttemptFailure,
    StepRow,
    StepStore,
)
from ._store_health import StoreHealth, store_health
from .cancellation import RunCaps
from .config import DurableConfig
from .context import JobContext
from .errors import (
    ClaimLost,
    ClaimRefused,
    Disposition,
    EventWaitSignal,
    RunCancelled,
    SleepSignal,
    StepRetrySignal,
    StepSignal,
    StoreError,
    StoreMisconfigured,
    StoreUnavailable,
    SwallowedStepSignal,
    UnknownRun,
    UnsupportedInEagerMode,
    classify,
    reason_of,
)
from .identity import check_run_key
from .policies import CancellationPolicy, RetryPolicy
from .steps import StepJournal
from .transactions import CallerConnection, watch_sqlalchemy

__all__ = ["Attempt", "AttemptDriver", "JobInfo", "default_owner"]

logger = logging.getLogger("flexiq_plugins")

_ENDED_STATUS: dict[outcomes.Ended, base.RunStatus] = {
    outcomes.Ended.REVOKED: "cancelled",
    outcomes.Ended.EXPIRED: "cancelled",
    outcomes.Ended.SKIPPED: "cancelled",
    outcomes.Ended.TIME_LIMIT: "failed",
    outcomes.Ended.FAILED: "failed",
}

_CANCELLING = frozenset({outcomes.Ended.REVOKED, outcomes.Ended.EXPIRED, outcomes.Ended.SKIPPED})
"""The ends that cancel a run (C34): through :func:`flexiq_plugins.cancellation.cancel`, undos included."""

_FINISH_RETRY_PAUSES = (0.2, 0.5, 1.0)
_FINISH_QUICK_FAILURE_S = 1.0
"""A release that failed within this many seconds met a blip (refused, dropped) and is tried again; a slower
failure waited for a network timeout (a black-holed store), and waiting for more of them only delays the put-back."""


@dataclass(frozen=True)
class JobInfo:
    """One framework message, as the core sees it.

    Parameters:
      run_key(str): the run key the message carries (or its job id, C1 words).
      job_id(str): the framework's job id.
      envelope(JobEnvelope | Callable[[], JobEnvelope]): what re-publishes the
        job (C35); or a function that builds it, called once, when the run is
        claimed (a job that takes no step never builds it).
      step_retry(RetryPolicy | None): the task's or actor's default budget for
        its steps (its ``step_retry`` option, C31); ``None``: the integration's.
      cancellation(CancellationPolicy | None): the task's or actor's caps
        (``max_run_seconds``, ``max_suspended_seconds``, C34); each cap it
        leaves off is the integration's.
      eager(bool): the job runs in the caller's process with no broker
        (Celery's ``task_always_eager``, ``Task.apply``): it cannot be put
        back, so a sleep fails its run instead of leaving one to resume (C38).
      lazy(bool): claim the run at the body's first use of ``current_job.step``
        (or ``current_job.attempt``) instead of before the body: a body that
        takes no step does no store I/O at all. Adapters set it for a first
        delivery of a new job that was not recorded at publish; a delivery
        that may continue a run (a retry, a put-back, a redelivery, a
        re-publish, a producer's own run key) or whose run was recorded at
        publish claims before the body, so its run is settled however the
        body ends (:func:`~flexiq_plugins.integration.claims_before_body`).
      task_name(str | None): the task or actor name; ``None``: the envelope's.
      unstarted_only(bool): recovery's copy of a run that was still ``queued``
        (C39): it runs only while the run has never started; once another
        delivery (the original, out of a backlog) has claimed it, the copy is
        acknowledged as a duplicate (or replays a finished run's outcome).
    """

    run_key: str
    job_id: str
    envelope: JobEnvelope | Callable[[], JobEnvelope]
    step_retry: RetryPolicy | None = None
    cancellation: CancellationPolicy | None = None
    eager: bool = False
    lazy: bool = False
    task_name: str | None = None
    unstarted_only: bool = False

    @functools.cached_property
    def job_envelope(self) -> JobEnvelope:
        """The envelope, built now if it was given as a function (once)."""
        envelope = self.envelope
        return envelope if isinstance(envelope, JobEnvelope) else envelope()

    @property
    def name(self) -> str:
        """The task or actor name."""
        return self.task_name if self.task_name is not None else self.job_envelope.task_name


_HANDED_ON = frozenset({"sleeping", "waiting", "retrying"})
"""Live statuses of a started run whose own message (a wake-up, a retry) is in the broker."""


def default_owner() -> str:
    """Return a claim owner id for this process and thread: ``host:pid:random``."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


class _Outage:
    """A store outage as this process's attempts see it: the put-back backoff (C28, C41).

    Consecutive put-backs for the store wait ``first`` seconds, then twice as
    long each time up to ``cap``. The process's ``StoreHealth`` logs
    the outage: the first failure at WARNING unless another part of the
    process (its lease renewals, its recovery sweeper, a publish) already
    reported it, each longer wait at DEBUG, and its end once at INFO. A
    :class:`StoreMisconfigured` store is an ERROR once per outage: it will
    not pass by itself.

    Parameters:
      first(float): the first delay, seconds (``store_retry_seconds``).
      cap(float): the longest delay, seconds (``store_retry_max_seconds``).
      health(StoreHealth): the store's health in this process (:func:`store_health`).
    """

    def __init__(self, first: float, cap: float, health: StoreHealth) -> None:
        self._lock = threading.Lock()
        self._first = first
        self._cap = max(cap, first)
        self._delay = 0.0
        self._misconfigured = False
        self._health = health

    def failed(self, exc: StoreUnavailable) -> float:
        """Note one more put-back for ``exc``; return its delay, seconds."""
        misconfigured = isinstance(exc, StoreMisconfigured)
        with self._lock:
            before = self._delay
            self._delay = self._first if before == 0.0 else min(before * 2, self._cap)
            delay = self._delay
            first_misconfigured, self._misconfigured = misconfigured and not self._misconfigured, misconfigured
        if first_misconfigured:  # not an outage: it will not pass by itself, even when met during one
            logger.error(
                "step store unavailable: %s; jobs are put back after %.3g s, then up to %.3g s, until it is fixed",
                exc,
                delay,
                self._cap,
            )
        elif before == 0.0 or not self._health.down:  # another part saw the store answer: a new outage (C41)
            self._health.failed(
                "step store unavailable: %s; jobs are put back after %.3g s, then up to %.3g s, until it returns",
                exc,
                delay,
                self._cap,
            )
        elif delay != before:
            logger.debug("step store still unavailable; jobs are put back for %.3g s", delay)
        return delay

    def ok(self) -> None:
        """The store answered: the outage (if any) is over."""
        if self._delay != 0.0:
            with self._lock:
                self._delay = 0.0
                self._misconfigured = False
        self._health.answered()


class AttemptDriver:
    """Runs attempts against one store with one configuration.

    Parameters:
      store(StepStore): where runs and steps live.
      config(DurableConfig | None): options; defaults apply when ``None``.
    """

    def __init__(self, store: StepStore, config: DurableConfig | None = None) -> None:
        self.store = store
        self.config = config or DurableConfig()
        self.codec = self.config.codec_chain()
        self._outage = _Outage(
            self.config.store_retry_seconds, self.config.store_retry_max_seconds, store_health(store)
        )
        watch_sqlalchemy()  # a plain step inside a SQLAlchemy transaction that has written is refused (C42)

    # ------------------------------------------------------------ one call
    def run_job(self, job: JobInfo, body: Callable[[], Any], *, owner: str | None = None) -> outcomes.Outcome:
        """Run one attempt of ``job`` with ``body()`` as its task body; return its outcome.

        The attempt's store calls in this thread (its start, its steps, its
        finish) share one connection, given back when it ends
        (:meth:`StepStore.held`).

        Raises:
          InvalidRunKey: the run key is not a ``str`` of 1 to 255 characters.
        """
        with self.store.held():
            started = self.start(job, owner=owner)
            return started.run(body) if isinstance(started, Attempt) else started

    async def arun_job(
        self, job: JobInfo, body: Callable[[], Awaitable[Any]], *, owner: str | None = None
    ) -> outcomes.Outcome:
        """Async :meth:`run_job`: ``body()`` is awaited."""
        started = self.start(job, owner=owner)
        return await started.arun(body) if isinstance(started, Attempt) else started

    # ------------------------------------------------------------ starting
    def start(self, job: JobInfo, owner: str | None = None) -> Attempt | outcomes.Outcome:
        """Claim ``job``'s run and return a ready :class:`Attempt`, or an outcome at once.

        One store transaction (C9). Returns a :class:`~flexiq_plugins.outcomes.PutBack`
        while another live claim holds the run (C24) or the store is down
        (C28), a :class:`~flexiq_plugins.outcomes.Replay` (or, keeping no
        outcome, an ``Ack``) if the run is terminal (C26, C37, :meth:`replay_finished`),
        a :class:`~flexiq_plugins.outcomes.DeadLetter` (``worker_lost``)
        past the takeover limit (C25). A ``lazy`` job claims nothing now: its
        :class:`Attempt` claims at the body's first step, and any of those
        outcomes then ends the attempt from there (:class:`ClaimRefused`).

        Raises:
          InvalidRunKey: the run key is not a ``str`` of 1 to 255 characters.
        """
        check_run_key(job.run_key)
        if job.lazy:
            return Attempt(self, job, None, owner=owner)
        claimed = self.claim(job, owner)
        return Attempt(self, job, claimed, owner=owner) if isinstance(claimed, base.Begun) else claimed

    def claim(self, job: JobInfo, owner: str | None = None) -> base.Begun | outcomes.Outcome:
        """Claim ``job``'s run (C23): the claim, or the outcome that ends the attempt without a body (C24–C28, C39)."""
        dropped = self._started_meanwhile(job) if job.unstarted_only else None
        return dropped if dropped is not None else self._claim(job, owner)

    def _claim(self, job: JobInfo, owner: str | None) -> base.Begun | outcomes.Outcome:
        try:
            result = self.store.begin(
                job.run_key, job.job_id, job.job_envelope, owner or default_owner(), self.config.lease_seconds
            )
            self._outage.ok()
        except StoreUnavailable as exc:
            return self.store_outage(exc)
        if isinstance(result, base.Finished):
            return self.replay_finished(job, result)
        if isinstance(result, base.Busy):
            delay = max(min(self.config.busy_retry_seconds, result.lease_remaining), 0.0)
            return outcomes.PutBack(outcomes.PutBackReason.BUSY, delay, "its run is running elsewhere")
        if result.takeovers > self.config.max_takeovers:
            return self._worker_lost(job, result)
        if result.envelope.corrupt:
            return self._dead_at_start(job, result, "corrupt_record", f"run {job.run_key!r}: {result.envelope.corrupt}")
        return result

    def _started_meanwhile(self, job: JobInfo) -> outcomes.Outcome | None:
        """A recovery copy of a ``queued`` run that another delivery has started and handed on: a duplicate (C39).

        One read. A run that is sleeping, waiting or retrying has a message
        of its own in the broker (its wake-up, its retry); the copy is
        dropped. ``None`` otherwise: the run never started, is running (the
        claim then puts the copy back while the lease lives, or takes a dead
        claimant's run over, C24, C25), or is finished (the claim replays its
        outcome, C37).
        """
        try:
            run = self.store.get_run(job.run_key)
        except UnknownRun:
            return None
        except StoreUnavailable as exc:
            return self.store_outage(exc)
        if run.attempt == 0 or run.status not in _HANDED_ON:
            return None
        logger.info(
            "job %s: run %s started meanwhile (%s); this recovery copy is dropped", job.job_id, job.run_key, run.status
        )
        return outcomes.Ack(outcomes.AckReason.DUPLICATE, run.status)

    def ended_unclaimed(self, job: JobInfo, value: Any = None, error: BaseException | None = None) -> outcomes.Outcome:
        """The outcome of an attempt that ended without claiming its run: its body took no step.

        The one place that decides what such an attempt is (issue 16); no
        run exists for it (a job recorded at publish claims before its body,
        :func:`~flexiq_plugins.integration.claims_before_body`), so nothing
        is written: a value is :class:`~flexiq_plugins.outcomes.Completed`, a
        worker shutdown puts the job back (C38), any other error is a
        ``Failure`` with ``claimed=False``, left to the framework's own retry
        policy as without the integration (no dead letter of the library's,
        C29/C30 apply to runs only).

        Parameters:
          job(JobInfo): the job.
          value(Any): what the body returned.
          error(BaseException | None): what it raised.
        """
        if error is None:
            return outcomes.Completed(value)
        if classify(error) is Disposition.INTERRUPTED:
            return outcomes.PutBack(outcomes.PutBackReason.SHUTDOWN, 0.0, str(error))
        return outcomes.Failure(error, job.run_key, 0, claimed=False)

    def replay_finished(self, job: JobInfo, finished: base.Finished) -> outcomes.Replay | outcomes.Ack:
        """The outcome of a job whose run is already finished: replay its stored outcome (C26, C37).

        A duplicate delivery, or a new job published with a finished run's
        key: the body does not run; the :class:`~flexiq_plugins.outcomes.Replay`
        carries the value the run returned, or the error it ended with
        (decoded here with this driver's codec chain). A run that keeps no
        outcome (it finished before outcomes were kept, or the framework
        ended it itself: a revoke, a time limit, a failure it acknowledged)
        is acknowledged as a duplicate, as before.
        """
        if finished.outcome is None:
            logger.debug("job %s: run %s is already %s; acknowledged", job.job_id, job.run_key, finished.status)
            return outcomes.Ack(outcomes.AckReason.DUPLICATE, finished.status)
        replayed = replays.load_outcome(finished.outcome, self.codec)
        logger.info("job %s: run %s is already %s; its outcome is replayed", job.job_id, job.run_key, finished.status)
        return outcomes.Replay(finished.status, replayed.value, replayed.error)

    def store_outage(self, exc: StoreUnavailable) -> outcomes.PutBack:
        """The outcome of a store outage: put back, no retry counted (C28, C41).

        The delay starts at ``store_retry_seconds`` and doubles while the
        outage lasts, up to ``store_retry_max_seconds``; the job stays in the
        broker whatever the cause, a :class:`StoreMisconfigured` store included.
        """
        delay = self._outage.failed(exc)
        return outcomes.PutBack(outcomes.PutBackReason.STORE_UNAVAILABLE, delay, str(exc))

    def _worker_lost(self, job: JobInfo, begun: base.Begun) -> outcomes.Outcome:
        message = (
            f"run {job.run_key!r} lost its worker {begun.takeovers} times "
            f"(limit {self.config.max_takeovers}); dead-lettered instead of crashing workers forever"
        )
        return self._dead_at_start(job, begun, "worker_lost", message)

    def _dead_at_start(self, job: JobInfo, begun: base.Begun, reason: str, message: str) -> outcomes.Outcome:
        """Dead-letter a run just claimed, without running its body (C25, C30)."""
        dead = NewDeadLetter(job.job_id, reason, message)
        self.store.finish(begun.claim, "dead", dead_letter=dead, outcome=replays.dead_letter_outcome(reason, message))
        logger.error("%s", message)
        return outcomes.DeadLetter(reason, message)

    # ------------------------------------------- when the framework ends a job
    def framework_ended(self, run_key: str, how: outcomes.Ended) -> str | None:
        """The framework ended the job of ``run_key`` by itself: settle its run to match (C34, C38).

        A revoke, an expiry or a skip cancels the run through the one
        cancellation (:func:`flexiq_plugins.cancellation.cancel`): a run no
        attempt holds ends ``cancelled`` (or, with undos to run, ``pending``
        until its next delivery runs them: recovery publishes it); an attempt
        still running stops at its next step. A time limit or a failure the
        framework acknowledges makes it ``failed``, except a run waiting to run
        its undos (C32), which keeps waiting; this applies to a run that is not
        terminal yet, whoever holds its claim (the attempt the framework killed
        is fenced out). Recovery never re-publishes a run settled so. Call it
        before the message is acknowledged when the framework lets you. A
        store error is logged, not raised.

        Returns:
          str | None: the status the run now has, or ``None`` if it was
          already terminal (or unknown, or the store failed).
        """
        if how in _CANCELLING:
            return self._cancelled_by_framework(run_key, how)
        status = _ENDED_STATUS[how]
        try:
            run = self._run_or_none(run_key)
            if run is None:
                return None  # never claimed (a job that took no step, C23): nothing to settle
            if status == "failed" and self._compensating(run):
                return None  # the attempt already handed the failure over: its undos run next (C32)
            applied = self.store.release_run(run_key, status, while_status=base.LIVE_STATUSES)
        except StoreError:
            logger.exception("could not settle run %s after its job was %s", run_key, how.value)
            return None
        if applied:
            logger.info("run %s is %s: its job was %s by the framework", run_key, status, how.value)
        return status if applied else None

    def _cancelled_by_framework(self, run_key: str, how: outcomes.Ended) -> str | None:
        try:
            done = cancellation.cancel(self.store, run_key, f"{how.value} by the framework")
        except UnknownRun:
            return None
        except StoreError:
            logger.exception("could not cancel run %s after its job was %s", run_key, how.value)
            return None
        if done.outcome == "finished":
            return None
        logger.info("run %s: its job was %s by the framework: %s", run_key, how.value, done.outcome)
        return done.status

    def _run_or_none(self, run_key: str) -> base.RunRecord | None:
        try:
            return self.store.get_run(run_key)
        except UnknownRun:
            return None

    def _compensating(self, run: base.RunRecord) -> bool:
        """Whether the run waits for the delivery that runs its undos (a ``compensation`` row, C32)."""
        return run.status == "pending" and any(s.kind == "compensation" for s in self.store.get_steps(run.run_key))

    def worker_stopped(self, run_key: str) -> bool:
        """The worker shut down and killed the attempt running ``run_key``; its message goes back (C38).

        The run returns to ``pending`` with its claim released, so the
        redelivered job claims it at once with no takeover counted (C25) and
        no retry; the interrupted step committed nothing. Applies only while
        the run is ``running``. A store error is logged, not raised.
        """
        try:
            return self.store.release_run(run_key, "pending", while_status={"running"})
        except StoreError:
            logger.exception("could not put run %s back after its worker stopped", run_key)
            return False

    # ------------------------------------------------------ after a Failure
    def settle_failed(self, failure: outcomes.Failure) -> bool:
        """The framework will not retry ``failure``: mark its run ``failed`` (C26).

        Call it before the message is acknowledged. Applies only while the run
        is still ``retrying`` at that attempt; returns whether it applied. A
        store error is logged, not raised.
        """
        if not failure.claimed:
            return False  # no run was claimed: nothing to settle (ended_unclaimed)
        try:
            return self.store.settle_failed(failure.run_key, failure.attempt)
        except StoreError:
            logger.exception("could not mark run %s failed", failure.run_key)
            return False

    def give_up(self, failure: outcomes.Failure) -> outcomes.PutBack | None:
        """The framework will not retry ``failure``: compensate its run (C32), else mark it ``failed`` (C26).

        Call it instead of :meth:`settle_failed`, before the message is
        acknowledged. If the run has committed steps with undos, the failure
        is recorded and a :class:`~flexiq_plugins.outcomes.PutBack` is
        returned: re-enqueue the job with it (the framework still reports the
        failure as usual); its next delivery runs the undos. Otherwise the
        run is settled ``failed`` and ``None`` is returned. A store error is
        logged, not raised.
        """
        if not failure.claimed:
            return None  # no run was claimed: no step to undo, nothing to settle (ended_unclaimed)
        try:
            if compensation.start_after_failure(self.store, failure.run_key, failure.attempt, failure.error):
                return outcomes.PutBack(outcomes.PutBackReason.COMPENSATE, 0.0, "its compensations run next")
        except StoreError:
            logger.exception("could not start the compensation of run %s", failure.run_key)
        self.settle_failed(failure)
        return None


class Attempt:
    """One execution of a task body for a run, holding its claim.

    Created by :meth:`AttemptDriver.start`. Use :meth:`run` / :meth:`arun`, or
    :meth:`activate` + :meth:`conclude` when the framework calls the body itself.
    An attempt of a ``lazy`` job claims its run at the body's first use of
    ``current_job.step`` (:meth:`claim_now`); until then :attr:`claim`,
    :attr:`number` and :attr:`journal` are ``None``.
    """

    def __init__(
        self, driver: AttemptDriver, job: JobInfo, begun: base.Begun | None, *, owner: str | None = None
    ) -> None:
        self._driver = driver
        self._store = driver.store
        self._config = driver.config
        self._owner = owner
        self.job = job
        self.run_key = job.run_key
        self.job_id = job.job_id
        self.task_name = job.name
        self.claim: base.Claim | None = None
        self.number: int | None = None
        self.journal: StepJournal = None  # type: ignore[assignment]  # set by _take, before any step runs
        self._refused: outcomes.Outcome | None = None
        self._claiming = threading.Lock()
        self._active = False
        self._lease: LeaseKeeper | None = None
        self.context = JobContext(self.run_key, self.job_id, None, self.task_name, None, claim=self.claim_now)
        if begun is not None:
            self._take(begun)

    @property
    def claimed(self) -> bool:
        """Whether this attempt holds (or held) its run's claim."""
        return self.claim is not None

    def _take(self, begun: base.Begun, *, bind: bool = True) -> None:
        """Hold the claim ``begun``: the journal, the caps and the lease of the run (C23, C34).

        :attr:`claim` is set last, and ``current_job`` is bound to the journal
        only with ``bind``: a lazy claim binds it once its keeper has started
        (see :meth:`claim_now`).
        """
        self._clock_offset = begun.now - time.time()
        self._local_clock = self._store.local_clock()
        label = f"job {self.job_id} (run {self.run_key})"
        step_retry = self.job.step_retry or self._config.step_retry
        self.journal = StepJournal(
            begun.snapshot, label, self, self._driver.codec, self._config.limits, step_retry=step_retry
        )
        self._caps = self._arm_caps(begun)
        self._lease = LeaseKeeper(self._store, begun.claim, self._config.lease_seconds)
        self.number = begun.claim.attempt
        self.claim = begun.claim
        if bind:
            self.context.bind(self.number, self.journal)

    def _held(self) -> base.Claim:
        """The claim this attempt holds; every store write of a step is fenced on it (C9, C25)."""
        claim = self.claim
        assert claim is not None, "a step ran before its attempt claimed the run"
        return claim

    def claim_now(self) -> None:
        """Claim the run now, if not yet: called at the body's first use of ``current_job.step`` (C23).

        The claim's keeper is started before ``current_job`` is bound to the
        journal: an exception that interrupts the start (a time limit's, which
        the body may catch and carry on) leaves the context unbound, so the
        body's next use of ``current_job.step`` comes back here and starts it
        (the claim is not taken again). Otherwise the body would go on with a
        claim nothing renews (C23).

        Raises:
          ClaimRefused: the claim ended the attempt (the run is busy, finished,
            past its takeover limit, or the store is unavailable); the outcome
            that ends it is kept, and the attempt concludes with it.
        """
        with self._claiming:
            if self.claim is None:
                claimed = self._driver.claim(self.job, self._owner) if self._refused is None else self._refused
                if not isinstance(claimed, base.Begun):
                    self._refused = claimed
                    raise ClaimRefused(f"job {self.job_id} (run {self.run_key}) could not claim its run: {claimed}")
                self._take(claimed, bind=False)
            if self._active:
                self._lease.start()  # type: ignore[union-attr]  # nothing if started already
            if not self.context.claimed:
                self.context.bind(self.number, self.journal)  # type: ignore[arg-type]

    def _arm_caps(self, begun: base.Begun) -> RunCaps:
        """The run's caps (C34); a run whose cancellation was requested, or that is over a cap, is cancelled now."""
        policy = (self.job.cancellation or CancellationPolicy()).over(self._config.cancellation)
        caps = RunCaps(policy, begun.created_at)
        deadline = caps.run_deadline
        if deadline is not None:
            self.journal.run_deadline = (deadline, caps.run_over(deadline) or "")
        reason = begun.cancel_reason or caps.over(begun.snapshot, begun.now)
        if reason is not None:
            self.journal.cancellation = RunCancelled(reason)
        return caps

    # ------------------------------------------------- the journal's writer
    def now(self) -> float:
        """The store's clock, epoch seconds: read locally when the store can, else estimated from the claim."""
        if self._local_clock is not None:
            return self._local_clock()
        return time.time() + self._clock_offset

    def commit_step(self, row: StepRow) -> StepRow:
        """Commit one step row, fenced on this attempt's claim (C9, C25)."""
        return self._store.commit_step(self._held(), row)

    def begin_step_attempt(self, step_key: str, max_attempts: int) -> StepAttemptBegin:
        """Journal a step attempt before its body runs, fenced on this attempt's claim (C25, C31)."""
        return self._store.begin_step_attempt(self._held(), step_key, max_attempts)

    def fail_step_attempt(self, failure: StepAttemptFailure, row: StepRow | None = None) -> StepAttemptFailed:
        """Record a failed step attempt (and commit ``row``), fenced on this attempt's claim (C25, C31)."""
        return self._store.fail_step_attempt(self._held(), failure, row=row)

    def poll_event(self, topic: str, key: str, deadline: float | None) -> EventPoll:
        """Look for the event a waiting step can receive, fenced on this attempt's claim (C25, C33)."""
        return self._store.poll_event(self._held(), topic, key, deadline)

    def commit_step_on(self, connection: CallerConnection, row: StepRow) -> StepRow:
        """Write one step row in the caller's transaction on ``connection``, fenced on the claim (C42)."""
        return self._store.commit_step_on(connection, self._held(), row)

    # ------------------------------------------------------- running the body
    @contextlib.contextmanager
    def activate(self) -> Iterator[JobContext]:
        """Set ``current_job`` and keep the lease alive for the ``with`` block (from the claim on, if lazy)."""
        tokens = self._enter()
        try:
            yield self.context
        finally:
            self._leave(tokens)

    def _enter(self) -> tuple[Any, Any]:
        if self._lease is not None:
            self._lease.start()
        self._active = True
        return self.context.enter()

    def _leave(self, tokens: tuple[Any, Any]) -> None:
        try:
            self._active = False
            try:
                if self.journal is not None:
                    self.journal.close_transactions()  # before the lease stops: a left-open one would hold it (C42)
            finally:  # even if a rollback fails: in a compensation (C32) no later stop follows
                if self._lease is not None:
                    self._lease.stop()
        finally:
            self.context.leave(tokens)

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> outcomes.Outcome:
        """Run ``fn(*args, **kwargs)`` as the task body and return its outcome."""
        try:
            tokens = self._enter()  # what ``activate`` does, without a generator per job (issue 16)
            try:
                value = fn(*args, **kwargs)
            finally:
                self._leave(tokens)
        except BaseException as exc:
            return self.conclude(error=exc)
        return self.conclude(value=value)

    async def arun(self, fn: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> outcomes.Outcome:
        """Await ``fn(*args, **kwargs)`` as the task body and return its outcome."""
        try:
            tokens = self._enter()
            try:
                value = await fn(*args, **kwargs)
            finally:
                self._leave(tokens)
        except BaseException as exc:
            return self.conclude(error=exc)
        return self.conclude(value=value)

    # ------------------------------------------------------------ concluding
    def conclude(self, *, value: Any = None, error: BaseException | None = None) -> outcomes.Outcome:
        """Commit what the body did and return exactly one outcome (C13–C16, C21, C25–C29).

        Parameters:
          value(Any): the body's return value, when it returned.
          error(BaseException | None): what it raised, when it raised.
        """
        if self._refused is not None:  # the lazy claim found the run busy, finished or dead (C24–C28)
            return self._refused
        if self.claim is None:
            return self._driver.ended_unclaimed(self.job, value, error)
        assert self._lease is not None
        self._lease.stop()
        try:
            return self._settle(value, self._effective_error(error))
        except ClaimLost as exc:
            logger.warning("attempt %s of run %s dropped: %s", self.number, self.run_key, exc)
            return outcomes.Ack(outcomes.AckReason.DROPPED, str(exc))
        except StoreUnavailable as exc:
            return self._driver.store_outage(exc)

    def _effective_error(self, error: BaseException | None) -> BaseException | None:
        latched = self.journal.latched
        if isinstance(error, (ClaimLost, StoreUnavailable)) or latched is None or error is latched:
            return error
        if isinstance(latched, SleepSignal) and _caused_by(error, latched):
            return error  # cleanup code failed while the sleep unwound: an ordinary, retryable error (C28)
        if not isinstance(latched, StepSignal):
            return latched  # a fatal step error, e.g. ConcurrentStep raised in another thread
        return SwallowedStepSignal(
            f"the task body of job {self.job_id} (run {self.run_key}) caught "
            f"{type(latched).__name__} ({latched}) and "
            f"{'returned anyway' if error is None else 'raised ' + type(error).__name__ + ' instead'}; "
            "step signals must propagate: do not use bare 'except:' or 'except BaseException' "
            "around steps"
        )

    def _settle(self, value: Any, error: BaseException | None) -> outcomes.Outcome:
        error = self._cancellation_or(error)
        settled = compensation.settle(self, error)  # a run failed for good undoes its committed steps (C32)
        if isinstance(settled, compensation.Compensated):
            return self._compensated(settled)
        return self._succeed(value) if settled is None else self._failed(settled)

    def _failed(self, error: BaseException) -> outcomes.Outcome:
        disposition = classify(error)
        if disposition in (Disposition.SLEEP, Disposition.CANCEL, Disposition.INTERRUPTED):
            return self._ended_early(error)
        if disposition is Disposition.DROP:
            raise error
        if disposition is Disposition.RETRY_ALWAYS:
            assert isinstance(error, StoreUnavailable)
            self._finish("retrying")
            return self._driver.store_outage(error)
        if disposition is Disposition.DEAD_LETTER:
            return self._dead_letter(error)
        self._finish("retrying", outcome=replays.error_outcome(error))  # kept when the framework gives up (C37)
        return outcomes.Failure(error, self.run_key, self.number or 0)

    def _ended_early(self, error: BaseException) -> outcomes.Outcome:
        """A sleep or wait (C15, C33), a cancellation (C34) or a worker shutdown (C38) ended the attempt."""
        if isinstance(error, RunCancelled):
            return self._cancelled_by(error)
        if isinstance(error, SleepSignal):
            return self._eager_sleep(error) if self.job.eager else self._sleeping(error)
        return self._interrupted(error)

    def _interrupted(self, error: BaseException) -> outcomes.Outcome:
        self._finish("pending")
        logger.info("job %s (run %s) interrupted by a worker shutdown; it goes back", self.job_id, self.run_key)
        return outcomes.PutBack(outcomes.PutBackReason.SHUTDOWN, 0.0, str(error))

    def _succeed(self, value: Any) -> outcomes.Outcome:
        sequence = self.journal.sequence
        unused = sequence.unused()
        if unused:
            logger.warning(
                "job %s (run %s) finished without reaching %s; recorded: %s; running: %s",
                self.job_id,
                self.run_key,
                ", ".join(unused),
                ", ".join(r.step_key for r in sequence.recorded),
                ", ".join(sequence.running),
            )
        outcome = replays.value_outcome(value, self._driver.codec, self._config.limits.step_bytes)
        self._finish("succeeded", drop_steps=not self._config.keep_succeeded_steps, outcome=outcome)
        return outcomes.Completed(value)

    def _sleeping(self, signal: SleepSignal) -> outcomes.Outcome:
        if isinstance(signal, EventWaitSignal):
            return self._waiting(signal)
        now = self.now()
        wake_at = self._caps.wake_by(signal.wake_at, self.journal.sequence.recorded, now)  # no later than a cap
        assert wake_at is not None
        self._finish("sleeping", wake_at=wake_at)
        delay = min(max(wake_at - now, 0.0), self._config.max_hop_seconds)
        logger.debug("job %s (run %s) sleeps at %r for %.3f s", self.job_id, self.run_key, signal.step_key, delay)
        retry = isinstance(signal, StepRetrySignal)  # a step's retry comes back like a sleep (C31)
        reason = outcomes.PutBackReason.STEP_RETRY if retry else outcomes.PutBackReason.SLEEP
        return outcomes.PutBack(reason, delay, signal.step_key, wake_at)

    def _waiting(self, signal: EventWaitSignal) -> outcomes.Outcome:
        """The run waits for an event (C33): put back for its deadline (or a cap), else acknowledged."""
        now = self.now()
        wake_at = self._caps.wake_by(signal.deadline, self.journal.sequence.recorded, now)
        self._finish("waiting", wake_at=wake_at)
        what = f"{signal.step_key}: ({signal.topic!r}, {signal.key!r})"
        logger.debug("job %s (run %s) waits at %s", self.job_id, self.run_key, what)
        if wake_at is None:  # no message is kept: the sender, or recovery, wakes the run
            return outcomes.Ack(outcomes.AckReason.WAITING, what)
        delay = min(max(wake_at - now, 0.0), self._config.max_hop_seconds)
        return outcomes.PutBack(outcomes.PutBackReason.WAIT, delay, what, wake_at)

    def _cancellation_or(self, error: BaseException | None) -> BaseException | None:
        """The run's cancellation, once this attempt saw one, whatever the body did next (C34); else ``error``."""
        cancelled = self.journal.cancellation
        if cancelled is None or isinstance(error, (ClaimLost, StoreUnavailable)):
            return error
        return cancelled

    def _cancelled_by(self, error: BaseException) -> outcomes.Outcome:
        assert isinstance(error, RunCancelled)
        return self._cancelled(error.reason, error.reason)

    def _cancelled(self, reason: str, message: str) -> outcomes.Outcome:
        """The run ends ``cancelled`` with ``reason`` (kept if one was requested before), C34."""
        self._store.request_cancel(self.run_key, reason)
        self._finish("cancelled", outcome=replays.cancelled_outcome(reason))
        logger.info("job %s (run %s) cancelled: %s", self.job_id, self.run_key, message)
        return outcomes.Ack(outcomes.AckReason.CANCELLED, message)

    def _compensated(self, done: compensation.Compensated) -> outcomes.Outcome:
        """Every undo ran: the run is ``compensated``; dead-lettered if it failed inside an attempt (C32).

        A cancelled run ends ``cancelled`` instead, and is acknowledged (C34).
        """
        failure = done.failure
        if failure.origin == "cancelled":
            cancelled = self.journal.cancellation
            return self._cancelled(cancelled.reason if cancelled else failure.message, done.message)
        if failure.origin == "framework":  # the framework already reported the failure
            self._finish("compensated", outcome=replays.failure_outcome(failure.error_type, failure.message))
            return outcomes.Ack(outcomes.AckReason.COMPENSATED, done.message)
        record = NewDeadLetter(self.job_id, failure.reason, done.message, failure.traceback)
        dead = replays.dead_letter_outcome(failure.reason, done.message)
        self._finish("compensated", dead_letter=record, outcome=dead)
        logger.error("job %s (run %s) dead-lettered (%s): %s", self.job_id, self.run_key, failure.reason, done.message)
        return outcomes.DeadLetter(failure.reason, done.message)

    def _eager_sleep(self, signal: SleepSignal) -> outcomes.Outcome:
        """An eager job cannot be put back: its run fails, so nothing is left to resume (C38)."""
        error = UnsupportedInEagerMode(
            f"job {self.job_id} (run {self.run_key}) sleeps at {signal.step_key!r}, which needs its queue: "
            "eager mode (task_always_eager / Task.apply) cannot put a job back; the run is failed, "
            "so no worker resumes it later. Run durable tasks that sleep on a worker"
        )
        self._finish("failed", outcome=replays.error_outcome(error))
        return outcomes.Failure(error, self.run_key, self.number or 0)

    def _dead_letter(self, error: BaseException) -> outcomes.Outcome:
        reason = reason_of(error)
        trace = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        record = NewDeadLetter(self.job_id, reason, str(error), trace)
        self._finish("dead", dead_letter=record, outcome=replays.dead_letter_outcome(reason, str(error)))
        logger.error("job %s (run %s) dead-lettered (%s): %s", self.job_id, self.run_key, reason, error)
        return outcomes.DeadLetter(reason, str(error), error)

    def _finish(self, status: base.RunStatus, **kwargs: Any) -> None:
        """``store.finish`` on the claim, retried through a brief store outage.

        A claim left held by a blip would make the next delivery wait for the
        lease and count as a dead worker's takeover (C25), so the release is
        tried a few times (0.2, 0.5, 1 s apart) before the outage is reported;
        but not after a failure that took more than a second: that one waited
        for a timeout on a silent network (the store black-holed), and each
        more try would wait as long again.
        """
        for pause in _FINISH_RETRY_PAUSES:
            started = time.monotonic()
            try:
                self._store.finish(self._held(), status, **kwargs)
                return
            except StoreUnavailable:
                if time.monotonic() - started > _FINISH_QUICK_FAILURE_S:
                    raise
                logger.debug("run %s: store unavailable while ending the attempt; trying again", self.run_key)
                time.sleep(pause)
        self._store.finish(self._held(), status, **kwargs)


def _caused_by(error: BaseException | None, cause: BaseException) -> bool:
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if error is cause:
            return True
        seen.add(id(error))
        error = error.__cause__ or (None if error.__suppress_context__ else error.__context__)
    return False
