"""The durable task class: one attempt of the core around each execution of the body.

Celery's tracer calls ``task(*args, **kwargs)`` when a task class defines
``__call__``; [`DurableTask`][celery_ext.DurableTask] does, so every delivery of a durable task
goes through `DurableTask.__call__`:

``__call__ → AttemptDriver.run_job(job, body) → act(decision)``

Before ``act``, the jobs the tracer will publish on behalf of the run (its
callbacks, its chain's next task, a chord's body) get run keys derived from
the run's (`celery_ext._dispatch`, C44).

The body is the task's ``run`` (with ``autoretry_for`` already wrapped around
it by Celery) or a user base class's own ``__call__``. Whatever it raises is
handed to the core, which classifies it before any retry filter (C28, C29);
step signals are ``BaseException`` and end inside the core, so none ever
reaches Celery's tracer (which would leave the message unacknowledged on the
solo and threads pools).

When the pool terminates the process running a body (a cold shutdown, a
``revoke(terminate=True)``, a hard time limit), billiard raises
``SystemExit`` in it. The core hears it as a
[`WorkerInterrupted`][flexiq_plugins.errors.WorkerInterrupted]: the interrupted step
commits nothing and the run's claim is released, so the message Celery gives
back is claimed again at once, without a takeover (C38); then the
``SystemExit`` goes on. What Celery decided for the job itself (a revoke, a
time limit) is settled by `celery_ext._request` and the ``task_revoked``
receiver.
"""

from __future__ import annotations

import functools
import os
import sys
from contextvars import ContextVar
from typing import Any

from billiard.common import terminate_handler_fired
from celery import Task
from celery.exceptions import Ignore

from flexiq_plugins import current_job
from flexiq_plugins.integration import (
    Completed,
    Disposition,
    RetryPolicy,
    StepSignal,
    WorkerInterrupted,
    belongs_to_a_run,
    classify,
    job_log_fields,
    no_current_job,
)

from ._dispatch import stamp_dispatches
from ._envelope import job_info, without_unstarted_only
from ._options import RESUME_HEADER, RUN_KEY_HEADER
from ._runtime import Runtime, runtime_of
from ._verbs import act

__all__ = ["ACK_DEFAULTS", "DurableTask"]

ACK_DEFAULTS = ("acks_late", "reject_on_worker_lost")
"""Task attributes turned on for tasks known to take steps unless the task sets them (C26, C43)."""

_NEVER_RETRIED = (Disposition.DEAD_LETTER, Disposition.SLEEP)

_in_body: ContextVar[Any] = ContextVar("flexiq_celery_in_body", default=None)
"""The request whose durable body runs in this context: a call of the task under it is a plain call."""


class DurableTask(Task):  # type: ignore[misc]
    """A Celery task whose body may use ``current_job.step`` (C5–C30).

    ``celery_ext.install`` makes it the app's default ``Task`` base and mixes
    it into tasks that have their own ``base=``; you rarely name it yourself.
    ``@app.task(durable=False)`` opts a task out: it then runs exactly as
    plain Celery would, and ``current_job`` is not available in it.
    ``@app.task(durable=True)`` declares it durable up front: its jobs are
    recorded at publish from the first one and it is acknowledged late
    (C26, C39). Unset, the library learns it: a task is known to take steps
    once one of its attempts took one (C43); until then it keeps Celery's
    acknowledgement and its jobs are claimed at their first step.
    ``@app.task(step_retry=RetryPolicy(max_attempts=3))`` gives every
    ``step.run`` of the task that budget unless the call passes its own
    ``retry=`` (C31); the integration's ``step_retry`` option applies otherwise.
    ``@app.task(max_run_seconds="7d", max_suspended_seconds="3d")`` caps each
    run's duration and its time in sleeps and waits: over a run cap it is
    cancelled (C34); the integration's options apply otherwise.
    ``@app.task(record_at_publish=False)`` publishes the task's new jobs
    without recording their runs first (C39): one store write less per
    publish, and a message lost before a worker starts it is lost for good.
    """

    durable: bool | None = None
    record_at_publish: bool | None = None
    step_retry: RetryPolicy | None = None
    max_run_seconds: float | str | None = None
    max_suspended_seconds: float | str | None = None
    Request = "celery_ext._request:DurableRequest"
    """The worker-side request that tells the core when Celery ends a job itself (C38)."""
    _flexiq_explicit: frozenset[str] = frozenset()

    @classmethod
    def bind(cls, app: Any) -> Any:
        """Bind to ``app``; a task declared ``durable=True`` defaults to ``acks_late`` and ``reject_on_worker_lost``
        (C26); a task learned later gets them when a worker starts (`celery_ext._prepare.acknowledge_late`, C43)."""
        if not cls.__dict__.get("__bound__", False) and "_flexiq_explicit" not in cls.__dict__:
            cls._flexiq_explicit = frozenset(a for a in ACK_DEFAULTS if getattr(cls, a, None) is not None)
        bound = super().bind(app)
        if cls.durable is True and runtime_of(app) is not None:
            for attr in ACK_DEFAULTS:
                if attr not in cls._flexiq_explicit:
                    setattr(cls, attr, True)
        return bound

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run one attempt of the job being executed (or the plain body when not durable)."""
        request = self.request
        runtime = runtime_of(self.app) if self.durable is not False else None
        if runtime is None:
            return self._flexiq_body(args, kwargs)
        if request.called_directly or _in_body.get() is request:
            # task(...) as a plain function, also inside its own body (Celery's request is then the outer
            # job's): no durable job of its own, not even the outer one; the outer attempt is untouched
            with no_current_job(self.name):
                return self._flexiq_body(args, kwargs)
        return _run_attempt(self, runtime, request, args, kwargs)

    def retry(  # noqa: PLR0917 - the signature of Celery's Task.retry
        self,
        args: Any = None,
        kwargs: Any = None,
        exc: BaseException | None = None,
        throw: bool = True,
        eta: Any = None,
        countdown: float | None = None,
        max_retries: int | None = None,
        **options: Any,
    ) -> Any:
        """Celery's ``retry``, except for step signals and dead-letter errors, which it re-raises.

        ``autoretry_for=(Exception,)`` or a ``self.retry()`` in an ``except``
        block would otherwise publish a retry for an error that is never
        retried (C13, C29) or for a sleep that is not a failure (C16).
        """
        pending = exc if exc is not None else sys.exc_info()[1]
        if pending is not None and (isinstance(pending, StepSignal) or classify(pending) in _NEVER_RETRIED):
            raise pending
        options = _retry_options(self.request, options)
        return super().retry(args, kwargs, exc, throw, eta, countdown, max_retries, **options)

    def _flexiq_body(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Call the body as Celery would have without this class."""
        if _next_call_is_celerys(type(self)):  # type: ignore[arg-type]  # classes are hashable
            return self.run(*args, **kwargs)
        return super().__call__(*args, **kwargs)


def _retry_options(request: Any, options: dict[str, Any]) -> dict[str, Any]:
    """The retry's options: it carries the run key, and resumes the run if this attempt claimed it (C11, C23).

    An eager retry is applied at once under the same task id but would get a
    run of its own (`celery_ext._envelope.job_info`): it carries the
    run key. A retry of an attempt that claimed its run claims before its
    body runs, so the run is settled however the retry ends; one of an
    attempt that took no step still claims at its first step, so a
    step-less task's eager retry writes nothing either (C43).
    """
    job = current_job.get()
    if job is None or not (request.is_eager or job.claimed):
        return options
    headers = {**without_unstarted_only(request.headers), **(options.get("headers") or {}), RUN_KEY_HEADER: job.run_key}
    headers[RESUME_HEADER] = job.claimed
    return {**options, "headers": headers}


@functools.cache
def _next_call_is_celerys(cls: type) -> bool:
    """Whether the ``__call__`` after [`DurableTask`][celery_ext.DurableTask] in ``cls``'s MRO is Celery's own."""
    mro = cls.__mro__
    for klass in mro[mro.index(DurableTask) + 1 :]:
        if "__call__" in klass.__dict__:
            return klass is Task
    return True


def _run_attempt(
    task: DurableTask, runtime: Runtime, request: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    job = job_info(task, request, lambda: runtime.driver().known_tasks)
    handed_on: list[Ignore] = []
    exiting: list[SystemExit] = []

    def body() -> Any:
        token = _in_body.set(request)
        try:
            return task._flexiq_body(args, kwargs)
        except Ignore as exc:  # self.replace() and friends: the job is handed on, the run is done
            handed_on.append(exc)
            return None
        except SystemExit as exc:
            if not terminate_handler_fired():
                raise  # the body's own sys.exit()
            exiting.append(exc)  # the pool terminates this process: a cold shutdown, a revoke, a time limit
            raise WorkerInterrupted(f"the worker process {os.getpid()} is being terminated") from exc
        finally:
            _in_body.reset(token)

    # the attempt names the run on every record it logs (C53): the driver while it claims and concludes,
    # current_job while the body runs; what follows names it too
    decision = runtime.driver().run_job(job, body) if request.is_eager else runtime.run_job(job, body)
    if handed_on and isinstance(decision, Completed):
        raise handed_on[0]
    if exiting:
        raise exiting[0]  # the process goes on exiting; Celery gives the unfinished message back (C38)
    if type(decision) is Completed and not decision.claimed:  # a body that took no step: its value, as is (C43)
        return decision.value
    with job_log_fields(job.run_key, job.job_id, job.name):
        if not request.is_eager and belongs_to_a_run(decision):
            stamp_dispatches(request, job.run_key)  # its callbacks, chain and chord body are runs of their own (C44)
        try:
            return act(task, request, runtime, job, decision)
        finally:
            del decision  # an error raised from here must not hold the decision through this frame (no cycle)
