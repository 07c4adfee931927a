"""flexiq-plugins: durable steps for the Celery and Dramatiq task queues you already run.

Inside a task body::

    from flexiq_plugins import current_job

    step = current_job.step
    charge = step.run("charge", lambda: pay(order, idempotency_key=step.idempotency_key))
    step.sleep("1h")
    step.run("receipt", lambda: send_receipt(charge))

The framework integrations live in ``celery_ext`` and ``dramatiq_ext``; this
package never imports Celery or Dramatiq.
"""

from ._store.base import DeadLetterRecord, JobEnvelope, RunRecord, StepRow, StepStore
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
    ConcurrentStep,
    ConfigurationError,
    DeadLettered,
    DecodeError,
    DuplicateStepKey,
    EncodeError,
    FlexiqError,
    InvalidDuration,
    InvalidRunKey,
    InvalidStepKey,
    InvalidStepName,
    NoCurrentJob,
    NoPublisher,
    NotInStep,
    OperationError,
    PublishFailed,
    SleepSignal,
    StepDivergence,
    StepLimitExceeded,
    StepRetryExhausted,
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

__version__ = "0.1.0"

__all__ = [
    "AlreadyRetried",
    "Attempt",
    "AttemptDriver",
    "ClaimLost",
    "CodecChain",
    "CodecError",
    "ConcurrentStep",
    "ConfigurationError",
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
    "InvalidStepKey",
    "InvalidStepName",
    "JobContext",
    "JobEnvelope",
    "JobInfo",
    "JsonSerializer",
    "Limits",
    "MemoryStepStore",
    "NoCurrentJob",
    "NoPublisher",
    "NotInStep",
    "OperationError",
    "PublishFailed",
    "RunRecord",
    "SleepSignal",
    "SqlStepStore",
    "StepContext",
    "StepDivergence",
    "StepLimitExceeded",
    "StepRetryExhausted",
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
