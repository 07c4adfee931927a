"""The step-attempt rules, written once for every store (C31).

A step with a retry budget journals each attempt *before* its body runs, so a
worker killed inside the body has used an attempt and a redelivery cannot give
it back. When a new attempt of the step begins, two questions are answered
here, by pure functions of the step's recorded attempts and the store's clock:

- which recorded attempts are over without having ended (:func:`close_lost`):
  the run is claimed by the caller, so any attempt still open belonged to a
  worker that died or lost its claim;
- may a new attempt start (:func:`decide_step_attempt`): not before the last
  failure's ``retry_at`` (an early delivery: a duplicate, a sleep hop, a
  recovery), not once ``max_attempts`` attempts exist.

The stores read the rows and write what the answer says, each under its own
atomicity (the memory store's lock, one SQL transaction fenced on the claim).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol

from .._model.records import AttemptNotDue, AttemptsSpent, AttemptStarted, StepAttempt, StepAttemptFailure
from ..errors import UnknownRun

__all__ = ["close_lost", "decide_step_attempt", "failed_attempt", "retry_cut_position"]


def close_lost(attempts: Sequence[StepAttempt]) -> tuple[StepAttempt, ...]:
    """``attempts`` with every attempt that has not ended marked ``lost``."""
    return tuple(dataclasses.replace(a, ended="lost") if a.ended is None else a for a in attempts)


def decide_step_attempt(
    attempts: Sequence[StepAttempt], *, now: float, max_attempts: int
) -> AttemptStarted | AttemptNotDue | AttemptsSpent:
    """Decide whether a new attempt of a step starts now (C31).

    Parameters:
      attempts(Sequence[StepAttempt]): the step's attempts by number, lost ones already closed.
      now(float): the store's clock, epoch seconds.
      max_attempts(int): the step's budget, the first attempt included.

    Returns:
      AttemptStarted | AttemptNotDue | AttemptsSpent: :class:`AttemptNotDue`
      while the last attempt ``failed`` and its ``retry_at`` is ahead;
      :class:`AttemptsSpent` once ``max_attempts`` attempts exist; else
      :class:`AttemptStarted` with the next number.
    """
    previous = tuple(attempts)
    last = previous[-1] if previous else None
    if last is not None and last.ended == "failed" and last.retry_at is not None and last.retry_at > now:
        return AttemptNotDue(last.retry_at)
    if len(previous) >= max_attempts:
        return AttemptsSpent(previous)
    number = (last.number if last is not None else 0) + 1
    return AttemptStarted(number, previous)


def failed_attempt(attempt: StepAttempt, failure: StepAttemptFailure, now: float) -> StepAttempt:
    """``attempt`` with ``failure`` recorded at ``now`` (store clock): its end, error, ``failed_at``, ``retry_at``."""
    retry_at = None if failure.retry_delay is None else now + failure.retry_delay
    return dataclasses.replace(
        attempt,
        ended=failure.ended,
        error_type=failure.error_type,
        message=failure.message,
        traceback=failure.traceback,
        failed_at=now,
        retry_at=retry_at,
    )


class StoredStep(Protocol):
    """The fields of a stored step row that :func:`retry_cut_position` reads (a ``StepRow`` or a SQL row)."""

    @property
    def position(self) -> int:
        """Its position."""

    @property
    def step_key(self) -> str:
        """Its key."""

    @property
    def kind(self) -> str:
        """Its kind."""

    @property
    def failure(self) -> str | None:
        """Its failure, for a step that failed for good."""


def retry_cut_position(steps: Sequence[StoredStep], reset_from: str | None, run_key: str) -> int | None:
    """Where a dead-letter retry cuts a run's steps (C30, C31): that position and every later one are dropped.

    With ``reset_from``, that step's position. Without, the position of the
    last ``run`` step that failed for good (the one that ended the run: a
    spent budget, a non-retryable error, a failed undo), so it runs again with
    its whole budget; ``None`` (nothing dropped) when no step failed for good.

    Raises:
      UnknownRun: the run has no step ``reset_from``; the message lists its steps.
    """
    if reset_from is None:
        failed = [s.position for s in steps if s.kind == "run" and s.failure is not None]
        return max(failed) if failed else None
    for s in steps:
        if s.step_key == reset_from:
            return s.position
    keys = ", ".join(s.step_key for s in steps) or "(none)"
    raise UnknownRun(f"run {run_key!r} has no step {reset_from!r}; its steps are: {keys}")
