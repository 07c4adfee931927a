"""The verb of ``step.sleep`` / ``step.sleep_until``: the wake time is the memo (C15–C19).

The first commit fixes the wake time from the store's clock (C17, C23); a
replay returns at once when it has passed, and ends the attempt again
([`SleepSignal`][flexiq_plugins.errors.SleepSignal]) when it has not.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from .._model.records import StepKind
from .journal import Protocol_, Step, StepJournal

__all__ = ["SleepVerb"]


class SleepVerb:
    """``step.sleep`` / ``sleep_until``: the wake time is the memo (C15, C17).

    Parameters:
      wake_at_from (Callable[[float], float]): the wake time, epoch seconds,
        from the store clock's ``now`` at the first commit.
    """

    kind: StepKind = "sleep"

    def __init__(self, wake_at_from: Callable[[float], float]) -> None:
        self._wake_at_from = wake_at_from

    def replay(self, journal: StepJournal, step: Step) -> None:
        """Return at once if the recorded wake time has passed, else sleep again (C17).

        A row without a finite wake time (NULL, ``inf``, ``nan``) is a
        [`CorruptRecord`][flexiq_plugins.errors.CorruptRecord], dead-lettered.
        """
        assert step.memo is not None
        wake_at = step.memo.wake_at
        if wake_at is None:
            journal.refuse(journal.corrupt(step, "has no wake time"))
        if not math.isfinite(wake_at):  # no moment: a sleep that could never end, or that always had
            journal.refuse(journal.corrupt(step, f"has a wake time that is not a moment ({wake_at!r})"))
        journal.sleep_until(step, wake_at)

    def execute(self, journal: StepJournal, step: Step) -> Protocol_:
        """Fix the wake time from the store's clock (no body to run)."""
        return self._wake_at_from(journal.now())
        yield  # pragma: no cover - makes this a generator like every verb

    def commit(self, journal: StepJournal, step: Step, produced: Any) -> None:
        """Commit the wake time, then sleep unless it has already passed (C15)."""
        journal.commit(step, None, produced)
        journal.sleep_until(step, produced)
