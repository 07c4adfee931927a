"""flexiq-plugins: durable steps for the Celery and Dramatiq task queues you already run.

Inside a task body::

    from flexiq_plugins import current_job

    step = current_job.step
    charge = step.run("charge", lambda: pay(order, idempotency_key=step.idempotency_key))
    step.sleep("1h")
    step.run("receipt", lambda: send_receipt(charge), retry=RetryPolicy(max_attempts=5))

The framework integrations live in ``celery_ext`` and ``dramatiq_ext``; this
package never imports Celery or Dramatiq.
"""

from ._store.base import DeadLetterRecord, JobEnvelope, RunRecord, StepAttempt, StepRow, StepStore
from ._store.factory import open_store
from ._store.memory import MemoryStepStore
from ._store.sql import SqlStepStore, upgrade_store
from .attempt import Attempt, AttemptDriver, JobInfo
from .codec import CodecChain, FernetCodec, FunctionSerializer, JsonSerializer, ZlibCodec
from .config import DurableConfig, Limits
from .context import JobContext, StepContext, current_job
from .durations import parse_duration
from .errors import (
    AlreadyRetried,
    ClaimLost,
    CodecError,
    CompensationFailed,
    ConcurrentStep,
    ConfigurationError,
    CorruptRecord,
    DeadLettered,
    DecodeError,
    DuplicateStepKey,
    EncodeError,
    FlexiqError,
    InvalidDuration,
    InvalidRunKey,
    InvalidStepBody,
    InvalidStepKey,
    InvalidStepName,
    InvalidStepOption,
    InvalidTransaction,
    InvalidWakeTime,
    NoCurrentJob,
    NonRetryableError,
    NoPublisher,
    NotInStep,
    OpenTransaction,
    OperationError,
    PublishFailed,
    ReplayStopped,
    RunCompensated,
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
    UnsupportedInEagerMode,
    WorkerInterrupted,
)
from .identity import new_run_key
from .policies import Compensation, RetryPolicy

__version__ = "0.1.0"

__all__ = [
    "AlreadyRetried",
    "Attempt",
    "AttemptDriver",
    "ClaimLost",
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
    "FernetCodec",
    "FlexiqError",
    "FunctionSerializer",
    "InvalidDuration",
    "InvalidRunKey",
    "InvalidStepBody",
    "InvalidStepKey",
    "InvalidStepName",
    "InvalidStepOption",
    "InvalidTransaction",
    "InvalidWakeTime",
    "JobContext",
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
    "PublishFailed",
    "ReplayStopped",
    "RetryPolicy",
    "RunCompensated",
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
    "UnsupportedInEagerMode",
    "WorkerInterrupted",
    "ZlibCodec",
    "__version__",
    "current_job",
    "new_run_key",
    "open_store",
    "parse_duration",
    "upgrade_store",
]
