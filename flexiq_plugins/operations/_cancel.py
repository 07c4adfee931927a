"""Cancelling a run on request (C34), and re-publishing it when its undos must run.

:func:`cancel_run` is :func:`flexiq_plugins.cancellation.cancel` (the one
cancellation: ``flexiq runs cancel``, :func:`flexiq_plugins.cancel_run`, a
framework's revoke) plus the publish of a run whose compensation waits for a
delivery, through the publisher of its framework; without one, recovery
publishes it (a run with a requested cancellation is stranded).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping

from .._store.base import StepStore
from ..cancellation import DEFAULT_CANCEL_REASON, CancelResult, cancel
from ..errors import PublishFailed
from ..registry import Publisher
from ._publishing import publish

__all__ = ["DEFAULT_CANCEL_REASON", "CancelResult", "cancel_run"]

logger = logging.getLogger("flexiq_plugins.operations")


def cancel_run(
    store: StepStore, run_key: str, *, reason: str = "", publishers: Mapping[str, Publisher] | None = None
) -> CancelResult:
    """Cancel the run ``run_key`` with ``reason`` (C34); re-publish it if its undos must run.

    Parameters:
      store(StepStore): the store.
      run_key(str): the run.
      reason(str): why, as ``flexiq runs list`` shows it (default
        ``"cancelled on request"``). The first reason given is kept.
      publishers(Mapping[str, Publisher] | None): re-publish a run whose undos
        must run; without one for its framework, recovery does it.

    Raises:
      UnknownRun: no run has ``run_key``.
      StoreUnavailable: the store cannot be reached.
    """
    done = cancel(store, run_key, reason)
    if done.outcome != "compensating":
        return done
    run = store.get_run(run_key)
    publisher = (publishers or {}).get(run.framework)
    if publisher is None:
        note = f"no publisher for {run.framework!r} jobs here: recovery re-publishes it to run its undos"
        return dataclasses.replace(done, note=note)
    try:  # a new job id: the old one may be revoked (a Celery revoke is what cancelled the run)
        job_id = publish(publisher, run.envelope, run_key)
    except PublishFailed as exc:
        return dataclasses.replace(done, note=f"{exc}; recovery re-publishes it")
    logger.info("run %s cancelled: its undos run in job %s", run_key, job_id)
    return dataclasses.replace(done, job_id=job_id)
