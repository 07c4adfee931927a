"""What a Celery app's result backend says of a job, read by recovery before it re-publishes one (C47).

A job recorded at publish that a worker without the integration ran (a
forgotten ``celery_ext.install``) leaves its run ``queued``; Celery stored
its SUCCESS or FAILURE in the app's result backend. Recovery reads that state
first and settles the run to match instead of running the body again.
"""

from __future__ import annotations

from typing import Any

from flexiq_plugins.integration import ReportedState

__all__ = ["reported_state"]

_TERMINAL: dict[str, ReportedState] = {"SUCCESS": "succeeded", "FAILURE": "failed", "REVOKED": "cancelled"}


def reported_state(app: Any, job_id: str) -> ReportedState | None:
    """The terminal state ``app``'s result backend holds for task id ``job_id``, else ``None`` (C47).

    One read of the backend (``backend.get_state``), never a wait. ``None``:
    no backend is configured (``DisabledBackend``), the backend is ``rpc://``
    (its results go to the caller only: nothing to read here), or the state is
    not terminal (``PENDING``, ``STARTED``, ``RETRY``; a result past its
    expiry reads ``PENDING``).

    Raises:
      Exception: the backend could not be read (connection refused, timeout).
    """
    from celery.backends.base import DisabledBackend
    from celery.backends.rpc import RPCBackend

    backend = app.backend
    if isinstance(backend, (DisabledBackend, RPCBackend)):
        return None
    return _TERMINAL.get(str(backend.get_state(job_id)))
