"""Run caps (C34): a cap on a run's duration and on its total time suspended.

A task (or actor, or the whole integration) may say how long a run may last
from its creation (``max_run_seconds``) and how long it may spend suspended in
sleeps and waits for events (``max_suspended_seconds``), together a
:class:`~flexiq_plugins.CancellationPolicy`. A run that goes over
either cap is cancelled: it ends ``cancelled`` with the reason, and the
compensations of its committed steps run (C32) — the same end as
``flexiq runs cancel``.

"Run caps" are these two durations only; the limits on a step's and a run's
encoded bytes and on its step count are the *size limits* (C22,
:class:`~flexiq_plugins.Limits`).

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

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .._model.policies import CancellationPolicy
from .._model.records import StepRow
from .._steps.wait import EVENT_PREFIX

__all__ = ["RunCaps", "suspended_seconds"]


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
