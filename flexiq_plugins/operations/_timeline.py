"""A run as a timeline of its steps, with everything an operator asks about each (C52).

[`run_timeline`][flexiq_plugins.operations.run_timeline] gathers what
``flexiq runs show`` prints and what a run page shows: the run, each committed
step in order with its idempotency key (C10), the attempts journaled for it
(C31), the undo it registered and whether that undo ran (C32), what a wait
waited for and the event it received (C33), the run's dead letters (C30) and
its stored outcome (C37). Values (step values, the returned value, event
payloads, the job's arguments) are decoded only when asked for, and never
when a codec the caller lacks encrypted them (C52).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from .._attempt.compensation import COMPENSATE_PREFIX
from .._model.codec import CodecChain
from .._model.failures import RunFailure, StepFailure, load_failure
from .._model.records import DeadLetterRecord, EventRecord, RunRecord, StepAttempt, StepRow
from .._model.replays import read_outcome
from .._steps.wait import EVENT_PREFIX
from .._store.forks import forkable_steps
from .._store.operator_side import OperatorStore
from ._runs import RunDetails, show_run
from ._values import DecodedValue, decode_step_value, decode_value
from ._wording import run_note, steps_note

__all__ = ["RunOutcome", "RunTimeline", "TimelineStep", "run_timeline"]


@dataclass(frozen=True)
class TimelineStep:
    """One committed step of a run and what belongs to it.

    Parameters:
      row (StepRow): the step row (position, key, kind, committed time, size, wake time …).
      idempotency_key (str): ``"<run key>:<step key>"`` (C10).
      attempts (list[StepAttempt]): the attempts journaled for it, in order (C31).
      failure (StepFailure | RunFailure | None): why it failed for good, or why
        the run is compensated (a ``compensation`` row).
      undo (StepRow | None): for a step that registered an undo (``row.compensate``),
        the row of that undo once it ran (``compensate:<step key>``).
      awaits (tuple[str, str] | None): for a ``wait``, the ``(topic, key)`` it waits
        or waited for, when known (from the run while it waits, else from the event received).
      event (EventRecord | None): for an ``event`` row, the event it received (``None``:
        the wait timed out, or the event has been cleaned up).
      value (DecodedValue | None): the decoded value, when values were asked for.
    """

    row: StepRow
    idempotency_key: str
    attempts: list[StepAttempt] = field(default_factory=list)
    failure: StepFailure | RunFailure | None = None
    undo: StepRow | None = None
    awaits: tuple[str, str] | None = None
    event: EventRecord | None = None
    value: DecodedValue | None = None


@dataclass(frozen=True)
class RunOutcome:
    """A finished run's stored outcome (C37).

    Parameters:
      kind (str): ``value``, ``error``, ``dead_letter``, ``cancelled``, ``not_kept`` or ``unreadable``.
      name (str): the error's class name or the dead letter's reason ('' for a value).
      message (str): the error's message ('' for a value).
      value (DecodedValue | None): the returned value, when values were asked for.
    """

    kind: str
    name: str = ""
    message: str = ""
    value: DecodedValue | None = None


@dataclass(frozen=True)
class RunTimeline:
    """What [`run_timeline`][flexiq_plugins.operations.run_timeline] gathered.

    Parameters:
      details (RunDetails): the run, its rows, its wake time and attempts, as ``runs show`` reads them.
      steps (list[TimelineStep]): its steps in position order.
      dead_letters (list[DeadLetterRecord]): its dead letters, newest first.
      outcome (RunOutcome | None): its stored outcome, once it finished with one.
      note (str): what it waits for, or why it is cancelled ('-': nothing).
      steps_note (str): why it has no step rows ('' when it has some).
      arguments (DecodedValue | None): the job's ``args``, ``kwargs`` and
        ``options`` as a dict, when values were asked for.
      forkable (list[str]): the keys of the steps the run can be forked from
        ([`fork_run`][flexiq_plugins.operations.fork_run], C50), in order.
    """

    details: RunDetails
    steps: list[TimelineStep]
    dead_letters: list[DeadLetterRecord]
    outcome: RunOutcome | None
    note: str
    steps_note: str
    arguments: DecodedValue | None = None
    forkable: list[str] = field(default_factory=list)

    @property
    def run(self) -> RunRecord:
        """The run."""
        return self.details.run


def run_timeline(
    store: OperatorStore, run_key: str, *, values: bool = False, codec: CodecChain | None = None
) -> RunTimeline:
    """Gather a run and its step timeline (a run page, ``flexiq runs show``).

    ``run_key`` may also be the id of the run's current job (see
    [`show_run`][flexiq_plugins.operations.show_run]).

    Parameters:
      store (OperatorStore): the store.
      run_key (str): the run key, or its current job's id.
      values (bool): decode step values, the returned value, event payloads
        and the job's arguments (they may be personal or payment data).
      codec (CodecChain | None): the chain the workers use; without it only
        the JSON family is decoded and encrypted values are marked so.

    Raises:
      InvalidRunKey: ``run_key`` cannot be a run key.
      UnknownRun: no run has that key or current job id.
      StoreUnavailable: the store cannot be reached.
    """
    details = show_run(store, run_key)
    run = details.run
    received = [s.event_id for s in details.steps if s.event_id is not None]
    events = {e.event.id: e.event for e in store.find_events(ids=received, limit=len(received))} if received else {}
    steps = _steps(details, events, values=values, codec=codec)
    return RunTimeline(
        details=details,
        steps=steps,
        dead_letters=store.find_dead_letters(run_key=run.run_key, limit=100),
        outcome=_outcome(run, values=values, codec=codec),
        note=run_note(run),
        steps_note="" if details.steps else steps_note(run),
        arguments=_arguments(run) if values else None,
        forkable=[row.step_key for row in forkable_steps(details.steps)],
    )


def _steps(
    details: RunDetails, events: dict[int, EventRecord], *, values: bool, codec: CodecChain | None
) -> list[TimelineStep]:
    run = details.run
    by_key = {s.step_key: s for s in details.steps}
    timeline = []
    for row in details.steps:
        event = events.get(row.event_id) if row.event_id is not None else None
        timeline.append(
            TimelineStep(
                row=row,
                idempotency_key=f"{run.run_key}:{row.step_key}",
                attempts=[a for a in details.attempts if a.step_key == row.step_key],
                failure=_failure(row),
                undo=by_key.get(COMPENSATE_PREFIX + row.step_key) if row.compensate else None,
                awaits=_awaits(row, run, by_key, events),
                event=event,
                value=decode_step_value(row, codec) if values and row.kind in ("run", "event") else None,
            )
        )
    return timeline


def _failure(row: StepRow) -> StepFailure | RunFailure | None:
    if row.failure is None:
        return None
    with contextlib.suppress(ValueError, TypeError):
        return load_failure(row.failure)
    return None


def _awaits(
    row: StepRow, run: RunRecord, by_key: dict[str, StepRow], events: dict[int, EventRecord]
) -> tuple[str, str] | None:
    """The ``(topic, key)`` a wait step waits or waited for, when the store still knows it."""
    if row.kind != "wait":
        return None
    received = by_key.get(EVENT_PREFIX + row.step_key)
    if received is None:
        if run.status == "waiting" and run.wait_topic is not None and run.wait_key is not None:
            return (run.wait_topic, run.wait_key)
        return None
    event = events.get(received.event_id) if received.event_id is not None else None
    return (event.topic, event.key) if event is not None else None


def _outcome(run: RunRecord, *, values: bool, codec: CodecChain | None) -> RunOutcome | None:
    if run.outcome is None:
        return None
    stored = read_outcome(run.outcome)
    value = decode_value(stored.value, codec, what="<return value>") if values and stored.value is not None else None
    return RunOutcome(stored.kind, stored.name, stored.message, value)


def _arguments(run: RunRecord) -> DecodedValue:
    envelope = run.envelope
    if envelope.corrupt:
        return DecodedValue(False, note=envelope.corrupt)
    return DecodedValue(
        True, {"args": list(envelope.args), "kwargs": dict(envelope.kwargs), "options": dict(envelope.options)}
    )
