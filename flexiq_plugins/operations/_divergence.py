"""A divergence dead letter's report as two step sequences side by side (C12).

A divergence names the recorded step sequence and the running one
(``flexiq_plugins._model.identity``). For an operator deciding how to fix
the code or where to retry from (``dlq retry --reset-from``), the two are
laid out position by position: which steps match, which one changed, which
recorded ones the new code did not reach.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .._model.records import DeadLetterRecord

__all__ = ["Divergence", "DivergenceLine", "divergence_of"]

Change = Literal["same", "changed", "not reached", "new"]


@dataclass(frozen=True)
class DivergenceLine:
    """One position of a divergence report.

    Parameters:
      position (int): the position in the step sequence, from 0.
      recorded (str | None): the recorded step key there (``None``: none was recorded).
      running (str | None): the running step key there (``None``: the attempt stopped before it).
      change (str): ``same``, ``changed``, ``not reached`` or ``new``.
    """

    position: int
    recorded: str | None
    running: str | None
    change: Change


@dataclass(frozen=True)
class Divergence:
    """The recorded and the running sequences of a divergence, position by position.

    Parameters:
      lines (list[DivergenceLine]): one per position.
      changed_at (int | None): the first position whose step changed.
    """

    lines: list[DivergenceLine]
    changed_at: int | None


def divergence_of(dead: DeadLetterRecord) -> Divergence | None:
    """The two sequences of a ``divergence`` dead letter; ``None`` for another reason or an unreadable message.

    Step keys are read from the message's ``recorded:`` and ``running:``
    lines (comma-separated), as the worker wrote them.

    Parameters:
      dead (DeadLetterRecord): the dead letter.
    """
    if dead.reason != "divergence":
        return None
    sequences: dict[str, list[str]] = {}
    for line in dead.message.splitlines():
        label, sep, keys = line.strip().partition(":")
        if sep and label in ("recorded", "running") and label not in sequences:
            sequences[label] = [k for k in keys.strip().split(", ") if k]
    if set(sequences) != {"recorded", "running"}:
        return None
    recorded, running = sequences["recorded"], sequences["running"]
    lines = [_line(i, recorded, running) for i in range(max(len(recorded), len(running)))]
    changed = [line.position for line in lines if line.change == "changed"]
    return Divergence(lines, changed[0] if changed else None)


def _line(i: int, recorded: list[str], running: list[str]) -> DivergenceLine:
    was = recorded[i] if i < len(recorded) else None
    now = running[i] if i < len(running) else None
    if was is None:
        return DivergenceLine(i, None, now, "new")
    if now is None:
        return DivergenceLine(i, was, None, "not reached")
    return DivergenceLine(i, was, now, "same" if was == now else "changed")
