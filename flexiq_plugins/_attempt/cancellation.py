"""Cancelling a run on request (C34): the one cancellation every path uses.

**On request** (:func:`cancel`, the one cancellation every path uses:
``flexiq runs cancel``, :func:`flexiq_plugins.cancel_run`, a framework's
revoke through :meth:`AttemptDriver.framework_ended`). The request is first
recorded on the run (:meth:`StepStore.request_cancel`), so whichever attempt
holds or next claims the run sees it; then:

- a **finished** run is left as it is;
- a run **held by a live attempt** is left to it: the attempt sees the
  request with its next commit, unwinds with
  :class:`~flexiq_plugins.errors.RunCancelled`, runs its undos and ends
  ``cancelled``;
- a run **no attempt holds** (pending, sleeping, waiting, retrying, or its
  worker died) with committed undos is turned into a compensation
  (:func:`~flexiq_plugins._attempt.compensation.begin_compensation`): its next
  delivery (the caller re-publishes its job, else recovery does) replays the
  body, runs the undos and ends the run ``cancelled``;
- otherwise it ends ``cancelled`` at once (a compare-and-set). A wake-up
  message still in the broker finds a finished run and is dropped (C26).

A run over one of its run caps (:mod:`flexiq_plugins._attempt.caps`) is cancelled the same way.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

from .._model import replays
from .._model.failures import RunFailure, qualified_name
from .._model.records import TERMINAL_STATUSES
from .._store.base import StepStore
from .._store.claims import lease_remaining
from ..errors import RunCancelled
from . import compensation

__all__ = ["DEFAULT_CANCEL_REASON", "CancelResult", "cancel"]

logger = logging.getLogger("flexiq_plugins")

DEFAULT_CANCEL_REASON = "cancelled on request"
"""The reason recorded when none is given."""

CancelEffect = Literal["cancelled", "compensating", "requested", "finished"]
"""What a cancellation did: see :attr:`CancelResult.effect`."""


@dataclass(frozen=True)
class CancelResult:
    """What a cancellation did (C34).

    Parameters:
      run_key(str): the run.
      effect(str): ``cancelled`` (ended now); ``compensating`` (its undos run
        at the next delivery, then it ends ``cancelled``); ``requested`` (an
        attempt holds it and stops at its next step boundary); ``finished``
        (it had already ended: nothing changed).
      status(str): the run's status after the call.
      job_id(str | None): the job re-published to run the undos, if any.
      note(str): why a compensation was not re-published ('' otherwise).
    """

    run_key: str
    effect: CancelEffect
    status: str
    job_id: str | None = None
    note: str = ""


def cancel(store: StepStore, run_key: str, reason: str = "") -> CancelResult:
    """Cancel the run ``run_key`` with ``reason`` (C34); see the module's description. Publishes nothing.

    A ``compensating`` run waits for one delivery: re-publish its job (as
    :func:`flexiq_plugins.operations.cancel_run` does), or recovery will.

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
    stated = run.cancel_reason or reason or DEFAULT_CANCEL_REASON
    if not compensation.is_compensating(store.get_steps(run_key)):
        failure = RunFailure("cancelled", "cancelled", qualified_name(RunCancelled), str(RunCancelled(stated)), "")
        if compensation.begin_compensation(store, run_key, failure, status=run.status, attempt=run.attempt):
            return CancelResult(run_key, "compensating", "pending")
        kept = replays.cancelled_outcome(stated)  # a duplicate replays the cancellation (C37)
        if store.settle_cancelled(run_key, status=run.status, attempt=run.attempt, outcome=kept):
            logger.info("run %s cancelled: %s", run_key, stated)
            return CancelResult(run_key, "cancelled", "cancelled")
    return CancelResult(run_key, "requested", store.get_run(run_key).status)  # whoever holds it now sees it
