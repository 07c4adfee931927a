"""The one error hierarchy of flexiq-plugins, and how each error is classified.

Two roots, on purpose. Control-flow *signals* derive from ``BaseException``
because they are not errors: a sleep is the normal way for an attempt to end,
and a divergence must not be caught by a task's ``except Exception`` and turned
into a retry or, worse, a success (C20). Everything else is an ordinary
``Exception`` under [`FlexiqError`][flexiq_plugins.errors.FlexiqError]:

    BaseException
    ├── StepSignal                      control flow, never an error (C20)
    │   ├── SleepSignal                 the attempt ends; the job comes back later (C15)
    │   │   ├── StepRetrySignal         a failed step with budget left comes back after its backoff (C31)
    │   │   └── EventWaitSignal         ``step.wait_for_event`` waits for its event (C33)
    │   ├── RunCancelled                the run is cancelled: on request or over a run cap (C34)
    │   ├── ClaimRefused                a lazy claim at the first step was refused: the attempt ends (C23–C28)
    │   ├── ReplayStopped               a compensation replay reached a step that never ran (C32)
    │   │   └── CheckStopped            a check of new code reached the first step past the record (C48)
    │   └── StepDivergence              recorded and running step sequences differ (C12)
    └── WorkerInterrupted               the worker shut down mid-attempt: the job goes back (C38)
    Exception
    └── FlexiqError
        ├── ConfigurationError (ValueError)   a bad store URL, option or codec key
        │   └── InvalidDuration (StepUsageError)   a duration that cannot be parsed (C19)
        ├── NoCurrentJob (RuntimeError)       ``current_job`` used outside a job
        ├── InvalidRunKey (ValueError)        a run key that is not a str of 1–255 characters
        ├── StepUsageError                    misuse of the step API inside a job: dead-lettered at once
        │   ├── InvalidStepName (ValueError, TypeError)   C2
        │   ├── InvalidStepKey (ValueError, TypeError)    C2
        │   ├── NotInStep (RuntimeError)                  ``idempotency_key`` read outside a step body (C10)
        │   ├── InvalidWakeTime (ValueError, TypeError)   ``sleep_until`` without an aware datetime (C19)
        │   ├── InvalidStepBody (TypeError)               a body that is not a callable, or returns an awaitable
        │   ├── DuplicateStepKey                          C3
        │   ├── ConcurrentStep                            C8
        │   ├── SwallowedStepSignal                       C21
        │   ├── InvalidStepOption (TypeError)             a bad ``retry=`` / ``compensate=`` (C31, C32)
        │   ├── OpenTransaction                           a plain step in a transaction the store cannot share (C42)
        │   └── InvalidTransaction (ValueError)           a transactional step that cannot share the caller's (C42)
        ├── InvalidEvent (ValueError)         an event topic, key or payload that cannot be sent (C33)
        ├── StepLimitExceeded                 a size limit refused a commit (C22)
        ├── CodecError                        a value cannot be encoded / decoded (C7)
        │   ├── EncodeError
        │   └── DecodeError
        ├── StepRetryExhausted                a step's durable retry budget is spent (C31)
        ├── StepMapFailed (ExceptionGroup)    items of a step map failed; on Python 3.10 an equivalent (C51)
        ├── NonRetryableError                 raise it (or subclass it) for an error that will never succeed (C31)
        │   └── ReplayedError                 a finished run's stored error whose class cannot be rebuilt (C37)
        ├── CompensationFailed                an undo failed for good; the run is dead-lettered (C32)
        ├── DeadLettered                      the job went to the dead-letter path (C13, C30), on every adapter
        ├── JobCancelled                      a cancelled run, as its waiter and a duplicate see it (C34, C37, C45)
        ├── JobEnded                          the framework ended the job itself: time or age limit (C38, C45)
        ├── OutcomeNotKept                    a finished run's value was not kept: nothing to replay (C37)
        ├── UnsupportedInEagerMode (RuntimeError)  a sleep or put-back under Celery's eager mode
        ├── StoreError                        anything the step store reports
        │   ├── StoreUnavailable              connection lost, timeout: retryable (C28)
        │   │   └── StoreMisconfigured (ConfigurationError)  authentication, unknown database, missing directory (C41)
        │   ├── ClaimLost                     another attempt holds the run (C25)
        │   ├── RunLocked                     a renewal refused at once: another transaction holds the run's row (C23)
        │   ├── CancelRequested               a notice from the store: the run's cancellation was requested (C34)
        │   ├── CorruptRecord                 a stored row that cannot be read: dead-lettered at once
        │   ├── UnknownRun (LookupError)      no run has that run key
        │   ├── UnknownDeadLetter (LookupError)  no dead letter has that id
        │   └── UnknownStep (LookupError)     no step of the run has that key
        └── OperationError                    an operator action failed (``flexiq`` exits 1)
            ├── NoPublisher                   no integration to re-publish a framework's jobs
            ├── PublishFailed                 the broker refused a re-publish
            ├── AlreadyRetried                the dead letter's run has moved on
            ├── RunCompensated                the dead letter's run was compensated: retry it only from a step
            └── InvalidForkStep (ValueError)  a run cannot be forked from that step (C50)

The tree is exact: each error defined here appears once, under its first
base, with its other bases in parentheses (a test checks it against the
classes). The package root exports the errors a task
author or an operator catches; every one of them is importable from here.

Classification ([`classify`][flexiq_plugins.errors.classify]) lives here, next to the errors, so every
adapter reads the same answer before it consults any retry filter (C28, C29).
A step that failed for good re-raises the error its body raised (its own type,
so a body's ``except`` still matches) *marked final* (`mark_final`):
whatever its type, it is then never retried and it triggers the run's
compensations (`compensates`, C31, C32).
"""

from __future__ import annotations

import enum
import math
import sys
from collections.abc import Sequence
from datetime import datetime

__all__ = [
    "AlreadyRetried",
    "CancelRequested",
    "CheckStopped",
    "ClaimLost",
    "ClaimRefused",
    "CodecError",
    "CompensationFailed",
    "ConcurrentStep",
    "ConfigurationError",
    "CorruptRecord",
    "DeadLettered",
    "DecodeError",
    "Disposition",
    "DuplicateStepKey",
    "EncodeError",
    "EventWaitSignal",
    "FlexiqError",
    "InvalidDuration",
    "InvalidEvent",
    "InvalidForkStep",
    "InvalidRunKey",
    "InvalidStepBody",
    "InvalidStepKey",
    "InvalidStepName",
    "InvalidStepOption",
    "InvalidTransaction",
    "InvalidWakeTime",
    "JobCancelled",
    "JobEnded",
    "NoCurrentJob",
    "NoPublisher",
    "NonRetryableError",
    "NotInStep",
    "OpenTransaction",
    "OperationError",
    "OutcomeNotKept",
    "PublishFailed",
    "ReplayStopped",
    "ReplayedError",
    "RunCancelled",
    "RunCompensated",
    "RunLocked",
    "SleepSignal",
    "StepDivergence",
    "StepLimitExceeded",
    "StepMapFailed",
    "StepRetryExhausted",
    "StepRetrySignal",
    "StepSignal",
    "StepUsageError",
    "StoreError",
    "StoreMisconfigured",
    "StoreUnavailable",
    "SwallowedStepSignal",
    "UnknownDeadLetter",
    "UnknownRun",
    "UnknownStep",
    "UnsupportedInEagerMode",
    "WorkerInterrupted",
    "classify",
    "compensates",
    "final_reason",
    "mark_final",
    "reason_of",
]


# --------------------------------------------------------------------- signals
class StepSignal(BaseException):
    """Base of the control-flow signals that unwind a task body.

    It derives from ``BaseException`` because it is technically not an error:
    a task's ``except Exception`` must not catch it, retry on it or hide it
    (C20). A body that catches it anyway and returns is failed by the worker
    regardless (C21).
    """


class SleepSignal(StepSignal):
    """Raised by ``step.sleep`` to end the attempt until ``wake_at`` (C15).

    Parameters:
      step_key (str): the sleep's step key, such as ``"sleep#0"``.
      wake_at (float): the wake time in seconds since the epoch, store clock.
    """

    def __init__(self, step_key: str, wake_at: float) -> None:
        self.step_key = step_key
        self.wake_at = wake_at
        super().__init__(f"step {step_key!r} sleeps until {_moment(wake_at)}")


def _moment(t: float) -> str:
    try:
        return datetime.fromtimestamp(t).astimezone().isoformat(timespec="seconds")
    except (OverflowError, OSError, ValueError):  # beyond what datetime can show, e.g. timedelta.max
        return f"{t:.0f} seconds since the epoch"


class StepRetrySignal(SleepSignal):
    """A step with a retry budget failed with attempts left: the attempt ends until ``wake_at`` (C31).

    A [`SleepSignal`][flexiq_plugins.errors.SleepSignal], so the attempt ends the way a sleep does (the job is
    put back, no retry of the task is counted), but the put-back's reason is
    ``step_retry``. Its ``__cause__`` is the error of the failed attempt.

    Parameters:
      step_key (str): the failed step's key, such as ``"ship#0"``.
      wake_at (float): when its next attempt is due, epoch seconds, store clock.
    """


class EventWaitSignal(SleepSignal):
    """``step.wait_for_event`` found no event yet: the attempt ends until one is sent or the deadline (C33).

    A [`SleepSignal`][flexiq_plugins.errors.SleepSignal], so everything that lets a sleep end an attempt
    lets a wait end one too; the run is then ``waiting`` for ``(topic, key)``.

    Parameters:
      step_key (str): the wait's step key, such as ``"payment#0"``.
      deadline (float | None): when the wait times out, epoch seconds, store
        clock; ``None`` waits without a timeout.
      topic (str): the event's topic.
      key (str): the event's key.
    """

    def __init__(self, step_key: str, deadline: float | None, topic: str, key: str) -> None:
        super().__init__(step_key, math.inf if deadline is None else deadline)
        self.deadline = deadline
        self.topic = topic
        self.key = key
        until = "" if deadline is None else f" at most until {_moment(deadline)}"
        self.args = (f"step {step_key!r} waits for the event ({topic!r}, {key!r}){until}",)


class RunCancelled(StepSignal):
    """The run is cancelled: an operator asked for it, or it went over a run cap of its task (C34).

    Raised at a step boundary, never caught by a task's ``except Exception``
    (like a sleep): the body unwinds, the compensations of its committed steps
    run, and the run ends ``cancelled`` with ``reason``.

    Parameters:
      reason (str): why, as ``flexiq runs list`` shows it.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(f"the run is cancelled: {reason}")
        self.reason = reason


class ClaimRefused(StepSignal):
    """The first step of an attempt could not claim its run: the body unwinds, the attempt ends at once.

    A job claims its run lazily, at its first use of ``current_job.step`` (or
    ``current_job.attempt``); when that claim finds the run held by another
    live claim (C24), already finished (C26, a duplicate), past its takeover
    limit (C25) or the store unavailable (C28), this signal unwinds the body
    and the attempt ends exactly as if the claim had been refused before the
    body ran. Never an error; never caught by a task's ``except Exception``.
    """


class ReplayStopped(StepSignal):
    """A compensation replay of the body reached a step that never ran: the body stops there (C32).

    When a run fails for good outside the attempt that can undo it (the
    framework gave up, a worker died mid-compensation), the next delivery
    replays the body only to hear which undo each committed step registers;
    it must not run anything new. Never an error.
    """


class CheckStopped(ReplayStopped):
    """A check of new code against a run's record reached the first step past the record (C48).

    In check mode every recorded step is a memo hit and nothing is written: a
    step that never ran ends the check there, and the run is compatible with
    the code up to that point. Never an error.

    Parameters:
      step_key (str): the first step past the record, e.g. ``"receipt#0"``.
    """

    def __init__(self, step_key: str, job_label: str = "the run") -> None:
        super().__init__(f"the check of {job_label} stopped at {step_key!r}, the first step past its record")
        self.step_key = step_key


class StepDivergence(StepSignal):
    """The running step sequence differs from the recorded one (C12).

    Never retried: the job is dead-lettered (C13). The message names the job,
    the position, both sequences and the step that changed.

    Parameters:
      message (str): the message.
      position (int | None): the recorded position where the sequences part.
      recorded (str | None): the step recorded there.
      running (str | None): the step the running code asked for there.
    """

    def __init__(
        self, message: str, *, position: int | None = None, recorded: str | None = None, running: str | None = None
    ) -> None:
        super().__init__(message)
        self.position = position
        self.recorded = recorded
        self.running = running


class WorkerInterrupted(BaseException):
    """The worker is shutting down and interrupted the attempt (a deploy restarting workers, C38).

    Not an error of the job: an adapter raises it in place of its
    framework's own shutdown exception (Dramatiq's ``Shutdown``). The attempt
    commits nothing for the interrupted step, releases its claim, and the job
    goes back to its queue without counting a retry.
    """


# ---------------------------------------------------------------------- errors
class FlexiqError(Exception):
    """Root of every ordinary error raised by flexiq-plugins."""


class ConfigurationError(FlexiqError, ValueError):
    """A store URL, an option or a codec key that cannot be used."""


class NoCurrentJob(FlexiqError, RuntimeError):
    """``current_job`` was used outside a durable job."""


class InvalidRunKey(FlexiqError, ValueError):
    """A job carried a run key that is not a ``str`` of 1 to 255 characters."""


class StepUsageError(FlexiqError):
    """The step API was used in a way the contract refuses."""


class InvalidStepName(StepUsageError, ValueError, TypeError):
    """A step name that is empty, not a ``str``, too long or has ``#``/``:``/control characters (C2)."""


class InvalidStepKey(StepUsageError, ValueError, TypeError):
    """A step key that is not a ``str``/``int`` or is longer than 256 bytes (C2)."""


class NotInStep(StepUsageError, RuntimeError):
    """``step.idempotency_key`` was read outside a step body (C10).

    A usage error: escaping the task body it is dead-lettered at once
    (reason ``invalid_idempotency_key_read``).
    """


class InvalidDuration(ConfigurationError, StepUsageError):
    """A duration that is negative, not finite, too long for a sleep or not in an accepted form (C19).

    A `ValueError` (through [`ConfigurationError`][flexiq_plugins.errors.ConfigurationError]), raised before
    anything is committed; the message names the value and the accepted forms.
    It is a [`StepUsageError`][flexiq_plugins.errors.StepUsageError] too: a bad ``step.sleep`` that escapes the
    task body is dead-lettered at once (reason ``invalid_duration``), since no
    retry can fix it.
    """


class InvalidWakeTime(StepUsageError, ValueError, TypeError):
    """``step.sleep_until`` got something other than a timezone-aware ``datetime`` within reach (C19).

    Raised before anything is committed; dead-lettered (reason ``invalid_wake_time``) if it escapes the body.
    """


class InvalidStepBody(StepUsageError, TypeError):
    """A step's body is not a callable, or ``step.run``'s body returned an awaitable.

    ``step.run("charge", charge(order))`` passes charge's *result*, computed
    before the step and outside it; the step needs the function itself
    (``lambda: charge(order)``). Dead-lettered at once (reason ``invalid_step_body``).
    """


class DuplicateStepKey(StepUsageError):
    """Two steps of one attempt derived the same step key (C3)."""


class ConcurrentStep(StepUsageError):
    """A step started while another step of the same attempt was uncommitted (C8)."""


class SwallowedStepSignal(StepUsageError):
    """The task body caught a step signal or fatal step error and returned anyway (C21)."""


class InvalidStepOption(StepUsageError, TypeError):
    """A ``retry=`` or ``compensate=`` argument of ``step.run`` that is not one of the accepted forms (C31, C32)."""


class InvalidEvent(FlexiqError, ValueError):
    """An event that cannot be sent: a bad topic or key, a payload that is not JSON or too big (C33).

    Raised by ``send_event`` (and ``step.wait_for_event`` for its topic and
    key) before anything is stored; the message names the value and what is
    accepted. Inside a task body it is a defect: the job is dead-lettered
    (``invalid_event``), never retried.
    """


class OpenTransaction(StepUsageError):
    """A plain step was called inside an open database transaction that the step store does not share (C42).

    If that transaction rolled back after the step committed, a retry would
    get the memo of writes that no longer exist. Make the step transactional
    (``step.transaction(name, fn, using=...)``), or run it outside the
    transaction; ``allow_open_transaction=True`` opts a step out of the check.
    Dead-lettered at once (reason ``open_transaction``).
    """


class InvalidTransaction(StepUsageError, ValueError):
    """A transactional step cannot commit in the transaction it was given (C42).

    ``using`` is not a Django connection or alias nor a SQLAlchemy ``Session``
    or ``Connection``; it reaches another database than the step store's; or
    the transaction was still open when the task body returned (it is rolled
    back). Dead-lettered at once (reason ``invalid_transaction``).
    """


class StepLimitExceeded(FlexiqError):
    """A size limit refused a step commit (C22); the job is dead-lettered."""


class CodecError(FlexiqError):
    """A step value could not go through the serializer and codec chain (C7)."""


class EncodeError(CodecError):
    """The serializer or a codec could not encode a step's value; nothing was committed."""


class DecodeError(CodecError):
    """Stored step bytes could not be decoded (another codec chain, a wrong key)."""


class StepRetryExhausted(FlexiqError):
    """A step's durable retry budget is spent (C31).

    Raised in the task body by the ``step.run`` call whose attempts are all
    used, on that attempt and on every replay. Uncaught, it fails the run for
    good: no retry of the task, the run's compensations run, and the job is
    dead-lettered with reason ``step_retry_exhausted``.

    Parameters:
      message (str): what happened, naming the step.
      step_key (str | None): the step whose budget is spent.
      attempts (int): how many attempts the step had (a worker lost inside
        the body counts as one).
      last_error (BaseException | None): the last attempt's error, rebuilt
        from the store on a replay (``None`` if its worker was lost).
    """

    def __init__(
        self,
        message: str = "",
        step_key: str | None = None,
        attempts: int = 0,
        last_error: BaseException | None = None,
    ) -> None:
        super().__init__(message)
        self.step_key = step_key
        self.attempts = attempts
        self.last_error = last_error


_GROUP: tuple[type[Exception], ...]
"""``(ExceptionGroup,)`` where Python has it (3.11 on), else nothing: the base `StepMapFailed` adds."""
if sys.version_info >= (3, 11):
    _GROUP = (ExceptionGroup,)  # noqa: F821 - a builtin from Python 3.11 on (ruff targets 3.10)
else:
    _GROUP = ()


class StepMapFailed(FlexiqError, *_GROUP):  # type: ignore[misc]
    """Items of a step map failed: ``step.map`` raises it once, after every other item finished (C51).

    An ``ExceptionGroup`` on Python 3.11 and later, so ``except* ValueError``
    picks the items that failed with a ``ValueError``. Python 3.10 has no
    ``ExceptionGroup`` and no ``except*``: there it is a plain ``Exception``
    with the same ``message`` and ``exceptions`` attributes and the same
    ``str()``; catch it by its class and look at ``exceptions``. Either way it
    is an ``Exception``, so a task's retry policy sees it like any error of its
    body, and the items that succeeded are committed: the retry runs only the
    failed ones.

    When one of the items failed for good (a
    [`NonRetryableError`][flexiq_plugins.errors.NonRetryableError], a spent
    budget, an error its policy does not retry), the group is marked final
    with that item's reason (`mark_final`): a replay would raise it again, so
    the run fails for good and its compensations run (C31, C32).

    Parameters:
      message (str): what failed, naming the map and its failed items.
      exceptions (Sequence[Exception]): the items' errors, in the order of the items.
      step_keys (Sequence[str]): the step key of each error's item (``name:key``), in the same order.

    Attributes:
      message (str): as the parameter.
      exceptions (tuple[Exception, ...]): as the parameter.
      step_keys (tuple[str, ...]): as the parameter.
    """

    message: str
    exceptions: tuple[Exception, ...]
    step_keys: tuple[str, ...]

    def __new__(cls, message: str, exceptions: Sequence[Exception], step_keys: Sequence[str] = ()) -> StepMapFailed:
        made = super().__new__(cls, message, list(exceptions))
        if not _GROUP:  # an ExceptionGroup has them already
            made.message, made.exceptions = message, tuple(exceptions)
        made.step_keys = tuple(step_keys)
        return made

    def __init__(self, message: str, exceptions: Sequence[Exception], step_keys: Sequence[str] = ()) -> None:
        super().__init__(message, list(exceptions))

    def __str__(self) -> str:
        count = len(self.exceptions)
        return f"{self.message} ({count} sub-exception{'' if count == 1 else 's'})"


class NonRetryableError(FlexiqError):
    """An error that will never succeed: raise it (or a subclass) to say so (C31).

    Raised inside a step body, the step is stored as failed for good: it is
    not retried by its step budget nor by the task's retry policy, and every
    replay raises the same error again without calling the body. Uncaught, it
    fails the run for good: the compensations run and the job is dead-lettered
    with reason ``non_retryable``. A ``RetryPolicy(no_retry_on=...)`` makes
    other error types behave the same way.
    """


class CompensationFailed(FlexiqError):
    """A compensation (undo) failed for good, or could not be found; the run is dead-lettered (C32).

    The message names the undo and its step, and the failure that started the
    compensation. Reason ``compensation_failed``.
    """


class DeadLettered(FlexiqError):
    """The job was dead-lettered and will not be retried (C13, C29, C30).

    What a framework adapter reports (for example in Celery's result backend)
    once the store has recorded the dead letter. The first argument is the
    message, which starts with the reason kind (``"divergence: ..."``).
    """


class ReplayedError(NonRetryableError):
    """A finished run's stored error whose class cannot be imported or built here (C37).

    A duplicate delivery of a failed run replays its error: the class is
    imported by the name the store holds and built with the message; when
    that fails, this error stands in for it.

    Parameters:
      message (str): ``"<error type>: <message>"``.
      error_type (str): the stored qualified class name.
    """

    def __init__(self, message: str = "", error_type: str = "") -> None:
        super().__init__(message)
        self.error_type = error_type


class JobCancelled(FlexiqError):
    """The job's run was cancelled (C34): what a duplicate of a cancelled run raises (C37).

    The first argument is the message, which names the cancellation's reason.
    """


class JobEnded(FlexiqError):
    """The framework ended the job itself: a hard time limit, an age limit, a failure it acknowledged (C38, C45).

    What the run's failure records (its compensation, C32) and what a
    duplicate of the run replays (C37); the framework has already told its
    own result waiter (Celery's ``TimeLimitExceeded``, Dramatiq's failed
    message). The first argument is the message, which says how it ended.
    """


class OutcomeNotKept(FlexiqError):
    """A finished run's return value was not kept, so a duplicate cannot replay it (C37).

    The value was over the step bytes limit (``step_bytes``, C22) or could not be
    encoded by the step serializer; the run itself succeeded. The message
    says which.
    """


class UnsupportedInEagerMode(FlexiqError, RuntimeError):
    """A durable job asked to be put back on its queue while run eagerly.

    Under Celery's ``task_always_eager`` (or ``Task.apply``) there is no broker
    to re-enqueue a sleeping or busy job, so ``step.sleep`` fails the eager
    call with this error instead of blocking or recursing (C15).
    """


class StoreError(FlexiqError):
    """An error reported by the step store."""


class StoreUnavailable(StoreError):
    """The store cannot be reached (connection refused or lost, timeout).

    Always retryable, whatever the task's retry filters say (C28).
    """


class StoreMisconfigured(StoreUnavailable, ConfigurationError):
    """The store refuses this configuration: authentication, an unknown database, a missing directory (C41).

    Unlike an outage it does not pass by itself. A worker refuses to start on
    it, with one line naming the cause; a job that meets it later (a password
    rotated while the worker runs) is put back like an outage, never
    acknowledged away (C28, C41).
    """


class ClaimLost(StoreError):
    """The attempt's claim on its run was taken over; its writes are refused (C25)."""


class RunLocked(StoreError):
    """The run's row is locked by another open transaction; a write that would wait for it was not made.

    Raised by `renew` on PostgreSQL and
    MySQL/MariaDB instead of waiting: the lock is typically a transactional
    step's, held until its caller's transaction ends (C42), and the process's
    one lease renewer must not wait on one claim while the others' leases run
    out (C23). Nothing was written; try again shortly.
    """


class CancelRequested(StoreError):
    """A notice from the store: the run's cancellation was requested while an attempt holds it (C34).

    Raised by a fenced write at a step boundary (``commit_step``,
    ``poll_event``) *after* its transaction: a step
    row it was given is committed all the same and travels in `row`,
    so the attempt can undo it. The attempt turns it into
    [`RunCancelled`][flexiq_plugins.errors.RunCancelled]; it never reaches a task body.

    Parameters:
      reason (str): the reason the cancellation was requested with.
      row (StepRow | None): the step row the write committed, if any.
    """

    def __init__(self, reason: str, row: object = None) -> None:
        super().__init__(f"the run's cancellation was requested: {reason}")
        self.reason = reason
        self.row = row


class CorruptRecord(StoreError):
    """A stored row cannot be read: a step row without its value, a job envelope that is not JSON or lacks fields.

    No retry can fix it, so a job that meets one is dead-lettered at once
    (reason ``corrupt_record``); the message names the run and the row.
    """


class UnknownRun(StoreError, LookupError):
    """No run has the given run key."""


class UnknownDeadLetter(StoreError, LookupError):
    """No dead letter has the given id."""


class UnknownStep(StoreError, LookupError):
    """The run has no step with the given key; the message lists the keys it accepts (C50)."""


class OperationError(FlexiqError):
    """An operator action could not be carried out (the ``flexiq`` CLI exits 1)."""


class NoPublisher(OperationError):
    """No integration can re-publish the job's framework (the CLI exits 2: pass ``--app`` / ``--broker``)."""


class PublishFailed(OperationError):
    """The broker refused or could not be reached while re-publishing a job."""


class AlreadyRetried(OperationError):
    """The dead letter was retried already and its run has moved on (it is no longer ``dead``)."""


class RunCompensated(OperationError):
    """The dead letter's run was compensated: its steps were undone (C32).

    Retrying it would only replay the compensation; retry it from a step
    (``--reset-from``) to run the job again.
    """


class InvalidForkStep(OperationError, ValueError):
    """A run cannot be forked from that step: it is not a step of the body that runs again (C50).

    Only ``run``, ``sleep`` and ``wait`` steps of the body qualify, not what a
    wait received (``event:…``), a patch marker or a compensation's rows. The
    message lists the keys that do. Nothing is written.
    """


# -------------------------------------------------------------- classification
class Disposition(enum.Enum):
    """What an adapter must do with an attempt that ended by raising."""

    RETRY = "retry"
    """The framework's own retry policy decides (C28)."""
    RETRY_ALWAYS = "retry_always"
    """Retry even where the task's filters would not: a store outage (C28)."""
    DEAD_LETTER = "dead_letter"
    """Never retried; straight to the dead-letter path (C13, C29)."""
    DROP = "drop"
    """The claim was lost: what the attempt did is dropped (C25)."""
    SLEEP = "sleep"
    """Not a failure: the job comes back at its wake time (C15, C16)."""
    CANCEL = "cancel"
    """The run is cancelled (C34): its compensations run, it ends ``cancelled``; never retried."""
    INTERRUPTED = "interrupted"
    """Not a failure: the worker shut down; the job goes back at once, no retry counted (C38)."""


_DEAD_LETTER_TYPES: tuple[type[BaseException], ...] = (
    StepDivergence,
    StepUsageError,
    InvalidEvent,
    CorruptRecord,
    StepLimitExceeded,
    EncodeError,
    StepRetryExhausted,
    NonRetryableError,
    CompensationFailed,
)

_FINAL_ATTRIBUTE = "_flexiq_final_reason"


def mark_final(exc: BaseException, reason: str) -> BaseException:
    """Mark ``exc``, raised by a step that failed for good, as final; return it (C31).

    A final error is dead-lettered with ``reason`` and never retried, whatever
    its type; uncaught, it triggers the run's compensations (C32).

    Parameters:
      exc (BaseException): the error the step's body raised (or its rebuilt copy on a replay).
      reason (str): the dead letter's reason kind, e.g. ``"non_retryable"``.
    """
    setattr(exc, _FINAL_ATTRIBUTE, reason)
    return exc


def final_reason(exc: BaseException) -> str | None:
    """The reason `mark_final` gave ``exc``, or ``None`` if it is not marked."""
    reason = getattr(exc, _FINAL_ATTRIBUTE, None)
    return reason if isinstance(reason, str) else None


def compensates(exc: BaseException) -> bool:
    """Whether ``exc``, uncaught, fails the run for good in a way that runs its compensations (C32).

    True for an exhausted step budget, a [`NonRetryableError`][flexiq_plugins.errors.NonRetryableError], an
    error marked final and a cancellation (C34); false for the dead letters
    that point at a defect (divergence, usage errors, size limits), which an
    operator fixes and retries without undoing anything.
    """
    return isinstance(exc, (StepRetryExhausted, NonRetryableError, RunCancelled)) or final_reason(exc) is not None


def classify(exc: BaseException) -> Disposition:
    """Return the [`Disposition`][flexiq_plugins.errors.Disposition] for ``exc``, before any retry filter (C28, C29).

    Parameters:
      exc (BaseException): what the task body (or the driver) raised.
    """
    for kind, disposition in _BY_TYPE:
        if isinstance(exc, kind):
            return disposition
    if isinstance(exc, _DEAD_LETTER_TYPES) or final_reason(exc) is not None:
        return Disposition.DEAD_LETTER
    return Disposition.RETRY


_BY_TYPE: tuple[tuple[type[BaseException], Disposition], ...] = (
    (SleepSignal, Disposition.SLEEP),
    (RunCancelled, Disposition.CANCEL),
    (WorkerInterrupted, Disposition.INTERRUPTED),
    (ClaimLost, Disposition.DROP),
    (StoreUnavailable, Disposition.RETRY_ALWAYS),
)


def reason_of(exc: BaseException) -> str:
    """Return the short reason kind recorded with a dead letter, e.g. ``"divergence"``."""
    marked = final_reason(exc)
    if marked is not None:
        return marked
    names: list[tuple[type[BaseException], str]] = [
        (StepDivergence, "divergence"),
        (DuplicateStepKey, "duplicate_step_key"),
        (ConcurrentStep, "concurrent_step"),
        (SwallowedStepSignal, "swallowed_signal"),
        (StepLimitExceeded, "size_limit"),
        (EncodeError, "unencodable_value"),
        (StepRetryExhausted, "step_retry_exhausted"),
        (NonRetryableError, "non_retryable"),
        (CompensationFailed, "compensation_failed"),
        (RunCancelled, "cancelled"),
        (JobEnded, "framework_ended"),
        (InvalidStepName, "invalid_step_name"),
        (InvalidStepKey, "invalid_step_key"),
        (InvalidStepOption, "invalid_step_option"),
        (InvalidEvent, "invalid_event"),
        (InvalidDuration, "invalid_duration"),
        (InvalidWakeTime, "invalid_wake_time"),
        (InvalidStepBody, "invalid_step_body"),
        (NotInStep, "invalid_idempotency_key_read"),
        (OpenTransaction, "open_transaction"),
        (InvalidTransaction, "invalid_transaction"),
        (CorruptRecord, "corrupt_record"),
        (StepUsageError, "usage_error"),
    ]
    for kind, reason in names:
        if isinstance(exc, kind):
            return reason
    return "error"
