"""Each core outcome turned into Celery's own verb.

===================  ============================================================
Outcome              What the task does
===================  ============================================================
``Completed``        returns the value (Celery stores SUCCESS, then acks)
``Sleeping``         re-publishes the same task id with ``countdown``, then
                     ``Ignore`` (acked); a failed publish is ``Reject(requeue=True)``
``Busy``             the same as a sleep, with the outcome's ``retry_after``
``Retry``            re-raises, so ``autoretry_for``/``self.retry`` decide; a store
                     outage is put back like a sleep (no retry counted, whatever the
                     filters say); no retry → run settled ``failed``
``DeadLetter``       :mod:`celery_ext._deadletter`: never a retry
``Duplicate``        ``Ignore``: acked, the stored result is left as it is
``Dropped``          ``Ignore``
===================  ============================================================

The re-published message keeps the headers (so the run key), the retry count
and the routing of the one being handled (``signature_from_request``): a sleep
touches no retry counter (C16). It is published *before* the current message
is acknowledged, so a sleep is never lost (C15).
"""

from __future__ import annotations

import logging
from typing import Any, NoReturn

from celery.exceptions import Ignore, Reject, Retry

from flexiq_plugins import outcomes
from flexiq_plugins.attempt import Attempt
from flexiq_plugins.errors import DeadLettered, UnsupportedInEagerMode

from ._deadletter import dead_letter_error, publish_dead_letter
from ._runtime import Runtime

__all__ = ["act"]

logger = logging.getLogger("flexiq_plugins.celery")


def act(
    task: Any,
    request: Any,
    runtime: Runtime,
    outcome: outcomes.Outcome,
    attempt: Attempt | None = None,
) -> Any:
    """Carry out ``outcome`` for the job ``request`` of ``task``; return the task's value or raise."""
    if isinstance(outcome, outcomes.Completed):
        return outcome.value
    if isinstance(outcome, outcomes.Sleeping):
        _put_back(task, request, outcome.delay, f"sleeps until {outcome.step_key!r} is due")
    if isinstance(outcome, outcomes.Busy):
        _put_back(task, request, outcome.retry_after, "is running elsewhere")
    if isinstance(outcome, outcomes.Retry):
        _retry(task, request, runtime, outcome, attempt)
    if isinstance(outcome, outcomes.DeadLetter):
        _dead_letter(task, request, runtime, outcome)
    raise Ignore()  # Duplicate, Dropped: acknowledge, leave the result backend alone


def _put_back(task: Any, request: Any, countdown: float, why: str) -> NoReturn:
    if request.is_eager:
        raise UnsupportedInEagerMode(
            f"job {request.id} of {task.name!r} {why} and must go back to its queue for "
            f"{countdown:.3f} s, which eager mode (task_always_eager / Task.apply) cannot do; "
            "run durable tasks that sleep on a worker"
        )
    # expires=None: a job that started before its expiry is not killed by it while it sleeps
    signature = task.signature_from_request(request, countdown=countdown, retries=request.retries, expires=None)
    try:
        signature.apply_async()
    except Exception as exc:
        logger.warning(
            "could not re-enqueue job %s (%s): %s; the message goes back to the broker", request.id, why, exc
        )
        raise Reject(f"re-enqueue failed: {exc}", requeue=True) from exc
    raise Ignore()


def _retry(task: Any, request: Any, runtime: Runtime, outcome: outcomes.Retry, attempt: Attempt | None) -> NoReturn:
    error = outcome.error
    if outcome.always and not isinstance(error, Retry):  # a user's self.retry() already published one
        _retry_always(task, request, runtime, error)
    if isinstance(error, Retry) or (isinstance(error, Reject) and error.requeue):
        raise error
    if not isinstance(error, Exception):
        raise error  # SystemExit, KeyboardInterrupt: the worker stops; the message is redelivered
    if attempt is not None:
        attempt.settle_failed()  # Celery will not retry: the run is failed before the ack (C26)
    raise error


def _retry_always(task: Any, request: Any, runtime: Runtime, error: BaseException) -> NoReturn:
    """A store outage: put the job back whatever the task's filters say, without using its retries (C28)."""
    logger.warning("job %s: step store unavailable (%s); putting it back", request.id, error)
    _put_back(task, request, runtime.options.store_retry_seconds, "met a store outage")


def _dead_letter(task: Any, request: Any, runtime: Runtime, outcome: outcomes.DeadLetter) -> NoReturn:
    if request.is_eager:
        raise DeadLettered(f"{outcome.reason}: {outcome.message}") from outcome.error
    if not runtime.native_dead_letter():
        publish_dead_letter(task, request, outcome, runtime.options.dead_letter_queue)
    raise dead_letter_error(outcome)
