"""The dead-letter path of a Celery job (C13, C29, C30).

By the time an adapter sees a :class:`~flexiq_plugins._attempt.decisions.DeadLetter`
the store has already recorded the dead letter (task, arguments, run key,
reason, traceback). What is left is the broker's side:

- RabbitMQ has a native path: :class:`DeadLetterReject` is a
  ``Reject(requeue=False)``, so a queue declared with
  ``x-dead-letter-exchange`` hands the message to its dead-letter exchange.
- Redis has none: the job is first published, unchanged but for a
  ``flexiq_dead_letter`` header, to a plain queue (``flexiq.dead_letter`` by
  default) that no worker consumes, and then rejected without requeue, which
  on Redis acknowledges it.

Either way Celery's worker stores FAILURE with this exception in the result
backend, so ``AsyncResult.get()`` raises :class:`DeadLetterReject` (a
:class:`~flexiq_plugins.errors.DeadLettered`) instead of waiting forever, and
no retry policy is ever consulted: ``Reject`` is not a failure Celery retries.
"""

from __future__ import annotations

import logging
from typing import Any

from celery.exceptions import Reject

from flexiq_plugins.integration import DeadLetter, DeadLettered

__all__ = ["DEAD_LETTER_HEADER", "DeadLetterReject", "dead_letter_error", "publish_dead_letter"]

logger = logging.getLogger("flexiq_plugins.celery")

DEAD_LETTER_HEADER = "flexiq_dead_letter"
"""Header of a message in the dead-letter queue: the reason kind, e.g. ``"divergence"``."""


class DeadLetterReject(Reject, DeadLettered):  # type: ignore[misc]
    """``Reject(requeue=False)`` that is also a :class:`DeadLettered` (C30).

    Parameters:
      reason(str): ``"<reason kind>: <message>"``.
      requeue(bool): always ``False``; accepted so that Celery's result
        backend can rebuild the exception from its stored arguments.
    """

    def __init__(self, reason: str = "", requeue: bool = False) -> None:
        Reject.__init__(self, reason, False)

    def __str__(self) -> str:
        return str(self.reason)


def publish_dead_letter(task: Any, request: Any, decision: DeadLetter, queue: str) -> None:
    """Publish the job of ``request`` to the dead-letter ``queue`` (Redis and other brokers).

    A failure to publish is logged, not raised: the store already holds the
    dead letter, and ``flexiq dead-letters retry`` works from the store alone.
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


def dead_letter_error(decision: DeadLetter) -> DeadLetterReject:
    """The exception that ends a dead-lettered job's attempt."""
    return DeadLetterReject(f"{decision.reason}: {decision.message}")
