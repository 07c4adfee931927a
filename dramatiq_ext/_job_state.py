"""What a Dramatiq broker's ``Results`` backend says of a job, read by recovery before it re-publishes one (C47).

A job recorded at publish that a worker without the middleware ran leaves its
run ``queued``; an actor with ``store_results=True`` left its value or its
error in the ``Results`` backend. Recovery reads it first and settles the run
to match instead of running the body again.
"""

from __future__ import annotations

from typing import Any

import dramatiq
from dramatiq.results import ResultFailure, ResultMissing, Results

from flexiq_plugins.integration import JobEnvelope, ReportedState

__all__ = ["reported_state"]


def reported_state(broker: Any, job_id: str, envelope: JobEnvelope) -> ReportedState | None:
    """``"succeeded"`` (a stored value) or ``"failed"`` (a stored error) for message ``job_id``, else ``None`` (C47).

    One read of the ``Results`` backend, never a wait. ``None``: the broker
    has no ``Results`` middleware, or nothing is stored for the message
    (the actor does not store results, the job has not finished, or its
    result expired).

    Raises:
      Exception: the backend could not be read (connection refused, timeout).
    """
    results = next((m for m in broker.middleware if isinstance(m, Results)), None)
    if results is None:
        return None
    message: dramatiq.Message[Any] = dramatiq.Message(
        queue_name=envelope.queue or "default",
        actor_name=envelope.task_name,
        args=(),
        kwargs={},
        options={},
        message_id=job_id,
    )
    try:
        results.backend.get_result(message, block=False)
    except ResultMissing:
        return None
    except ResultFailure:
        return "failed"
    return "succeeded"
