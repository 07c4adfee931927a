"""The attempt driver: the only thing the framework adapters talk to.

An adapter turns a framework message into a :class:`JobInfo` and hands it,
with the task body, to :meth:`AttemptDriver.run_job` (or ``arun_job`` for an
``async def`` body). The driver claims the run and reads its snapshot in one
transaction (before the body, or, for a ``lazy`` job, at the body's first
step: a body that takes no step does no store I/O), runs the body with
``current_job`` set, commits the run's state (if it claimed one), and returns
exactly one :mod:`~flexiq_plugins._attempt.outcomes` value. Every decision
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
- a run that fails for good is compensated (C32, :mod:`flexiq_plugins._attempt.compensation`);
- a wait for an event ends the attempt ``waiting``: put back for its deadline,
  or acknowledged without a deadline, the sender waking it (C33);
- a cancelled run (on request, or over a cap of its task) is compensated and
  ends ``cancelled`` (C34, :mod:`flexiq_plugins._attempt.cancellation`).

The step protocol itself lives in :mod:`flexiq_plugins._steps.journal`; the driver
gives it a writer fenced on the attempt's claim.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from .._model import replays
from .._model.config import DurableConfig
from .._model.identity import check_run_key
from .._model.records import (
    LIVE_STATUSES,
    Begun,
    Busy,
    Claim,
    Finished,
    NewDeadLetter,
    RunRecord,
    RunStatus,
)
from .._store.base import StepStore
from .._store.caller import watch_sqlalchemy
from ..errors import (
    Disposition,
    StoreError,
    StoreMisconfigured,
    StoreUnavailable,
    UnknownRun,
    classify,
)
from . import cancellation, compensation, outcomes
from .attempt import Attempt
from .job import JobInfo
from .late_release import LateReleases
from .store_health import StoreHealth, store_health

__all__ = ["AttemptDriver", "default_owner"]

logger = logging.getLogger("flexiq_plugins")

_ENDED_STATUS: dict[outcomes.Ended, RunStatus] = {
    outcomes.Ended.REVOKED: "cancelled",
    outcomes.Ended.EXPIRED: "cancelled",
    outcomes.Ended.SKIPPED: "cancelled",
    outcomes.Ended.TIME_LIMIT: "failed",
    outcomes.Ended.FAILED: "failed",
}

_CANCELLING = frozenset({outcomes.Ended.REVOKED, outcomes.Ended.EXPIRED, outcomes.Ended.SKIPPED})
"""The ends that cancel a run (C34): through :func:`flexiq_plugins._attempt.cancellation.cancel`, undos included."""


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
        self.late_releases = LateReleases(store, self.config.lease_seconds)
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

        One store transaction (C9). Returns a :class:`~flexiq_plugins._attempt.outcomes.PutBack`
        while another live claim holds the run (C24) or the store is down
        (C28), a :class:`~flexiq_plugins._attempt.outcomes.Replay` (or, keeping no
        outcome, an ``Ack``) if the run is terminal (C26, C37, :meth:`replay_finished`),
        a :class:`~flexiq_plugins._attempt.outcomes.DeadLetter` (``worker_lost``)
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
        return Attempt(self, job, claimed, owner=owner) if isinstance(claimed, Begun) else claimed

    def claim(self, job: JobInfo, owner: str | None = None) -> Begun | outcomes.Outcome:
        """Claim ``job``'s run (C23): the claim, or the outcome that ends the attempt without a body (C24–C28, C39)."""
        dropped = self._started_meanwhile(job) if job.unstarted_only else None
        return dropped if dropped is not None else self._claim(job, owner)

    def _claim(self, job: JobInfo, owner: str | None) -> Begun | outcomes.Outcome:
        try:
            result = self.store.begin(
                job.run_key, job.job_id, job.job_envelope, owner or default_owner(), self.config.lease_seconds
            )
            self._outage.ok()
        except StoreUnavailable as exc:
            return self.store_outage(exc)
        if isinstance(result, Finished):
            return self.replay_finished(job, result)
        if isinstance(result, Busy):
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

        The one place that decides what such an attempt is, so that a body
        that takes no step behaves as it would without the integration: no
        run exists for it (a job recorded at publish claims before its body,
        :func:`~flexiq_plugins.integration.claims_before_body`), so nothing
        is written: a value is :class:`~flexiq_plugins._attempt.outcomes.Completed`, a
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

    def replay_finished(self, job: JobInfo, finished: Finished) -> outcomes.Replay | outcomes.Ack:
        """The outcome of a job whose run is already finished: replay its stored outcome (C26, C37).

        A duplicate delivery, or a new job published with a finished run's
        key: the body does not run; the :class:`~flexiq_plugins._attempt.outcomes.Replay`
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

    def release_later(self, claim: Claim) -> None:
        """Release ``claim``, held through a store outage, as soon as the store answers (C28, :mod:`.late_release`)."""
        self.late_releases.add(claim)

    def store_outage(self, exc: StoreUnavailable) -> outcomes.PutBack:
        """The outcome of a store outage: put back, no retry counted (C28, C41).

        The delay starts at ``store_retry_seconds`` and doubles while the
        outage lasts, up to ``store_retry_max_seconds``; the job stays in the
        broker whatever the cause, a :class:`StoreMisconfigured` store included.
        """
        delay = self._outage.failed(exc)
        return outcomes.PutBack(outcomes.PutBackReason.STORE_UNAVAILABLE, delay, str(exc))

    def _worker_lost(self, job: JobInfo, begun: Begun) -> outcomes.Outcome:
        message = (
            f"run {job.run_key!r} lost its worker {begun.takeovers} times "
            f"(limit {self.config.max_takeovers}); dead-lettered instead of crashing workers forever"
        )
        return self._dead_at_start(job, begun, "worker_lost", message)

    def _dead_at_start(self, job: JobInfo, begun: Begun, reason: str, message: str) -> outcomes.Outcome:
        """Dead-letter a run just claimed, without running its body (C25, C30)."""
        dead = NewDeadLetter(job.job_id, reason, message)
        self.store.finish(begun.claim, "dead", dead_letter=dead, outcome=replays.dead_letter_outcome(reason, message))
        logger.error("%s", message)
        return outcomes.DeadLetter(reason, message)

    # ------------------------------------------- when the framework ends a job
    def framework_ended(self, run_key: str, how: outcomes.Ended) -> str | None:
        """The framework ended the job of ``run_key`` by itself: settle its run to match (C34, C38).

        A revoke, an expiry or a skip cancels the run through the one
        cancellation (:func:`flexiq_plugins._attempt.cancellation.cancel`): a run no
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
            applied = self.store.release_run(run_key, status, while_status=LIVE_STATUSES)
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

    def _run_or_none(self, run_key: str) -> RunRecord | None:
        try:
            return self.store.get_run(run_key)
        except UnknownRun:
            return None

    def _compensating(self, run: RunRecord) -> bool:
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
        is recorded and a :class:`~flexiq_plugins._attempt.outcomes.PutBack` is
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
