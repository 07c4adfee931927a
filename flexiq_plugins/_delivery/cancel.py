"""Cancelling a run on request (C34), and re-publishing it when its undos must run.

:func:`cancel_run` is :func:`flexiq_plugins._attempt.cancellation.cancel` (the one
cancellation: ``flexiq runs cancel``, a framework's revoke) plus the publish
of a run whose compensation waits for a delivery, through the publisher of its framework; without one, recovery
publishes it (a run with a requested cancellation is stranded).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping

from .._attempt.cancellation import DEFAULT_CANCEL_REASON, CancelResult, cancel
from .._store.factory import StoreSpec
from ..errors import PublishFailed
from .process import this_process
from .publishing import publish
from .registry import Publisher

__all__ = ["DEFAULT_CANCEL_REASON", "CancelResult", "cancel_run"]

logger = logging.getLogger("flexiq_plugins.operations")


def cancel_run(
    run_key: str, *, reason: str = "", store: StoreSpec = None, publishers: Mapping[str, Publisher] | None = None
) -> CancelResult:
    """Cancel the run ``run_key`` (C34): at once if no attempt runs it, at its next step boundary if one does.

    Its compensations run (C32) and it ends ``cancelled`` with ``reason``; a
    wake-up message of a sleeping or waiting run is dropped when it arrives.
    A run whose undos must run is re-published through the publisher of its
    framework (else recovery re-publishes it).

    Parameters:
      run_key(str): the run.
      reason(str): why, as ``flexiq runs list`` shows it (default
        ``"cancelled on request"``). The first reason given is kept.
      store(StepStore | Engine | str | None): where the run is; ``None``: the
        store of the integration configured in this process, else
        ``FLEXIQ_STORE_URL``, else the default SQLite file (which must exist).
      publishers(Mapping[str, Publisher] | None): a publisher per framework
        name; ``None``: the app or broker of each integration configured in
        this process; ``{}``: leave the re-publish to recovery.

    Returns:
      CancelResult: ``cancelled``, ``compensating``, ``requested`` or ``finished``, and the run's status.

    Raises:
      UnknownRun: no run has ``run_key``.
      ConfigurationError: an unusable store setting, or a SQLite file that does not exist.
      StoreUnavailable: the store cannot be reached.
    """
    here = this_process(store, publishers)
    done = cancel(here.store, run_key, reason)
    if done.effect != "compensating":
        return done
    run = here.store.get_run(run_key)
    publisher = here.publishers.get(run.framework)
    if publisher is None:
        note = f"no publisher for {run.framework!r} jobs here: recovery re-publishes it to run its undos"
        return dataclasses.replace(done, note=note)
    try:  # a new job id: the old one may be revoked (a Celery revoke is what cancelled the run)
        job_id = publish(publisher, run.envelope, run_key)
    except PublishFailed as exc:
        return dataclasses.replace(done, note=f"{exc}; recovery re-publishes it")
    logger.info("run %s cancelled: its undos run in job %s", run_key, job_id)
    return dataclasses.replace(done, job_id=job_id)
