"""The attempt driver: the only thing the framework adapters talk to.

An adapter turns a framework message into a [`JobInfo`][flexiq_plugins.integration.JobInfo] and hands it,
with the task body, to [`AttemptDriver.run_job`][flexiq_plugins.integration.AttemptDriver.run_job] (or ``arun_job`` for
an ``async def`` body). The driver claims the run and reads its snapshot in one
transaction (before the body, or, for a ``lazy`` job, at the body's first
step: a body that takes no step does no store I/O), runs the body with
``current_job`` set, commits the run's state (if it claimed one), and returns
exactly one [`Decision`][flexiq_plugins.integration.Decision]. Every decision
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
- a run that fails for good is compensated (C32, `flexiq_plugins._attempt.compensation`);
- a wait for an event ends the attempt ``waiting``: put back for its deadline,
  or acknowledged without a deadline, the sender waking it (C33);
- a cancelled run (on request, or over a run cap of its task) is compensated and
  ends ``cancelled`` (C34, `flexiq_plugins._attempt.cancellation`);
- every terminal ending the framework reports (retries given up, a revoke,
  a time or age limit, a failure it acknowledged) is settled one way
  (C38, C45, `flexiq_plugins._attempt.endings`).

The step protocol itself lives in `flexiq_plugins._steps.journal`; the driver
gives it a writer fenced on the attempt's claim.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from .._model import replays
from .._model.config import DurableConfig
from .._model.identity import check_run_key
from .._model.records import (
    Begun,
    Busy,
    Claim,
    Finished,
    NewDeadLetter,
)
from .._observe import AttemptObservation, observer_for
from .._steps.logfields import job_log_fields
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
from . import decisions, endings
from .attempt import Attempt, report_end
from .job import JobInfo
from .known_tasks import KnownTasks
from .late_release import LateReleases
from .store_health import StoreHealth, store_health
from .unclaimed import Unclaimed

__all__ = ["AttemptDriver", "default_owner"]

logger = logging.getLogger("flexiq_plugins")

_HANDED_ON = frozenset({"sleeping", "waiting", "retrying"})
"""Live statuses of a started run whose own message (a wake-up, a retry) is in the broker."""


def default_owner() -> str:
    """Return a claim owner id for an attempt of this process: ``host:pid:random`` (48 random bits).

    The host and pid are read once per process (again in a forked child), and
    the random part comes from a generator of this module's own, seeded from
    the system's randomness at import and again in a forked child: no system
    call per attempt, and nothing drawn from the global `random`, whose seed
    user code owns (a ``random.seed`` there neither repeats owners nor sees
    its numbers change).
    """
    return f"{_owner_prefix[0]}{_owner_bits(48):012x}"


def _read_owner_prefix() -> None:
    _owner_prefix[0] = f"{socket.gethostname()}:{os.getpid()}:"


def _in_forked_child() -> None:
    _read_owner_prefix()
    _owner_random.seed()  # not the parent's sequence


_owner_prefix = [""]
_read_owner_prefix()
_owner_random = random.Random()  # seeded from os.urandom
_owner_bits = _owner_random.getrandbits
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_in_forked_child)


class _Outage:
    """A store outage as this process's attempts see it: the put-back backoff (C28, C41).

    Consecutive put-backs for the store wait ``first`` seconds, then twice as
    long each time up to ``cap``. The process's ``StoreHealth`` logs
    the outage: the first failure at WARNING unless another part of the
    process (its lease renewals, its recovery sweeper, a publish) already
    reported it, each longer wait at DEBUG, and its end once at INFO. A
    [`StoreMisconfigured`][flexiq_plugins.errors.StoreMisconfigured] store is an ERROR once per outage: it will
    not pass by itself.

    Parameters:
      first (float): the first delay, seconds (``store_retry_seconds``).
      cap (float): the longest delay, seconds (``store_retry_max_seconds``).
      health (StoreHealth): the store's health in this process (`store_health`).
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
      store (StepStore): where runs and steps live.
      config (DurableConfig | None): options; defaults apply when ``None``.
    """

    def __init__(self, store: StepStore, config: DurableConfig | None = None) -> None:
        self.store = store
        self.config = config or DurableConfig()
        self.codec = self.config.codec_chain()
        self._outage = _Outage(
            self.config.store_retry_seconds, self.config.store_retry_max_seconds, store_health(store)
        )
        self.observer = observer_for(self.config)  # what its attempts report to (C53); None: nothing is observed
        if self.observer is not None:
            self.observer.watch(store.count_statuses)
        self.late_releases = LateReleases(store, self.config.lease_seconds)
        self.known_tasks = KnownTasks(store, self.config.known_tasks_refresh_seconds)  # the tasks taking steps (C43)
        watch_sqlalchemy()  # a plain step inside a SQLAlchemy transaction that has written is refused (C42)

    # ------------------------------------------------------------ one call
    def run_job(self, job: JobInfo, body: Callable[[], Any], *, owner: str | None = None) -> decisions.Decision:
        """Run one attempt of ``job`` with ``body()`` as its task body; return its decision.

        The attempt's store calls in this thread (its start, its steps, its
        finish) share one connection, given back when it ends
        (`StepStore.held`).

        Raises:
          InvalidRunKey: the run key is not a ``str`` of 1 to 255 characters.
        """
        if job.lazy:  # a body that takes no step touches no connection; its claim holds one (Attempt.claim_now)
            check_run_key(job.run_key)
            observation = self._observe(job)
            if observation is None:  # nothing of an attempt until the body's first step (C43)
                return Unclaimed(self, job, owner).run(body)
            return Attempt(self, job, None, owner=owner, observation=observation).run(body)
        with self.store.held():
            started = self.start(job, owner=owner)
            return started.run(body) if isinstance(started, Attempt) else started

    async def arun_job(
        self, job: JobInfo, body: Callable[[], Awaitable[Any]], *, owner: str | None = None
    ) -> decisions.Decision:
        """Async [`run_job`][flexiq_plugins.integration.AttemptDriver.run_job]: ``body()`` is awaited."""
        started = self.start(job, owner=owner)
        return await started.arun(body) if isinstance(started, Attempt) else started

    # ------------------------------------------------------------ starting
    def start(self, job: JobInfo, owner: str | None = None) -> Attempt | decisions.Decision:
        """Claim ``job``'s run and return a ready [`Attempt`][flexiq_plugins.integration.Attempt], or a decision at
        once.

        One store transaction (C9). Returns a [`PutBack`][flexiq_plugins.integration.PutBack]
        while another live claim holds the run (C24) or the store is down
        (C28), a [`Replay`][flexiq_plugins.integration.Replay] (or, keeping no
        outcome to replay, an ``Ack``) if the run is terminal (C26, C37,
        [`replay_finished`][flexiq_plugins.integration.AttemptDriver.replay_finished]), a
        [`DeadLetter`][flexiq_plugins.integration.DeadLetter] (``worker_lost``) past the takeover limit (C25). A
        ``lazy`` job claims nothing now: its [`Attempt`][flexiq_plugins.integration.Attempt] claims at the body's first
        step, and any of those decisions then ends the attempt from there
        ([`ClaimRefused`][flexiq_plugins.errors.ClaimRefused]).

        Raises:
          InvalidRunKey: the run key is not a ``str`` of 1 to 255 characters.
        """
        check_run_key(job.run_key)
        if job.lazy:  # nothing is claimed or logged now
            return Attempt(self, job, None, owner=owner, observation=self._observe(job))
        with job_log_fields(job.run_key, job.job_id, job.name):
            observation = self._observe(job)
            trace = None if observation is None else observation.trace_context
            claimed = self.claim(job, owner, trace_context=trace)
            if isinstance(claimed, Begun):
                return Attempt(self, job, claimed, owner=owner, observation=observation)
            if observation is not None:
                report_end(observation, claimed)
            return claimed

    def _observe(self, job: JobInfo) -> AttemptObservation | None:
        """The attempt's observation (C53), or ``None`` when nothing is observed."""
        if self.observer is None:
            return None
        return self.observer.attempt(
            run_key=job.run_key, job_id=job.job_id, task=job.name, publish_trace=job.publish_trace
        )

    def claim(
        self, job: JobInfo, owner: str | None = None, *, trace_context: str | None = None
    ) -> Begun | decisions.Decision:
        """Claim ``job``'s run (C23): the claim, or the decision that ends the attempt without a body (C24–C28, C39).

        ``trace_context`` is the attempt's W3C ``traceparent``, stored with a run that has none (C53).
        """
        dropped = self._started_meanwhile(job) if job.unstarted_only else None
        return dropped if dropped is not None else self._claim(job, owner, trace_context)

    def _claim(self, job: JobInfo, owner: str | None, trace_context: str | None = None) -> Begun | decisions.Decision:
        traced = {} if trace_context is None else {"trace_context": trace_context}  # a store older than C53 works
        try:
            result = self.store.begin(
                job.run_key, job.job_id, job.job_envelope, owner or default_owner(), self.config.lease_seconds, **traced
            )
            self._outage.ok()
        except StoreUnavailable as exc:
            return self.store_outage(exc)
        if isinstance(result, Finished):
            return self.replay_finished(job, result)
        if isinstance(result, Busy):
            delay = max(min(self.config.busy_retry_seconds, result.lease_remaining), 0.0)
            return decisions.PutBack(decisions.PutBackReason.BUSY, delay, "its run is running elsewhere")
        if result.takeovers > self.config.max_takeovers:
            return self._worker_lost(job, result)
        if result.envelope.corrupt:
            return self._dead_at_start(job, result, "corrupt_record", f"run {job.run_key!r}: {result.envelope.corrupt}")
        return result

    def _started_meanwhile(self, job: JobInfo) -> decisions.Decision | None:
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
        return decisions.Ack(decisions.AckReason.DUPLICATE, run.status)

    def ended_unclaimed(
        self, job: JobInfo, value: Any = None, error: BaseException | None = None
    ) -> decisions.Decision:
        """The decision for an attempt that ended without claiming its run: its body took no step.

        The one place that decides what such an attempt is, so that a body
        that takes no step behaves as it would without the integration: no
        run exists for it (a job recorded at publish claims before its body,
        [`claims_before_body`][flexiq_plugins.integration.claims_before_body]), so nothing
        is written: a value is [`Completed`][flexiq_plugins.integration.Completed], any
        error is a ``Failure`` with ``claimed=False``, left to the framework's
        own retry policy as without the integration (no dead letter of the
        library's, C29/C30 apply to runs only). A worker shutdown that
        interrupts such a body is the framework's own interruption again (the
        ``WorkerInterrupted``'s cause, e.g. Dramatiq's ``Shutdown``): the
        framework handles it exactly as it would without the integration,
        since no committed step is at stake (C43); the put-back of C38 is for
        runs.

        Parameters:
          job (JobInfo): the job.
          value (Any): what the body returned.
          error (BaseException | None): what it raised.
        """
        if error is None:
            return decisions.Completed(value, claimed=False)
        if classify(error) is Disposition.INTERRUPTED and error.__cause__ is not None:
            error = error.__cause__  # the framework's own shutdown exception, as the body raised it (C43)
        return decisions.Failure(error, job.run_key, 0, claimed=False)

    def took_step(self, job: JobInfo) -> None:
        """``job``'s body took a step: its task is known to take steps from now on (C43, `KnownTasks`).

        Nothing once this process knows the task; else one insert-if-absent.
        """
        self.known_tasks.took_step(job.job_envelope.framework, job.name)

    def replay_finished(self, job: JobInfo, finished: Finished) -> decisions.Replay | decisions.Ack:
        """The decision for a job whose run is already finished: replay its stored outcome (C26, C37).

        A duplicate delivery, or a new job published with a finished run's
        key: the body does not run; the [`Replay`][flexiq_plugins.integration.Replay]
        carries the value the run returned, or the error it ended with
        (decoded here with this driver's codec chain). A run that keeps no
        outcome (it finished before runs kept their outcome, or the framework
        ended it itself: a revoke, a time limit, a failure it acknowledged)
        is acknowledged as a duplicate, as before.
        """
        if finished.outcome is None:
            logger.debug("job %s: run %s is already %s; acknowledged", job.job_id, job.run_key, finished.status)
            return decisions.Ack(decisions.AckReason.DUPLICATE, finished.status)
        replayed = replays.load_outcome(finished.outcome, self.codec)
        logger.info("job %s: run %s is already %s; its outcome is replayed", job.job_id, job.run_key, finished.status)
        return decisions.Replay(finished.status, replayed.value, replayed.error)

    def release_later(self, claim: Claim) -> None:
        """Release ``claim``, held through a store outage, as soon as the store answers (C28, `late_release`)."""
        self.late_releases.add(claim)

    def store_outage(self, exc: StoreUnavailable) -> decisions.PutBack:
        """The decision for a store outage: put back, no retry counted (C28, C41).

        The delay starts at ``store_retry_seconds`` and doubles while the
        outage lasts, up to ``store_retry_max_seconds``; the job stays in the
        broker whatever the cause, a [`StoreMisconfigured`][flexiq_plugins.errors.StoreMisconfigured] store included.
        """
        delay = self._outage.failed(exc)
        if self.observer is not None:
            self.observer.store_unavailable()
        return decisions.PutBack(decisions.PutBackReason.STORE_UNAVAILABLE, delay, str(exc))

    def _worker_lost(self, job: JobInfo, begun: Begun) -> decisions.Decision:
        message = (
            f"run {job.run_key!r} lost its worker {begun.takeovers} times "
            f"(limit {self.config.max_takeovers}); dead-lettered instead of crashing workers forever"
        )
        return self._dead_at_start(job, begun, "worker_lost", message)

    def _dead_at_start(self, job: JobInfo, begun: Begun, reason: str, message: str) -> decisions.Decision:
        """Dead-letter a run just claimed, without running its body (C25, C30)."""
        dead = NewDeadLetter(job.job_id, reason, message)
        self.store.finish(begun.claim, "dead", dead_letter=dead, outcome=replays.dead_letter_outcome(reason, message))
        logger.error("%s", message)
        return decisions.DeadLetter(reason, message)

    # ------------------------------------------- when the framework ends a job
    def framework_ended(
        self,
        run_key: str,
        how: decisions.Ended,
        *,
        job_id: str | None = None,
        detail: str = "",
        reason: str = "",
        publisher: endings.Republish | None = None,
        killed: bool = False,
    ) -> str | None:
        """The framework ended the job of ``run_key`` by itself: settle its run to match (C32, C34, C38, C45).

        The one settlement of `flexiq_plugins._attempt.endings`: a
        revoke, an expiry or a skip cancels the run (its undos run, then it
        is ``cancelled``); a time limit, an age limit or a failure the
        framework acknowledged fails it: with committed undos it waits
        ``pending`` for the delivery that runs them (then ``compensated``),
        else it is ``failed``. That delivery is published through
        ``publisher`` (else recovery publishes it). A hard time limit (or an
        end with ``killed``) takes the run from the attempt it killed (fenced
        out, C25); any other end leaves a run a live attempt holds to that
        attempt. Recovery never
        re-publishes a run settled so. Call it before the message is
        acknowledged when the framework lets you. A store error is logged,
        not raised.

        Parameters:
          run_key (str): the ended job's run.
          how (Ended): how the framework ended it.
          job_id (str | None): the ended job's id (a time limit takes only its own claim).
          detail (str): what the framework said, recorded with the failure.
          reason (str): a cancellation's reason (default ``"<how> by the framework"``).
          publisher (Republish | None): publishes the run's job when its undos must run.
          killed (bool): the framework killed the attempt running the body (a lost
            worker process it acknowledged); always so for a hard time limit.

        Returns:
          str | None: the status the run now has, or ``None`` if nothing
          changed (already terminal, unknown, held by a live attempt, or the store failed).
        """
        try:
            ended = endings.settle(
                self.store,
                run_key,
                how,
                job_id=job_id,
                detail=detail,
                reason=reason,
                republish=publisher,
                killed=killed,
            )
        except StoreError:
            logger.exception("could not settle run %s after its job was %s", run_key, how.value)
            return None
        return ended.status

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
    def settle_failed(self, failure: decisions.Failure) -> bool:
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

    def give_up(self, failure: decisions.Failure) -> decisions.PutBack | None:
        """The framework will not retry ``failure``: compensate its run (C32), else mark it ``failed`` (C26).

        Call it instead of [`settle_failed`][flexiq_plugins.integration.AttemptDriver.settle_failed], before the message
        is acknowledged; it settles the run as every other ending does
        (`flexiq_plugins._attempt.endings.given_up`). If the run has
        committed steps with undos, the failure is recorded and a
        [`PutBack`][flexiq_plugins.integration.PutBack] is returned:
        re-enqueue the job with it (the framework still reports the failure
        as usual); its next delivery runs the undos. Otherwise the run is
        settled ``failed`` and ``None`` is returned. A store error is logged,
        not raised.
        """
        if not failure.claimed:
            return None  # no run was claimed: no step to undo, nothing to settle (ended_unclaimed)
        try:
            if endings.given_up(self.store, failure.run_key, failure.attempt, failure.error):
                return decisions.PutBack(decisions.PutBackReason.COMPENSATE, 0.0, "its compensations run next")
        except StoreError:
            logger.exception("could not start the compensation of run %s", failure.run_key)
            self.settle_failed(failure)  # at least failed, as before the undos were known (C26)
        return None
