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
from ._results import ResultKey, tell_waiter

__all__ = ["DramatiqAdapter", "DramatiqPublisher", "adapter", "publisher"]


def publisher(broker: Any) -> DramatiqPublisher:
    """A `DramatiqPublisher` on ``broker``.

    Parameters:
      broker (dramatiq.Broker): the broker to enqueue on.
    """
    return DramatiqPublisher(broker)


class DramatiqPublisher:
    """Re-publishes Dramatiq jobs on one broker (C11, C30, C36), answers their waiters (C45), reads their state (C47).

    Given a ``job_id`` it reuses that message id, so a ``Results`` waiter
    (``message.get_result()``) of a run woken by an event (C33) or recovered
    (C39) gets the run's outcome. Two messages of one id in the broker are
    harmless: the Redis broker gives each enqueue its own ``redis_message_id``,
    and the run's claim lets one delivery run the body. It also tells a job's
    result waiter how a run ended outside Dramatiq (C45).

    Parameters:
      broker (dramatiq.Broker): the broker.
    """

    def __init__(self, broker: Any) -> None:
        self.broker = broker

    def __call__(
        self, envelope: JobEnvelope, run_key: str, *, job_id: str | None = None, unstarted_only: bool = False
    ) -> str:
        """Enqueue ``envelope`` again carrying ``run_key``; return the message id (``job_id`` when given)."""
        message = republish(self.broker, envelope, run_key, message_id=job_id, unstarted_only=unstarted_only)
        return str(message.message_id)

    def report_ended(self, envelope: JobEnvelope, job_id: str, error: BaseException) -> bool:
        """Store ``error`` for message ``job_id`` in the broker's ``Results`` backend, if it stores results (C45)."""
        key = ResultKey(envelope.queue or "default", envelope.task_name, job_id, dict(envelope.options))
        return tell_waiter(self.broker, key, error if isinstance(error, Exception) else Exception(str(error)))

    def job_state(self, job_id: str, envelope: JobEnvelope) -> ReportedState | None:
        """What the broker's ``Results`` backend holds for ``job_id`` (see `dramatiq_ext._job_state.reported_state`)."""
        return reported_state(self.broker, job_id, envelope)


def _read_json(data: bytes) -> Any:
    return json.loads(data)["v"]


class DramatiqAdapter:
    """[`flexiq_plugins.integration.Adapter`][flexiq_plugins.integration.Adapter] for Dramatiq."""

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

    def tasks(self, target: object) -> Mapping[str, object]:
        """The broker's declared actors by name."""
        broker: Any = target  # a Dramatiq broker: owns() said so
        return {name: broker.get_actor(name) for name in sorted(broker.get_declared_actors())}


adapter = DramatiqAdapter()
"""The registered adapter instance."""
