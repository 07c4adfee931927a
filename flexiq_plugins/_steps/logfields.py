"""Log records that name the run: ``run_key``, ``job_id``, ``task`` and, inside a step body, ``step_key`` (C53).

Every record the library logs carries the four as attributes of the
``LogRecord`` (what ``extra=`` gives), so a JSON formatter writes them as
fields and a ``%(run_key)s`` format works. They are ``None`` where no job is
known (a recovery sweep, a worker's start line). A [`JobLogFilter`][flexiq_plugins.JobLogFilter] on each of the
library's loggers fills them in from the job being handled in the calling
context: the attempt sets it from its start to its outcome
(`job_log_fields`), and ``current_job`` covers the body. Attributes a caller
passed in ``extra=`` are kept.

Add a [`JobLogFilter`][flexiq_plugins.JobLogFilter] to your own handler to give your task's records the same fields.
"""

from __future__ import annotations

import logging
from contextvars import ContextVar, Token

from .context import current_job
from .journal import current_step_key

__all__ = ["LIBRARY_LOGGERS", "LOG_FIELDS", "JobLogFilter", "job_log_fields"]

LOG_FIELDS = ("run_key", "job_id", "task", "step_key")
"""The ``LogRecord`` attributes the filter sets."""

LIBRARY_LOGGERS = (
    "flexiq_plugins",
    "flexiq_plugins.operations",
    "flexiq_plugins.integration",
    "flexiq_plugins.registry",
    "flexiq_plugins.celery",
    "flexiq_plugins.dashboard",
    "dramatiq_ext.DurableSteps",
)
"""Every logger the library logs to; each gets a [`JobLogFilter`][flexiq_plugins.JobLogFilter] when this module is
imported."""

_handled: ContextVar[tuple[str, str, str] | None] = ContextVar("flexiq_log_job", default=None)


class job_log_fields:
    """Name the job ``(run_key, job_id, task)`` on every library record logged in this context for the block.

    Nested blocks naming the same job (the adapter's, the driver's, the
    attempt's) set nothing again: a job that takes no step pays for one
    context variable set, not one per layer (C43).

    Parameters:
      run_key (str): the job's run.
      job_id (str): the job's id.
      task (str): its task name.
    """

    __slots__ = ("_fields", "_token")

    def __init__(self, run_key: str, job_id: str, task: str) -> None:
        self._fields = (run_key, job_id, task)
        self._token: Token[tuple[str, str, str] | None] | None = None

    def __enter__(self) -> None:
        if _handled.get() != self._fields:
            self._token = _handled.set(self._fields)

    def __exit__(self, *exc: object) -> None:
        token, self._token = self._token, None
        if token is not None:
            _handled.reset(token)


class JobLogFilter(logging.Filter):
    """A `logging.Filter` that sets ``run_key``, ``job_id``, ``task`` and ``step_key`` on each record (C53).

    It never drops a record. Outside a job the four are ``None``; an
    attribute already on the record (passed with ``extra=``) is kept. Add it
    to a handler to name the run on your own records too:

    ```python
    handler.addFilter(flexiq_plugins.JobLogFilter())
    ```
    """

    def filter(self, record: logging.LogRecord) -> bool:
        """Set the fields on ``record``; return ``True``."""
        fields = record.__dict__
        if "run_key" in fields and "step_key" in fields:
            return True
        handled = _handled.get()
        if handled is None:
            job = current_job.get()
            handled = None if job is None else (job.run_key, job.job_id, job.task_name)
        run_key, job_id, task = handled if handled is not None else (None, None, None)
        fields.setdefault("run_key", run_key)
        fields.setdefault("job_id", job_id)
        fields.setdefault("task", task)
        fields.setdefault("step_key", current_step_key())
        return True


_FILTER = JobLogFilter()
for _name in LIBRARY_LOGGERS:
    _logger = logging.getLogger(_name)
    if not any(isinstance(f, JobLogFilter) for f in _logger.filters):
        _logger.addFilter(_FILTER)
