"""The rules of events (C33), written once for every store.

Like `claims`, each question is answered by a pure
function of stored fields and the store's clock, so the memory store and the
SQL store (which states the same rules as ``WHERE`` clauses) cannot drift apart:

- may a run receive an event (`receivable`): same topic and key; sent to
  this run by its run key, or to every run at or after the run was created;
  not received by it before (no step row of the run holds its id);
- what a waiting step's poll found (`poll_result`): the event, or a
  timeout once the deadline has passed with none;
- whom a sender wakes (`wakes`): the runs waiting on the event's topic
  and key (``waiting``, or ``running`` between their poll and their
  suspension) that can receive it.

Times are epoch seconds on the store's clock.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Protocol

from .._model.records import EventPoll, EventRecord, StepRow

__all__ = [
    "WAITER_STATUSES",
    "consumed_event_ids",
    "first_receivable",
    "poll_result",
    "receivable",
    "wakes",
]

WAITER_STATUSES = ("waiting", "running")
"""A run in one of these states with matching wait fields is woken by a sender."""


class WaitingRun(Protocol):
    """The fields of a stored run that `wakes` reads."""

    @property
    def run_key(self) -> str:
        """The run's key."""

    @property
    def status(self) -> str:
        """The run's status."""

    @property
    def created_at(self) -> float:
        """When the run was created, epoch seconds."""

    @property
    def wait_topic(self) -> str | None:
        """The topic the run waits on."""

    @property
    def wait_key(self) -> str | None:
        """The key the run waits on."""


def consumed_event_ids(rows: Iterable[StepRow]) -> set[int]:
    """The ids of the events a run received: its ``event`` rows' ``event_id``."""
    return {r.event_id for r in rows if r.event_id is not None}


def receivable(
    event: EventRecord, *, run_key: str, run_created_at: float, topic: str, key: str, consumed: Collection[int]
) -> bool:
    """Whether the run ``run_key`` (created at ``run_created_at``) can receive ``event`` on ``(topic, key)``."""
    if event.topic != topic or event.key != key or event.id in consumed:
        return False
    if event.run_key is not None:
        return event.run_key == run_key
    return event.created_at >= run_created_at


def first_receivable(
    events: Iterable[EventRecord],
    *,
    run_key: str,
    run_created_at: float,
    topic: str,
    key: str,
    consumed: Collection[int],
) -> EventRecord | None:
    """The receivable event with the lowest id, or ``None`` (see `receivable`)."""
    found = [
        e
        for e in events
        if receivable(e, run_key=run_key, run_created_at=run_created_at, topic=topic, key=key, consumed=consumed)
    ]
    return min(found, key=lambda e: e.id) if found else None


def poll_result(event: EventRecord | None, now: float, deadline: float | None) -> EventPoll:
    """What a poll found: the event; else a timeout when ``deadline`` (epoch seconds) has passed; else nothing yet."""
    if event is not None:
        return EventPoll(event, now)
    return EventPoll(None, now, timed_out=deadline is not None and deadline <= now)


def wakes(run: WaitingRun, event: EventRecord) -> bool:
    """Whether a sender of ``event`` wakes ``run``: it waits on the event's topic and key and can receive it."""
    if run.status not in WAITER_STATUSES or (run.wait_topic, run.wait_key) != (event.topic, event.key):
        return False
    if event.run_key is not None:
        return run.run_key == event.run_key
    return run.created_at <= event.created_at
