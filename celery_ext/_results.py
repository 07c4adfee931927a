"""Telling a job's result waiter how its run ended when Celery itself never will (C45).

A run cancelled by its own attempt (at a step boundary, or over a cap) ends
with an ``Ack`` whose ``Ignore`` leaves the result backend alone; a run
cancelled from outside ([`flexiq_plugins.cancel_run`][flexiq_plugins.cancel_run]) ends while none of
its job's messages is being handled. Either way ``AsyncResult.get()`` would
wait for ever. Here the error the core gives (a
[`JobCancelled`][flexiq_plugins.errors.JobCancelled]) is stored as the task's
FAILURE, as Celery's tracer stores a failure: ``get()`` raises it, and with
the request at hand ``link_error`` callbacks, a chain and a chord hear of it.

Nothing is stored where the task keeps no results (no backend, or
``ignore_result`` without ``store_errors_even_if_ignored``) or where the
backend already holds a ready state for the task id: what Celery reported
itself (a ``REVOKED`` after ``revoke()``) wins.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import states
from celery.backends.base import DisabledBackend

__all__ = ["tell_waiter"]

logger = logging.getLogger("flexiq_plugins.celery")


def tell_waiter(task: Any, job_id: str, error: BaseException, *, request: Any = None) -> bool:
    """Store ``error`` as the FAILURE of the task id ``job_id`` of ``task`` (C45); return whether it was stored.

    Parameters:
      task (celery.Task | None): the job's task (its backend and result
        options); ``None``: a task this process does not have, whose result
        is then not stored.
      job_id (str): the task id the waiter holds.
      error (BaseException): what ``AsyncResult.get()`` raises.
      request (celery.app.task.Context | None): the request being handled, if
        any: its errbacks, chain and chord hear of the failure too.

    Raises:
      Exception: whatever the result backend raises.
    """
    if task is None or (request is not None and request.is_eager):
        return False
    backend = task.backend
    ignored = task.ignore_result or (request is not None and request.ignore_result)
    if isinstance(backend, DisabledBackend) or (ignored and not task.store_errors_even_if_ignored):
        return False
    if backend.get_state(job_id) in states.READY_STATES:
        return False
    backend.mark_as_failure(job_id, error, request=request)
    logger.debug("job %s: its result waiter is told %s", job_id, type(error).__name__)
    return True
