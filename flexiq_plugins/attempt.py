"""The attempt driver: the only thing the framework adapters talk to.

An adapter turns a framework message into a :class:`JobInfo`, asks
:meth:`AttemptDriver.start` for an attempt (claim + snapshot in one
transaction, or ``Busy``/``Duplicate`` straight away), runs the task body
inside :meth:`Attempt.activate`, and hands what happened to
:meth:`Attempt.conclude`, which commits the run's state and returns exactly
one :mod:`~flexiq_plugins.outcomes` value. Classification (C28, C29) is read
from :mod:`flexiq_plugins.errors`, so both adapters give the same answer.

The attempt also owns the *latch* (C21): every signal or fatal step error it
raises is remembered, so a body that catches it and returns anyway still
fails, naming what it swallowed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import traceback
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from . import outcomes
from ._store import base
from ._store.base import JobEnvelope, NewDeadLetter, StepKind, StepRow, StepStore
from .codec import CodecChain
from .context import JobContext
from .errors import (
    ClaimLost,
    ConcurrentStep,
    DecodeError,
    Disposition,
    EncodeError,
    InvalidRunKey,
    SleepSignal,
    StepLimitExceeded,
    StepSignal,
    StoreError,
    StoreUnavailable,
    SwallowedStepSignal,
    classify,
    reason_of,
)
from .identity import Sequence, StepId

__all__ = ["Attempt", "AttemptDriver", "DurableConfig", "JobInfo", "Limits", "default_owner"]

logger = logging.getLogger("flexiq_plugins")

_FINISH_RETRY_PAUSES = (0.2, 0.5, 1.0)


@dataclass(frozen=True)
class Limits:
    """Size caps on encoded bytes (C22).

    Parameters:
      step_bytes(int): one step's stored value, bytes (default 262,144).
      run_bytes(int): all step values of one run, bytes (default 4 MiB).
      run_steps(int): number of steps in one run (default 10,000).
    """

    step_bytes: int = 262_144
    run_bytes: int = 4 * 1024 * 1024
    run_steps: int = 10_000


@dataclass(frozen=True)
class DurableConfig:
    """Options shared by both adapters.

    Parameters:
      codec(CodecChain): serializer + codecs for step values (C7).
      limits(Limits): size caps (C22).
      lease_seconds(float): claim lease, seconds; renewed every third of it (C23).
      max_hop_seconds(float): longest delay of one sleep hop, seconds (C18,
        default 900 = 15 minutes).
      busy_retry_seconds(float): the most a duplicate delivery is put back
        for, seconds (C24; never longer than the remaining lease).
      max_takeovers(int): claim takeovers from dead workers before the run is
        dead-lettered with reason ``worker_lost`` (C25, default 5).
      keep_succeeded_steps(bool): keep step rows of succeeded runs for
        inspection (C27); ``flexiq store cleanup`` drops them later.
    """

    codec: CodecChain = field(default_factory=CodecChain)
    limits: Limits = field(default_factory=Limits)
    lease_seconds: float = 30.0
    max_hop_seconds: float = 900.0
    busy_retry_seconds: float = 5.0
    max_takeovers: int = 5
    keep_succeeded_steps: bool = False

    def __post_init__(self) -> None:
        for name in ("lease_seconds", "max_hop_seconds", "busy_retry_seconds"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")


@dataclass(frozen=True)
class JobInfo:
    """One framework message, as the core sees it.

    Parameters:
      run_key(str): the run key from the message (or its job id, C1 words).
      job_id(str): the framework's job id.
      envelope(JobEnvelope): what re-publishes the job (C35).
    """

    run_key: str
    job_id: str
    envelope: JobEnvelope


MAX_RUN_KEY_LENGTH = 255


def _check_run_key(run_key: object) -> None:
    if not isinstance(run_key, str) or not 0 < len(run_key) <= MAX_RUN_KEY_LENGTH:
        raise InvalidRunKey(
            f"run key {run_key!r} is not a str of 1 to {MAX_RUN_KEY_LENGTH} characters; "
            "the run key header/option must be such a string (a UUIDv7 when minted at publish)"
        )


def default_owner() -> str:
    """Return a claim owner id for this process and thread: ``host:pid:random``."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


class AttemptDriver:
    """Starts attempts against one store with one configuration.

    Parameters:
      store(StepStore): where runs and steps live.
      config(DurableConfig | None): options; defaults apply when ``None``.
    """

    def __init__(self, store: StepStore, config: DurableConfig | None = None) -> None:
        self.store = store
        self.config = config or DurableConfig()

    def start(self, job: JobInfo, owner: str | None = None) -> Attempt | outcomes.Outcome:
        """Claim ``job``'s run and return a ready :class:`Attempt`, or an outcome at once.

        One store transaction (C9). Returns :class:`~flexiq_plugins.outcomes.Busy`
        while another live claim holds the run (C24),
        :class:`~flexiq_plugins.outcomes.Duplicate` if the run is terminal (C26),
        :class:`~flexiq_plugins.outcomes.DeadLetter` (``worker_lost``) past the
        takeover limit (C25).

        Raises:
          StoreUnavailable: the store cannot be reached (retryable, C28).
          InvalidRunKey: the run key is not a ``str`` of 1 to 255 characters.
        """
        _check_run_key(job.run_key)
        owner = owner or default_owner()
        result = self.store.begin(job.run_key, job.job_id, job.envelope, owner, self.config.lease_seconds)
        if isinstance(result, base.Finished):
            return outcomes.Duplicate(result.status)
        if isinstance(result, base.Busy):
            delay = max(min(self.config.busy_retry_seconds, result.lease_remaining), 0.0)
            return outcomes.Busy(delay)
        if result.takeovers > self.config.max_takeovers:
            return self._worker_lost(job, result)
        return Attempt(self, job, result)

    def _worker_lost(self, job: JobInfo, begun: base.Begun) -> outcomes.Outcome:
        message = (
            f"run {job.run_key!r} lost its worker {begun.takeovers} times "
            f"(limit {self.config.max_takeovers}); dead-lettered instead of crashing workers forever"
        )
        dead = NewDeadLetter(job.job_id, "worker_lost", message)
        self.store.finish(begun.claim, "dead", dead_letter=dead)
        logger.error("%s", message)
        return outcomes.DeadLetter("worker_lost", message)


@dataclass
class _Step:
    id: StepId
    memo: StepRow | None


class Attempt:
    """One execution of a task body for a run, holding its claim.

    Created by :meth:`AttemptDriver.start`. Use :meth:`run` / :meth:`arun`, or
    :meth:`activate` + :meth:`conclude` when the framework calls the body itself.
    """

    def __init__(self, driver: AttemptDriver, job: JobInfo, begun: base.Begun) -> None:
        self._store = driver.store
        self._config = driver.config
        self.job = job
        self.claim = begun.claim
        self.run_key = job.run_key
        self.job_id = job.job_id
        self.number = begun.claim.attempt
        self.task_name = job.envelope.task_name
        self._clock_offset = begun.now - time.time()
        self._sequence = Sequence(begun.snapshot, f"job {job.job_id} (run {job.run_key})")
        self._run_bytes = sum(r.size for r in begun.snapshot)
        self._guard = threading.Lock()
        self._active: str | None = None
        self._latched: BaseException | None = None
        self._lease = _LeaseKeeper(self._store, self.claim, self._config.lease_seconds)
        self.context = JobContext(self)

    # ------------------------------------------------------- running the body
    def now(self) -> float:
        """The store's clock, estimated from the offset read at claim time (epoch seconds)."""
        return time.time() + self._clock_offset

    @contextlib.contextmanager
    def activate(self) -> Iterator[JobContext]:
        """Set ``current_job`` and keep the lease alive for the ``with`` block."""
        self._lease.start()
        try:
            with self.context.activate() as job:
                yield job
        finally:
            self._lease.stop()

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> outcomes.Outcome:
        """Run ``fn(*args, **kwargs)`` as the task body and return its outcome."""
        try:
            with self.activate():
                value = fn(*args, **kwargs)
        except BaseException as exc:
            return self.conclude(error=exc)
        return self.conclude(value=value)

    async def arun(self, fn: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> outcomes.Outcome:
        """Await ``fn(*args, **kwargs)`` as the task body and return its outcome."""
        try:
            with self.activate():
                value = await fn(*args, **kwargs)
        except BaseException as exc:
            return self.conclude(error=exc)
        return self.conclude(value=value)

    # ------------------------------------------------------ the step protocol
    @contextlib.contextmanager
    def step_guard(self) -> Iterator[None]:
        """Admit one step at a time (C8); re-raise a latched signal (C21)."""
        self._raise_latched()
        with self._guard:
            busy = self._active
            if busy is None:
                self._active = "?"
        if busy is not None:
            self._latch(
                ConcurrentStep(
                    f"a step was started while step {busy!r} of the same attempt was uncommitted; "
                    "steps run one at a time: do not start them from threads, asyncio.gather or "
                    "inside another step's body"
                )
            )
        try:
            yield
        finally:
            self._active = None

    def enter(self, name: object, key: object, kind: StepKind) -> _Step:
        """Derive the step's identity and match it against the snapshot (C1–C3, C12)."""
        try:
            step_id = self._sequence.derive(name, key, kind)
            self._active = step_id.step_key
            memo = self._sequence.enter(step_id)
        except BaseException as exc:
            self._latch(exc)
        return _Step(step_id, memo)

    @contextlib.contextmanager
    def body_of(self, step: _Step) -> Iterator[None]:
        """Run a new step's body: if it raises, the step takes no key and no place (C6)."""
        try:
            yield
        except BaseException:
            self._sequence.abandon(step.id)
            raise

    def memo_value(self, step: _Step) -> Any:
        """Decode a memo hit from the snapshot; no store statement (C5, C9)."""
        assert step.memo is not None
        assert step.memo.value is not None
        return self._config.codec.decode(step.memo.value, step_key=step.id.step_key)

    def commit_value(self, step: _Step, value: Any) -> Any:
        """Encode, check caps, commit in one fenced transaction; return the decoded value (C5, C7, C22)."""
        codec = self._config.codec
        try:
            encoded = codec.encode(value, step_key=step.id.step_key)
            decoded = codec.decode(encoded, step_key=step.id.step_key)  # never store what cannot be read back
        except DecodeError as exc:
            self._latch(
                EncodeError(f"step {step.id.step_key!r} returned a value its serializer cannot read back: {exc}")
            )
        except BaseException as exc:
            self._latch(exc)
        self._commit(step, encoded, None)
        return decoded

    def sleep(self, step: _Step, wake_at_from: Callable[[float], float]) -> None:
        """Commit a new sleep's wake time or replay an old one; raise :class:`SleepSignal` unless due (C15, C17)."""
        if step.memo is not None:
            wake_at = step.memo.wake_at if step.memo.wake_at is not None else 0.0
        else:
            wake_at = wake_at_from(self.now())
            self._commit(step, None, wake_at)
        if wake_at > self.now():
            self._latch(SleepSignal(step.id.step_key, wake_at))

    def _commit(self, step: _Step, encoded: bytes | None, wake_at: float | None) -> None:
        self._check_limits(step.id.step_key, len(encoded or b""))
        row = StepRow(self._sequence.next_position, step.id.step_key, step.id.kind, encoded, wake_at)
        stored = self._store.commit_step(self.claim, row)
        self._sequence.record(stored)
        self._run_bytes += stored.size

    def _check_limits(self, step_key: str, size: int) -> None:
        limits = self._config.limits
        checks = [
            ("step bytes", size, limits.step_bytes),
            ("run bytes", self._run_bytes + size, limits.run_bytes),
            ("run step count", self._sequence.next_position + 1, limits.run_steps),
        ]
        for what, value, limit in checks:
            if value > limit:
                self._latch(StepLimitExceeded(f"step {step_key!r} exceeds the {what} limit: {value} > {limit}"))

    def _latch(self, exc: BaseException) -> Any:
        if self._latched is None:
            self._latched = exc
        raise exc

    def _raise_latched(self) -> None:
        if self._latched is not None:
            raise self._latched

    # ------------------------------------------------------------ concluding
    def conclude(self, *, value: Any = None, error: BaseException | None = None) -> outcomes.Outcome:
        """Commit what the body did and return exactly one outcome (C13–C16, C21, C25–C29).

        Parameters:
          value(Any): the body's return value, when it returned.
          error(BaseException | None): what it raised, when it raised.
        """
        self._lease.stop()
        try:
            return self._settle(value, self._effective_error(error))
        except ClaimLost as exc:
            logger.warning("attempt %s of run %s dropped: %s", self.number, self.run_key, exc)
            return outcomes.Dropped(str(exc))
        except StoreUnavailable as exc:
            return outcomes.Retry(exc, always=True)

    def _effective_error(self, error: BaseException | None) -> BaseException | None:
        if isinstance(error, (ClaimLost, StoreUnavailable)) or self._latched is None:
            return error
        if error is self._latched:
            return error
        if isinstance(self._latched, SleepSignal) and _caused_by(error, self._latched):
            return error  # cleanup code failed while the sleep unwound: an ordinary, retryable error (C28)
        if not isinstance(self._latched, StepSignal):
            return self._latched  # a fatal step error, e.g. ConcurrentStep raised in another thread
        return SwallowedStepSignal(
            f"the task body of job {self.job_id} (run {self.run_key}) caught "
            f"{type(self._latched).__name__} ({self._latched}) and "
            f"{'returned anyway' if error is None else 'raised ' + type(error).__name__ + ' instead'}; "
            "step signals must propagate: do not use bare 'except:' or 'except BaseException' "
            "around steps"
        )

    def _settle(self, value: Any, error: BaseException | None) -> outcomes.Outcome:
        if error is None:
            return self._succeed(value)
        disposition = classify(error)
        if disposition is Disposition.SLEEP:
            assert isinstance(error, SleepSignal)
            return self._sleeping(error)
        if disposition is Disposition.DROP:
            raise error
        if disposition is Disposition.DEAD_LETTER:
            return self._dead_letter(error)
        self._finish("retrying")
        return outcomes.Retry(error, always=disposition is Disposition.RETRY_ALWAYS)

    def _succeed(self, value: Any) -> outcomes.Outcome:
        unused = self._sequence.unused()
        if unused:
            logger.warning(
                "job %s (run %s) finished without reaching %s; recorded: %s; running: %s",
                self.job_id,
                self.run_key,
                ", ".join(unused),
                ", ".join(r.step_key for r in self._sequence.recorded),
                ", ".join(self._sequence.running),
            )
        drop = not self._config.keep_succeeded_steps
        self._finish("succeeded", drop_steps=drop)
        return outcomes.Completed(value)

    def _sleeping(self, signal: SleepSignal) -> outcomes.Outcome:
        self._finish("sleeping")
        remaining = max(signal.wake_at - self.now(), 0.0)
        delay = min(remaining, self._config.max_hop_seconds)
        return outcomes.Sleeping(signal.wake_at, delay, signal.step_key)

    def _dead_letter(self, error: BaseException) -> outcomes.Outcome:
        reason = reason_of(error)
        trace = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        record = NewDeadLetter(self.job_id, reason, str(error), trace)
        self._finish("dead", dead_letter=record)
        logger.error("job %s (run %s) dead-lettered (%s): %s", self.job_id, self.run_key, reason, error)
        return outcomes.DeadLetter(reason, str(error), error)

    def _finish(self, status: base.RunStatus, **kwargs: Any) -> None:
        """``store.finish`` on the claim, retried through a brief store outage.

        A claim left held by a blip would make the next delivery wait for the
        lease and count as a dead worker's takeover (C25), so the release is
        tried a few times (0.2, 0.5, 1 s apart) before the outage is reported.
        """
        for pause in _FINISH_RETRY_PAUSES:
            try:
                self._store.finish(self.claim, status, **kwargs)
                return
            except StoreUnavailable:
                logger.warning("run %s: store unavailable while ending the attempt; trying again", self.run_key)
                time.sleep(pause)
        self._store.finish(self.claim, status, **kwargs)

    def settle_failed(self) -> bool:
        """After a :class:`~flexiq_plugins.outcomes.Retry` the framework will not retry: mark the run failed.

        Returns whether the run was still this attempt's to settle.
        """
        try:
            return self._store.settle_failed(self.run_key, self.number)
        except StoreError:
            logger.exception("could not mark run %s failed", self.run_key)
            return False


def _caused_by(error: BaseException | None, cause: BaseException) -> bool:
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if error is cause:
            return True
        seen.add(id(error))
        error = error.__cause__ or (None if error.__suppress_context__ else error.__context__)
    return False


class _LeaseKeeper:
    """Renews a claim's lease every third of the lease in a daemon thread (C23)."""

    def __init__(self, store: StepStore, claim: base.Claim, lease_seconds: float) -> None:
        self._store = store
        self._claim = claim
        self._lease = lease_seconds
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lost: ClaimLost | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="flexiq-lease", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self._lease / 3):
            try:
                self._claim = self._store.renew(self._claim, self._lease)
            except ClaimLost as exc:
                self.lost = exc
                return
            except StoreError:
                logger.warning("lease renewal of run %s failed; will retry", self._claim.run_key, exc_info=True)
