"""Cancelling a run (C34): on request, and when it goes over a cap on its duration or its total suspension.

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
  (:func:`~flexiq_plugins.compensation.begin_compensation`): its next
  delivery (the caller re-publishes its job, else recovery does) replays the
  body, runs the undos and ends the run ``cancelled``;
- otherwise it ends ``cancelled`` at once (a compare-and-set). A wake-up
  message still in the broker finds a finished run and is dropped (C26).

**Caps.**

A task (or actor, or the whole integration) may say how long a run may last
from its creation (``max_run_seconds``) and how long it may spend suspended in
sleeps and waits for events (``max_suspended_seconds``), together a
:class:`~flexiq_plugins.CancellationPolicy`. A run that goes over
either cap is cancelled: it ends ``cancelled`` with the reason, and the
compensations of its committed steps run (C32) — the same end as
``flexiq runs cancel``.

**Where the time is counted.** Nothing new is stored for it: the run's
``created_at`` comes with its claim, and its suspension is read from its own
step rows (:func:`suspended_seconds`): a sleep is suspended from its commit to
its wake time, a wait from its ``wait`` row to the ``event`` row that ended it
(or until now). Step-retry backoffs and the framework's own retries are not
suspensions.

**When a cap is checked** (:class:`RunCaps`):

- when an attempt claims the run (a run over a cap replays its committed
  steps only, so their undos are registered, and stops at the first step that
  never ran);
- before each new step of an attempt (the duration cap);
- when the run suspends: it is put back no later than the moment it would
  reach a cap, so a run sleeping for a week under a one-day cap is cancelled
  after one day, and a wait without a timeout still comes back at the cap.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from . import compensation, replays
from ._store.base import TERMINAL_STATUSES, StepRow, StepStore
from ._store.claims import lease_remaining
from .errors import RunCancelled
from .failures import RunFailure, qualified_name
from .policies import CancellationPolicy
from .waits import EVENT_PREFIX

__all__ = ["DEFAULT_CANCEL_REASON", "CancelResult", "RunCaps", "cancel", "suspended_seconds"]

logger = logging.getLogger("flexiq_plugins")

DEFAULT_CANCEL_REASON = "cancelled on request"
"""The reason recorded when none is given."""

CancelOutcome = Literal["cancelled", "compensating", "requested", "finished"]


@dataclass(frozen=True)
class CancelResult:
    """What a cancellation did (C34).

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


def suspended_seconds(rows: Iterable[StepRow], now: float) -> float:
    """How long the run with these step rows has been suspended in sleeps and waits, seconds (C34).

    A sleep counts from its commit to its wake time (or now, if that is
    earlier); a wait from its ``wait`` row to its ``event`` row (or now).

    Parameters:
      rows(Iterable[StepRow]): the run's committed step rows.
      now(float): the store's clock, epoch seconds.
    """
    rows = list(rows)
    ended = {r.step_key.removeprefix(EVENT_PREFIX): r.committed_at for r in rows if r.kind == "event"}
    total = 0.0
    for row in rows:
        start = row.committed_at
        if start is None:
            continue
        if row.kind == "sleep" and row.wake_at is not None:
            total += max(min(row.wake_at, now) - start, 0.0)
        elif row.kind == "wait":
            end = ended.get(row.step_key)
            total += max((end if end is not None else now) - start, 0.0)
    return total


@dataclass(frozen=True)
class RunCaps:
    """A run's caps against its clock: whether it is over one, and how long it may stay suspended (C34).

    Parameters:
      policy(CancellationPolicy): the caps.
      created_at(float): when the run was created, epoch seconds, store clock.
    """

    policy: CancellationPolicy
    created_at: float

    @property
    def run_deadline(self) -> float | None:
        """When the run reaches its duration cap, epoch seconds; ``None`` without one."""
        cap = self.policy.max_run_seconds
        return None if cap is None else self.created_at + cap

    def run_over(self, now: float) -> str | None:
        """The reason the run is over its duration cap at ``now``, else ``None``."""
        deadline = self.run_deadline
        if deadline is None or now < deadline:
            return None
        return f"the run lasted longer than its cap of {_seconds(self.policy.max_run_seconds)} (max_run_seconds)"

    def over(self, rows: Sequence[StepRow], now: float) -> str | None:
        """The reason the run is over a cap at ``now``, else ``None``."""
        cap = self.policy.max_suspended_seconds
        if cap is not None and suspended_seconds(rows, now) >= cap:
            return f"the run was suspended longer than its cap of {_seconds(cap)} (max_suspended_seconds)"
        return self.run_over(now)

    def wake_by(self, wake_at: float | None, rows: Sequence[StepRow], now: float) -> float | None:
        """The earliest of ``wake_at`` and the moments a run suspending now reaches a cap (epoch seconds).

        Parameters:
          wake_at(float | None): when the sleep or wait ends by itself; ``None``: never.
          rows(Sequence[StepRow]): the run's committed step rows.
          now(float): the store's clock, epoch seconds.
        """
        times = [t for t in (wake_at, self.run_deadline) if t is not None and t != math.inf]
        cap = self.policy.max_suspended_seconds
        if cap is not None:
            times.append(now + max(cap - suspended_seconds(rows, now), 0.0))
        return min(times) if times else None


def _seconds(value: float | None) -> str:
    return f"{value:g} s"
