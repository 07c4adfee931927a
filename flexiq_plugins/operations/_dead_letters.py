"""Dead letters as operators handle them: retry with the same run key, purge (C11, C30).

**Check, then change, then publish.** A retry first makes sure a publisher
exists for the job's framework, so a missing ``--app`` changes nothing; only
then does it reset the run (`OperatorStore.prepare_retry`) and publish. If
the publish fails the run stays ``pending`` and recovery picks it up.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .._delivery.publishing import publish, require_publisher, require_readable
from .._delivery.registry import Publisher
from .._store.operator_side import OperatorStore
from ..errors import AlreadyRetried, OperationError, RunCompensated, StoreError, UnknownDeadLetter

__all__ = ["Retried", "purge_dead_letters", "retry_dead_letter", "retry_dead_letters"]

logger = logging.getLogger("flexiq_plugins.operations")


@dataclass(frozen=True)
class Retried:
    """A dead letter re-published (C30).

    Parameters:
      dead_letter_id (int): the dead letter.
      run_key (str): the run, unchanged (C11).
      framework (str): ``"celery"`` or ``"dramatiq"``.
      job_id (str): the new job's id.
    """

    dead_letter_id: int
    run_key: str
    framework: str
    job_id: str


def retry_dead_letter(
    store: OperatorStore,
    dead_letter_id: int,
    publishers: Mapping[str, Publisher],
    *,
    reset_from: str | None = None,
) -> Retried:
    """Retry one dead letter: reset its run, then re-publish it with a new job id and the same run key (C11, C30).

    Parameters:
      store (OperatorStore): the store.
      dead_letter_id (int): the dead letter.
      publishers (Mapping[str, Publisher]): a publisher per framework name.
      reset_from (str | None): a step key; that step and every later one are
        dropped so they run again. Without it, the step that failed for good
        (a spent budget, a non-retryable error, a failed undo), if any, and
        every later one are dropped, with their attempts (C31).

    Raises:
      UnknownDeadLetter: no such dead letter.
      UnknownRun: its run is gone, or it has no step ``reset_from``.
      NoPublisher: no publisher for the job's framework (nothing changed).
      CorruptRecord: the stored job envelope cannot be read (nothing changed).
      AlreadyRetried: retried before and the run is no longer ``dead`` (nothing changed).
      RunCompensated: the run was compensated and ``reset_from`` is not given (nothing changed, C32).
      PublishFailed: the broker refused; the run stays ``pending`` for [`recover`][flexiq_plugins.operations.recover].
      StoreUnavailable: the store cannot be reached.
    """
    dead = store.get_dead_letter(dead_letter_id)
    require_readable(dead.envelope, dead.run_key)
    publisher = require_publisher(dead.envelope, publishers)
    run = store.get_run(dead.run_key)
    if dead.retried_at is not None and run.status not in ("dead", "pending"):
        raise AlreadyRetried(f"dead letter {dead_letter_id} was retried already; its run is now {run.status!r}")
    if run.status == "compensated" and reset_from is None:
        raise RunCompensated(
            f"the run of dead letter {dead_letter_id} was compensated: its committed steps were undone, so a "
            "retry would only replay the compensation; to run the job again from a step, retry with "
            "--reset-from <step key> (reset_from=...), usually its first step"
        )
    store.prepare_retry(dead_letter_id, reset_from=reset_from)
    job_id = publish(publisher, dead.envelope, dead.run_key)
    logger.info("dead letter %s re-published as job %s (run %s)", dead_letter_id, job_id, dead.run_key)
    return Retried(dead_letter_id, dead.run_key, dead.envelope.framework, job_id)


def retry_dead_letters(
    store: OperatorStore,
    publishers: Mapping[str, Publisher],
    *,
    ids: Sequence[int] | None = None,
    task_name: str | None = None,
) -> tuple[list[Retried], list[tuple[int, OperationError | StoreError]]]:
    """Retry several dead letters; one failure does not stop the others (C30).

    A publisher is checked for every selected dead letter first: if one is
    missing, [`NoPublisher`][flexiq_plugins.errors.NoPublisher] is raised and nothing is changed.

    Parameters:
      store (OperatorStore): the store.
      publishers (Mapping[str, Publisher]): a publisher per framework name.
      ids (Sequence[int] | None): the dead letters; every one not yet retried when ``None``.
      task_name (str | None): with ``ids=None``, only those of this task or actor.

    Returns:
      tuple: the retried ones, and ``(id, error)`` for each that failed.

    Raises:
      NoPublisher: a selected dead letter's framework has no publisher (nothing changed).
      StoreUnavailable: the store cannot be reached while listing.
    """
    if ids is None:
        ids = [d.id for d in store.list_dead_letters(task_name=task_name)]
    for dead_letter_id in ids:  # all publishers first, so a missing --app/--broker changes nothing
        with contextlib.suppress(UnknownDeadLetter):
            envelope = store.get_dead_letter(dead_letter_id).envelope
            if not envelope.corrupt:  # an unreadable one fails on its own below (CorruptRecord)
                require_publisher(envelope, publishers)
    done: list[Retried] = []
    failed: list[tuple[int, OperationError | StoreError]] = []
    for dead_letter_id in ids:
        try:
            done.append(retry_dead_letter(store, dead_letter_id, publishers))
        except (OperationError, StoreError) as exc:
            failed.append((dead_letter_id, exc))
    return done, failed


def purge_dead_letters(store: OperatorStore, ids: Sequence[int] | None = None) -> int:
    """Delete dead letters (all when ``ids`` is ``None``); their runs stay until cleanup (C30).

    Every id is checked first, so an unknown one deletes nothing.

    Returns:
      int: how many were deleted.

    Raises:
      UnknownDeadLetter: one of ``ids`` does not exist.
      StoreUnavailable: the store cannot be reached.
    """
    if ids is not None:
        for dead_letter_id in ids:
            store.get_dead_letter(dead_letter_id)
    return store.purge_dead_letters(ids)
