"""The Dramatiq adapter as the core's registry sees it (entry point ``flexiq_plugins.adapters: dramatiq``).

The operator tools (``flexiq dlq retry``, ``flexiq recover``) re-publish a
Dramatiq job on the broker given with ``--broker``; this object tells them
which objects are Dramatiq brokers, how to publish on one, and how to read the
step values Dramatiq's JSON encoder stored.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from flexiq_plugins.integration import JobEnvelope, Publisher, ReportedState, ValueReader

from ._actor import Body, unwrap_durable
from ._envelope import republish
from ._job_state import reported_state

__all__ = ["DramatiqAdapter", "DramatiqPublisher", "adapter", "publisher"]


class DramatiqPublisher:
    """Re-publishes Dramatiq jobs on one broker, carrying the run key (C11, C30, C36), and reads their state (C47).

    Given a ``job_id`` it reuses that message id, so a ``Results`` waiter
    (``message.get_result()``) of a run woken by an event (C33) or recovered
    (C39) gets the run's outcome. Two messages of one id in the broker are
    harmless: the Redis broker gives each enqueue its own ``redis_message_id``,
    and the run's claim lets one delivery run the body.

    Parameters:
      broker(dramatiq.Broker): the broker to enqueue on.
    """

    def __init__(self, broker: Any) -> None:
        self.broker = broker

    def __call__(
        self, envelope: JobEnvelope, run_key: str, *, job_id: str | None = None, unstarted_only: bool = False
    ) -> str:
        """Enqueue ``envelope`` again carrying ``run_key``; return the message id (``job_id`` when given)."""
        message = republish(self.broker, envelope, run_key, message_id=job_id, unstarted_only=unstarted_only)
        return str(message.message_id)

    def job_state(self, job_id: str, envelope: JobEnvelope) -> ReportedState | None:
        """What the broker's ``Results`` backend holds for ``job_id`` (see ``_job_state.reported_state``)."""
        return reported_state(self.broker, job_id, envelope)


def publisher(broker: Any) -> Publisher:
    """A :class:`DramatiqPublisher` on ``broker``.

    Parameters:
      broker(dramatiq.Broker): the broker to enqueue on.
    """
    return DramatiqPublisher(broker)


def _read_json(data: bytes) -> Any:
    return json.loads(data)["v"]


class DramatiqAdapter:
    """:class:`flexiq_plugins.integration.Adapter` for Dramatiq."""

    framework = "dramatiq"
    publish_hint = "--broker module:broker"

    def owns(self, target: object) -> bool:
        """Whether ``target`` is a Dramatiq broker."""
        import dramatiq

        return isinstance(target, dramatiq.Broker)

    def publisher(self, target: object) -> Publisher:
        """A publisher on the broker ``target``."""
        return publisher(target)

    def value_readers(self) -> Mapping[str, ValueReader]:
        """Dramatiq's JSON encoder, whose values are stored as ``{"v": value}``."""
        return {"dramatiq:json": _read_json}

    def task_body(self, task: object) -> Callable[..., Any] | None:
        """A Dramatiq actor's own function (unwrapped from the middleware and ``async_to_sync``), else ``None``."""
        import dramatiq

        if not isinstance(task, dramatiq.Actor):
            return None
        return Body(unwrap_durable(task.fn)).target


adapter = DramatiqAdapter()
"""The registered adapter instance."""
