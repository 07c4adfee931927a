"""Each attempt outcome turned into Dramatiq's own verb.

The store state is already committed when an outcome arrives; what is left is
the broker's side. A sleep, a busy run, a duplicate and a dropped claim end by
raising :class:`~dramatiq.middleware.SkipMessage` from the actor: the worker
then acknowledges the message, the Retries middleware is not consulted and no
``on_success`` callback or pipeline fires. The worker logs every skipped
message at WARNING; a sleep logs no warning (C16), so :class:`QuietSkipFilter`
drops that one record for the skips made here (the way ``RabbitmqBroker``
filters pika's scary logs). A dead letter fails the message first, so the
broker moves it to its ``.XQ`` queue (C30).
"""

from __future__ import annotations

import logging
import math
import sys
import time
from typing import Any

import dramatiq
from dramatiq.common import compute_backoff, q_name
from dramatiq.middleware import SkipMessage

from flexiq_plugins import outcomes

__all__ = ["DeadLettered", "QuietSkipFilter", "apply_outcome", "enqueue_again"]

_ENQUEUE_RETRY_PAUSES = (0.2, 0.5, 1.0)
_OUTAGE_BACKOFF_MS = 1_000
_OUTAGE_MAX_BACKOFF_MS = 300_000


class DeadLettered(SkipMessage):
    """The durable job was dead-lettered; raised at Dramatiq's boundary (C13, C29, C30).

    It is a :class:`~dramatiq.middleware.SkipMessage`, so no retry policy sees
    it, and the message is already failed, so the broker moves it to its
    dead-letter queue and a Results backend stores this as the job's failure.

    Parameters:
      reason(str): short kind: ``divergence``, ``size_cap``, ``worker_lost`` …
      detail(str): the message recorded with the dead letter.
    """

    def __init__(self, reason: str, detail: str) -> None:
        self.reason = reason
        super().__init__(f"dead-lettered ({reason}): {detail}")


class _Handled(SkipMessage):
    """The job was re-enqueued or acknowledged on purpose; not worth a warning."""


class QuietSkipFilter(logging.Filter):
    """Drops the worker's "Message … was skipped." record for skips raised here."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Return ``False`` for the worker's record of a :class:`_Handled` or :class:`DeadLettered` skip."""
        handling = sys.exc_info()[1]  # the worker logs from inside its ``except SkipMessage``
        return not isinstance(handling, (_Handled, DeadLettered))


def install_quiet_skip_filter() -> None:
    """Attach one :class:`QuietSkipFilter` to the worker threads' logger (idempotent)."""
    logger = logging.getLogger("dramatiq.worker.WorkerThread")
    if not any(isinstance(f, QuietSkipFilter) for f in logger.filters):
        logger.addFilter(QuietSkipFilter())


def enqueue_again(broker: dramatiq.Broker, message: Any, delay_ms: int, **options: Any) -> None:
    """Enqueue the same message (same id, same options) again after ``delay_ms`` milliseconds.

    A failing enqueue is tried again after 0.2, 0.5 and 1 s (a broker blip
    must not turn a sleep into a retry, C16); after that it raises whatever
    the broker raises, so the current message is not acknowledged as done and
    the job is not lost (C15).
    """
    again = message.copy(queue_name=q_name(message.queue_name), options=options)
    for pause in _ENQUEUE_RETRY_PAUSES:
        try:
            broker.enqueue(again, delay=max(delay_ms, 1))
            return
        except Exception:
            logging.getLogger(__name__).warning("re-enqueue of %r failed; trying again", message.message_id)
            time.sleep(pause)
    broker.enqueue(again, delay=max(delay_ms, 1))


def apply_outcome(broker: dramatiq.Broker, message: Any, outcome: outcomes.Outcome, logger: logging.Logger) -> Any:
    """Do the broker's part of ``outcome``; return the actor's value or raise a skip.

    A :class:`~flexiq_plugins.outcomes.Retry` that is not ``always`` is handled
    by the caller (it re-raises the error so Retries decides).
    """
    if isinstance(outcome, outcomes.Completed):
        return outcome.value
    if isinstance(outcome, outcomes.Sleeping):
        enqueue_again(broker, message, _millis(outcome.delay))
        logger.info("Message %r sleeps at %r; wakes in %.3f s.", message.message_id, outcome.step_key, outcome.delay)
        raise _Handled(f"sleeping at {outcome.step_key}")
    if isinstance(outcome, outcomes.Busy):
        enqueue_again(broker, message, _millis(outcome.retry_after))
        logger.debug("Message %r: its run is busy; back in %.3f s.", message.message_id, outcome.retry_after)
        raise _Handled("run busy")
    if isinstance(outcome, outcomes.Retry):  # always: a store outage, retried whatever the filters say
        outages = int(message.options.get("flexiq_outages", 0))
        _, delay = compute_backoff(outages, factor=_OUTAGE_BACKOFF_MS, max_backoff=_OUTAGE_MAX_BACKOFF_MS)
        enqueue_again(broker, message, delay, flexiq_outages=outages + 1)
        logger.warning(
            "Message %r: step store unavailable (%s); retrying in %d ms.", message.message_id, outcome.error, delay
        )
        raise _Handled("store unavailable")
    if isinstance(outcome, outcomes.DeadLetter):
        message.fail()
        raise DeadLettered(outcome.reason, outcome.message)
    logger.debug("Message %r acknowledged without running: %s.", message.message_id, outcome)
    raise _Handled(type(outcome).__name__)


def _millis(seconds: float) -> int:
    return math.ceil(seconds * 1000)
