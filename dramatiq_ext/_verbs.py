"""Each attempt's decision turned into Dramatiq's own verb.

===================  ============================================================
Decision             What the actor call does
===================  ============================================================
``Completed``        returns the value
``PutBack``          enqueues the same message (same id, the run's key) with
                     ``delay``, then skips (acked); while the enqueue fails the
                     message is held, unacknowledged, as Dramatiq holds its own
                     acks through a broker outage
``Failure``          re-raises, so the Retries middleware decides; if it gives
                     up, the middleware settles the run ``failed`` before the ack
``DeadLetter``       fails the message (the broker moves it to ``.XQ``) and skips
``Ack``              skips (acked)
``Replay``           the run already finished (C37): returns its stored value
                     (``Results`` stores it, pipelines go on), or raises its
                     stored error with this delivery's ``max_retries`` set to 0,
                     so ``Retries`` fails it at once (``Results`` stores the
                     error, ``on_failure`` callbacks fire) instead of retrying
                     a delivery that would only replay it again
===================  ============================================================

A skip is raised as :class:`~dramatiq.middleware.SkipMessage`: the worker
then acknowledges the message, the Retries middleware is not consulted and no
``on_success`` callback or pipeline fires. A put-back or an acknowledgement
stores no result either: a ``Results`` backend would otherwise record
``None`` as the value of a job that is only sleeping (C39), so the delivery
is marked ``store_results=False`` before it is skipped and a result waiter
gets the value of the attempt that completes. The worker logs every skipped
message at WARNING; a sleep logs no warning (C16), so :class:`QuietSkipFilter`
drops that one record for the skips made here (the way ``RabbitmqBroker``
filters pika's scary logs).

A dead letter's skip, :class:`DeadLetterSkip`, is also the core's
:class:`~flexiq_plugins.DeadLettered`: the one error every adapter raises for a
dead letter (Celery's is ``DeadLetterReject``), so ``except DeadLettered``
catches it.
"""

from __future__ import annotations

import logging
import math
import sys
from typing import Any, NoReturn

import dramatiq
from dramatiq.common import q_name
from dramatiq.middleware import SkipMessage
from dramatiq.threading import Interrupt
from typing_extensions import assert_never

from flexiq_plugins.integration import (
    Ack,
    Completed,
    DeadLetter,
    DeadLettered,
    Decision,
    Failure,
    JobInfo,
    PutBack,
    Replay,
    hand_off,
)

from ._envelope import RESUME_OPTION, RUN_KEY_OPTION

__all__ = ["DeadLetterSkip", "QuietSkipFilter", "apply_decision", "enqueue_again"]

logger = logging.getLogger("dramatiq_ext.DurableSteps")


class DeadLetterSkip(SkipMessage, DeadLettered):
    """The durable job was dead-lettered: the core's ``DeadLettered``, raised as Dramatiq's skip (C13, C29, C30).

    A :class:`~dramatiq.middleware.SkipMessage`, so no retry policy sees it
    (the worker catches a skip apart from every other exception), and the
    message is already failed, so the broker moves it to its dead-letter
    queue and a Results backend stores this as the job's failure. A
    :class:`~flexiq_plugins.DeadLettered`, so ``except DeadLettered`` catches
    it as it catches Celery's dead letter; its message starts with the reason
    kind, as every ``DeadLettered``'s does (``"divergence: ..."``).

    Parameters:
      reason(str): short kind: ``divergence``, ``size_limit``, ``worker_lost`` …
      detail(str): the message recorded with the dead letter.
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")


class _Handled(SkipMessage):
    """The job was re-enqueued or acknowledged on purpose; not worth a warning."""


class QuietSkipFilter(logging.Filter):
    """Drops the worker's "Message … was skipped." record for skips raised here."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Return ``False`` for the worker's record of a :class:`_Handled` or :class:`DeadLetterSkip` skip."""
        handling = sys.exc_info()[1]  # the worker logs from inside its ``except SkipMessage``
        return not isinstance(handling, (_Handled, DeadLetterSkip))


def install_quiet_skip_filter() -> None:
    """Attach one :class:`QuietSkipFilter` to the worker threads' logger (idempotent)."""
    logger = logging.getLogger("dramatiq.worker.WorkerThread")
    if not any(isinstance(f, QuietSkipFilter) for f in logger.filters):
        logger.addFilter(QuietSkipFilter())


def enqueue_again(broker: dramatiq.Broker, message: Any, run_key: str, delay_ms: int) -> None:
    """Enqueue the same message (same id, the run's key) again after ``delay_ms`` milliseconds (C15, C36).

    Held until the broker accepts it (:func:`~flexiq_plugins.integration.hand_off`
    with ``forever``): the current message is not acknowledged before its
    successor is in the broker, so the job is never lost and no retry is
    counted (C16). A time limit or a shutdown notice raised in the thread
    while it waits does not end the wait either: it would hand the sleep to
    the Retries middleware, which must never see one.
    """
    again = message.copy(queue_name=q_name(message.queue_name), options={RUN_KEY_OPTION: run_key, RESUME_OPTION: True})
    what = f"message {message.message_id!r}"
    while True:
        try:
            hand_off(lambda: broker.enqueue(again, delay=max(delay_ms, 1)), what=what, forever=True)
            return
        except Interrupt as exc:
            logger.warning("%s interrupted the re-enqueue of %s; still holding it (%s)", type(exc).__name__, what, exc)


def apply_decision(broker: dramatiq.Broker, message: Any, job: JobInfo, decision: Decision) -> Any:
    """Do the broker's part of ``decision``; return the actor's value or raise."""
    try:
        return _apply(broker, message, job, decision)
    finally:
        del decision  # an error raised from here must not hold it through this frame (issue 16)


def _apply(broker: dramatiq.Broker, message: Any, job: JobInfo, decision: Decision) -> Any:
    try:
        match decision:
            case Completed(value=value):
                return value
            case PutBack():
                enqueue_again(broker, message, job.run_key, math.ceil(decision.delay * 1000))
                _skip_without_result(message, decision.reason.value)
            case Failure():
                _reraise(decision)  # Retries decides; the middleware settles the run if it gives up
            case DeadLetter():
                _fail(message, decision)
            case Ack():
                _skip_without_result(message, decision.reason.value)
            case Replay(error=None, value=value):
                return value  # the body does not run; Results stores the value, a pipeline goes on (C37)
            case Replay():
                _replay_failure(message, decision)
            case _:
                assert_never(decision)
    finally:
        del decision


def _reraise(failure: Failure) -> NoReturn:
    """Raise ``failure``'s error with no frame of this call holding it: no reference cycle (issue 16).

    The traceback of the error raised keeps every frame it passes through;
    a frame still referencing the decision (and so the error) would keep the
    error, its traceback, and the actor's locals alive until a cyclic
    garbage collection. Dramatiq frees them at once; so must a durable actor.
    """
    error = failure.error
    del failure
    try:
        raise error
    finally:
        del error


def _replay_failure(message: Any, replay: Replay) -> NoReturn:
    """Raise a finished run's stored error for this delivery, which Retries then fails at once (C37).

    ``max_retries`` 0 for this delivery only: ``Retries`` fails the message
    (the broker's dead-letter queue, ``Results`` stores the error,
    ``on_failure`` and ``on_retry_exhausted`` fire) instead of retrying one
    that would only replay the error again. An actor with ``retry_when``
    decides by it instead; each retry then replays the error again, the
    body never runs.
    """
    message.options["max_retries"] = 0
    error = replay.error
    del replay  # no frame of this call holds the error once raised (issue 16)
    assert error is not None
    try:
        raise error
    finally:
        del error


def _skip_without_result(message: Any, why: str) -> NoReturn:
    """Skip this delivery (acknowledged) without a ``Results`` backend storing ``None`` for it (C39)."""
    message.options["store_results"] = False  # this delivery only: the copy re-enqueued keeps the actor's option
    raise _Handled(why)


def _fail(message: Any, decision: DeadLetter) -> NoReturn:
    message.fail()
    raise DeadLetterSkip(decision.reason, decision.message)
