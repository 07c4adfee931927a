"""The dead-letter path of a Celery job (C13, C29, C30).

By the time an adapter sees a [`DeadLetter`][flexiq_plugins.integration.DeadLetter]
the store has already recorded the dead letter (task, arguments, run key,
reason, traceback). What is left is the broker's side:

- RabbitMQ has a native path: [`DeadLetterReject`][celery_ext.DeadLetterReject] is a
  ``Reject(requeue=False)``, so a queue declared with
  ``x-dead-letter-exchange`` hands the message to its dead-letter exchange.
- Redis has none: the job is first published, unchanged but for a
  ``flexiq_dead_letter`` header, to a plain queue (``flexiq.dead_letter`` by
  default) that no worker consumes, and then rejected without requeue, which
  on Redis acknowledges it. Nothing reads that list, so it is bounded: after
  each publish it is trimmed to its newest ``dead_letter_queue_max_length``
  messages (``LTRIM``). The store's dead-letter table, which ``flexiq dlq``
  reads and retries from, is the record; the list is a copy for inspection.

Either way Celery's worker stores FAILURE with this exception in the result
backend, so ``AsyncResult.get()`` raises [`DeadLetterReject`][celery_ext.DeadLetterReject] (a
[`DeadLettered`][flexiq_plugins.errors.DeadLettered]) instead of waiting forever, and
no retry policy is ever consulted: ``Reject`` is not a failure Celery retries.
"""

from __future__ import annotations

import logging
from typing import Any

from celery.exceptions import Reject

from flexiq_plugins.integration import DeadLetter, DeadLettered

__all__ = ["DEAD_LETTER_HEADER", "DeadLetterReject", "dead_letter_error", "publish_dead_letter", "trim_redis_queue"]

logger = logging.getLogger("flexiq_plugins.celery")

DEAD_LETTER_HEADER = "flexiq_dead_letter"
"""Header of a message in the dead-letter queue: the reason kind, e.g. ``"divergence"``."""


class DeadLetterReject(Reject, DeadLettered):  # type: ignore[misc]
    """``Reject(requeue=False)`` that is also a [`DeadLettered`][flexiq_plugins.errors.DeadLettered] (C30).

    Parameters:
      reason (str): ``"<reason kind>: <message>"``.
      requeue (bool): always ``False``; accepted so that Celery's result
        backend can rebuild the exception from its stored arguments.
    """

    def __init__(self, reason: str = "", requeue: bool = False) -> None:
        Reject.__init__(self, reason, False)

    def __str__(self) -> str:
        return str(self.reason)


def publish_dead_letter(task: Any, request: Any, decision: DeadLetter, queue: str, max_length: int | None) -> None:
    """Publish the job of ``request`` to the dead-letter ``queue`` (Redis and other brokers), then bound it.

    On Redis the queue's list is trimmed to its newest ``max_length``
    messages (``None``: not trimmed); other brokers' queues are left to their
    own limits (a RabbitMQ ``max-length`` policy). A failure to publish or
    trim is logged, not raised: the store already holds the dead letter, and
    ``flexiq dlq retry`` works from the store alone.

    Parameters:
      task (Any): the Celery task.
      request (Any): the dead-lettered job's request.
      outcome (DeadLetter): the dead letter (its reason becomes the header).
      queue (str): the dead-letter queue (option ``dead_letter_queue``).
      max_length (int | None): messages kept (option ``dead_letter_queue_max_length``).
    """
    headers = {**(request.headers or {}), DEAD_LETTER_HEADER: decision.reason}
    signature = task.signature_from_request(request, queue=queue, retries=request.retries, headers=headers)
    try:
        signature.apply_async()
    except Exception:
        logger.exception(
            "job %s was dead-lettered in the store but could not be published to queue %r",
            request.id,
            queue,
        )
        return
    if max_length is not None:
        try:
            trim_redis_queue(task.app, queue, max_length)
        except Exception:
            logger.exception("the dead-letter queue %r could not be trimmed to %d messages", queue, max_length)


def trim_redis_queue(app: Any, queue: str, max_length: int) -> None:
    """Keep the newest ``max_length`` messages of ``queue`` on a Redis broker; nothing on another broker.

    kombu pushes a message to the left of the list of its priority (one list
    per priority step, the first being the queue's own name), so
    ``LTRIM key 0 max_length-1`` drops the oldest of each.
    """
    with app.pool.acquire(block=True) as conn:
        if conn.transport.driver_type != "redis":
            return
        channel = conn.default_channel
        with channel.client.pipeline() as pipe:
            for priority in channel.priority_steps:
                pipe.ltrim(channel._q_for_pri(queue, priority), 0, max_length - 1)
            pipe.execute()


def dead_letter_error(decision: DeadLetter) -> DeadLetterReject:
    """The exception that ends a dead-lettered job's attempt."""
    return DeadLetterReject(f"{decision.reason}: {decision.message}")
