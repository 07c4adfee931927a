"""The worker side of a durable task: how Celery itself ended a job, told to the core (C38).

Some ends of a job happen in the worker's main process, where no task body
runs: a hard ``time_limit`` kills the pool process inside a step, a failure
is acknowledged, a cold shutdown kills the process running a step. Celery
handles them in its `Request`; durable tasks
use this subclass (``Task.Request``), which lets Celery do exactly what it
does, then reports what happened to the core, which settles the run:

- a hard time limit (the pool process is killed inside the body) or a
  failure Celery acknowledged (or rejected for good): the core settles the
  run as every failing end
  ([`AttemptDriver.framework_ended`][flexiq_plugins.integration.AttemptDriver.framework_ended]): with committed undos,
  it is taken from the killed attempt and published once more through the app, so its undos run (then ``compensated``);
  else it is ``failed`` (C32, C38, C45). Celery has already stored FAILURE
  (``TimeLimitExceeded``) for the task's result waiter;
- a cold shutdown that kills the process running the job, whose message
  Celery leaves to be delivered again: the run goes back to ``pending``
  without counting a takeover
  ([`AttemptDriver.worker_stopped`][flexiq_plugins.integration.AttemptDriver.worker_stopped]).

A revoke is reported by Celery's ``task_revoked`` signal (see
`celery_ext._signals`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from billiard.einfo import ExceptionWithTraceback
from billiard.exceptions import TimeLimitExceeded, WorkerLostError
from celery.exceptions import Ignore, Reject, Retry, Terminated
from celery.worker.request import Request

from flexiq_plugins import ConfigurationError, InvalidRunKey
from flexiq_plugins.integration import RECORDED_FLAG, AttemptDriver, Ended, run_key_from

from ._adapter import publisher
from ._options import RESUME_HEADER, RUN_KEY_HEADER
from ._runtime import runtime_of

__all__ = ["DurableRequest", "driver_for", "run_key_in"]

logger = logging.getLogger("flexiq_plugins.celery")

_NOT_AN_END = (Retry, Ignore, Reject, Terminated)
"""Failures that are not Celery ending the job: a retry, a put-back, a dead letter, a revoke (reported apart)."""


def run_key_in(headers: Mapping[str, Any], job_id: str) -> str | None:
    """The run key a message's headers carry (its job id if none), or ``None`` if the header is unusable."""
    carried = headers.get(RUN_KEY_HEADER) or (headers.get("headers") or {}).get(RUN_KEY_HEADER)
    try:
        return run_key_from(carried, job_id, where=f"{RUN_KEY_HEADER} header")
    except InvalidRunKey:
        return None


def driver_for(task: Any) -> AttemptDriver | None:
    """The driver of a durable task's app in this process; ``None`` for a task that is not durable, or no store."""
    runtime = runtime_of(task.app) if getattr(task, "durable", False) is not False else None
    if runtime is None:
        return None
    try:
        return runtime.driver()
    except ConfigurationError:  # the worker refused to start on it; its jobs are put back (C41)
        return None


class DurableRequest(Request):  # type: ignore[misc]
    """Celery's request, reporting to the core when Celery ends the job itself (C38)."""

    _flexiq_requeued = False

    def reject(self, requeue: bool = False) -> None:
        """Celery's reject; remembers whether the message goes back to the queue."""
        self._flexiq_requeued = requeue
        super().reject(requeue)

    def on_timeout(self, soft: bool, timeout: float) -> None:
        """Celery's handling; then a hard time limit whose message is gone ends the run: undos first (C32, C38)."""
        super().on_timeout(soft, timeout)
        if not soft:
            self._settle_if_gone(Ended.TIME_LIMIT, f"hard time limit ({timeout} s)")

    def on_failure(self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False) -> None:
        """Celery's handling; then a failure whose message is gone ends the run (if the attempt did not already).

        billiard reports a hard time limit here first (``TimeLimitExceeded``),
        then calls `on_timeout`, both before it terminates the process
        running the body: either report takes the run from that attempt.
        """
        super().on_failure(exc_info, send_failed_event=send_failed_event, return_ok=return_ok)
        error = exc_info.exception
        if isinstance(error, ExceptionWithTraceback):  # how a pool process sends its exception back
            error = error.exc
        if isinstance(error, TimeLimitExceeded):
            self._settle_if_gone(Ended.TIME_LIMIT, f"hard time limit ({error})")
        elif not isinstance(error, _NOT_AN_END):  # a lost worker's process died running the body
            killed = isinstance(error, WorkerLostError)
            self._settle_if_gone(Ended.FAILED, f"{type(error).__name__}: {error}", killed=killed)

    def cancel(self, pool: Any, signal: Any = None, emit_retry: bool = True) -> None:
        """Celery's cold-shutdown cancel (the process running the job is terminated); the run goes back."""
        super().cancel(pool, signal, emit_retry=emit_retry)
        if self.acknowledged:
            return
        driver, run_key = self._run()
        if driver is not None and run_key is not None and driver.worker_stopped(run_key):
            logger.info("job %s (run %s) goes back: the worker shut down while it ran", self.id, run_key)

    def _settle_if_gone(self, how: Ended, detail: str, *, killed: bool = False) -> None:
        """If Celery acknowledged the message, or rejected it for good, tell the core how the job ended."""
        if not self.acknowledged or self._flexiq_requeued:
            return
        driver, run_key = self._run()
        if driver is not None and run_key is not None and self._may_have_a_run(driver):
            driver.framework_ended(
                run_key, how, job_id=str(self.id), detail=detail, publisher=publisher(self.task.app), killed=killed
            )

    def _may_have_a_run(self, driver: AttemptDriver) -> bool:
        """Whether this job may have a run to settle: not a job of a task not known to take steps (C43).

        A job recorded at publish or continuing a run (the resume mark), or
        of a task declared ``durable=True`` or known to take steps in this
        process, may; any other job's failure is Celery's alone, with no
        store statement, as without the integration.
        """
        headers = self._request_dict
        if getattr(self.task, "durable", None) is True or headers.get(RECORDED_FLAG) or headers.get(RESUME_HEADER):
            return True
        return driver.known_tasks.is_known("celery", self.task.name)

    def _run(self) -> tuple[AttemptDriver | None, str | None]:
        driver = driver_for(self.task)
        return driver, run_key_in(self.request_dict, str(self.id)) if driver is not None else None
