"""The state of a store at a glance: what an operator's first page shows (C52).

Every figure is read through an index and capped, so the overview of a store
with a million runs costs what the overview of an empty one does: runs per
status and per task (each count at most ``cap``, above it "more than"), the
few oldest runs in each state that may be stuck, the last day's dead letters
by reason, and when recovery last swept (C39).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .._model.listings import RunFilter, SweepLease
from .._model.records import RunRecord
from .._store.operator_side import OperatorStore

__all__ = ["DEFAULT_COUNT_CAP", "Overview", "overview"]

DEFAULT_COUNT_CAP = 10_000
"""The most runs a count of the overview counts exactly; a larger group reads "more than 10,000"."""

_DAY_SECONDS = 86_400.0


@dataclass(frozen=True)
class Overview:
    """What [`overview`][flexiq_plugins.operations.overview] read.

    Parameters:
      now (float): the store's clock when it was read, epoch seconds.
      cap (int): a count above this is "more than ``cap``".
      by_status (dict[str, int]): runs per status (capped).
      by_task (dict[str, int]): runs per task or actor name (capped; the first 50 names).
      oldest_queued (list[RunRecord]): the runs recorded at publish that waited longest to start (C39).
      overdue_sleepers (list[RunRecord]): sleeping runs past their wake time, the most overdue first (C35).
      oldest_waiting (list[RunRecord]): the runs that have waited longest for an event (C33).
      dead_letters_by_reason (dict[str, int]): dead letters of the last 24 hours per reason (capped in total).
      sweeps (list[SweepLease]): the recovery leases, each with when it last swept (C39).
    """

    now: float
    cap: int
    by_status: dict[str, int]
    by_task: dict[str, int]
    oldest_queued: list[RunRecord] = field(default_factory=list)
    overdue_sleepers: list[RunRecord] = field(default_factory=list)
    oldest_waiting: list[RunRecord] = field(default_factory=list)
    dead_letters_by_reason: dict[str, int] = field(default_factory=dict)
    sweeps: list[SweepLease] = field(default_factory=list)


def overview(store: OperatorStore, *, cap: int = DEFAULT_COUNT_CAP, sample: int = 5) -> Overview:
    """Read the overview of ``store`` (the dashboard's first page).

    Parameters:
      store (OperatorStore): the store.
      cap (int): the most runs counted exactly per status or task.
      sample (int): how many runs each "oldest" list holds.

    Raises:
      StoreUnavailable: the store cannot be reached.
    """
    now = store.now()
    return Overview(
        now=now,
        cap=cap,
        by_status=store.count_runs(by="status", cap=cap),
        by_task=store.count_runs(by="task_name", cap=cap),
        oldest_queued=store.find_runs(RunFilter(status="queued"), order="updated_asc", limit=sample),
        overdue_sleepers=store.find_runs(RunFilter(status="sleeping", wake_before=now), order="wake_asc", limit=sample),
        oldest_waiting=store.find_runs(RunFilter(status="waiting"), order="updated_asc", limit=sample),
        dead_letters_by_reason=store.count_dead_letters(since=now - _DAY_SECONDS, cap=cap),
        sweeps=store.sweep_leases(),
    )
