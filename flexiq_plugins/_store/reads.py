"""The reads both sides of the store make: its clock, a run and the run's step rows, the known durable tasks.

An attempt's driver reads a run to settle a framework's end of its job (C38)
and its step rows to see whether it compensates (C32); an operator reads them
to show a run, recovery to decide on one (C35). Both read the store's clock
(C23). Producers and workers read the tasks known to take steps, and so does
an operator listing them (C43). So these live below both interfaces, in this small base, rather
than in one of them: `AttemptStore`
and `OperatorStore` extend it.
"""

from __future__ import annotations

import abc

from .._model.records import KnownTask, RunRecord, StepRow

__all__ = ["StoreReads"]


class StoreReads(abc.ABC):
    """The store's clock, one run and its step rows, the known durable tasks: what an attempt and an operator both read.

    Times are ``float`` seconds since the epoch on the store's clock (C23).
    """

    @abc.abstractmethod
    def now(self) -> float:
        """Return the store's clock, epoch seconds."""

    @abc.abstractmethod
    def get_run(self, run_key: str) -> RunRecord:
        """Return one run; raises [`UnknownRun`][flexiq_plugins.errors.UnknownRun]."""

    @abc.abstractmethod
    def get_steps(self, run_key: str) -> list[StepRow]:
        """Return the run's step rows ordered by position (empty if none)."""

    @abc.abstractmethod
    def durable_tasks(self) -> list[KnownTask]:
        """Return the tasks known to take steps, ordered by framework and name (C43).

        What producers and workers cache (refreshed at most every
        ``known_tasks_refresh_seconds``) and ``flexiq tasks`` lists: each task
        an attempt noted with `note_durable_task` the first time it took a step.
        """
