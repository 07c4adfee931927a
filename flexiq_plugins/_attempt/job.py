"""A job as the core sees it: one framework message, translated by its adapter."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from .._model.policies import CancellationPolicy, RetryPolicy
from .._model.records import (
    JobEnvelope,
)

__all__ = ["JobInfo"]


@dataclass
class JobInfo:
    """One framework message, as the core sees it; an adapter makes one per delivery and changes none.

    A plain (not frozen) dataclass: made for every message a worker handles,
    it costs a third of a frozen one (C43).

    Parameters:
      run_key (str): the run key the message carries (or its job id, C1 words).
      job_id (str): the framework's job id.
      envelope (JobEnvelope | Callable[[], JobEnvelope]): what re-publishes the
        job (C35); or a function that builds it, called once, when the run is
        claimed (a job that takes no step never builds it).
      step_retry (RetryPolicy | None): the task's or actor's default budget for
        its steps (its ``step_retry`` option, C31); ``None``: the integration's.
      cancellation (CancellationPolicy | None): the task's or actor's run caps
        (``max_run_seconds``, ``max_suspended_seconds``, C34); each cap it
        leaves off is the integration's.
      eager (bool): the job runs in the caller's process with no broker
        (Celery's ``task_always_eager``, ``Task.apply``): it cannot be put
        back, so a sleep fails its run instead of leaving one to resume (C38).
      lazy (bool): claim the run at the body's first use of ``current_job.step``
        (or ``current_job.attempt``) instead of before the body: a body that
        takes no step does no store I/O at all. Adapters set it for a first
        delivery of a new job that was not recorded at publish; a delivery
        that may continue a run (a retry, a put-back, a redelivery, a
        re-publish, a producer's own run key) or whose run was recorded at
        publish claims before the body, so its run is settled however the
        body ends ([`claims_before_body`][flexiq_plugins.integration.claims_before_body]).
      task_name (str | None): the task or actor name; ``None``: the envelope's.
      unstarted_only (bool): recovery's copy of a run that was still ``queued``
        (C39): it runs only while the run has never started; once another
        delivery (the original, out of a backlog) has claimed it, the copy is
        acknowledged as a duplicate (or replays a finished run's outcome).
      publish_trace (str | None): the W3C ``traceparent`` of the span that
        published the job, when its message carries one (C53): the run's
        first traced attempt links to it.
    """

    run_key: str
    job_id: str
    envelope: JobEnvelope | Callable[[], JobEnvelope]
    step_retry: RetryPolicy | None = None
    cancellation: CancellationPolicy | None = None
    eager: bool = False
    lazy: bool = False
    task_name: str | None = None
    unstarted_only: bool = False
    publish_trace: str | None = None

    @functools.cached_property
    def job_envelope(self) -> JobEnvelope:
        """The envelope, built now if it was given as a function (once)."""
        envelope = self.envelope
        return envelope if isinstance(envelope, JobEnvelope) else envelope()

    @property
    def name(self) -> str:
        """The task or actor name."""
        return self.task_name if self.task_name is not None else self.job_envelope.task_name
