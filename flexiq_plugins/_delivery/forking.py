"""Forking a run from a step: run a job again from a chosen step, keeping what came before (C50).

For "send the receipts again" after a bug fix. A fork makes a *new* run (a
new run key) of the same task with the same arguments, whose steps before
the chosen one are copied from the old run: they are memo hits there, so
their bodies do not run again. The chosen step and every later one run in the
new run, under the new run key, so their idempotency keys
(``<new run key>:<step key>``, C10) are new: a payment service that
deduplicates on them sees new requests. The old run is not touched.

**Check, then change, then publish**, as a dead-letter retry does: a missing
publisher or a bad step changes nothing; the store copies the steps and
records the new run ``queued`` in one transaction
([`OperatorStore.fork_run`][flexiq_plugins.OperatorStore.fork_run]); then its
job is published. If that publish fails the new run stays ``queued`` and
recovery publishes it (C39).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from .._model.identity import check_run_key, new_run_key
from .._store.forks import fork_position
from .._store.operator_side import OperatorStore
from ..errors import PublishFailed
from .publishing import publish, require_publisher, require_readable
from .registry import Publisher

__all__ = ["Forked", "fork_run"]

logger = logging.getLogger("flexiq_plugins.operations")


@dataclass(frozen=True)
class Forked:
    """A run forked from a step (C50).

    Parameters:
      run_key (str): the old run, unchanged.
      new_run_key (str): the new run.
      from_step (str): the first step the new run runs again.
      copied (int): how many step rows were copied (the steps before ``from_step``).
      framework (str): ``"celery"`` or ``"dramatiq"``.
      job_id (str): the new run's job id.
    """

    run_key: str
    new_run_key: str
    from_step: str
    copied: int
    framework: str
    job_id: str


def fork_run(
    store: OperatorStore,
    run_key: str,
    from_step: str,
    publishers: Mapping[str, Publisher],
    *,
    new_key: str | None = None,
) -> Forked:
    """Fork ``run_key`` from ``from_step``: a new run with the steps before it copied, published as a new job (C50).

    The new run replays the copied steps as memo hits and runs ``from_step``
    and every later step once, with new idempotency keys (its own run key).
    The old run is not changed.

    Parameters:
      store (OperatorStore): the store.
      run_key (str): the run to fork.
      from_step (str): a ``run``, ``sleep`` or ``wait`` step of the run (e.g. ``"receipt#0"``).
      publishers (Mapping[str, Publisher]): a publisher per framework name.
      new_key (str | None): the new run's key; a new UUIDv7 when ``None``.

    Returns:
      Forked: the new run and its job.

    Raises:
      InvalidRunKey: ``run_key`` or ``new_key`` is not a run key, or ``new_key`` names a run.
      UnknownRun: no run has ``run_key``.
      UnknownStep: it has no step ``from_step``; the message lists the valid ones (nothing written).
      InvalidForkStep: ``from_step`` is an event, patch or compensation row; the message lists the valid ones.
      NoPublisher: no publisher for the job's framework (nothing written).
      CorruptRecord: the stored job envelope cannot be read (nothing written).
      PublishFailed: the broker refused; the new run stays ``queued``, and
        `recover` publishes it.
      StoreUnavailable: the store cannot be reached.
    """
    check_run_key(run_key)
    key = check_run_key(new_key) if new_key is not None else new_run_key()
    run = store.get_run(run_key)
    fork_position(store.get_steps(run_key), from_step, run_key)  # a bad step is named before anything else
    require_readable(run.envelope, run_key)
    publisher = require_publisher(run.envelope, publishers)
    forked = store.fork_run(run_key, from_step, key)
    try:
        job_id = publish(publisher, run.envelope, key)
    except PublishFailed as exc:
        raise PublishFailed(f"{exc}; the new run {key} is recorded queued: `flexiq recover` publishes it") from exc
    logger.info("forked run %s from %r as run %s (job %s)", run_key, from_step, key, job_id)
    return Forked(run_key, key, from_step, forked.step_count, run.envelope.framework, job_id)
