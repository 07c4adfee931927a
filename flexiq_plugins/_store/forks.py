"""Where a fork cuts a run's steps (C50), written once for every store.

Forking a run from a step copies the steps recorded before it into a new
run; that step and every later one run again there. The step must be one the
body runs again: a ``run``, ``sleep`` or ``wait`` step of the body, recorded
before any compensation began. What a wait received (``event:…``) belongs to
its wait, a patch marker to the patch (C49), and a compensation's rows to the
compensation (C32): none of them is a place to start from.
"""

from __future__ import annotations

from collections.abc import Sequence

from .._model.records import StepRow
from ..errors import InvalidForkStep, UnknownStep

__all__ = ["FORKABLE_KINDS", "fork_position", "forkable_steps"]

FORKABLE_KINDS = frozenset({"run", "sleep", "wait"})
"""The kinds of step a run can be forked from."""

_NONE = "(none: it has no step of the body; a succeeded run's steps are dropped unless the workers keep them)"


def forkable_steps(steps: Sequence[StepRow]) -> list[StepRow]:
    """The steps of ``steps`` (by position) a run can be forked from: the body's, before any compensation."""
    chosen = []
    for row in sorted(steps, key=lambda r: r.position):
        if row.kind == "compensation":
            break
        if row.kind in FORKABLE_KINDS:
            chosen.append(row)
    return chosen


def fork_position(steps: Sequence[StepRow], from_step: str, run_key: str) -> int:
    """The position of ``from_step`` in ``steps``: the steps before it are copied, it and the later ones are not.

    Raises:
      UnknownStep: the run has no step ``from_step``; the message lists the ones it can be forked from.
      InvalidForkStep: ``from_step`` is a step of another kind (or an undo); the message lists the valid ones.
    """
    valid = forkable_steps(steps)
    for row in valid:
        if row.step_key == from_step:
            return row.position
    choices = ", ".join(r.step_key for r in valid) or _NONE
    if any(r.step_key == from_step for r in steps):
        raise InvalidForkStep(
            f"run {run_key!r} cannot be forked from {from_step!r}: it is not a run, sleep or wait step of the "
            f"body; fork it from one of: {choices}"
        )
    raise UnknownStep(f"run {run_key!r} has no step {from_step!r}; fork it from one of: {choices}")
