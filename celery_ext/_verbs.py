"""Each core decision turned into Celery's own verb.

===================  ============================================================
Decision             What the task does
===================  ============================================================
``Completed``        returns the value (Celery stores SUCCESS, then acks)
``PutBack``          re-publishes the same task id with ``countdown`` and the
                     run key, then ``Ignore`` (acked); if the publish keeps
                     failing, ``Reject(requeue=True)``: the message stays
``Failure``          re-raises, so ``autoretry_for``/``self.retry`` decide; no
                     retry → :meth:`AttemptDriver.give_up` before the ack: the
                     run is settled ``failed``, or, with undos to run (C32),
                     the same task id is re-published once to run them
``DeadLetter``       :mod:`celery_ext._deadletter`: never a retry
``Ack``              ``Ignore``: acked, the stored result is left as it is
``Replay``           the run already finished (C37): returns its stored value,
                     or raises its stored error, from ``__call__``, outside
                     ``autoretry_for`` (which wraps ``run``) and without
                     ``self.retry``: Celery's tracer stores the result, acks,
                     and continues chains, ``link``/``link_error`` and chords
===================  ============================================================

The re-published message keeps the headers, the retry count and the routing
of the one being handled (``signature_from_request``) and carries the run's
key explicitly (C36): a sleep touches no retry counter (C16). It is published
*before* the current message is acknowledged, so a sleep is never lost (C15).

Celery logs every ``Ignore`` as "Task … ignored" at INFO, which would be one
line per sleep hop. The put-backs and acknowledgements made here raise
:class:`HandedBack`, whose line :class:`QuietIgnoredFilter` turns into a
DEBUG record (the way ``dramatiq_ext`` quiets its skips).
"""

from __future__ import annotations

import logging
import sys
from typing import Any, NoReturn

from celery.exceptions import Ignore, Reject, Retry
from typing_extensions import assert_never

from flexiq_plugins.integration import (
    Ack,
    AttemptDriver,
    Completed,
    DeadLetter,
    DeadLettered,
    Decision,
    Failure,
    JobInfo,
    PutBack,
    Replay,
    UnsupportedInEagerMode,
    body_traceback,
    hand_off,
)

from ._deadletter import dead_letter_error, publish_dead_letter
from ._envelope import without_unstarted_only
from ._options import RESUME_HEADER, RUN_KEY_HEADER
from ._runtime import Runtime

__all__ = ["HandedBack", "QuietIgnoredFilter", "act", "install_quiet_ignored_filter"]

logger = logging.getLogger("flexiq_plugins.celery")


class HandedBack(Ignore):  # type: ignore[misc]
    """The job went back to its queue (a sleep hop, a busy run) or was a duplicate: acknowledged on purpose."""


class QuietIgnoredFilter(logging.Filter):
    """Turns Celery's "Task … ignored" INFO record of a :class:`HandedBack` into a DEBUG record."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Demote the record of a :class:`HandedBack` (Celery logs it inside its ``except Ignore``)."""
        if record.levelno != logging.INFO or not isinstance(sys.exc_info()[1], HandedBack):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


def install_quiet_ignored_filter() -> None:
    """Attach one :class:`QuietIgnoredFilter` to Celery's task tracer logger (idempotent)."""
    trace_logger = logging.getLogger("celery.app.trace")
    if not any(isinstance(f, QuietIgnoredFilter) for f in trace_logger.filters):
        trace_logger.addFilter(QuietIgnoredFilter())


def act(task: Any, request: Any, runtime: Runtime, job: JobInfo, decision: Decision) -> Any:
    """Carry out ``decision`` for the job ``request`` of ``task``; return the task's value or raise.

    An error raised from here leaves no frame of it holding the decision or the
    error: the traceback keeps its frames, so that would be a reference cycle
    keeping the error and the body's locals until a cyclic collection.
    """
    try:
        return _act(task, request, runtime, job, decision)
    finally:
        del decision


def _act(task: Any, request: Any, runtime: Runtime, job: JobInfo, decision: Decision) -> Any:
    try:
        match decision:
            case Completed(value=value):
                return value
            case PutBack():
                _put_back(task, request, job, decision)
            case Failure():
                _failure(task, request, runtime, job, decision)
            case DeadLetter():
                _dead_letter(task, request, runtime, decision)
            case Ack():
                raise HandedBack()  # acknowledge, leave the result backend alone
            case Replay(error=None, value=value):
                return value  # the body does not run; Celery stores the value and goes on (C37)
            case Replay():
                _raise_replayed(decision)  # Celery stores FAILURE and calls link_error; no retry policy sees it
            case _:
                assert_never(decision)
    finally:
        del decision


def _raise_replayed(replay: Replay) -> NoReturn:
    """Raise a finished run's stored error (C37) with no frame of this call holding it (issue 16)."""
    error = replay.error
    del replay
    assert error is not None
    try:
        raise error
    finally:
        del error


def _put_back(task: Any, request: Any, job: JobInfo, decision: PutBack) -> NoReturn:
    _republish(task, request, job, decision)
    raise HandedBack()


def _republish(task: Any, request: Any, job: JobInfo, decision: PutBack) -> None:
    """Publish the same task id again after ``decision.delay`` s, carrying the run key; ``Reject`` if it fails."""
    why = f"{decision.reason.value}: {decision.detail}" if decision.detail else decision.reason.value
    if request.is_eager:
        raise UnsupportedInEagerMode(
            f"job {request.id} of {task.name!r} must go back to its queue for {decision.delay:.3f} s ({why}), "
            "which eager mode (task_always_eager / Task.apply) cannot do; run durable tasks that sleep on a worker"
        )
    headers = {**without_unstarted_only(request.headers), RUN_KEY_HEADER: job.run_key, RESUME_HEADER: True}
    # expires=None: a job that started before its expiry is not killed by it while it sleeps
    signature = task.signature_from_request(
        request, countdown=decision.delay, retries=request.retries, expires=None, headers=headers
    )
    try:
        hand_off(signature.apply_async, what=f"job {request.id}")
    except Exception as exc:
        logger.warning("could not re-enqueue job %s (%s): %s; the message goes back", request.id, why, exc)
        raise Reject(f"re-enqueue failed: {exc}", requeue=True) from exc


def _failure(task: Any, request: Any, runtime: Runtime, job: JobInfo, decision: Failure) -> NoReturn:
    error = body_traceback(decision.error)  # Celery formats the traceback the body's error would have had
    try:
        _settle_failure(task, request, runtime, job, decision)
    finally:
        del decision
    try:
        raise error
    finally:
        del error  # the traceback keeps this frame: it must not keep the error (no cycle)


def _settle_failure(task: Any, request: Any, runtime: Runtime, job: JobInfo, decision: Failure) -> None:
    """What Celery's failure needs before it is raised: the run settled, or re-published to compensate."""
    error = decision.error
    if isinstance(error, Retry) or (isinstance(error, Reject) and error.requeue):
        return  # a user's self.retry() already published one; or the message goes back
    if not isinstance(error, Exception):
        return  # SystemExit, KeyboardInterrupt: the worker stops; the message is redelivered
    driver: AttemptDriver = runtime.driver()
    if request.is_eager:  # no broker to come back through: no compensation (C38)
        driver.settle_failed(decision)
        return
    after = driver.give_up(decision)  # Celery will not retry: failed, or compensated next (C26, C32)
    if after is not None:
        _republish(task, request, job, after)


def _dead_letter(task: Any, request: Any, runtime: Runtime, decision: DeadLetter) -> NoReturn:
    if request.is_eager:
        raise DeadLettered(f"{decision.reason}: {decision.message}") from decision.error
    if not runtime.native_dead_letter():
        publish_dead_letter(task, request, decision, runtime.config.dead_letter_queue)
    raise dead_letter_error(decision)
