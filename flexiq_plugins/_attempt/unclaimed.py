"""A lazy job's body before its first step: nothing of an attempt exists until the body takes one (C23, C43).

A first delivery of a job whose run was not recorded at publish claims its run
at the body's first use of ``current_job.step`` (``JobInfo.lazy``). Most such
jobs are of tasks that never take a step, and those must cost what they cost
without the integration (C43). So an unobserved lazy job runs its body under a
bare ``current_job`` and the job's log fields (C53), and nothing else: no
[`Attempt`][flexiq_plugins.integration.Attempt], no lease, no store connection.
The first read of ``current_job.step`` (or ``.attempt``)
makes the attempt, joins it to the running body and claims the run; from then
on the body is exactly an attempt that claimed lazily, and it concludes as one.
A body that returns or raises without a step ends as
[`ended_unclaimed`][flexiq_plugins.integration.AttemptDriver.ended_unclaimed] decides.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from .._steps.context import JobContext
from .._steps.logfields import job_log_fields
from . import decisions
from .attempt import Attempt, AttemptHost
from .job import JobInfo

__all__ = ["Unclaimed"]


class Unclaimed:
    """One lazy job's body, run with ``current_job`` set and no attempt until its first step.

    Parameters:
      driver (AttemptHost): the driver whose attempt the job becomes at its first step.
      job (JobInfo): a ``lazy`` job, its run key checked.
      owner (str | None): the claim's owner; ``None``: this process's.
    """

    __slots__ = ("_attempt", "_context", "_done", "_driver", "_job", "_making", "_owner", "_thread")

    def __init__(self, driver: AttemptHost, job: JobInfo, owner: str | None = None) -> None:
        self._driver = driver
        self._job = job
        self._owner = owner
        self._attempt: Attempt | None = None
        self._done = False
        self._making = threading.Lock()  # two threads of the body that first take a step at once make one attempt
        self._thread = 0
        self._context = JobContext(job.run_key, job.job_id, None, job.name, None, claim=self._claim)

    def run(self, body: Callable[[], Any]) -> decisions.Decision:
        """Run ``body()`` as the job's body in the calling thread; return the one decision it ends with."""
        self._thread = threading.get_ident()
        job = self._job
        with job_log_fields(job.run_key, job.job_id, job.name):  # this job, even inside another's body (C53)
            tokens = self._context.enter()
            try:
                try:
                    value = body()
                finally:
                    self._leave(tokens)
            except BaseException as exc:
                return self._conclude(None, exc)
            return self._conclude(value, None)

    def _claim(self) -> None:
        """The body's first ``current_job.step``: make the attempt, join it to the body, claim the run (C23).

        Raises:
          ClaimRefused: the claim ended the attempt (as `Attempt.claim_now`).
          RuntimeError: the body has already ended (a thread it left behind asks).
        """
        attempt = self._attempt
        if attempt is None:
            with self._making:
                if self._done:
                    raise RuntimeError(f"job {self._job.job_id} (run {self._job.run_key}) has ended: no step can run")
                attempt = self._attempt
                if attempt is None:
                    attempt = Attempt(self._driver, self._job, None, owner=self._owner, context=self._context)
                    attempt.join_running_body(self._thread)
                    self._attempt = attempt
        attempt.claim_now()

    def _leave(self, tokens: tuple[Any, Any]) -> None:
        with self._making:
            self._done = True
            attempt = self._attempt
        if attempt is None:
            self._context.leave(tokens)
        else:
            attempt.leave_body(tokens)

    def _conclude(self, value: Any, error: BaseException | None) -> decisions.Decision:
        attempt = self._attempt
        if attempt is None:
            return self._driver.ended_unclaimed(self._job, value, error)
        try:
            return attempt.conclude(value=value, error=error)
        finally:
            attempt.give_connection_back()
