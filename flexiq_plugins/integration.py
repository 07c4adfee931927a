"""Everything a framework adapter needs from the core, in one public module.

``celery_ext`` and ``dramatiq_ext`` import only this module and the package
root; a third integration would too. The shape of an adapter:

1. At publish, stamp a run key on each new job ([`new_run_key`][flexiq_plugins.integration.new_run_key]) and,
   on a job's first publish ([`first_publish`][flexiq_plugins.integration.first_publish]: a minted, a
   producer-chosen or a derived key) of a task known to take steps
   ([`durable_at_publish`][flexiq_plugins.integration.durable_at_publish], C43) unless the task or the message opts
   out ([`wants_record`][flexiq_plugins.integration.wants_record]), record its run ``queued`` before the message
   leaves unless it exists ([`record_at_publish`][flexiq_plugins.integration.record_at_publish], C39, C46); flag the
   message with [`RECORDED_FLAG`][flexiq_plugins.integration.RECORDED_FLAG] when it was recorded. A job the
   framework dispatches on behalf of a run (a callback, a chain's next task,
   a pipeline's next stage) gets a key derived from the run's
   ([`derived_run_key`][flexiq_plugins.integration.derived_run_key]) when the attempt
   [`belongs_to_a_run`][flexiq_plugins.integration.belongs_to_a_run] (C44). A worker starts recovery with
   [`start_recovery`][flexiq_plugins.integration.start_recovery] (C39).
2. At delivery, describe the message as a [`JobInfo`][flexiq_plugins.integration.JobInfo] (the run key by
   [`run_key_from`][flexiq_plugins.integration.run_key_from], the envelope by
   [`build_envelope`][flexiq_plugins.integration.build_envelope]) and run it with the per-process
   [`AttemptDriver`][flexiq_plugins.integration.AttemptDriver] ([`PerProcess`][flexiq_plugins.integration.PerProcess]):
   ``driver.run_job(job, body)``.
3. Translate the [`Decision`][flexiq_plugins.integration.Decision] into the framework's verb with ``match`` and
   ``assert_never`` (see `flexiq_plugins._attempt.decisions` for each outcome's verb). The
   core has already decided everything that does not depend on the framework.
   A put-back re-enqueues the same job carrying the run's key (C36) through
   [`hand_off`][flexiq_plugins.integration.hand_off]; if it still fails, the message stays in the broker.
4. Register an [`Adapter`][flexiq_plugins.integration.Adapter] under the entry point group
   ``flexiq_plugins.adapters`` so the operator tools can re-publish its jobs.

Options are one frozen [`DurableConfig`][flexiq_plugins.DurableConfig] (subclass it for options of
your own), the store comes from [`resolve_store`][flexiq_plugins.integration.resolve_store]. A task's or actor's
own ``step_retry`` option (C31) is checked with [`retry_policy_option`][flexiq_plugins.integration.retry_policy_option]
and travels in `JobInfo.step_retry`; its run caps (``max_run_seconds``,
``max_suspended_seconds``, C34) are checked with [`cancellation_option`][flexiq_plugins.integration.cancellation_option]
and travel in `JobInfo.cancellation`. When the framework gives up on a
[`Failure`][flexiq_plugins.integration.Failure], call
[`AttemptDriver.give_up`][flexiq_plugins.integration.AttemptDriver.give_up]: a run with undos to run (C32) comes back as
a [`PutBack`][flexiq_plugins.integration.PutBack] to re-enqueue. A worker that receives a recorded job for a task or
actor it does not have (the framework discards the message) calls
[`dead_letter_unregistered`][flexiq_plugins.integration.dead_letter_unregistered] from the framework's hook, so the run
is dead-lettered instead of staying ``queued`` (C39). A store setting is
checked when the integration is configured ([`check_store_spec`][flexiq_plugins.integration.check_store_spec]) and the
store is reached once when a worker starts ([`check_store_at_start`][flexiq_plugins.integration.check_store_at_start]),
so a misconfiguration stops the worker with one line instead of failing jobs
(C41); a job that cannot open its store is put back
([`driver_or_put_back`][flexiq_plugins.integration.driver_or_put_back]), never acknowledged away.

At publish, an adapter carries the publishing span's trace context in the
message under [`TRACE_HEADER`][flexiq_plugins.integration.TRACE_HEADER]
([`publishing_trace`][flexiq_plugins.integration.publishing_trace]) and hands it
back at delivery in `JobInfo.publish_trace`, so the run's first attempt links
to its publisher (C53); it wraps its handling of a message in
[`job_log_fields`][flexiq_plugins.integration.job_log_fields] so its own log
records name the run.

An integration configured in a process calls [`register_installation`][flexiq_plugins.integration.register_installation]
with its app or broker, so [`flexiq_plugins.send_event`][flexiq_plugins.send_event] and
[`flexiq_plugins.cancel_run`][flexiq_plugins.cancel_run] called there use its store and wake runs
through it (C33, C34). Every terminal ending the framework reports by itself
(a revoke, an expiry, a skip, a hard time limit, an age limit, a failure it
acknowledged) goes to [`AttemptDriver.framework_ended`][flexiq_plugins.integration.AttemptDriver.framework_ended] with
the adapter's publisher: the core settles it one way, its undos included
(C32, C34, C38, C45). An adapter's publisher is also a
[`ResultReporter`][flexiq_plugins.integration.ResultReporter], and an ``Ack`` carrying an ``error`` (a cancelled
run) is stored as the job's result before the acknowledgement, so a result
waiter always gets a terminal state (C45).
"""

from __future__ import annotations

from ._attempt.attempt import Attempt
from ._attempt.cancellation import CancelResult
from ._attempt.decisions import (
    Ack,
    AckReason,
    Completed,
    DeadLetter,
    Decision,
    Ended,
    Failure,
    PutBack,
    PutBackReason,
    Replay,
    belongs_to_a_run,
)
from ._attempt.driver import AttemptDriver
from ._attempt.job import JobInfo
from ._delivery.cancel import cancel_run
from ._delivery.jobs import (
    PAYLOAD_OPTION,
    body_traceback,
    build_envelope,
    claims_before_body,
    envelope_arguments,
    first_publish,
    is_json,
    resume_mark_at_publish,
)
from ._delivery.recording import (
    RECORD_OPTION,
    RECORD_TASK_OPTION,
    RECORDED_FLAG,
    durable_at_publish,
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
    ResultReporter,
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
from ._model.identity import derived_run_key, new_run_key, run_key_from
from ._model.policies import CancellationPolicy, RetryPolicy, cancellation_option, retry_policy_option
from ._model.records import JobEnvelope
from ._observe import TRACE_HEADER, publishing_trace
from ._steps.context import no_current_job
from ._steps.logfields import job_log_fields
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
    "Decision",
    "PAYLOAD_OPTION",
    "PerProcess",
    "JobStates",
    "Publisher",
    "ReportedState",
    "ResultReporter",
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
    "TRACE_HEADER",
    "UnsupportedInEagerMode",
    "ValueReader",
    "WorkerInterrupted",
    "belongs_to_a_run",
    "body_traceback",
    "build_envelope",
    "cancel_run",
    "cancellation_option",
    "dead_letter_unregistered",
    "derived_run_key",
    "check_store_at_start",
    "check_store_spec",
    "claims_before_body",
    "classify",
    "driver_or_put_back",
    "envelope_arguments",
    "first_publish",
    "hand_off",
    "is_json",
    "log_worker_start",
    "job_log_fields",
    "new_run_key",
    "no_current_job",
    "publishing_trace",
    "durable_at_publish",
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
