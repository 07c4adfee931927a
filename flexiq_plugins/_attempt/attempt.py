"""One attempt of a run: the body under its claim, and the one decision it concludes with.

An [`Attempt`][flexiq_plugins.integration.Attempt] is made by the driver
([`AttemptDriver`][flexiq_plugins.integration.AttemptDriver]) once the run is claimed (or, for a ``lazy`` job, claims it
at the body's first step). It binds ``current_job`` to the run's step journal, keeps the
claim's lease alive while the body runs (C23), and then *concludes*: what the
body returned or raised becomes exactly one committed run state and one
[`Decision`][flexiq_plugins.integration.Decision] (C13–C16, C21, C25–C29, C32–C34).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import traceback
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, Protocol

from typing_extensions import assert_never

from .._model import replays
from .._model.codec import CodecChain
from .._model.config import DurableConfig
from .._model.policies import CancellationPolicy
from .._model.records import (
    Begun,
    Claim,
    EventPoll,
    NewDeadLetter,
    RunStatus,
    StepAttemptBegin,
    StepAttemptFailed,
    StepAttemptFailure,
    StepRow,
)
from .._observe import AttemptObservation
from .._steps.context import JobContext
from .._steps.journal import StepJournal
from .._steps.logfields import job_log_fields
from .._steps.observed import ObservedJournal
from .._store.attempt_side import AttemptStore
from .._store.caller import CallerConnection
from ..errors import (
    ClaimLost,
    ClaimRefused,
    Disposition,
    EventWaitSignal,
    RunCancelled,
    SleepSignal,
    StepRetrySignal,
    StepSignal,
    StoreUnavailable,
    SwallowedStepSignal,
    UnsupportedInEagerMode,
    classify,
    reason_of,
)
from . import compensation, decisions
from .caps import RunCaps
from .job import JobInfo
from .lease import LeaseKeeper

__all__ = ["Attempt", "AttemptHost", "outcome_label", "report_end"]

logger = logging.getLogger("flexiq_plugins")

_FINISH_RETRY_PAUSES = (0.2, 0.5, 1.0)
_FINISH_QUICK_FAILURE_S = 1.0
"""A release that failed within this many seconds met a blip (refused, dropped) and is tried again; a slower
failure waited for a network timeout (a black-holed store), and waiting for more of them only delays the put-back."""


class AttemptHost(Protocol):
    """What an attempt asks of the driver that started it
    ([`AttemptDriver`][flexiq_plugins.integration.AttemptDriver])."""

    config: DurableConfig
    codec: CodecChain

    @property
    def store(self) -> AttemptStore:
        """The store the attempt claims its run in and writes its steps to (the attempt side of it)."""

    def claim(
        self, job: JobInfo, owner: str | None = None, *, trace_context: str | None = None
    ) -> Begun | decisions.Decision:
        """Claim ``job``'s run, or return the decision that ends the attempt without a body (C23–C28)."""

    def ended_unclaimed(
        self, job: JobInfo, value: Any = None, error: BaseException | None = None
    ) -> decisions.Decision:
        """The decision for an attempt that ended without claiming its run."""

    def store_outage(self, exc: StoreUnavailable) -> decisions.PutBack:
        """The decision for a store outage: put back, no retry counted (C28)."""

    def took_step(self, job: JobInfo) -> None:
        """``job``'s body took a step: note its task as one that takes steps (C43)."""

    def release_later(self, claim: Claim) -> None:
        """Release ``claim``, held through a store outage, as soon as the store answers (C28)."""


class Attempt:
    """One execution of a task body for a run, holding its claim.

    Created by [`AttemptDriver.start`][flexiq_plugins.integration.AttemptDriver.start]. Use
    [`run`][flexiq_plugins.integration.Attempt.run] / [`arun`][flexiq_plugins.integration.Attempt.arun], or
    [`activate`][flexiq_plugins.integration.Attempt.activate] +
    [`conclude`][flexiq_plugins.integration.Attempt.conclude] when the framework calls the body itself. An attempt of a
    ``lazy`` job claims its run at the body's first use of ``current_job.step``
    ([`claim_now`][flexiq_plugins.integration.Attempt.claim_now]); until then `claim`, `number` and `journal` are
    ``None``.
    """

    def __init__(
        self,
        driver: AttemptHost,
        job: JobInfo,
        begun: Begun | None,
        *,
        owner: str | None = None,
        observation: AttemptObservation | None = None,
        context: JobContext | None = None,
    ) -> None:
        self._driver = driver
        self.observation = observation
        self._store = driver.store
        self._config = driver.config
        self._owner = owner
        self.job = job
        self.run_key = job.run_key
        self.job_id = job.job_id
        self.task_name = job.name
        self.claim: Claim | None = None
        self.number: int | None = None
        self.journal: StepJournal = None  # type: ignore[assignment]  # set by _take, before any step runs
        self._refused: decisions.Decision | None = None
        self._claiming = threading.Lock()
        self._concluding = False  # set under _claiming: a claim asked for after it is refused
        self._active = False
        self._lease: LeaseKeeper | None = None
        self._body_thread: int | None = None
        self._kept: contextlib.AbstractContextManager[None] | None = None
        if context is None:
            context = JobContext(self.run_key, self.job_id, None, self.task_name, None, claim=self.claim_now)
        self.context = context
        if begun is not None:
            self._take(begun)

    @property
    def claimed(self) -> bool:
        """Whether this attempt holds (or held) its run's claim."""
        return self.claim is not None

    def _take(self, begun: Begun, *, bind: bool = True) -> None:
        """Hold the claim ``begun``: the journal, the caps and the lease of the run (C23, C34).

        `claim` is set last, and ``current_job`` is bound to the journal
        only with ``bind``: a lazy claim binds it once its keeper has started
        (see [`claim_now`][flexiq_plugins.integration.Attempt.claim_now]).
        """
        self._clock_offset = begun.now - time.time()
        self._local_clock = self._store.local_clock()
        label = f"job {self.job_id} (run {self.run_key})"
        step_retry = self.job.step_retry or self._config.step_retry
        journal_args = (begun.snapshot, label, self, self._driver.codec, self._config.limits)
        if self.observation is None:
            self.journal = StepJournal(*journal_args, step_retry=step_retry)
        else:  # an observed attempt reports its steps (C53); an unobserved one pays nothing for it
            self.journal = ObservedJournal(*journal_args, step_retry=step_retry, observation=self.observation)
            self.observation.claimed(begun.claim.attempt, begun.trace_context)
        self._caps = self._arm_caps(begun)
        self._lease = LeaseKeeper(self._store, begun.claim, self._config.lease_seconds)
        self.number = begun.claim.attempt
        self.claim = begun.claim
        if bind:
            self.context.bind(self.number, self.journal)

    def _held(self) -> Claim:
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
            past its takeover limit, or the store is unavailable); the decision
            that ends it is kept, and the attempt concludes with it.
        """
        with self._claiming:
            if self.claim is None:
                if self._concluding:  # a thread the body left behind: its attempt has ended without a claim
                    raise RuntimeError(f"job {self.job_id} (run {self.run_key}) has ended: no step can run")
                if self._refused is None and self._body_thread == threading.get_ident():
                    self._keep_connection()
                self._claim_and_take()
                self._driver.took_step(self.job)  # the body takes a step: its task is durable (C43)
            if self._active:
                self._lease.start()  # type: ignore[union-attr]  # nothing if started already
            if not self.context.claimed:
                self.context.bind(self.number, self.journal)  # type: ignore[arg-type]

    def _claim_and_take(self) -> None:
        """Claim the run and hold the claim; a refused claim is kept and raised as ``ClaimRefused``.

        An exception raised into the body's thread from outside (a
        framework's time limit) after the store granted the claim but before
        it is held still leaves it held: the attempt then settles the run as
        that exception ends it (C38), instead of leaving it ``running`` with
        nothing renewing its lease.
        """
        claimed: Begun | decisions.Decision | None = None
        try:
            claimed = self._claim() if self._refused is None else self._refused
            if not isinstance(claimed, Begun):
                self._refused = claimed
                raise ClaimRefused(f"job {self.job_id} (run {self.run_key}) could not claim its run: {claimed}")
            self._take(claimed, bind=False)
        except BaseException:
            if isinstance(claimed, Begun) and self.claim is None:
                self._take(claimed, bind=False)
            raise

    def join_running_body(self, thread: int) -> None:
        """This lazy attempt is made while its body already runs in ``thread`` (`unclaimed.Unclaimed`).

        What `run` does before the body, minus entering ``current_job`` (the
        body's context is already current): the claim that follows keeps the
        lease alive and holds a connection in ``thread``. End it with
        `leave_body`, `conclude` and `give_connection_back`.
        """
        self._body_thread = thread
        self._active = True

    def leave_body(self, tokens: tuple[Any, Any]) -> None:
        """What `run` does once the body has returned or raised: undo the ``current_job`` ``tokens``, stop the lease."""
        self._leave((tokens, None))

    def give_connection_back(self) -> None:
        """Give back the connection a lazy claim kept in the body's thread (after `conclude`)."""
        self._give_connection_back()

    def _keep_connection(self) -> None:
        """From a lazy claim on, keep one store connection for this attempt's calls in the body's thread.

        What `AttemptDriver.run_job` does for an attempt that claims before
        its body (`StepStore.held`), begun only now: a body that takes no step
        never touches the store, not even its pool. Given back once the
        attempt has concluded (`_run`).
        """
        if self._kept is None:
            self._kept = self._store.held()  # kept before it is entered: an interruption in between leaks nothing
            self._kept.__enter__()

    def _give_connection_back(self) -> None:
        hold, self._kept = self._kept, None
        if hold is not None:
            hold.__exit__(None, None, None)

    def _claim(self) -> Begun | decisions.Decision:
        trace = None if self.observation is None else self.observation.trace_context
        if trace is None:  # untraced: the driver's claim as it always was
            return self._driver.claim(self.job, self._owner)
        return self._driver.claim(self.job, self._owner, trace_context=trace)  # stored with the run (C53)

    def _arm_caps(self, begun: Begun) -> RunCaps:
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

    def commit_steps(self, rows: Sequence[StepRow]) -> tuple[StepRow, ...]:
        """Commit several step rows in one transaction, fenced on this attempt's claim (C9, C25, C51)."""
        return self._store.commit_steps(self._held(), rows)

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
        observed = None if self.observation is None else self.observation.activate()  # its span is current (C53)
        return self.context.enter(), observed

    def _leave(self, entered: tuple[Any, Any]) -> None:
        tokens, observed = entered
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
            if self.observation is not None:
                self.observation.deactivate(observed)

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> decisions.Decision:
        """Run ``fn(*args, **kwargs)`` as the task body and return its decision."""
        with job_log_fields(self.run_key, self.job_id, self.task_name):
            return self._run(fn, *args, **kwargs)

    def _run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> decisions.Decision:
        if self.claim is not None:
            return self._run_body(fn, args, kwargs)
        self._body_thread = threading.get_ident()  # a lazy claim in this thread holds a connection (_keep_connection)
        try:
            return self._run_body(fn, args, kwargs)
        finally:
            self._give_connection_back()

    def _run_body(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> decisions.Decision:
        try:
            tokens = self._enter()  # what ``activate`` does, without a generator per job: less per-job cost
            try:
                value = fn(*args, **kwargs)
            finally:
                self._leave(tokens)
        except BaseException as exc:
            return self.conclude(error=exc)
        return self.conclude(value=value)

    async def arun(self, fn: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> decisions.Decision:
        """Await ``fn(*args, **kwargs)`` as the task body and return its decision."""
        with job_log_fields(self.run_key, self.job_id, self.task_name):
            return await self._arun(fn, *args, **kwargs)

    async def _arun(self, fn: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> decisions.Decision:
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
    def conclude(self, *, value: Any = None, error: BaseException | None = None) -> decisions.Decision:
        """Commit what the body did and return exactly one decision (C13–C16, C21, C25–C29).

        Parameters:
          value (Any): the body's return value, when it returned.
          error (BaseException | None): what it raised, when it raised.
        """
        with self._claiming:  # a claim in flight in another of the body's threads lands first, or never
            self._concluding = True
        outcome = self._conclude(value, error)
        if self.observation is not None:
            report_end(self.observation, outcome, claim_refused=outcome is self._refused)
        return outcome

    def _conclude(self, value: Any, error: BaseException | None) -> decisions.Decision:
        if self._refused is not None:  # the lazy claim found the run busy, finished or dead (C24–C28)
            return self._refused
        if self.claim is None:
            return self._driver.ended_unclaimed(self.job, value, error)
        if self.journal.sequence.running:  # a step was taken (a run claimed before its body, C43)
            self._driver.took_step(self.job)
        assert self._lease is not None
        self._lease.stop()
        try:
            return self._settle(value, self._effective_error(error))
        except ClaimLost as exc:
            logger.warning("attempt %s of run %s dropped: %s", self.number, self.run_key, exc)
            return decisions.Ack(decisions.AckReason.DROPPED, str(exc))
        except StoreUnavailable as exc:  # the claim could not be released: as soon as the store answers, then
            self._driver.release_later(self._held())
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

    def _settle(self, value: Any, error: BaseException | None) -> decisions.Decision:
        error = self._cancellation_or(error)
        settled = compensation.settle(self, error)  # a run failed for good undoes its committed steps (C32)
        if isinstance(settled, compensation.Compensated):
            return self._compensated(settled)
        return self._succeed(value) if settled is None else self._failed(settled)

    def _failed(self, error: BaseException) -> decisions.Decision:
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
        return decisions.Failure(error, self.run_key, self.number or 0)

    def _ended_early(self, error: BaseException) -> decisions.Decision:
        """A sleep or wait (C15, C33), a cancellation (C34) or a worker shutdown (C38) ended the attempt."""
        if isinstance(error, RunCancelled):
            return self._cancelled_by(error)
        if isinstance(error, SleepSignal):
            return self._eager_sleep(error) if self.job.eager else self._sleeping(error)
        return self._interrupted(error)

    def _interrupted(self, error: BaseException) -> decisions.Decision:
        self._finish("pending")
        logger.info("job %s (run %s) interrupted by a worker shutdown; it goes back", self.job_id, self.run_key)
        return decisions.PutBack(decisions.PutBackReason.SHUTDOWN, 0.0, str(error))

    def _succeed(self, value: Any) -> decisions.Decision:
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
        return decisions.Completed(value)

    def _sleeping(self, signal: SleepSignal) -> decisions.Decision:
        if isinstance(signal, EventWaitSignal):
            return self._waiting(signal)
        now = self.now()
        wake_at = self._caps.wake_by(signal.wake_at, self.journal.sequence.recorded, now)  # no later than a cap
        assert wake_at is not None
        self._finish("sleeping", wake_at=wake_at)
        delay = min(max(wake_at - now, 0.0), self._config.max_hop_seconds)
        logger.debug("job %s (run %s) sleeps at %r for %.3f s", self.job_id, self.run_key, signal.step_key, delay)
        retry = isinstance(signal, StepRetrySignal)  # a step's retry comes back like a sleep (C31)
        reason = decisions.PutBackReason.STEP_RETRY if retry else decisions.PutBackReason.SLEEP
        return decisions.PutBack(reason, delay, signal.step_key, wake_at)

    def _waiting(self, signal: EventWaitSignal) -> decisions.Decision:
        """The run waits for an event (C33): put back for its deadline (or a cap), else acknowledged."""
        now = self.now()
        wake_at = self._caps.wake_by(signal.deadline, self.journal.sequence.recorded, now)
        self._finish("waiting", wake_at=wake_at)
        what = f"{signal.step_key}: ({signal.topic!r}, {signal.key!r})"
        logger.debug("job %s (run %s) waits at %s", self.job_id, self.run_key, what)
        if wake_at is None:  # no message is kept: the sender, or recovery, wakes the run
            return decisions.Ack(decisions.AckReason.WAITING, what)
        delay = min(max(wake_at - now, 0.0), self._config.max_hop_seconds)
        return decisions.PutBack(decisions.PutBackReason.WAIT, delay, what, wake_at)

    def _cancellation_or(self, error: BaseException | None) -> BaseException | None:
        """The run's cancellation, once this attempt saw one, whatever the body did next (C34); else ``error``."""
        cancelled = self.journal.cancellation
        if cancelled is None or isinstance(error, (ClaimLost, StoreUnavailable)):
            return error
        return cancelled

    def _cancelled_by(self, error: BaseException) -> decisions.Decision:
        assert isinstance(error, RunCancelled)
        return self._cancelled(error.reason, error.reason)

    def _cancelled(self, reason: str, message: str) -> decisions.Decision:
        """The run ends ``cancelled`` with ``reason`` (kept if one was requested before), C34.

        The ``Ack`` carries the [`JobCancelled`][flexiq_plugins.errors.JobCancelled] a
        duplicate would replay, for the adapter to tell the job's result waiter (C45).
        """
        self._store.request_cancel(self.run_key, reason)
        self._finish("cancelled", outcome=replays.cancelled_outcome(reason))
        logger.info("job %s (run %s) cancelled: %s", self.job_id, self.run_key, message)
        return decisions.Ack(
            decisions.AckReason.CANCELLED, message, replays.cancelled_error(reason)
        )  # its waiter (C45)

    def _compensated(self, done: compensation.Compensated) -> decisions.Decision:
        """Every undo ran: the run is ``compensated``; dead-lettered if it failed inside an attempt (C32).

        A cancelled run ends ``cancelled`` instead, and is acknowledged (C34).
        """
        failure = done.failure
        if failure.origin == "cancelled":
            cancelled = self.journal.cancellation
            return self._cancelled(cancelled.reason if cancelled else failure.message, done.message)
        if failure.origin == "framework":  # the framework already reported the failure
            self._finish("compensated", outcome=replays.failure_outcome(failure.error_type, failure.message))
            return decisions.Ack(decisions.AckReason.COMPENSATED, done.message)
        record = NewDeadLetter(self.job_id, failure.reason, done.message, failure.traceback)
        dead = replays.dead_letter_outcome(failure.reason, done.message)
        self._finish("compensated", dead_letter=record, outcome=dead)
        logger.error("job %s (run %s) dead-lettered (%s): %s", self.job_id, self.run_key, failure.reason, done.message)
        return decisions.DeadLetter(failure.reason, done.message)

    def _eager_sleep(self, signal: SleepSignal) -> decisions.Decision:
        """An eager job cannot be put back: its run fails, so nothing is left to resume (C38)."""
        error = UnsupportedInEagerMode(
            f"job {self.job_id} (run {self.run_key}) sleeps at {signal.step_key!r}, which needs its queue: "
            "eager mode (task_always_eager / Task.apply) cannot put a job back; the run is failed, "
            "so no worker resumes it later. Run durable tasks that sleep on a worker"
        )
        self._finish("failed", outcome=replays.error_outcome(error))
        return decisions.Failure(error, self.run_key, self.number or 0)

    def _dead_letter(self, error: BaseException) -> decisions.Decision:
        reason = reason_of(error)
        trace = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        record = NewDeadLetter(self.job_id, reason, str(error), trace)
        self._finish("dead", dead_letter=record, outcome=replays.dead_letter_outcome(reason, str(error)))
        logger.error("job %s (run %s) dead-lettered (%s): %s", self.job_id, self.run_key, reason, error)
        return decisions.DeadLetter(reason, str(error), error)

    def _finish(self, status: RunStatus, **kwargs: Any) -> None:
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
                if self.observation is not None:
                    _report_finish(self.observation, status, kwargs.get("dead_letter"), self.journal)
                return
            except StoreUnavailable:
                if time.monotonic() - started > _FINISH_QUICK_FAILURE_S:
                    raise
                logger.debug("run %s: store unavailable while ending the attempt; trying again", self.run_key)
                time.sleep(pause)
        self._store.finish(self._held(), status, **kwargs)
        if self.observation is not None:
            _report_finish(self.observation, status, kwargs.get("dead_letter"), self.journal)


# ------------------------------------------------------------ observing (C53)
def outcome_label(decision: decisions.Decision) -> str:
    """How observers name an outcome: ``completed``, ``put_back:sleep``, ``ack:cancelled``, ``dead_letter`` …"""
    match decision:
        case decisions.Completed():
            return "completed"
        case decisions.PutBack(reason=reason):
            return f"put_back:{reason.value}"
        case decisions.Failure():
            return "failure"
        case decisions.DeadLetter():
            return "dead_letter"
        case decisions.Ack(reason=reason):
            return f"ack:{reason.value}"
        case decisions.Replay():
            return "replay"
        case _:
            assert_never(decision)


def report_end(observation: AttemptObservation, decision: decisions.Decision, *, claim_refused: bool = True) -> None:
    """End ``observation`` with ``outcome``; a dead letter the claim decided is reported as the run's end too."""
    if claim_refused and isinstance(decision, decisions.DeadLetter):  # e.g. worker_lost: no attempt committed it
        observation.finished("dead", reason=decision.reason, message=decision.message)
    error = decision.error if isinstance(decision, (decisions.Failure, decisions.DeadLetter)) else None
    observation.ended(outcome_label(decision), error)


def _report_finish(
    observation: AttemptObservation, status: str, dead: NewDeadLetter | None, journal: StepJournal | None
) -> None:
    cancelled = journal.cancellation if journal is not None and status == "cancelled" else None
    reason = dead.reason if dead is not None else cancelled.reason if cancelled is not None else None
    message = dead.message if dead is not None else None
    observation.finished(status, reason=reason, message=message)


def _caused_by(error: BaseException | None, cause: BaseException) -> bool:
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if error is cause:
            return True
        seen.add(id(error))
        error = error.__cause__ or (None if error.__suppress_context__ else error.__context__)
    return False
