"""Runs recorded at publish, and recovery in the workers (C39).

A run used to exist in the store only once its first attempt started, so a
message the broker lost before that (a purge, an eviction, a message a
crashed worker had taken off a Redis list without noting it) left nothing
for recovery to find. With the integration installed, publishing a **new**
durable job (no run key on the message yet) writes its run as ``queued``
with its envelope, in one small transaction, before the message leaves
([`record_at_publish`][flexiq_plugins.integration.record_at_publish]). Recovery re-publishes a run that stays
``queued`` past ``recovery_queued_seconds`` under the same run key; the
claim makes a late original harmless (C24, C26). The library's own
re-publishes (sleeps, put-backs, recovery, dead-letter retries) carry the run
key already and are never recorded again.

**What it costs.** One insert per new job on the producer's side (a round
trip to the store), and a run row per job from publish on. A task or actor
with ``record_at_publish=False``, or a message sent with the option
``flexiq_record=False``, skips it: its run is recorded only when a worker
starts it, as before, and a message lost before that cannot be recovered.

**Only the tasks known to take steps are recorded (C43).** A task that
never takes a step is not touched: no statement at publish, no run row.
Which tasks take steps is learned (the first attempt of a task that takes a
step notes it, `flexiq_plugins._attempt.known_tasks`) or declared
(``durable=True``); [`durable_at_publish`][flexiq_plugins.integration.durable_at_publish]
is the one rule both adapters follow. A job of a task not known yet is
published unrecorded and claimed at its first step (C23): its committed
steps are never lost (a job whose worker dies after a step is recovered
from its claim, C35); a message the broker loses before its first step is
lost as it would be without the integration. A job published with a run
key the producer chose, or one derived from a parent run's, names a run:
it is recorded whatever its task (C44, C46).

**A store that cannot be reached at publish** does not fail the publish:
the job goes out unrecorded (it is then exactly as durable as the broker
makes it), with one WARNING line per process when the store starts failing
and one INFO line when it is back. A store that cannot be used at all (an
unknown scheme, a missing driver, a refused login: C41) is one ERROR line
naming the cause, once per process and cause; the job still goes out, and
the worker that meets the same store refuses to start with that line.

A message whose run was recorded carries the flag [`RECORDED_FLAG`][flexiq_plugins.integration.RECORDED_FLAG]
(a Celery header, a Dramatiq message option): its run row exists, so its
delivery claims the run before the body runs, even if the body takes no step
([`claims_before_body`][flexiq_plugins.integration.claims_before_body]). A recorded job of a
task the worker runs with ``durable=False`` never claims; it is ended with
[`settle_unclaimed_run`][flexiq_plugins.integration.settle_unclaimed_run].

Every worker runs the recovery `Sweeper`
by default ([`start_recovery`][flexiq_plugins.integration.start_recovery]); the store's recovery lease lets one
sweep run at a time across all of them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Literal

from .._attempt.known_tasks import KnownTasks
from .._attempt.store_health import StoreHealth, store_health
from .._model.config import DurableConfig
from .._model.records import JobEnvelope
from .._observe import observer_for
from .._store.attempt_side import AttemptStore
from .._store.operator_side import OperatorStore
from ..errors import FlexiqError, StoreMisconfigured, StoreUnavailable
from .recovery import Sweeper
from .registry import Publisher

__all__ = [
    "RECORDED_FLAG",
    "RECORD_OPTION",
    "RECORD_TASK_OPTION",
    "durable_at_publish",
    "record_at_publish",
    "settle_unclaimed_run",
    "start_recovery",
    "wants_record",
]

logger = logging.getLogger("flexiq_plugins")

RECORDED_FLAG = "flexiq_recorded"
"""The header (Celery) or message option (Dramatiq) saying the run was recorded at publish."""

RECORD_OPTION = "flexiq_record"
"""The header (Celery) or message option (Dramatiq) that opts one message out: ``flexiq_record=False``."""

RECORD_TASK_OPTION = "record_at_publish"
"""The task attribute (Celery) or actor option (Dramatiq) that opts a task out: ``record_at_publish=False``."""


def wants_record(config: DurableConfig, *, task_option: object = None, call_option: object = None) -> bool:
    """Whether a new job is recorded at publish: the message's option, else the task's, else the integration's.

    Parameters:
      config (DurableConfig): the integration's options (``record_at_publish``).
      task_option (object): the task's or actor's ``record_at_publish`` (``None``: not set).
      call_option (object): the message's ``flexiq_record`` (``None``: not set).
    """
    chosen = next((value for value in (call_option, task_option) if value is not None), config.record_at_publish)
    return bool(chosen)


def durable_at_publish(
    open_known: Callable[[], KnownTasks],
    framework: str,
    task_name: str,
    *,
    declared: object,
    run_key_given: bool = False,
) -> bool:
    """Whether a new job of ``task_name`` is a durable job at publish, whose run may be recorded (C39, C43, C46).

    ``durable=False`` never is; ``durable=True`` always is, without a store
    read; a job with a run key the producer chose (or derived from a parent
    run's, C44) names a run, so it is (C46); otherwise the task must be
    known to take steps (`KnownTasks.is_known`:
    from memory, the store read at most every ``known_tasks_refresh_seconds``).
    A store that cannot be opened or read makes the job not durable here: it
    is claimed at its first step instead.

    Parameters:
      open_known (Callable[[], KnownTasks]): this process's known tasks (its driver's, opened on first use).
      framework (str): the adapter's framework name.
      task_name (str): the task or actor name.
      declared (object): the task's or actor's ``durable`` option (``None``: not set, or a task this producer
        does not have).
      run_key_given (bool): the producer put a run key on the message.
    """
    if declared is False:
        return False
    if declared is True or run_key_given:
        return True
    try:
        known = open_known()
    except FlexiqError:  # a misconfigured store: the worker refuses to start and says why (C41)
        return False
    return known.is_known(framework, task_name)


class _PublishLog:
    """One line per outage (shared with the process's other parts, C41) and one per misconfiguration cause."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._misconfigured: set[str] = set()

    def unreachable(self, health: StoreHealth, exc: Exception) -> None:
        health.failed(  # a WARNING only for the first failure of an outage in this process
            "new jobs are published without recording their runs: the step store cannot be reached (%s); "
            "a message the broker loses before a worker starts it cannot be recovered",
            exc,
        )

    def reachable(self, health: StoreHealth) -> None:
        health.answered()

    def misconfigured(self, exc: Exception) -> None:
        with self._lock:
            first = str(exc) not in self._misconfigured
            self._misconfigured.add(str(exc))
        if first:
            logger.error("new jobs are published without recording their runs: %s", exc)


_LOG = _PublishLog()


def record_at_publish(
    open_store: Callable[[], AttemptStore],
    run_key: str,
    job_id: str,
    envelope: JobEnvelope,
    *,
    delay_seconds: float = 0.0,
) -> bool:
    """Record a new job's run as ``queued`` before its message leaves; return whether it was recorded (C39).

    Insert-if-absent (`AttemptStore.record_queued`): a run that exists is
    never reset. Never raises for the store: an unreachable store is logged
    once per outage, a misconfigured one once per cause, and the job is
    published unrecorded (see the module's description).

    Parameters:
      open_store (Callable[[], AttemptStore]): this process's store (opened on first use).
      run_key (str): the run key just stamped on the message.
      job_id (str): the message's job id.
      envelope (JobEnvelope): what re-publishes the job (C35).
      delay_seconds (float): the message's countdown or ETA from now, seconds:
        recovery counts ``recovery_queued_seconds`` from then, so a scheduled
        job is never re-published before it is due.

    Returns:
      bool: ``True`` when the run is in the store: put [`RECORDED_FLAG`][flexiq_plugins.integration.RECORDED_FLAG] on
        the message.
    """
    store: object = open_store
    try:
        store = open_store()
        store.record_queued(run_key, job_id, envelope, delay_seconds)
    except StoreUnavailable as exc:
        if isinstance(exc, StoreMisconfigured):  # not an outage: an ERROR, never hidden behind one (C41)
            _LOG.misconfigured(exc)
        else:
            _LOG.unreachable(store_health(store), exc)
        return False
    except FlexiqError as exc:  # ConfigurationError, StoreError (C41)
        _LOG.misconfigured(exc)
        return False
    _LOG.reachable(store_health(store))
    return True


SettledStatus = Literal["succeeded", "failed", "cancelled"]


def settle_unclaimed_run(store: AttemptStore, run_key: str, status: SettledStatus) -> bool:
    """End a run recorded at publish that no attempt ever claimed (C39).

    For a job that finished without taking a step (so without claiming its
    run): the ``queued`` row must not stay behind, or recovery would
    re-publish it. Applies only while the run is still ``queued``; a run an
    attempt claimed meanwhile is left to that attempt.

    Parameters:
      store (AttemptStore): the store.
      run_key (str): the run.
      status (str): ``succeeded``, ``failed`` or ``cancelled``.

    Returns:
      bool: whether the run was ``queued`` and is now ``status``.

    Raises:
      StoreUnavailable: the store cannot be reached.
    """
    return store.release_run(run_key, status, while_status={"queued"})


def start_recovery(
    open_store: Callable[[], OperatorStore],
    publishers: Mapping[str, Publisher],
    config: DurableConfig,
    *,
    name: str,
) -> Sweeper | None:
    """Start this worker's recovery sweeper, unless ``config.recovery`` is off (C39).

    The sweeper's first tick comes one ``recovery_interval_seconds`` after
    the start; it sweeps only while it holds the store's recovery lease.
    A store that cannot be opened is one WARNING line, and no sweeper.

    Parameters:
      open_store (Callable[[], OperatorStore]): this process's store.
      publishers (Mapping[str, Publisher]): the worker's publisher per framework.
      config (DurableConfig): ``recovery`` and the ``recovery_*_seconds`` options.
      name (str): names the worker in log lines, e.g. ``"celery worker"``.

    Returns:
      Sweeper | None: the running sweeper (stop it when the worker stops), or ``None``.
    """
    if not config.recovery:
        logger.info("%s: recovery is off (recovery=False): run `flexiq recover` yourself", name)
        return None
    try:
        store = open_store()
    except FlexiqError as exc:
        logger.warning("%s: recovery does not run, the step store cannot be opened: %s", name, exc)
        return None
    sweeper = Sweeper(
        store,
        publishers,
        interval=config.recovery_interval_seconds,
        grace=config.recovery_grace_seconds,
        stale_after=config.recovery_stale_seconds,
        queued_after=config.recovery_queued_seconds,
        name=name,
        observer=observer_for(config),
    )
    logger.info("%s: recovery runs every %g s (one sweep at a time across workers)", name, sweeper.interval)
    return sweeper.start()
