"""Everything a framework adapter needs from the core, in one public module.

``celery_ext`` and ``dramatiq_ext`` import only this module and the package
root; a third integration would too. The shape of an adapter:

1. At publish, stamp a run key on each new job (:func:`new_run_key`) and,
   unless the task or the message opts out (:func:`wants_record`), record
   its run ``queued`` before the message leaves (:func:`record_at_publish`,
   C39); flag the message with :data:`RECORDED_FLAG` when it was recorded.
   A worker starts recovery with :func:`start_recovery` (C39).
2. At delivery, describe the message as a :class:`JobInfo` (the run key by
   :func:`run_key_from`, the envelope by :func:`build_envelope`) and run it
   with the per-process :class:`AttemptDriver` (:class:`PerProcess`):
   ``driver.run_job(job, body)``.
3. Translate the :data:`Outcome` into the framework's verb with ``match`` and
   ``assert_never`` (see :mod:`flexiq_plugins._attempt.outcomes` for the table). The
   core has already decided everything that does not depend on the framework.
   A put-back re-enqueues the same job carrying the run's key (C36) through
   :func:`hand_off`; if it still fails, the message stays in the broker.
4. Register an :class:`Adapter` under the entry point group
   ``flexiq_plugins.adapters`` so the operator tools can re-publish its jobs.

Options are one frozen :class:`DurableConfig` (subclass it for options of
your own), the store comes from :func:`resolve_store`. A task's or actor's
own ``step_retry`` option (C31) is checked with :func:`retry_policy_option`
and travels in :attr:`JobInfo.step_retry`; its caps (``max_run_seconds``,
``max_suspended_seconds``, C34) are checked with :func:`cancellation_option`
and travel in :attr:`JobInfo.cancellation`. When the framework gives up on a
:class:`Failure`, call :meth:`AttemptDriver.give_up`: a run with undos to run
(C32) comes back as a :class:`PutBack` to re-enqueue. A worker that
receives a recorded job for a task or actor it does not have (the framework
discards the message) calls :func:`dead_letter_unregistered` from the
framework's hook, so the run is dead-lettered instead of staying ``queued``
(C39). A store setting is
checked when the integration is configured (:func:`check_store_spec`) and the
store is reached once when a worker starts (:func:`check_store_at_start`), so
a misconfiguration stops the worker with one line instead of failing jobs
(C41); a job that cannot open its store is put back
(:func:`driver_or_put_back`), never acknowledged away.

An integration configured in a process calls :func:`register_installation`
with its app or broker, so :func:`flexiq_plugins.send_event` and
:func:`flexiq_plugins.cancel_run` called there use its store and wake runs
through it (C33, C34). When the framework cancels a job itself (a Celery
``revoke``), :meth:`AttemptDriver.framework_ended` calls :func:`cancel_run`,
the one cancellation.
"""

from __future__ import annotations

from ._attempt.attempt import Attempt
from ._attempt.cancellation import CancelResult
from ._attempt.driver import AttemptDriver
from ._attempt.job import JobInfo
from ._attempt.outcomes import (
    Ack,
    AckReason,
    Completed,
    DeadLetter,
    Ended,
    Failure,
    Outcome,
    PutBack,
    PutBackReason,
    Replay,
)
from ._delivery.cancel import cancel_run
from ._delivery.jobs import (
    PAYLOAD_OPTION,
    body_traceback,
    build_envelope,
    claims_before_body,
    envelope_arguments,
    is_json,
    resume_mark_at_publish,
)
from ._delivery.recording import (
    RECORD_OPTION,
    RECORD_TASK_OPTION,
    RECORDED_FLAG,
    record_at_publish,
    settle_unclaimed_run,
    start_recovery,
    wants_record,
)
from ._delivery.recovery import Sweeper
from ._delivery.registry import (
    UNSTARTED_ONLY,
    Adapter,
    JobStates,
    Publisher,
    ReportedState,
    ValueReader,
    register_adapter,
    register_installation,
)
from ._delivery.unregistered import UNREGISTERED_REASON, dead_letter_unregistered
from ._delivery.worker import (
    EXIT_CONFIGURATION,
    HAND_OFF_PAUSES,
    PerProcess,
    check_store_at_start,
    driver_or_put_back,
    hand_off,
    log_worker_start,
)
from ._model.codec import CodecChain, FunctionSerializer, Serializer
from ._model.config import DurableConfig
from ._model.identity import new_run_key, run_key_from
from ._model.policies import CancellationPolicy, RetryPolicy, cancellation_option, retry_policy_option
from ._model.records import JobEnvelope
from ._steps.context import no_current_job
from ._store.base import StepStore
from ._store.factory import StoreSpec, check_store_spec, resolve_store, resolve_store_spec
from .errors import (
    DeadLettered,
    Disposition,
    StepSignal,
    UnsupportedInEagerMode,
    WorkerInterrupted,
    classify,
)

__all__ = [
    "Ack",
    "AckReason",
    "Adapter",
    "Attempt",
    "AttemptDriver",
    "CancelResult",
    "CancellationPolicy",
    "CodecChain",
    "Completed",
    "DeadLetter",
    "DeadLettered",
    "Disposition",
    "DurableConfig",
    "EXIT_CONFIGURATION",
    "Ended",
    "Failure",
    "FunctionSerializer",
    "HAND_OFF_PAUSES",
    "JobEnvelope",
    "JobInfo",
    "Outcome",
    "PAYLOAD_OPTION",
    "PerProcess",
    "JobStates",
    "Publisher",
    "ReportedState",
    "PutBack",
    "PutBackReason",
    "RECORDED_FLAG",
    "RECORD_OPTION",
    "RECORD_TASK_OPTION",
    "Replay",
    "RetryPolicy",
    "UNREGISTERED_REASON",
    "UNSTARTED_ONLY",
    "Serializer",
    "StepSignal",
    "StepStore",
    "StoreSpec",
    "Sweeper",
    "UnsupportedInEagerMode",
    "ValueReader",
    "WorkerInterrupted",
    "body_traceback",
    "build_envelope",
    "cancel_run",
    "cancellation_option",
    "dead_letter_unregistered",
    "check_store_at_start",
    "check_store_spec",
    "claims_before_body",
    "classify",
    "driver_or_put_back",
    "envelope_arguments",
    "hand_off",
    "is_json",
    "log_worker_start",
    "new_run_key",
    "no_current_job",
    "record_at_publish",
    "register_adapter",
    "register_installation",
    "resolve_store",
    "resolve_store_spec",
    "resume_mark_at_publish",
    "retry_policy_option",
    "run_key_from",
    "settle_unclaimed_run",
    "start_recovery",
    "wants_record",
]
