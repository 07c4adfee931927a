"""Pages of runs, dead letters and events for an operator, and the selection a bulk action acts on (C52).

Each listing is one keyset page of the store (`OperatorStore.find_runs` …)
plus an opaque cursor for the next one: the dashboard passes it back in a
link, so paging a million runs costs what the first page does. A bulk action
first selects the runs of a filter, at most a cap of them, so its
confirmation can show how many it will touch before it touches any.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from .._model.durations import parse_duration
from .._model.listings import ListedEvent, RunCursor, RunFilter, RunOrder
from .._model.records import DeadLetterRecord, RunRecord
from .._store.operator_side import OperatorStore

__all__ = [
    "DeadLetterPage",
    "EventPage",
    "RunPage",
    "browse_dead_letters",
    "browse_events",
    "browse_runs",
    "parse_moment",
    "select_runs",
]


@dataclass(frozen=True)
class RunPage:
    """One page of runs and where the next one starts.

    Parameters:
      runs (list[RunRecord]): the runs of this page.
      next_cursor (str | None): pass it as ``cursor`` for the next page; ``None`` on the last page.
    """

    runs: list[RunRecord]
    next_cursor: str | None


def browse_runs(
    store: OperatorStore,
    where: RunFilter | None = None,
    *,
    cursor: str | None = None,
    order: RunOrder = "updated_desc",
    limit: int = 50,
) -> RunPage:
    """Return one page of the runs ``where`` selects, most recently updated first by default (C52).

    Parameters:
      store (OperatorStore): the store.
      where (RunFilter | None): the filter (``None``: every run).
      cursor (str | None): the previous page's ``next_cursor``; ``None`` for the first page.
      order (RunOrder): ``"updated_desc"``, ``"updated_asc"`` or ``"wake_asc"``.
      limit (int): at most this many runs (1 to 500).

    Raises:
      ValueError: ``cursor`` is not one this function made, or ``limit`` is out of range.
      StoreUnavailable: the store cannot be reached.
    """
    if not 1 <= limit <= 500:
        raise ValueError(f"a page holds 1 to 500 runs, not {limit}")
    after = None if cursor is None else _read_cursor(cursor)
    found = store.find_runs(where or RunFilter(), order=order, after=after, limit=limit + 1)
    runs = found[:limit]
    if len(found) <= limit:
        return RunPage(runs, None)
    last = runs[-1]
    value = last.wake_at if order == "wake_asc" and last.wake_at is not None else last.updated_at
    return RunPage(runs, f"{value!r}|{last.run_key}")


def _read_cursor(cursor: str) -> RunCursor:
    value, sep, run_key = cursor.partition("|")
    try:
        if not sep or not run_key:
            raise ValueError(cursor)
        return RunCursor(float(value), run_key)
    except ValueError:
        raise ValueError(f"{cursor[:80]!r} is not a page cursor; start again from the first page") from None


def select_runs(store: OperatorStore, where: RunFilter, *, cap: int) -> list[RunRecord]:
    """Return every run ``where`` selects, oldest update first, stopping after ``cap + 1`` of them.

    What a bulk action acts on: more than ``cap`` runs means the filter is too
    wide to act on at once (the caller says so and acts on none).

    Raises:
      StoreUnavailable: the store cannot be reached.
    """
    selected: list[RunRecord] = []
    after = None
    while len(selected) <= cap:
        page = store.find_runs(where, order="updated_asc", after=after, limit=min(500, cap + 1 - len(selected)))
        selected += page
        if not page:
            break
        after = RunCursor(page[-1].updated_at, page[-1].run_key)
    return selected


@dataclass(frozen=True)
class DeadLetterPage:
    """One page of dead letters, newest first.

    Parameters:
      letters (list[DeadLetterRecord]): the dead letters of this page.
      next_before (int | None): pass it as ``before_id`` for the next page; ``None`` on the last page.
    """

    letters: list[DeadLetterRecord]
    next_before: int | None


def browse_dead_letters(
    store: OperatorStore,
    *,
    task_name: str | None = None,
    reason: str | None = None,
    retried: bool | None = None,
    before_id: int | None = None,
    limit: int = 50,
) -> DeadLetterPage:
    """Return one page of dead letters, newest first (C30, C52).

    Parameters:
      store (OperatorStore): the store.
      task_name (str | None): only those of this task or actor.
      reason (str | None): only those of this reason (``divergence`` …).
      retried (bool | None): only those retried, or only those not yet.
      before_id (int | None): the previous page's ``next_before``.
      limit (int): at most this many.

    Raises:
      StoreUnavailable: the store cannot be reached.
    """
    found = store.find_dead_letters(
        before_id=before_id, limit=limit + 1, task_name=task_name, reason=reason, retried=retried
    )
    letters = found[:limit]
    return DeadLetterPage(letters, letters[-1].id if len(found) > limit else None)


@dataclass(frozen=True)
class EventPage:
    """One page of events, newest first, each with the runs that received it.

    Parameters:
      events (list[ListedEvent]): the events of this page.
      next_before (int | None): pass it as ``before_id`` for the next page; ``None`` on the last page.
    """

    events: list[ListedEvent]
    next_before: int | None


def browse_events(
    store: OperatorStore, *, received: bool | None = None, before_id: int | None = None, limit: int = 50
) -> EventPage:
    """Return one page of events, newest first: pending ones (no run received them yet) and received ones (C33).

    Parameters:
      store (OperatorStore): the store.
      received (bool | None): only received (``True``) or pending (``False``) ones.
      before_id (int | None): the previous page's ``next_before``.
      limit (int): at most this many.

    Raises:
      StoreUnavailable: the store cannot be reached.
    """
    found = store.find_events(before_id=before_id, limit=limit + 1, received=received)
    events = found[:limit]
    return EventPage(events, events[-1].event.id if len(found) > limit else None)


def parse_moment(text: str, now: float) -> float:
    """A moment as an operator types it: an ISO 8601 date or date-time, or a duration ago.

    ``2025-01-02``, ``2025-01-02T03:04`` (UTC unless an offset is given) or
    ``1h``, ``7d``, ``90s`` (that long before ``now``).

    Parameters:
      text (str): what was typed.
      now (float): the store's clock, epoch seconds.

    Returns:
      float: epoch seconds.

    Raises:
      ValueError: neither a date-time nor a duration, naming both forms.
    """
    text = text.strip()
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        pass
    else:
        return (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).timestamp()
    try:
        return now - parse_duration(text)
    except ValueError:
        raise ValueError(
            f"{text[:40]!r} is neither a date-time (2025-01-02T03:04, UTC unless it has an offset) "
            "nor a duration ago (1h, 7d)"
        ) from None
