"""Telling a job's result waiter how its run ended when Dramatiq itself never will (C45).

A run cancelled by its own attempt (at a step boundary, or over a cap) ends
with a skip that stores no result; a run cancelled from outside
([`flexiq_plugins.cancel_run`][flexiq_plugins.cancel_run]) ends while none of its job's messages is
being handled. Either way ``message.get_result(block=True)`` would wait until
its timeout. When the broker has the ``Results`` middleware and the actor (or
the message) stores results, the error the core gives (a
[`JobCancelled`][flexiq_plugins.errors.JobCancelled]) is stored for the message id,
as ``Results`` stores a failed message's exception: ``get_result`` raises
``ResultFailure("actor raised JobCancelled: …")``.

Nothing is stored where a result is already stored for the message (what
Dramatiq reported itself wins).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import dramatiq
from dramatiq.errors import ActorNotFound
from dramatiq.results import ResultFailure, ResultMissing, Results

__all__ = ["ResultKey", "tell_waiter"]

logger = logging.getLogger("dramatiq_ext.DurableSteps")


@dataclass(frozen=True)
class ResultKey:
    """What a result backend keys a message's result by (``ResultBackend.build_message_key``).

    Parameters:
      queue_name (str): the message's queue.
      actor_name (str): its actor.
      message_id (str): its id, the one the waiter's message has.
      options (dict[str, Any]): its options (``store_results``, ``result_ttl``).
    """

    queue_name: str
    actor_name: str
    message_id: str
    options: dict[str, Any]


def tell_waiter(broker: dramatiq.Broker, message: Any, error: Exception) -> bool:
    """Store ``error`` as the result of ``message`` in the broker's ``Results`` backend (C45); whether it was stored.

    Parameters:
      broker (dramatiq.Broker): the broker whose middleware holds ``Results``.
      message (dramatiq.Message | ResultKey): the message the waiter has (its queue, actor and id).
      error (Exception): what ``get_result`` raises, as a ``ResultFailure`` naming it.

    Raises:
      Exception: whatever the result backend raises.
    """
    results = next((m for m in broker.middleware if isinstance(m, Results)), None)
    if results is None:
        return False
    stores, ttl = _result_options(broker, results, message)
    if not stores:
        return False
    backend = results.backend
    try:
        backend.get_result(message)
        return False  # a result is stored already
    except ResultFailure:
        return False  # so is a failure
    except ResultMissing:
        pass
    backend.store_exception(message, error, ttl)
    logger.debug("message %s: its result waiter is told %s", message.message_id, type(error).__name__)
    return True


def _result_options(broker: dramatiq.Broker, results: Results, message: Any) -> tuple[bool, int]:
    """``store_results`` and ``result_ttl`` of ``message``: its options, else its actor's, else the middleware's."""
    try:
        actor_options = broker.get_actor(message.actor_name).options
    except ActorNotFound:
        actor_options = {}
    options = message.options
    stores = options.get("store_results", actor_options.get("store_results", results.store_results))
    ttl = options.get("result_ttl", actor_options.get("result_ttl", results.result_ttl))
    return bool(stores), int(ttl)
