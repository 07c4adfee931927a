"""The verbs of ``step.wait_for_event`` (C33), and how an event's topic, key and payload are checked.

A wait is two steps of the one step protocol (:mod:`flexiq_plugins._steps.journal`):

1. **the wait** (:class:`WaitVerb`, kind ``wait``, e.g. ``payment#0``): its
   row fixes the deadline when the wait first starts (``wake_at``; ``None``
   without a timeout), like a sleep fixes its wake time (C17). A replay keeps
   the deadline; its commit time is when the run began to wait.
2. **what it received** (:class:`EventVerb`, kind ``event``, the step
   ``event:payment#0``): a memo hit replays the payload (or ``None`` for a
   timeout) without a store statement (C9). A new one polls the store
   (:meth:`~flexiq_plugins.StepStore.poll_event`): an event the run can
   receive is committed with its id, so it is received once per run; with
   none and the deadline passed, ``None`` is committed; otherwise the attempt
   ends with :class:`~flexiq_plugins.errors.EventWaitSignal` (like a sleep)
   and the run is ``waiting`` until a sender or the deadline brings it back.

Payloads travel as bytes made by the sender's codec chain (the integration's
in the sending process, else the core's JSON), and are kept in the ``event``
row through the run's own chain, under the size limits (C7, C22).
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from typing import Any

from .._model.codec import CodecChain
from .._model.identity import StepId
from .._model.records import EventRecord, StepKind
from ..errors import CodecError, EventWaitSignal, InvalidEvent
from .journal import Protocol_, Step, StepJournal

__all__ = [
    "EVENT_PREFIX",
    "MAX_EVENT_FIELD",
    "EventVerb",
    "WaitStart",
    "WaitVerb",
    "decode_payload",
    "encode_payload",
    "event_step",
    "validate_event_field",
]

EVENT_PREFIX = "event:"
"""What a wait received is the step ``event:<wait step key>``, e.g. ``event:payment#0``."""

MAX_EVENT_FIELD = 255
"""The longest topic or key, in characters."""

_CORE_CHAIN = CodecChain()
_FORMS = f"a non-empty str of at most {MAX_EVENT_FIELD} characters without control characters"


def validate_event_field(what: str, value: object) -> str:
    """Return ``value`` if it is a usable topic or key, else raise :class:`InvalidEvent` naming it (C33).

    Parameters:
      what(str): ``"topic"`` or ``"key"``.
      value(object): the value given.
    """
    if not isinstance(value, str) or not value:
        raise InvalidEvent(f"event {what} {value!r} is not {_FORMS}")
    if len(value) > MAX_EVENT_FIELD or any(unicodedata.category(ch) == "Cc" for ch in value):
        raise InvalidEvent(f"event {what} {value[:40]!r} is not {_FORMS}")
    return value


def encode_payload(payload: Any, chain: CodecChain | None, *, max_bytes: int) -> bytes:
    """The stored bytes of an event's payload, encoded by ``chain`` (the core's JSON when ``None``).

    Raises:
      InvalidEvent: the chain cannot encode it, or it is larger than ``max_bytes``.
    """
    try:
        data = (chain or _CORE_CHAIN).encode(payload, step_key="event payload")
    except CodecError as exc:
        raise InvalidEvent(f"the event payload cannot be encoded: {exc}") from exc
    if len(data) > max_bytes:
        raise InvalidEvent(f"the event payload is {len(data)} bytes encoded; at most {max_bytes} are accepted")
    return data


def decode_payload(data: bytes | None, chain: CodecChain, *, step_key: str) -> Any:
    """An event's payload: decoded by the run's ``chain`` when it wrote the bytes, else by the core's JSON.

    Raises:
      DecodeError: neither chain wrote the bytes, or they cannot be decoded.
    """
    if data is None:
        return None
    written_by = data.partition(b"\n")[0].decode(errors="replace").removeprefix("FQ1|")
    reader = chain if written_by == chain.description else _CORE_CHAIN
    return reader.decode(data, step_key=step_key)


def event_step(wait_key: str) -> StepId:
    """The identity of what the wait ``wait_key`` received: the step ``event:<wait_key>``."""
    return StepId("event", wait_key, EVENT_PREFIX + wait_key, "event")


@dataclass(frozen=True)
class WaitStart:
    """The wait step as committed: its key and its deadline (epoch seconds; ``None``: no timeout)."""

    step_key: str
    deadline: float | None


class WaitVerb:
    """The wait's start: the deadline, fixed from the store's clock when first committed, is the memo (C33).

    Parameters:
      timeout(float | None): seconds from the start until the wait returns ``None``.
    """

    kind: StepKind = "wait"

    def __init__(self, timeout: float | None) -> None:
        self._timeout = timeout

    def replay(self, journal: StepJournal, step: Step) -> WaitStart:
        """The recorded deadline (C9: no store statement)."""
        assert step.memo is not None
        return WaitStart(step.id.step_key, step.memo.wake_at)

    def execute(self, journal: StepJournal, step: Step) -> Protocol_:
        """The deadline from the store's clock (no body to run)."""
        return None if self._timeout is None else journal.now() + self._timeout
        yield  # pragma: no cover - makes this a generator like every verb

    def commit(self, journal: StepJournal, step: Step, produced: Any) -> WaitStart:
        """Commit the deadline as the row's ``wake_at``."""
        journal.commit(step, None, produced)
        return WaitStart(step.id.step_key, produced)


_TIMED_OUT = object()


class EventVerb:
    """What the wait received: the event's payload, or ``None`` at the timeout, is the memo (C33).

    Parameters:
      topic(str): the topic waited on.
      key(str): the key waited on.
      wait(WaitStart): the wait step it belongs to.
    """

    kind: StepKind = "event"

    def __init__(self, topic: str, key: str, wait: WaitStart) -> None:
        self.topic = topic
        self.key = key
        self.wait = wait

    def replay(self, journal: StepJournal, step: Step) -> Any:
        """The received payload (``None`` for a timeout), decoded by the run's chain, no store statement (C9)."""
        assert step.memo is not None
        return None if step.memo.value is None else journal.decode(step)

    def execute(self, journal: StepJournal, step: Step) -> Protocol_:
        """Poll the store once: the event, the timeout, or the end of the attempt until one of them."""
        journal.check_new_step(step)  # a cancelled run, or a compensation replay, does not wait (C32, C34)
        poll = journal.poll_event(self.topic, self.key, self.wait.deadline)
        if poll.event is not None:
            return poll.event
        if poll.timed_out:
            return _TIMED_OUT
        journal.refuse(EventWaitSignal(self.wait.step_key, self.wait.deadline, self.topic, self.key))
        yield  # pragma: no cover - makes this a generator like every verb

    def commit(self, journal: StepJournal, step: Step, produced: Any) -> Any:
        """Commit the payload through the run's chain with the event's id (received once, C7, C22), or the timeout."""
        if produced is _TIMED_OUT:
            journal.commit(step, None, None)
            return None
        assert isinstance(produced, EventRecord)
        value = _decoded(journal, produced, step.id.step_key)
        encoded, decoded = journal.encode(step, value)
        journal.commit(step, encoded, None, event_id=produced.id)
        return decoded


def _decoded(journal: StepJournal, event: EventRecord, step_key: str) -> Any:
    try:
        return decode_payload(event.payload, journal.codec, step_key=step_key)
    except CodecError as exc:
        journal.refuse(exc)
        raise  # unreachable: refuse() raises
