"""What an operator's listing asks of the store and gets back: filters, cursors, capped counts (C52).

The dashboard and ``flexiq runs list`` page through stores of millions of
runs. Every listing here is a *keyset* page: ordered by an indexed value and
the run key, continued after the last row of the previous page (a
`RunCursor`), never by an ``OFFSET`` the database would have to walk. Counts
are *capped*: a store counts at most ``cap + 1`` rows of a group, so a count
above ``cap`` means "more than ``cap``" and costs no more than ``cap`` rows.

Times are ``float`` seconds since the epoch on the store's clock (C23).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .records import EventRecord

__all__ = ["ListedEvent", "RunCursor", "RunFilter", "RunGroup", "RunOrder", "SweepLease"]

RunOrder = Literal["updated_desc", "updated_asc", "wake_asc"]
"""The order of a runs listing: last update newest or oldest first, or wake time soonest first.

Ties are broken by the run key in the same direction, so a cursor names one place."""

RunGroup = Literal["status", "task_name"]
"""What a runs count groups by."""


@dataclass(frozen=True)
class RunFilter:
    """Which runs a listing shows; every field given must match (``None``: any).

    Parameters:
      status (str | None): the run's status.
      task_name (str | None): the task or actor name.
      framework (str | None): ``"celery"`` or ``"dramatiq"``.
      queue (str | None): the queue its job was published to.
      updated_since (float | None): last updated at or after this time, epoch seconds.
      updated_until (float | None): last updated before this time, epoch seconds.
      wake_before (float | None): its wake time (a sleep's, a wait's deadline) is before this, epoch seconds.
    """

    status: str | None = None
    task_name: str | None = None
    framework: str | None = None
    queue: str | None = None
    updated_since: float | None = None
    updated_until: float | None = None
    wake_before: float | None = None


@dataclass(frozen=True)
class RunCursor:
    """Where a page of runs ended: the last run's sort value and run key; the next page starts after it.

    Parameters:
      value (float): the last run's ``updated_at`` (or ``wake_at`` for ``wake_asc``), epoch seconds.
      run_key (str): the last run's key.
    """

    value: float
    run_key: str


@dataclass(frozen=True)
class ListedEvent:
    """A stored event and the runs that received it (C33).

    Parameters:
      event (EventRecord): the event.
      received_by (tuple[str, ...]): the run keys whose ``event`` step holds its id, sorted;
        empty while it is pending.
    """

    event: EventRecord
    received_by: tuple[str, ...]


@dataclass(frozen=True)
class SweepLease:
    """A recovery lease and when its holder last swept (C39).

    Parameters:
      name (str): the lease, e.g. ``"recovery:celery"``.
      owner (str | None): the process holding it (``None``: released).
      lease_until (float | None): until when it is held, epoch seconds.
      swept_at (float | None): when it was last taken or renewed, which a
        sweeper does right before each sweep, epoch seconds (``None``: not
        recorded, a lease taken before the store kept it).
    """

    name: str
    owner: str | None
    lease_until: float | None
    swept_at: float | None
