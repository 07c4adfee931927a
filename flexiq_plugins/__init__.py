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

# The package root is the face of a task author and an operator: what they call,
# configure or catch. An adapter author's names (Attempt, AttemptDriver, JobInfo,
# the decisions) are in flexiq_plugins.integration; an operator's actions in
# flexiq_plugins.operations; every error in flexiq_plugins.errors.
from ._delivery.cancel import cancel_run
from ._delivery.events import send_event
from ._model.codec import CodecChain, FernetCodec, FunctionSerializer, JsonSerializer, ZlibCodec
from ._model.config import DurableConfig, Limits
from ._model.durations import parse_duration
from ._model.identity import new_run_key
from ._model.policies import CancellationPolicy, Compensation, RetryPolicy
from ._model.records import DeadLetterRecord, JobEnvelope, KnownTask, RunRecord, StepAttempt, StepRow
from ._steps.context import JobContext, StepContext, current_job
from ._steps.logfields import JobLogFilter
from ._store.attempt_side import AttemptStore
from ._store.base import StepStore
from ._store.factory import open_store
from ._store.memory import MemoryStepStore
from ._store.operator_side import OperatorStore
from ._store.sql import SqlStepStore, upgrade_store
from .errors import (
    ConfigurationError,
    DeadLettered,
    FlexiqError,
    InvalidEvent,
    InvalidForkStep,
    InvalidRunKey,
    JobCancelled,
    JobEnded,
    NoCurrentJob,
    NonRetryableError,
    OutcomeNotKept,
    ReplayedError,
    StepDivergence,
    StepMapFailed,
    StepRetryExhausted,
    StoreError,
    StoreUnavailable,
    UnknownRun,
    UnknownStep,
    UnsupportedInEagerMode,
)

__version__ = "0.1.0"

__all__ = [
    # Inside a task body: the current job and its step API (C1–C21, C31–C33, C42).
    "current_job",
    "JobContext",
    "StepContext",
    # The policies a task, an actor or one step takes: a step's retry budget and undo (C31, C32),
    # a run's run caps (C34).
    "RetryPolicy",
    "Compensation",
    "CancellationPolicy",
    # From any process: an event for a waiting run (C33), cancelling a run (C34), a run key a
    # producer chooses (C46), a duration as the options take it (C19).
    "send_event",
    "cancel_run",
    "new_run_key",
    "parse_duration",
    # Configuring an integration: its options and size limits (C22), a logging filter that names the run
    # in every record (C53), the step codecs (C7), the store
    # (C41) and its schema.
    "DurableConfig",
    "Limits",
    "JobLogFilter",
    "CodecChain",
    "JsonSerializer",
    "FunctionSerializer",
    "ZlibCodec",
    "FernetCodec",
    "StepStore",
    "AttemptStore",
    "OperatorStore",
    "SqlStepStore",
    "MemoryStepStore",
    "open_store",
    "upgrade_store",
    # What a store hands an operator: runs, their steps and step attempts, dead letters, envelopes.
    "RunRecord",
    "StepRow",
    "StepAttempt",
    "DeadLetterRecord",
    "JobEnvelope",
    "KnownTask",
    # The errors a task body raises or catches: NonRetryableError to say "never retry" (C31),
    # StepRetryExhausted when a step's budget is spent (C31), StepMapFailed when items of a
    # step.map failed (C51), NoCurrentJob outside a job.
    "NonRetryableError",
    "StepRetryExhausted",
    "StepMapFailed",
    "NoCurrentJob",
    # The errors a job's caller meets in its result (C30, C34, C37, C45): a dead letter on any adapter,
    # a cancelled run, a run the framework ended itself (a time or age limit), a finished run's error
    # or value that cannot be replayed as it was; and a sleep under Celery's eager mode (a unit
    # test's task.apply(), C38).
    "DeadLettered",
    "JobCancelled",
    "JobEnded",
    "ReplayedError",
    "OutcomeNotKept",
    "UnsupportedInEagerMode",
    # The errors a producer or an operator catches: configuration (C41), the store (C28), a run
    # key, an event or a run that cannot be used (C33, C34), a step a fork cannot start from (C50),
    # a divergence a check reports (C12), and the root of them all. Every other error is in flexiq_plugins.errors.
    "FlexiqError",
    "ConfigurationError",
    "StoreError",
    "StoreUnavailable",
    "InvalidRunKey",
    "InvalidEvent",
    "UnknownRun",
    "UnknownStep",
    "InvalidForkStep",
    "StepDivergence",
    "__version__",
]
