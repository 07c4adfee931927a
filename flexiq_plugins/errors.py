"""The one error hierarchy of flexiq-plugins, and how each error is classified.

Two roots, on purpose. Control-flow *signals* derive from ``BaseException``
because they are not errors: a sleep is the normal way for an attempt to end,
and a divergence must not be caught by a task's ``except Exception`` and turned
into a retry or, worse, a success (C20). Everything else is an ordinary
``Exception`` under :class:`FlexiqError`::

    BaseException
    ├── StepSignal                      control flow, never an error (C20)
    │   ├── SleepSignal                 the attempt ends; the job comes back later
    │   └── StepDivergence              recorded and running step sequences differ (C12)
    └── WorkerInterrupted               the worker shut down mid-attempt: the job goes back (C38)
    Exception
    └── FlexiqError
        ├── ConfigurationError (ValueError)   a bad store URL, option or codec key
        ├── InvalidDuration (ValueError)      a duration that cannot be parsed (C19)
        ├── NoCurrentJob (RuntimeError)       ``current_job`` used outside a job
        ├── NotInStep (RuntimeError)          ``idempotency_key`` outside a step body
        ├── InvalidRunKey (ValueError)        a run key that is not a str of 1–255 characters
        ├── StepUsageError                    misuse of the step API inside a job
        │   ├── InvalidStepName (ValueError, TypeError)   C2
        │   ├── InvalidStepKey (ValueError, TypeError)    C2
        │   ├── DuplicateStepKey                          C3
        │   ├── ConcurrentStep                            C8
        │   └── SwallowedStepSignal                       C21
        ├── StepLimitExceeded                 a size cap refused a commit (C22)
        ├── CodecError                        a value cannot be encoded / decoded (C7)
        │   ├── EncodeError
        │   └── DecodeError
        ├── StepRetryExhausted                a step's durable retry budget is spent (C31)
        ├── DeadLettered                      the job went to the dead-letter path (C13, C30)
        ├── UnsupportedInEagerMode (RuntimeError)  a sleep or put-back under Celery's eager mode
        ├── StoreError                        anything the step store reports
        │   ├── StoreUnavailable              connection lost, timeout: retryable (C28)
        │   │   └── StoreMisconfigured (ConfigurationError)  authentication, unknown database, missing directory (C41)
        │   ├── ClaimLost                     another attempt holds the run (C25)
        │   └── UnknownRun / UnknownDeadLetter (LookupError)
        └── OperationError                    an operator action failed (``flexiq`` exits 1)
            ├── NoPublisher                   no integration to re-publish a framework's jobs
            ├── PublishFailed                 the broker refused a re-publish
            └── AlreadyRetried                the dead letter's run has moved on

Classification (:func:`classify`) lives here, next to the errors, so every
adapter reads the same answer before it consults any retry filter (C28, C29).
"""

from __future__ import annotations

import enum
from datetime import datetime

__all__ = [
    "ClaimLost",
    "CodecError",
    "ConcurrentStep",
    "AlreadyRetried",
    "ConfigurationError",
    "DeadLettered",
    "DecodeError",
    "Disposition",
    "DuplicateStepKey",
    "EncodeError",
    "FlexiqError",
    "InvalidDuration",
    "InvalidRunKey",
    "InvalidStepKey",
    "InvalidStepName",
    "NoCurrentJob",
    "NoPublisher",
    "NotInStep",
    "OperationError",
    "PublishFailed",
    "SleepSignal",
    "StepDivergence",
    "StepLimitExceeded",
    "StepRetryExhausted",
    "StepSignal",
    "StepUsageError",
    "StoreError",
    "StoreMisconfigured",
    "StoreUnavailable",
    "SwallowedStepSignal",
    "UnknownDeadLetter",
    "UnknownRun",
    "UnsupportedInEagerMode",
    "WorkerInterrupted",
    "classify",
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
      step_key(str): the sleep's step key, such as ``"sleep#0"``.
      wake_at(float): the wake time in seconds since the epoch, store clock.
    """

    def __init__(self, step_key: str, wake_at: float) -> None:
        self.step_key = step_key
        self.wake_at = wake_at
        try:
            when = datetime.fromtimestamp(wake_at).astimezone().isoformat(timespec="seconds")
        except (OverflowError, OSError, ValueError):  # beyond what datetime can show, e.g. timedelta.max
            when = f"{wake_at:.0f} seconds since the epoch"
        super().__init__(f"step {step_key!r} sleeps until {when}")


class StepDivergence(StepSignal):
    """The running step sequence differs from the recorded one (C12).

    Never retried: the job is dead-lettered (C13). The message names the job,
    the position, both sequences and the step that changed.
    """


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


class InvalidDuration(ConfigurationError):
    """A duration that is negative, not finite or not in an accepted form (C19).

    A :class:`ValueError` (through :class:`ConfigurationError`), raised before
    anything is committed; the message names the value and the accepted forms.
    """


class NoCurrentJob(FlexiqError, RuntimeError):
    """``current_job`` was used outside a durable job."""


class NotInStep(FlexiqError, RuntimeError):
    """``step.idempotency_key`` was read outside a step body (C10)."""


class InvalidRunKey(FlexiqError, ValueError):
    """A job carried a run key that is not a ``str`` of 1 to 255 characters."""


class StepUsageError(FlexiqError):
    """The step API was used in a way the contract refuses."""


class InvalidStepName(StepUsageError, ValueError, TypeError):
    """A step name that is empty, not a ``str``, too long or has ``#``/``:``/control characters (C2)."""


class InvalidStepKey(StepUsageError, ValueError, TypeError):
    """A step key that is not a ``str``/``int`` or is longer than 256 bytes (C2)."""


class DuplicateStepKey(StepUsageError):
    """Two steps of one attempt derived the same step key (C3)."""


class ConcurrentStep(StepUsageError):
    """A step started while another step of the same attempt was uncommitted (C8)."""


class SwallowedStepSignal(StepUsageError):
    """The task body caught a step signal or fatal step error and returned anyway (C21)."""


class StepLimitExceeded(FlexiqError):
    """A size cap refused a step commit (C22); the job is dead-lettered."""


class CodecError(FlexiqError):
    """A step value could not go through the serializer and codec chain (C7)."""


class EncodeError(CodecError):
    """The serializer or a codec could not encode a step's value; nothing was committed."""


class DecodeError(CodecError):
    """Stored step bytes could not be decoded (another codec chain, a wrong key)."""


class StepRetryExhausted(FlexiqError):
    """A step's durable retry budget is spent (C31)."""


class DeadLettered(FlexiqError):
    """The job was dead-lettered and will not be retried (C13, C29, C30).

    What a framework adapter reports (for example in Celery's result backend)
    once the store has recorded the dead letter. The first argument is the
    message, which starts with the reason kind (``"divergence: ..."``).
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


class UnknownRun(StoreError, LookupError):
    """No run has the given run key."""


class UnknownDeadLetter(StoreError, LookupError):
    """No dead letter has the given id."""


class OperationError(FlexiqError):
    """An operator action could not be carried out (the ``flexiq`` CLI exits 1)."""


class NoPublisher(OperationError):
    """No integration can re-publish the job's framework (the CLI exits 2: pass ``--app`` / ``--broker``)."""


class PublishFailed(OperationError):
    """The broker refused or could not be reached while re-publishing a job."""


class AlreadyRetried(OperationError):
    """The dead letter was retried already and its run has moved on (it is no longer ``dead``)."""


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
    """The claim was lost: the outcome is dropped (C25)."""
    SLEEP = "sleep"
    """Not a failure: the job comes back at its wake time (C15, C16)."""
    INTERRUPTED = "interrupted"
    """Not a failure: the worker shut down; the job goes back at once, no retry counted (C38)."""


_DEAD_LETTER_TYPES: tuple[type[BaseException], ...] = (
    StepDivergence,
    StepUsageError,
    StepLimitExceeded,
    EncodeError,
    StepRetryExhausted,
)


def classify(exc: BaseException) -> Disposition:
    """Return the :class:`Disposition` for ``exc``, before any retry filter (C28, C29).

    Parameters:
      exc(BaseException): what the task body (or the driver) raised.
    """
    if isinstance(exc, SleepSignal):
        return Disposition.SLEEP
    if isinstance(exc, WorkerInterrupted):
        return Disposition.INTERRUPTED
    if isinstance(exc, ClaimLost):
        return Disposition.DROP
    if isinstance(exc, StoreUnavailable):
        return Disposition.RETRY_ALWAYS
    if isinstance(exc, _DEAD_LETTER_TYPES):
        return Disposition.DEAD_LETTER
    return Disposition.RETRY


def reason_of(exc: BaseException) -> str:
    """Return the short reason kind recorded with a dead letter, e.g. ``"divergence"``."""
    names: list[tuple[type[BaseException], str]] = [
        (StepDivergence, "divergence"),
        (DuplicateStepKey, "duplicate_step_key"),
        (ConcurrentStep, "concurrent_step"),
        (SwallowedStepSignal, "swallowed_signal"),
        (StepLimitExceeded, "size_cap"),
        (EncodeError, "unencodable_value"),
        (StepRetryExhausted, "step_retry_exhausted"),
        (InvalidStepName, "invalid_step_name"),
        (InvalidStepKey, "invalid_step_key"),
    ]
    for kind, reason in names:
        if isinstance(exc, kind):
            return reason
    return "error"
