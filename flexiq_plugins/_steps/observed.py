"""The step journal of an observed attempt: the same protocol, reported to an observer (C53).

An attempt that is observed (an OpenTelemetry provider is configured, see
`flexiq_plugins._observe`) gets an `ObservedJournal` instead of the
plain `StepJournal`; an attempt that is not gets the plain one, so
observing costs a step nothing when it is off. The subclass changes no
decision of the protocol: it wraps the points where something happens.

- a step that executes is observed from its start to its end: its outcome
  is read from what the protocol did (a committed row, a signal, a refusal);
- a memo hit is counted, never observed as a step (a replay must not repeat
  the trace);
- each commit is timed; a sleep not yet due, a wait that suspends, a
  divergence and the start of a compensation are noted as events;
- a step map (C51) is observed as one step of kind ``map`` while any of its
  items runs, each item that runs as a step of its own (made current where
  its body runs), each committed item as a memo hit;
- ``step.patched`` (C49) is noted as a ``flexiq.patch`` event saying which
  branch the run takes; a marker the run commits is a step of kind ``patch``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from typing import Any

from .._model.failures import RunFailure, load_failure
from .._model.identity import StepId
from .._model.records import StepKind, StepRow
from .._observe.observer import AttemptObservation, Attribute, StepKindName, StepObservation, StepOutcome
from ..errors import EventWaitSignal, StepDivergence, StepRetryExhausted, StepRetrySignal
from .journal import ItemObservation, Protocol_, Step, StepJournal, Verb
from .transaction import TransactionVerb

__all__ = ["ObservedJournal"]

_UNDO_NAME = "compensate"
"""The name of an undo's step (``compensate:<step key>``, C32), which only `StepJournal.protocol_for` enters."""


class ObservedJournal(StepJournal):
    """A `StepJournal` that reports to ``observation``.

    Takes the plain journal's parameters, and:

    Parameters:
      observation (AttemptObservation): the attempt's observation.
    """

    def __init__(self, *args: Any, observation: AttemptObservation, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.observation = observation
        self._current: StepObservation | None = None
        self._undoing = False
        self._map_position: int | None = None

    def protocol_for(self, verb: Verb, step_id: StepId) -> Protocol_:
        """`StepJournal.protocol_for`, knowing an undo (C32) from what a wait received (C33)."""
        self._undoing = step_id.name == _UNDO_NAME
        try:
            return (yield from super().protocol_for(verb, step_id))
        finally:
            self._undoing = False

    def _replay_or_execute(self, verb: Verb, step: Step) -> Protocol_:
        if verb.kind == "patch":
            old_branch = step.memo is None and self.sequence.first_unreached() is not None
            self._event(
                "flexiq.patch", {"flexiq.patch.id": step.id.key or "", "flexiq.patch.new_branch": not old_branch}
            )
            if old_branch:  # nothing runs and nothing is written: the run keeps its recorded path (C49)
                return (yield from super()._replay_or_execute(verb, step))
        if step.memo is not None:
            self.observation.replayed(step.id)
            return (yield from super()._replay_or_execute(verb, step))
        recorded = len(self.sequence.recorded)
        observed = self.observation.step(step.id, self._kind(verb, step.id.kind), self.sequence.next_position)
        self._current = observed
        try:
            value = yield from super()._replay_or_execute(verb, step)
        except BaseException as exc:
            outcome, size = self._ended(observed, recorded, exc)
            observed.end(outcome, size=size, error=exc)
            raise
        finally:
            self._current = None
        observed.end("committed", size=self._size_since(recorded))
        return value

    def _kind(self, verb: Verb, kind: StepKind) -> StepKindName:
        if kind in ("sleep", "patch"):
            return kind
        if kind in ("wait", "event"):
            return "wait"
        if self._undoing:
            return "compensation"
        return "transaction" if isinstance(verb, TransactionVerb) else "run"

    def _size_since(self, recorded: int) -> int:
        rows = self.sequence.recorded
        return rows[-1].size if len(rows) > recorded else 0

    def _ended(self, observed: StepObservation, recorded: int, exc: BaseException) -> tuple[StepOutcome, int]:
        """How a step that raised ended: committed first (a sleep, a noticed cancellation), else what it raised."""
        rows = self.sequence.recorded
        if len(rows) > recorded:
            row = rows[-1]
            if row.failure is None:
                return "committed", row.size
            return ("exhausted" if isinstance(exc, StepRetryExhausted) else "failed"), row.size
        if isinstance(exc, EventWaitSignal):
            observed.event("flexiq.wait", _wait_attributes(exc))
            return "suspended", 0
        if isinstance(exc, StepRetrySignal):
            return "retry_scheduled", 0
        if isinstance(exc, StepRetryExhausted):
            return "exhausted", 0
        return ("refused" if exc is self.latched else "failed"), 0

    def _enter(self, name: object, key: object, kind: StepKind) -> Step:
        try:
            return super()._enter(name, key, kind)
        except StepDivergence as exc:
            self.observation.event("flexiq.divergence", {"flexiq.message": str(exc)[:2048]})
            raise

    # ------------------------------------------------------ a step map (C51)
    @contextlib.contextmanager
    def map_entry(self, name: object, keys: list[object]) -> Iterator[tuple[Step, list[Step]]]:
        """`StepJournal.map_entry`, observing the map as one step of kind ``map`` unless every item is a memo hit."""
        with super().map_entry(name, keys) as (entry, steps):
            if entry.memo is not None and all(s.memo is not None for s in steps):
                yield entry, steps  # a replay: each item counts as a memo hit, the map makes no step
                return
            position = entry.memo.position if entry.memo is not None else self.sequence.next_position
            observed = self.observation.step(entry.id, "map", position)
            self._map_position = position
            try:
                yield entry, steps
            except BaseException as exc:
                observed.end(self.outcome_of(exc), error=exc)
                raise
            else:
                observed.end("committed")
            finally:
                self._map_position = None

    def observe_item(self, step: Step) -> ItemObservation:
        """An item of the map that starts running: a step of its own, a child of the map's (C51, C53)."""
        position = self._map_position if self._map_position is not None else self.sequence.next_position
        return _ObservedItem(self, self.observation.step(step.id, "run", position, current=False))

    def item_replayed(self, step: Step) -> None:
        """Count a committed item of the map as a memo hit."""
        self.observation.replayed(step.id)

    def commit_rows(self, pending: list[tuple[Step, bytes | None, str | None]]) -> None:
        """`StepJournal.commit_rows`, timing the batch's one commit."""
        started = time.perf_counter()
        super().commit_rows(pending)
        if pending:
            self.observation.committed(time.perf_counter() - started)

    def outcome_of(self, error: BaseException) -> StepOutcome:
        """How a step map or one of its items that raised ``error`` ended."""
        if isinstance(error, StepRetrySignal):
            return "retry_scheduled"
        if isinstance(error, StepRetryExhausted):
            return "exhausted"
        return "refused" if error is self.latched else "failed"

    def _written(self, row: StepRow, write: Callable[[StepRow], StepRow]) -> StepRow:
        started = time.perf_counter()
        stored = super()._written(row, write)
        self.observation.committed(time.perf_counter() - started)
        return stored

    def sleep_until(self, step: Step, wake_at: float) -> None:
        """`StepJournal.sleep_until`, noting a sleep that is not due yet (``flexiq.sleep``)."""
        now = self.now()
        if wake_at > now:
            self._event(
                "flexiq.sleep",
                {
                    "flexiq.step.key": step.id.step_key,
                    "flexiq.sleep.wake_at": _iso(wake_at),
                    "flexiq.sleep.seconds": round(wake_at - now, 3),
                },
            )
        super().sleep_until(step, wake_at)

    def commit_compensation_start(self, failure: str) -> None:
        """`StepJournal.commit_compensation_start`, noting why the run is compensated (``flexiq.compensation``)."""
        super().commit_compensation_start(failure)
        try:
            loaded = load_failure(failure)
        except Exception:  # a summary is a courtesy: an unreadable one never fails the attempt
            loaded = None
        summary = loaded.summary if isinstance(loaded, RunFailure) else "?"
        self.observation.event("flexiq.compensation", {"flexiq.failure": summary[:2048]})

    def _event(self, name: str, attributes: dict[str, Attribute]) -> None:
        current = self._current
        if current is not None:
            current.event(name, attributes)
        else:
            self.observation.event(name, attributes)


class _ObservedItem:
    """`ItemObservation`: one running item of a step map, as a step observation of its own."""

    def __init__(self, journal: ObservedJournal, observed: StepObservation) -> None:
        self._journal = journal
        self._observed = observed

    def activate(self) -> object:
        return self._observed.activate()

    def deactivate(self, token: object) -> None:
        self._observed.deactivate(token)

    def committed(self, size: int) -> None:
        self._observed.end("committed", size=size)

    def failed(self, error: BaseException) -> None:
        self._observed.end(self._journal.outcome_of(error), error=error)


def _wait_attributes(signal: EventWaitSignal) -> dict[str, Attribute]:
    attributes: dict[str, Attribute] = {
        "flexiq.step.key": signal.step_key,
        "flexiq.wait.topic": signal.topic,
        "flexiq.wait.key": signal.key,
    }
    if signal.deadline is not None:
        attributes["flexiq.wait.deadline"] = _iso(signal.deadline)
    return attributes


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, tz=timezone.utc).isoformat(timespec="milliseconds")
