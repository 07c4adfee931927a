"""Cancelling a run on request (C34): at once when it is not running, at the next step boundary when it is.

The one cancellation every path uses: ``flexiq runs cancel``,
:func:`flexiq_plugins.cancel_run`, and an adapter whose framework ended a job
on purpose (a Celery ``revoke``). It first records the request on the run
(:meth:`StepStore.request_cancel`), so whichever attempt holds or next claims
the run sees it, then:

- a **finished** run is left as it is;
- a run **held by a live attempt** is left to it: the attempt sees the
  request with its next commit, unwinds with
  :class:`~flexiq_plugins.errors.RunCancelled`, runs its undos and ends
  ``cancelled``;
- a run **no attempt holds** (pending, sleeping, waiting, retrying, or its
  worker died) with committed undos is turned into a compensation
  (:func:`~flexiq_plugins.compensation.begin_compensation`) and its job
  re-published: that delivery replays the body, runs the undos and ends the
  run ``cancelled``;
- otherwise it ends ``cancelled`` at once (a compare-and-set). A wake-up
  message still in the broker finds a finished run and is dropped (C26).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from .. import compensation
from .._store.base import TERMINAL_STATUSES, RunRecord, StepStore
from .._store.claims import lease_remaining
from ..errors import PublishFailed, RunCancelled
from ..failures import RunFailure, qualified_name
from ..registry import Publisher
from ._publishing import publish

__all__ = ["DEFAULT_CANCEL_REASON", "CancelResult", "cancel_run"]

logger = logging.getLogger("flexiq_plugins.operations")

DEFAULT_CANCEL_REASON = "cancelled on request"
"""The reason recorded when none is given."""

CancelOutcome = Literal["cancelled", "compensating", "requested", "finished"]


@dataclass(frozen=True)
class CancelResult:
    """What :func:`cancel_run` did (C34).

    Parameters:
      run_key(str): the run.
      outcome(str): ``cancelled`` (ended now); ``compensating`` (its undos run
        at the next delivery, then it ends ``cancelled``); ``requested`` (an
        attempt holds it and stops at its next step boundary); ``finished``
        (it had already ended: nothing changed).
      status(str): the run's status after the call.
      job_id(str | None): the job re-published to run the undos, if any.
      note(str): why a compensation was not re-published ('' otherwise).
    """

    run_key: str
    outcome: CancelOutcome
    status: str
    job_id: str | None = None
    note: str = ""


def cancel_run(
    store: StepStore, run_key: str, *, reason: str = "", publishers: Mapping[str, Publisher] | None = None
) -> CancelResult:
    """Cancel the run ``run_key`` with ``reason`` (C34); see the module's description.

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
    run = store.request_cancel(run_key, reason or DEFAULT_CANCEL_REASON)
    if run.status in TERMINAL_STATUSES:
        return CancelResult(run_key, "finished", run.status)
    if run.owner is not None and lease_remaining(run.lease_until, store.now()) is not None:
        logger.info("run %s: cancellation requested; its attempt stops at the next step", run_key)
        return CancelResult(run_key, "requested", run.status)
    rows = store.get_steps(run_key)
    if not compensation.is_compensating(rows):
        failure = _failure(run.cancel_reason or reason)
        if compensation.begin_compensation(store, run_key, failure, status=run.status, attempt=run.attempt):
            return _republished(store, run, publishers or {})
        if store.settle_cancelled(run_key, status=run.status, attempt=run.attempt):
            logger.info("run %s cancelled: %s", run_key, run.cancel_reason)
            return CancelResult(run_key, "cancelled", "cancelled")
    return CancelResult(run_key, "requested", store.get_run(run_key).status)  # whoever holds it now sees it


def _failure(reason: str) -> RunFailure:
    cancelled = RunCancelled(reason)
    return RunFailure("cancelled", "cancelled", qualified_name(RunCancelled), str(cancelled), "")


def _republished(store: StepStore, run: RunRecord, publishers: Mapping[str, Publisher]) -> CancelResult:
    publisher = publishers.get(run.framework)
    if publisher is None:
        note = f"no publisher for {run.framework!r} jobs here: recovery re-publishes it to run its undos"
        return CancelResult(run.run_key, "compensating", "pending", note=note)
    try:  # a new job id: the old one may be revoked (a Celery revoke is what cancelled the run)
        job_id = publish(publisher, run.envelope, run.run_key)
    except PublishFailed as exc:
        return CancelResult(run.run_key, "compensating", "pending", note=f"{exc}; recovery re-publishes it")
    logger.info("run %s cancelled: its undos run in job %s", run.run_key, job_id)
    return CancelResult(run.run_key, "compensating", "pending", job_id=job_id)
