"""A durable job that reaches a worker which does not have its task or actor (C30, C38, C39).

A producer that knows a task name the consuming workers do not (a typo in
``send_task``, producers deployed before the workers, an actor module a
worker does not import) publishes a job whose run is recorded ``queued``
(C39). The framework then discards the message without running anything:
Celery's worker logs ``Received unregistered task of type …``, rejects the
message and marks the result ``NotRegistered``; Dramatiq's logs ``Received
message for undefined actor …`` and rejects it to its dead-letter queue. No
message of the job is left, so the run must not stay ``queued``: recovery
would re-publish it every ``recovery_stale_seconds``, forever, and the store
would disagree with the framework.

[`dead_letter_unregistered`][flexiq_plugins.integration.dead_letter_unregistered] is the one decision both adapters call
from the framework's own hook (Celery's ``task_unknown`` signal, Dramatiq's
``before_nack``): a run **no attempt started** (``queued``, or ``pending``
after a dead-letter retry, with attempt 0; or a retried dead letter of a run
that had started, which counts as unstarted until an attempt starts after
the retry, like a freshly published job) is dead-lettered with the reason
[`UNREGISTERED_REASON`][flexiq_plugins.integration.UNREGISTERED_REASON], naming the task and what the worker knows. It
then shows in ``flexiq dlq list``, recovery leaves it alone (it is
terminal), and ``flexiq dlq retry`` re-publishes it under the same run key
once the workers have the task. A run an attempt has started (a worker that
has the task took another copy of the message first, also after a retry) is
never touched, so a stale worker in a rolling deploy cannot harm it. The
framework's own behaviour (its log line, its reject, its result) is
unchanged.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Callable, Iterable

from .._attempt.store_health import store_health
from .._model.identity import run_key_from
from .._model.records import NewDeadLetter
from .._model.replays import dead_letter_outcome
from .._store.attempt_side import AttemptStore
from ..errors import FlexiqError, InvalidRunKey, StoreMisconfigured, StoreUnavailable

__all__ = ["UNREGISTERED_REASON", "dead_letter_unregistered", "unregistered_message"]

logger = logging.getLogger("flexiq_plugins")

UNREGISTERED_REASON = "unregistered_task"
"""The dead-letter reason of a job whose task or actor the worker that received it does not have."""

_LISTED = 5


def unregistered_message(task_name: str, known: Iterable[str], *, worker: str, kind: str = "task") -> str:
    """The dead letter's message: which worker does not know which task, and the closest names it knows.

    Parameters:
      task_name (str): the job's task or actor name.
      known (Iterable[str]): the names the worker has.
      worker (str): names the worker, e.g. ``"celery worker celery@host"``.
      kind (str): ``"task"`` or ``"actor"``.
    """
    names = sorted({str(name) for name in known})
    close = difflib.get_close_matches(task_name, names, n=3, cutoff=0.6)
    if close:
        hint = "did you mean " + " or ".join(repr(name) for name in close) + "?"
    elif names:
        listed = ", ".join(repr(name) for name in names[:_LISTED])
        hint = f"it has {len(names)} {kind}s: {listed}{', …' if len(names) > _LISTED else ''}"
    else:
        hint = f"it has no {kind}s"
    return (
        f"{worker} does not have the {kind} {task_name!r} ({hint}); it discarded the job without running it. "
        f"Deploy the {kind} to the workers of its queue, then retry the dead letter (flexiq dlq retry)"
    )


def dead_letter_unregistered(
    open_store: Callable[[], AttemptStore],
    carried_run_key: object,
    job_id: str,
    task_name: str,
    *,
    known: Iterable[str],
    worker: str,
    kind: str = "task",
) -> bool:
    """Dead-letter the run of a job the framework discarded because the worker does not have its task (C30, C39).

    Applies only to a run no attempt started
    (`AttemptStore.dead_letter_unstarted`: ``queued`` or ``pending`` with
    attempt 0, or a retried dead letter no attempt started since its retry);
    any other run, an unknown one, or a message without a run key is left
    alone. The run ends
    ``dead`` with a dead letter of reason [`UNREGISTERED_REASON`][flexiq_plugins.integration.UNREGISTERED_REASON] whose
    message is `unregistered_message`; a duplicate of the job then
    replays [`DeadLettered`][flexiq_plugins.errors.DeadLettered] (C37). One WARNING line
    when it applies. Never raises: it runs inside the framework's consumer;
    a store that cannot be reached is the outage's one WARNING per process (C41; the run stays
    ``queued``, recovery re-publishes it, and the next worker to discard it
    tries again).

    Parameters:
      open_store (Callable[[], AttemptStore]): this process's store (opened on first use).
      carried_run_key (object): the run key the message carries (its header or option), ``None`` if none.
      job_id (str): the framework's job id (Celery task id, Dramatiq message id).
      task_name (str): the task or actor name the message names.
      known (Iterable[str]): the task or actor names the worker has, for the hint.
      worker (str): names the worker in the message, e.g. ``"celery worker celery@host"``.
      kind (str): ``"task"`` (Celery) or ``"actor"`` (Dramatiq).

    Returns:
      bool: whether the run was dead-lettered now.
    """
    if not carried_run_key:
        return False  # not published through the integration: no run was recorded
    try:
        run_key = run_key_from(carried_run_key, job_id, where="run key")
    except InvalidRunKey:
        return False
    message = unregistered_message(task_name, known, worker=worker, kind=kind)
    dead = NewDeadLetter(job_id, UNREGISTERED_REASON, message)
    store: object = open_store
    try:
        store = open_store()
        applied = store.dead_letter_unstarted(run_key, dead, outcome=dead_letter_outcome(UNREGISTERED_REASON, message))
    except StoreUnavailable as exc:
        if isinstance(exc, StoreMisconfigured):
            logger.error("could not dead-letter run %s of unregistered %s %r: %s", run_key, kind, task_name, exc)
        else:  # the outage's one WARNING in this process, shared with its other parts (C41)
            store_health(store).failed(
                "could not dead-letter run %s of unregistered %s %r: %s", run_key, kind, task_name, exc
            )
        return False
    except FlexiqError as exc:  # ConfigurationError, StoreError: already one line at the worker's start (C41)
        logger.warning("could not dead-letter run %s of unregistered %s %r: %s", run_key, kind, task_name, exc)
        return False
    except Exception:  # a bug must not break the framework's consumer, which is rejecting the message
        logger.exception("could not dead-letter run %s of unregistered %s %r", run_key, kind, task_name)
        return False
    if applied:
        logger.warning("job %s (run %s) dead-lettered (%s): %s", job_id, run_key, UNREGISTERED_REASON, message)
    else:
        logger.debug("run %s of unregistered %s %r was started or ended already: left alone", run_key, kind, task_name)
    return applied
