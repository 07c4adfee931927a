"""flexiq-plugins: durable steps for the Celery and Dramatiq task queues you already run.

Inside a task body:

    from flexiq_plugins import current_job

    step = current_job.step
    charge = step.run("charge", lambda: pay(order, idempotency_key=step.idempotency_key))
    step.sleep("1h")
    step.run("receipt", lambda: send_receipt(charge), retry=RetryPolicy(max_attempts=5))

Wait for the outside world with ``step.wait_for_event("payment", key=order_id)``
and ``send_event("payment", order_id, payload)`` from any process; cancel a run
with ``cancel_run(run_key)``.

The framework integrations live in ``celery_ext`` and ``dramatiq_ext``; this
package never imports Celery or Dramatiq.
"""

from ._attempt.attempt import Attempt
from ._attempt.driver import AttemptDriver
from ._attempt.job import JobInfo
from ._delivery.cancel import cancel_run
from ._delivery.events import send_event
from ._model.codec import CodecChain, FernetCodec, FunctionSerializer, JsonSerializer, ZlibCodec
from ._model.config import DurableConfig, Limits
from ._model.durations import parse_duration
from ._model.identity import new_run_key
from ._model.policies import CancellationPolicy, Compensation, RetryPolicy
from ._model.records import DeadLetterRecord, JobEnvelope, RunRecord, StepAttempt, StepRow
from ._steps.context import JobContext, StepContext, current_job
from ._store.attempt_side import AttemptStore
from ._store.base import StepStore
from ._store.factory import open_store
from ._store.memory import MemoryStepStore
from ._store.operator_side import OperatorStore
from ._store.sql import SqlStepStore, upgrade_store
from .errors import (
    AlreadyRetried,
    CancelRequested,
    CheckStopped,
    ClaimLost,
    ClaimRefused,
    CodecError,
    CompensationFailed,
    ConcurrentStep,
    ConfigurationError,
    CorruptRecord,
    DeadLettered,
    DecodeError,
    DuplicateStepKey,
    EncodeError,
    EventWaitSignal,
    FlexiqError,
    InvalidDuration,
    InvalidEvent,
    InvalidForkStep,
    InvalidRunKey,
    InvalidStepBody,
    InvalidStepKey,
    InvalidStepName,
    InvalidStepOption,
    InvalidTransaction,
    InvalidWakeTime,
    JobCancelled,
    JobEnded,
    NoCurrentJob,
    NonRetryableError,
    NoPublisher,
    NotInStep,
    OpenTransaction,
    OperationError,
    OutcomeNotKept,
    PublishFailed,
    ReplayedError,
    ReplayStopped,
    RunCancelled,
    RunCompensated,
    RunLocked,
    SleepSignal,
    StepDivergence,
    StepLimitExceeded,
    StepRetryExhausted,
    StepRetrySignal,
    StepSignal,
    StepUsageError,
    StoreError,
    StoreMisconfigured,
    StoreUnavailable,
    SwallowedStepSignal,
    UnknownDeadLetter,
    UnknownRun,
    UnknownStep,
    UnsupportedInEagerMode,
    WorkerInterrupted,
)

__version__ = "0.1.0"

__all__ = [
    "AlreadyRetried",
    "Attempt",
    "AttemptDriver",
    "AttemptStore",
    "CancelRequested",
    "CancellationPolicy",
    "CheckStopped",
    "ClaimLost",
    "ClaimRefused",
    "CodecChain",
    "CodecError",
    "Compensation",
    "CompensationFailed",
    "ConcurrentStep",
    "ConfigurationError",
    "CorruptRecord",
    "DeadLetterRecord",
    "DeadLettered",
    "DecodeError",
    "DuplicateStepKey",
    "DurableConfig",
    "EncodeError",
    "EventWaitSignal",
    "FernetCodec",
    "FlexiqError",
    "FunctionSerializer",
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
    "JobContext",
    "JobEnded",
    "JobEnvelope",
    "JobInfo",
    "JsonSerializer",
    "Limits",
    "MemoryStepStore",
    "NoCurrentJob",
    "NoPublisher",
    "NonRetryableError",
    "NotInStep",
    "OpenTransaction",
    "OperationError",
    "OperatorStore",
    "OutcomeNotKept",
    "PublishFailed",
    "ReplayStopped",
    "ReplayedError",
    "RetryPolicy",
    "RunCancelled",
    "RunCompensated",
    "RunLocked",
    "RunRecord",
    "SleepSignal",
    "SqlStepStore",
    "StepAttempt",
    "StepContext",
    "StepDivergence",
    "StepLimitExceeded",
    "StepRetryExhausted",
    "StepRetrySignal",
    "StepRow",
    "StepSignal",
    "StepStore",
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
    "ZlibCodec",
    "__version__",
    "cancel_run",
    "current_job",
    "new_run_key",
    "open_store",
    "parse_duration",
    "send_event",
    "upgrade_store",
]
