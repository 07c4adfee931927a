"""Everything a framework adapter needs from the core, in one public module.

``celery_ext`` and ``dramatiq_ext`` import only this module and the package
root; a third integration would too. The shape of an adapter:

1. At publish, stamp a run key on each new job (:func:`new_run_key`) and,
   unless the task or the message opts out (:func:`wants_record`), record
   its run ``queued`` before the message leaves (:func:`record_at_publish`,
   C39); flag the message with :data:`RECORDED_FLAG` when it was recorded.
   A worker starts recovery with :func:`start_recovery` (C39).
2. At delivery, describe the message as a :class:`JobInfo` (the run key by
   :func:`run_key_from`, the envelope by :func:`build_envelope`) and run it
   with the per-process :class:`AttemptDriver` (:class:`PerProcess`):
   ``driver.run_job(job, body)``.
3. Translate the :data:`Outcome` into the framework's verb with ``match`` and
   ``assert_never`` (see :mod:`flexiq_plugins._attempt.outcomes` for the table). The
   core has already decided everything that does not depend on the framework.
   A put-back re-enqueues the same job carrying the run's key (C36) through
   :func:`hand_off`; if it still fails, the message stays in the broker.
4. Register an :class:`Adapter` under the entry point group
   ``flexiq_plugins.adapters`` so the operator tools can re-publish its jobs.

Options are one frozen :class:`DurableConfig` (subclass it for options of
your own), the store comes from :func:`resolve_store`. A task's or actor's
own ``step_retry`` option (C31) is checked with :func:`retry_policy_option`
and travels in :attr:`JobInfo.step_retry`; its caps (``max_run_seconds``,
``max_suspended_seconds``, C34) are checked with :func:`cancellation_option`
and travel in :attr:`JobInfo.cancellation`. When the framework gives up on a
:class:`Failure`, call :meth:`AttemptDriver.give_up`: a run with undos to run
(C32) comes back as a :class:`PutBack` to re-enqueue. A worker that
receives a recorded job for a task or actor it does not have (the framework
discards the message) calls :func:`dead_letter_unregistered` from the
framework's hook, so the run is dead-lettered instead of staying ``queued``
(C39). A store setting is
checked when the integration is configured (:func:`check_store_spec`) and the
store is reached once when a worker starts (:func:`check_store_at_start`), so
a misconfiguration stops the worker with one line instead of failing jobs
(C41); a job that cannot open its store is put back
(:func:`driver_or_put_back`), never acknowledged away.

An integration configured in a process calls :func:`register_installation`
with its app or broker, so :func:`flexiq_plugins.send_event` and
:func:`flexiq_plugins.cancel_run` called there use its store and wake runs
through it (C33, C34). When the framework cancels a job itself (a Celery
``revoke``), :meth:`AttemptDriver.framework_ended` calls :func:`cancel_run`,
the one cancellation.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, NoReturn, TypeVar

from ._attempt.attempt import Attempt
from ._attempt.cancellation import CancelResult
from ._attempt.driver import AttemptDriver
from ._attempt.job import JobInfo
from ._attempt.outcomes import (
    Ack,
    AckReason,
    Completed,
    DeadLetter,
    Ended,
    Failure,
    Outcome,
    PutBack,
    PutBackReason,
    Replay,
)
from ._attempt.store_health import store_health
from ._delivery.cancel import cancel_run
from ._delivery.recording import (
    RECORD_OPTION,
    RECORD_TASK_OPTION,
    RECORDED_FLAG,
    record_at_publish,
    settle_unclaimed_run,
    start_recovery,
    wants_record,
)
from ._delivery.recovery import Sweeper
from ._delivery.registry import UNSTARTED_ONLY, Adapter, Publisher, ValueReader, register_adapter, register_installation
from ._delivery.unregistered import UNREGISTERED_REASON, dead_letter_unregistered
from ._model.codec import CodecChain, FunctionSerializer, Serializer
from ._model.config import DurableConfig
from ._model.identity import new_run_key, run_key_from
from ._model.policies import CancellationPolicy, RetryPolicy, cancellation_option, retry_policy_option
from ._model.records import JobEnvelope
from ._steps.context import no_current_job
from ._store.base import StepStore
from ._store.factory import StoreSpec, check_store_spec, resolve_store, resolve_store_spec
from .errors import (
    ConfigurationError,
    DeadLettered,
    Disposition,
    FlexiqError,
    StepSignal,
    StoreError,
    StoreUnavailable,
    UnsupportedInEagerMode,
    WorkerInterrupted,
    classify,
)

__all__ = [
    "Ack",
    "AckReason",
    "Adapter",
    "Attempt",
    "AttemptDriver",
    "CancelResult",
    "CancellationPolicy",
    "CodecChain",
    "Completed",
    "DeadLetter",
    "DeadLettered",
    "Disposition",
    "DurableConfig",
    "EXIT_CONFIGURATION",
    "Ended",
    "Failure",
    "FunctionSerializer",
    "HAND_OFF_PAUSES",
    "JobEnvelope",
    "JobInfo",
    "Outcome",
    "PAYLOAD_OPTION",
    "PerProcess",
    "Publisher",
    "PutBack",
    "PutBackReason",
    "RECORDED_FLAG",
    "RECORD_OPTION",
    "RECORD_TASK_OPTION",
    "Replay",
    "RetryPolicy",
    "UNREGISTERED_REASON",
    "UNSTARTED_ONLY",
    "Serializer",
    "StepSignal",
    "StepStore",
    "StoreSpec",
    "Sweeper",
    "UnsupportedInEagerMode",
    "ValueReader",
    "WorkerInterrupted",
    "body_traceback",
    "build_envelope",
    "cancel_run",
    "cancellation_option",
    "dead_letter_unregistered",
    "check_store_at_start",
    "check_store_spec",
    "claims_before_body",
    "classify",
    "driver_or_put_back",
    "envelope_arguments",
    "hand_off",
    "is_json",
    "log_worker_start",
    "new_run_key",
    "no_current_job",
    "record_at_publish",
    "register_adapter",
    "register_installation",
    "resolve_store",
    "resolve_store_spec",
    "resume_mark_at_publish",
    "retry_policy_option",
    "run_key_from",
    "settle_unclaimed_run",
    "start_recovery",
    "wants_record",
]

logger = logging.getLogger("flexiq_plugins.integration")

T = TypeVar("T")

PAYLOAD_OPTION = "flexiq_payload"
"""The envelope option holding arguments that are not JSON, encoded by the framework's serializer."""

HAND_OFF_PAUSES = (0.2, 0.5, 1.0)
"""Seconds between the tries of a failing hand-off before :func:`hand_off` gives up."""

_HAND_OFF_STEADY_PAUSE = 5.0

EXIT_CONFIGURATION = 78
"""The exit status of a worker that refuses to start on an unusable store (sysexits' ``EX_CONFIG``, C41)."""


# ---------------------------------------------------------------- claims
def claims_before_body(
    resume: bool | None, *, run_key_given: bool, redelivered: bool = False, recorded: bool = False
) -> bool:
    """Whether a delivery claims its run before the body runs, or lazily at its first step (C23, C37, C39).

    The one rule both adapters follow. A delivery that may continue an
    existing run claims first, so a duplicate of a finished run replays its
    outcome without running any of the body (C37) and a busy run is never run
    twice at once (C24). So does a job whose run was recorded at publish
    (C39): its run row exists, and recovery re-publishes a run that stays
    ``queued``; claiming first marks it started, so neither a long body
    before its first step nor a copy recovery published can run it twice. A
    genuinely new job that was not recorded claims at its first step, so a
    body that takes no step costs no store I/O (issue 16).

    Parameters:
      resume(bool | None): the message's resume mark (``flexiq_resume``):
        ``True`` on the library's own re-publishes, put-backs and retries of an
        attempt that claimed, and on a job published with a run key the
        producer chose; ``False`` on a job whose run key the integration
        stamped at publish (a new run); ``None`` when no integration marked it.
      run_key_given(bool): whether the message carries a run key.
      redelivered(bool): whether the broker says it delivered the message before.
      recorded(bool): whether the message says its run was recorded at publish (C39).

    Returns:
      bool: ``True`` to claim before the body.
    """
    if redelivered or recorded:
        return True
    if resume is None:
        return run_key_given  # a run key from a producer without the integration may name an existing run
    return resume


def resume_mark_at_publish(resume: bool | None, *, run_key_given: bool) -> bool:
    """The resume mark a publish hook sets (C23, C37): kept if set, else ``True`` for a producer's own run key.

    Parameters:
      resume(bool | None): the mark already on the message, if any.
      run_key_given(bool): whether the producer put a run key on the message
        (``False``: the hook is stamping a new one, the job is a new run).
    """
    if resume is not None:
        return resume
    return run_key_given


# ---------------------------------------------------------------- envelopes
def is_json(*values: Any) -> bool:
    """Whether ``values`` can be stored as JSON (the envelope is stored as JSON)."""
    try:
        json.dumps(values)
    except (TypeError, ValueError):
        return False
    return True


def build_envelope(
    task_name: str,
    framework: str,
    *,
    queue: str | None,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    options: Mapping[str, Any],
    serializer: Serializer,
) -> JobEnvelope:
    """The :class:`JobEnvelope` stored with a run, what re-publishes its job (C35).

    Arguments a JSON encoder cannot take (a pickle-configured app sending a
    ``datetime``) are kept encoded by the framework's ``serializer``, base64,
    under the option :data:`PAYLOAD_OPTION`; :func:`envelope_arguments` reads
    them back. Options must be JSON already.

    Parameters:
      task_name(str): the task or actor name.
      framework(str): the adapter's framework name.
      queue(str | None): the queue the job was delivered from.
      args(Sequence[Any]): positional arguments.
      kwargs(Mapping[str, Any]): keyword arguments.
      options(Mapping[str, Any]): what re-publishing needs besides the arguments.
      serializer(Serializer): encodes non-JSON arguments.
    """
    args, kwargs, kept = list(args), dict(kwargs), dict(options)
    if not is_json(args, kwargs):
        data = serializer.dumps({"args": args, "kwargs": kwargs})
        kept[PAYLOAD_OPTION] = {"serializer": serializer.name, "data": base64.b64encode(data).decode()}
        args, kwargs = [], {}
    return JobEnvelope(task_name, framework, queue, args, kwargs, kept)


def envelope_arguments(envelope: JobEnvelope, serializer: Serializer) -> tuple[list[Any], dict[str, Any]]:
    """The job's ``(args, kwargs)``, decoding :data:`PAYLOAD_OPTION` with ``serializer`` if present."""
    payload = envelope.options.get(PAYLOAD_OPTION)
    if not payload:
        return list(envelope.args), dict(envelope.kwargs)
    data = serializer.loads(base64.b64decode(payload["data"]))
    return list(data["args"]), dict(data["kwargs"])


# -------------------------------------------------------------- tracebacks
_OWN_MODULES = ("flexiq_plugins.", "celery_ext.", "dramatiq_ext.")


def body_traceback(error: BaseException) -> BaseException:
    """``error`` with the integration's frames dropped from the top of its traceback; returns ``error``.

    A body's error is caught by the attempt; its traceback then starts with
    the attempt's and the adapter's frames before the body's. An adapter
    re-raising it for the framework drops them, so the framework logs and
    formats (Dramatiq's Retries formats every retried traceback) what it
    would without the integration: the body's frames and below (issue 16).
    """
    tb = error.__traceback__
    while (
        tb is not None and tb.tb_next is not None and tb.tb_frame.f_globals.get("__name__", "").startswith(_OWN_MODULES)
    ):
        tb = tb.tb_next
    return error.with_traceback(tb)


def _is_own(frame: Any) -> bool:
    return str(frame.f_globals.get("__name__", "")).startswith(_OWN_MODULES)


# ------------------------------------------------------------------- stores
def check_store_at_start(open_driver: Callable[[], AttemptDriver], *, worker: str) -> None:
    """Open this process's store and reach it once, as a worker starts (C41).

    A store that cannot be used (an unknown scheme or a missing driver in a
    setting read only now, a login the database refuses, an unknown
    database, a SQLite file in a missing directory, a migration that fails)
    is logged as one CRITICAL line naming the cause, and the worker stops
    with :data:`EXIT_CONFIGURATION`. A store that is only unreachable
    (connection refused, a timeout) is logged as one WARNING line: the worker
    starts, and its jobs are put back until the store returns (C28).

    Parameters:
      open_driver(Callable[[], AttemptDriver]): the adapter's per-process driver.
      worker(str): names the worker in the log line, e.g. ``"celery worker"``.

    Raises:
      SystemExit: with :data:`EXIT_CONFIGURATION`, the store cannot be used.
    """
    store: object = open_driver
    try:
        store = open_driver().store
        store.now()
    except ConfigurationError as exc:  # StoreMisconfigured included
        _refuse_to_start(worker, exc)
    except StoreUnavailable as exc:  # the outage's one WARNING in this process (C41)
        store_health(store).failed(
            "%s starts without its step store: %s; jobs are put back until it is reachable", worker, exc
        )
    except StoreError as exc:
        _refuse_to_start(worker, exc)


def _refuse_to_start(worker: str, exc: Exception) -> NoReturn:
    logger.critical("%s cannot start: %s", worker, exc)
    raise SystemExit(EXIT_CONFIGURATION) from None


def driver_or_put_back(open_driver: Callable[[], AttemptDriver], config: DurableConfig) -> AttemptDriver | PutBack:
    """This process's driver, or the put-back of a job whose store cannot be opened (C41).

    A job never meets a :class:`~flexiq_plugins.ConfigurationError` that
    would fail it and let the framework acknowledge it away: it goes back to
    the broker for ``store_retry_max_seconds``, with an ERROR line, until the
    configuration is fixed.

    Parameters:
      open_driver(Callable[[], AttemptDriver]): the adapter's per-process driver.
      config(DurableConfig): the adapter's options.
    """
    try:
        return open_driver()
    except ConfigurationError as exc:
        logger.error("the step store cannot be opened: %s; the job goes back to its queue", exc)
        return PutBack(PutBackReason.STORE_UNAVAILABLE, config.store_retry_max_seconds, str(exc))


# --------------------------------------------------------------- hand-offs
def hand_off(publish: Callable[[], T], *, what: str, forever: bool = False) -> T:
    """Publish a put-back (sleep, busy, outage), trying again through a broker blip (C15).

    Tries again after 0.2, 0.5 and 1 s; then raises the last error, or with
    ``forever`` keeps trying every 5 s (an adapter whose framework has no way
    to leave the current message in the broker holds it unacknowledged until
    the broker accepts, as the framework does for its own acknowledgements).
    A sleep's hand-off is never a retry (C16).

    Parameters:
      publish(Callable[[], T]): enqueues the job again.
      what(str): names the job in log lines.
      forever(bool): never give up.
    """
    for pause in HAND_OFF_PAUSES:
        try:
            return publish()
        except Exception as exc:
            logger.warning("re-enqueue of %s failed (%s); trying again in %.1f s", what, exc, pause)
            time.sleep(pause)
    while forever:
        try:
            return publish()
        except Exception as exc:
            logger.debug("re-enqueue of %s still failing (%s)", what, exc)
            time.sleep(_HAND_OFF_STEADY_PAUSE)
    return publish()


# ------------------------------------------------------------ worker start
def log_worker_start(make_driver: Callable[[], AttemptDriver], who: str) -> None:
    """Log the one line a worker starts with: its step store (password hidden) and schema revision.

    The store is opened (and its tables created or upgraded, quietly) now
    rather than at the first job. A store that cannot be used is one WARNING
    line instead; jobs then meet it as usual (put back while it is unavailable).

    Parameters:
      make_driver(Callable[[], AttemptDriver]): the process's driver (e.g. ``PerProcess.get``).
      who(str): names the worker, e.g. ``"celery worker"``.
    """
    try:
        described = make_driver().store.describe()
    except FlexiqError as exc:
        logger.warning("flexiq-plugins %s: the step store cannot be used yet: %s", who, exc)
        return
    logger.info("flexiq-plugins %s: durable steps in %s", who, described)


# ------------------------------------------------------------- per process
class PerProcess(Generic[T]):
    """A value made on first use in each process: a forked worker child makes its own.

    Celery prefork and Dramatiq fork worker processes; a store opened before a
    fork must not hand its connections to the children. Thread-safe.

    Parameters:
      factory(Callable[[], T]): makes the value (e.g. opens the store and builds an :class:`AttemptDriver`).
    """

    def __init__(self, factory: Callable[[], T]) -> None:
        self._factory = factory
        self._lock = threading.Lock()
        self._value: T | None = None
        self._pid = -1

    def get(self) -> T:
        """The value of this process, made now if needed (the factory's errors propagate)."""
        value = self._value
        if value is not None and self._pid == os.getpid():
            return value
        with self._lock:
            if self._value is None or self._pid != os.getpid():
                self._value = self._factory()
                self._pid = os.getpid()
            return self._value

    def forget(self) -> None:
        """Drop this process's value; the next :meth:`get` makes a new one."""
        with self._lock:
            self._value = None
            self._pid = -1
