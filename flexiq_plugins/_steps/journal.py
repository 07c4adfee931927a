"""The step protocol: "enter the step → replay its memo, or execute it → commit", written once.

Every verb of the step API (``run``, ``arun``, ``sleep``, and the verbs to
come) goes through `StepJournal.protocol`. The protocol is a generator
so that one implementation serves sync and async bodies alike: where the
step's body must run it *yields* `CALL_BODY`, and a driver calls the
body and sends its value back (`drive`), or awaits it
(`adrive`); an exception from the body is thrown back in. So the guard
(C8), the identity and divergence check (C1–C3, C12), the memo (C5, C9), the
abandonment of a failed step (C6), the size limits (C22) and the commit happen in
exactly one place.

A `Verb` says what is particular to one kind of step: how a memo is
replayed, how a new step executes, and what it commits. The journal never
sees a claim or a framework: it commits through a `StepWriter`, which
the attempt fences on its claim.

The journal also owns the *latch* (C21): every signal or fatal step error it
raises is remembered, so a body that catches it and returns anyway still
fails, naming what it swallowed.

For compensations (C32) the journal keeps the undos that ``step.run(...,
compensate=...)`` registered in this attempt (`StepJournal.compensations`),
and knows when its run is being compensated (`StepJournal.replay_only`):
the body is then replayed only to register them, and stops at the first step
that never ran ([`ReplayStopped`][flexiq_plugins.errors.ReplayStopped]).

A step map (``step.map``, C51) is one entry of the sequence whose items are
keyed steps: `StepJournal.map_entry` admits it and enters its entry and its
items at once (the same guard, identity and divergence check), and
`StepJournal.commit_rows` commits the items that finished together in one
fenced transaction, each under the same caps. The concurrency of the items'
bodies is the verb's (`flexiq_plugins._steps.map`); the journal only sees its
commits, all from the thread that called the map.

A check of new code against a run's record (C48, `StepJournal.checking`)
is replayed the same way too, over a writer that refuses every write: it
stops at the first step past the record with
[`CheckStopped`][flexiq_plugins.errors.CheckStopped], and a step that differs
from the record raises the divergence a worker would.

A cancelled run (C34, `StepJournal.cancellation`) is replayed the same
way and stops with [`RunCancelled`][flexiq_plugins.errors.RunCancelled] instead. A
cancellation requested while the attempt runs reaches the journal as a notice
from the store's commit ([`CancelRequested`][flexiq_plugins.errors.CancelRequested]): the
step is committed, its undo registered, and then the body unwinds.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import threading
from collections.abc import Awaitable, Callable, Generator, Iterator
from contextvars import ContextVar, Token
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol, TypeVar

from .._model.codec import CodecChain
from .._model.config import Limits
from .._model.identity import Sequence, StepId
from .._model.policies import Compensation, RetryPolicy
from .._model.records import EventPoll, StepAttemptBegin, StepAttemptFailed, StepAttemptFailure, StepKind, StepRow
from .._store.caller import CallerConnection, CallerTransaction, open_transactions
from ..errors import (
    CancelRequested,
    CheckStopped,
    ConcurrentStep,
    CorruptRecord,
    DecodeError,
    DuplicateStepKey,
    EncodeError,
    InvalidStepBody,
    InvalidTransaction,
    OpenTransaction,
    ReplayStopped,
    RunCancelled,
    SleepSignal,
    StepLimitExceeded,
)

__all__ = [
    "CALL_BODY",
    "COMPENSATION_KEY",
    "ItemObservation",
    "Step",
    "StepJournal",
    "StepWriter",
    "Verb",
    "adrive",
    "current_step_key",
    "drive",
    "in_step",
    "outside_steps",
]

T = TypeVar("T")

CALL_BODY = object()
"""What the protocol yields when the step's body must run now."""

COMPENSATION_KEY = "compensation:start"
"""The step key of the row recording why a run is being compensated (C32)."""

Protocol_ = Generator[object, Any, Any]
"""A step protocol in progress: yields `CALL_BODY`, receives the body's value, returns the step's."""

_step_key: ContextVar[str | None] = ContextVar("flexiq_current_step", default=None)
_NEVER_AWAITABLE = frozenset({int, str, bytes, float, bool, type(None), dict, list, tuple})
"""Exact types no body's return value can be awaited as: checked before `inspect.isawaitable`, which costs more."""


def current_step_key() -> str | None:
    """The key of the step whose body runs in this context, or ``None`` outside a step body (C10)."""
    return _step_key.get()


@contextlib.contextmanager
def outside_steps() -> Iterator[None]:
    """Run the ``with`` block as if no step body were running (a nested job must not see the outer step)."""
    token = leave_steps()
    try:
        yield
    finally:
        back_in_steps(token)


def leave_steps() -> Token[str | None] | None:
    """From now on, no step body runs in this context; `back_in_steps` with the token undoes it.

    Outside any step body (the usual case: a job started by its worker) nothing is set and the token is ``None``.
    """
    return None if _step_key.get() is None else _step_key.set(None)


def back_in_steps(token: Token[str | None] | None) -> None:
    """Undo `leave_steps`."""
    if token is not None:
        _step_key.reset(token)


@contextlib.contextmanager
def in_step(step_key: str) -> Iterator[None]:
    """Run the ``with`` block as the body of the step ``step_key``: what `current_step_key` reads there (C10)."""
    token = _step_key.set(step_key)
    try:
        yield
    finally:
        _step_key.reset(token)


class StepWriter(Protocol):
    """Where a journal commits: the attempt, fenced on its claim (C9, C25)."""

    def commit_step(self, row: StepRow) -> StepRow:
        """Commit one step row in one transaction; return it as stored."""

    def commit_steps(self, rows: list[StepRow]) -> tuple[StepRow, ...]:
        """Commit several step rows in one transaction; return them as stored (C51)."""

    def begin_step_attempt(self, step_key: str, max_attempts: int) -> StepAttemptBegin:
        """Journal a new attempt of a step with a budget before its body runs (C31)."""

    def fail_step_attempt(self, failure: StepAttemptFailure, row: StepRow | None = None) -> StepAttemptFailed:
        """Record a failed step attempt, and commit ``row`` with it when given (C31)."""

    def poll_event(self, topic: str, key: str, deadline: float | None) -> EventPoll:
        """Look for the event a waiting step can receive (C33)."""

    def commit_step_on(self, connection: CallerConnection, row: StepRow) -> StepRow:
        """Write one step row in the caller's open transaction on ``connection`` (C42); return it as stored."""

    def now(self) -> float:
        """The store's clock, epoch seconds."""


@dataclass
class Step:
    """A step entered by the protocol: its identity, and its committed row if it is a memo hit."""

    id: StepId
    memo: StepRow | None


class Verb(Protocol):
    """What is particular to one kind of step."""

    kind: StepKind

    def replay(self, journal: StepJournal, step: Step) -> Any:
        """Return the step's value from its memo (no store statement, C9)."""

    def execute(self, journal: StepJournal, step: Step) -> Protocol_:
        """Execute a new step (yielding `CALL_BODY` for its body) and return what to commit."""

    def commit(self, journal: StepJournal, step: Step, produced: Any) -> Any:
        """Commit what `execute` produced; return the step's value."""


class ItemObservation(Protocol):
    """What an observed attempt's journal makes of one item of a step map that runs (C51, C53)."""

    def activate(self) -> object:
        """Make the item current where its body runs (its thread or task); return a token for `deactivate`."""

    def deactivate(self, token: object) -> None:
        """Undo `activate`, in the same context."""

    def committed(self, size: int) -> None:
        """The item's value was committed (``size`` bytes)."""

    def failed(self, error: BaseException) -> None:
        """The item ended without a value: ``error`` is what its verb, its commit or the whole call raised."""


# ----------------------------------------------------------------- journal
class StepJournal:
    """The recorded and running steps of one attempt, and the one step protocol.

    Parameters:
      snapshot (tuple[StepRow, ...]): the run's committed step rows (C9).
      job_label (str): how messages name the job, e.g. ``"job j-1 (run r-1)"``.
      writer (StepWriter): commits rows, fenced on the attempt's claim.
      codec (CodecChain): serializer and codecs of step values (C7).
      limits (Limits): the size limits (C22).
      step_retry (RetryPolicy | None): the task's default budget for its steps (C31).

    Attributes:
      compensations (dict[str, Compensation]): the undo each committed step
        registered in this attempt, by step key (C32).
      replay_only (bool): the run is being compensated: a step that never ran
        stops the body instead of running (C32).
      cancellation (RunCancelled | None): the run is cancelled (C34): a step
        that never ran stops the body with it, and the attempt ends cancelled.
      run_deadline (tuple[float, str] | None): when the run reaches its
        duration cap (epoch seconds) and the reason to cancel it then (C34).
      ignore_cancel (bool): the undos are running: a cancellation requested
        meanwhile does not stop them.
      checking (bool): the body is checked against the run's record (C48):
        recorded steps replay, the first step that never ran stops the body
        with [`CheckStopped`][flexiq_plugins.errors.CheckStopped], and nothing is written.
      patches (dict[str, bool]): what each ``step.patched(id)`` of this
        attempt answered, by patch id (C49).
    """

    def __init__(
        self,
        snapshot: tuple[StepRow, ...],
        job_label: str,
        writer: StepWriter,
        codec: CodecChain,
        limits: Limits,
        *,
        step_retry: RetryPolicy | None = None,
    ) -> None:
        self.sequence = Sequence(snapshot, job_label)
        self.job_label = job_label
        self.step_retry = step_retry
        self.compensations: dict[str, Compensation] = {}
        self.replay_only = any(r.kind == "compensation" for r in snapshot)
        self.cancellation: RunCancelled | None = None
        self.run_deadline: tuple[float, str] | None = None
        self.ignore_cancel = False
        self.checking = False
        self.patches: dict[str, bool] = {}
        self._cancel_noticed = False
        self._writer = writer
        self._codec = codec
        self._limits = limits
        self._run_bytes = sum(r.size for r in snapshot)
        self._guard = threading.Lock()
        self._active: str | None = None
        self.latched: BaseException | None = None
        self.joined: list[tuple[str, CallerTransaction]] = []

    def now(self) -> float:
        """The store's clock, epoch seconds."""
        return self._writer.now()

    @property
    def limits(self) -> Limits:
        """The size limits (C22)."""
        return self._limits

    @property
    def codec(self) -> CodecChain:
        """The run's serializer and codecs (C7)."""
        return self._codec

    # --------------------------------------------------------- the protocol
    def protocol(self, verb: Verb, name: object, key: object = None) -> Protocol_:
        """Enter one step, then replay its memo or execute and commit it; return the step's value."""
        self._admit()
        try:
            step = self._enter(name, key, verb.kind)
            if step.memo is None:
                self.check_new_step(step)
            return (yield from self._replay_or_execute(verb, step))
        finally:
            self._active = None

    def protocol_for(self, verb: Verb, step_id: StepId) -> Protocol_:
        """`protocol` for a step whose identity the core made, e.g. an undo ``compensate:<key>`` (C32)."""
        self._admit()
        try:
            try:
                self._active = step_id.step_key
                step = Step(step_id, self.sequence.enter(step_id))
            except BaseException as exc:
                self.refuse(exc)
            return (yield from self._replay_or_execute(verb, step))
        finally:
            self._active = None

    def _replay_or_execute(self, verb: Verb, step: Step) -> Protocol_:
        if step.memo is not None:
            return verb.replay(self, step)
        token = _step_key.set(step.id.step_key)  # what in_step does, and _body_of: no generator per step
        try:
            produced = yield from verb.execute(self, step)
        except BaseException:
            _step_key.reset(token)
            self.sequence.abandon(step.id)  # a body that raised: the step takes no key and no place (C6)
            raise
        _step_key.reset(token)
        value = verb.commit(self, step, produced)
        self.stop_if_cancelled()
        return value

    def stop_if_cancelled(self) -> None:
        """Raise the run's [`RunCancelled`][flexiq_plugins.errors.RunCancelled] (latched) if the last commit found
        its cancellation requested (C34); the committed step's undo is registered by then."""
        if self._cancel_noticed and not self.ignore_cancel:
            self._cancel_noticed = False
            assert self.cancellation is not None
            self.refuse(self.cancellation)

    def check_new_step(self, step: Step) -> None:
        """Let a step that never ran start, unless the run is being checked, compensated or is cancelled.

        Raises [`CheckStopped`][flexiq_plugins.errors.CheckStopped] in check mode (C48),
        [`ReplayStopped`][flexiq_plugins.errors.ReplayStopped] during a compensation replay (C32), the
        run's [`RunCancelled`][flexiq_plugins.errors.RunCancelled] once it is cancelled or past its duration
        cap (C34); all latched.
        """
        if self.replay_only or self.checking or self.cancellation is not None:
            self._stop_replay(step)
        if self.run_deadline is not None and self.now() >= self.run_deadline[0]:
            self.cancellation = RunCancelled(self.run_deadline[1])
            self._stop_replay(step)

    def refuse(self, exc: BaseException) -> NoReturn:
        """Raise ``exc`` as a fatal step error: latched, so a body cannot catch it away (C21)."""
        if self.latched is None:
            self.latched = exc
        raise exc

    def unlatch(self, signal: BaseException) -> None:
        """Forget ``signal`` if it is the latched one: a step map caught it from one item, and raises at its end
        what the whole call comes to (C21, C51)."""
        if self.latched is signal:
            self.latched = None

    def _admit(self) -> None:
        """Admit one step at a time (C8); re-raise a latched signal (C21).

        Once admitted the caller must set ``_active`` back to ``None`` when the
        step ends (``try/finally``): a plain method, not a context manager, as
        it runs on every memo hit.
        """
        if self.latched is not None:
            raise self.latched
        with self._guard:
            busy = self._active
            if busy is None:
                self._active = "?"
        if busy is not None:
            self.refuse(
                ConcurrentStep(
                    f"a step was started while step {busy!r} of the same attempt was uncommitted; "
                    "steps run one at a time: do not start them from threads, asyncio.gather or "
                    "inside another step's body"
                )
            )

    def _enter(self, name: object, key: object, kind: StepKind) -> Step:
        """Derive the step's identity and match it against the snapshot (C1–C3, C12)."""
        try:
            step_id = self.sequence.derive(name, key, kind)
            self._active = step_id.step_key
            memo = self.sequence.enter(step_id)
        except BaseException as exc:
            self.refuse(exc)
        return Step(step_id, memo)

    # ------------------------------------------------------ a step map (C51)
    @contextlib.contextmanager
    def map_entry(self, name: object, keys: list[object]) -> Iterator[tuple[Step, list[Step]]]:
        """Admit a step map and enter it: its own entry ``name#n`` (kind ``map``) and its items ``name:key`` (C51).

        The map is admitted as one step (C8): while the ``with`` block runs,
        every other step of the attempt, one started in an item's body
        included, is refused with ``ConcurrentStep``; the map's own items
        commit through `commit_rows`. The entry is matched by position among
        the unkeyed steps and the items by key (C12), so a map at the place of
        a recorded ``run`` (or the reverse) diverges, and items missing from
        the recorded ones are new.

        Yields:
          tuple[Step, list[Step]]: the entry and the items in the order of
          ``keys``, each with its memo if it is committed.

        Raises (latched, before any body runs):
          InvalidStepName, InvalidStepKey: a bad name or key (C2).
          DuplicateStepKey: two items with one key, or a key used earlier in this attempt (C3).
          StepDivergence: the recorded sequence has another step here (C12).
        """
        self._admit()
        try:
            yield self._enter_map(name, keys)
        finally:
            self._active = None

    def observe_item(self, step: Step) -> ItemObservation | None:
        """An observation of a step map's item that starts running now; ``None``: the attempt is not observed."""
        return None

    def item_replayed(self, step: Step) -> None:
        """A step map's item was answered from its memo (C9): nothing to do unless the attempt is observed."""

    def _enter_map(self, name: object, keys: list[object]) -> tuple[Step, list[Step]]:
        try:
            entry = self.sequence.derive(name, None, "map")
            self._active = entry.step_key
            items = [self.sequence.derive(entry.name, key, "run") for key in keys]
            _refuse_repeated(entry, items, self.job_label)
            marker = Step(entry, self.sequence.enter(entry))
            return marker, [Step(item, self.sequence.enter(item)) for item in items]
        except BaseException as exc:
            self.refuse(exc)

    def commit_rows(self, pending: list[tuple[Step, bytes | None, str | None]]) -> None:
        """Check the caps of each row, then commit them all in one fenced transaction (C9, C22, C25, C51).

        ``pending`` holds ``(step, encoded value, undo name)`` per row, in
        the order they take their positions. A row over a cap refuses the
        whole batch before anything is written
        ([`StepLimitExceeded`][flexiq_plugins.errors.StepLimitExceeded], latched); a requested
        cancellation is noticed as by one commit (`stop_if_cancelled`).
        """
        if not pending:
            return
        rows: list[StepRow] = []
        added = 0
        for step, encoded, compensate in pending:
            row = StepRow(self.sequence.next_position + len(rows), step.id.step_key, step.id.kind, encoded)
            row = dataclasses.replace(row, compensate=compensate)
            self._check_limits(row.step_key, row.size, earlier_bytes=added, earlier_steps=len(rows))
            rows.append(row)
            added += row.size
        self._refuse_while_joined(pending[0][0])
        try:
            stored = self._writer.commit_steps(rows)
        except CancelRequested as notice:
            self._notice(notice)
            stored = notice.row  # type: ignore[assignment]
        if not isinstance(stored, tuple):
            raise TypeError("a batch commit's cancellation notice must carry the committed rows")
        for row in stored:
            self.record(row)

    # ------------------------------------------------- what verbs build on
    def decode(self, step: Step) -> Any:
        """Decode a memo hit from the snapshot; no store statement (C5, C9).

        A stored ``run`` row without a value is a fatal [`CorruptRecord`][flexiq_plugins.errors.CorruptRecord].
        """
        assert step.memo is not None
        if step.memo.value is None:
            self.refuse(self.corrupt(step, "has no stored value (NULL)"))
        return self._codec.decode(step.memo.value, step_key=step.id.step_key)

    def value_of(self, row: StepRow) -> Any:
        """Decode a committed ``run`` row's value, e.g. for its undo (C7, C32)."""
        assert row.value is not None
        return self._codec.decode(row.value, step_key=row.step_key)

    def corrupt(self, step: Step, problem: str) -> CorruptRecord:
        """The error for a stored row of ``step`` that cannot be replayed."""
        return CorruptRecord(
            f"the stored row of step {step.id.step_key!r} of {self.job_label} {problem}; "
            "no retry can replay it: fix or delete the row, then retry the dead letter"
        )

    def refuse_awaitable(self, step: Step, value: Any) -> None:
        """Refuse a body of ``run`` that returned an awaitable: it belongs in ``arun``."""
        if type(value) not in _NEVER_AWAITABLE and inspect.isawaitable(value):
            _discard(value)
            self.refuse(
                InvalidStepBody(
                    f"the body of step {step.id.step_key!r} returned an awaitable ({type(value).__name__}), "
                    "which step.run and step.map do not await; use: await step.arun(...) or await step.amap(...)"
                )
            )

    def refuse_open_transactions(self, step: Step, shared: CallerTransaction | None = None) -> None:
        """Refuse a step inside a transaction it does not share (C42); ``shared`` is the one it commits in."""
        found = open_transactions(exclude=shared)
        if not found:
            return
        where = ", ".join(t.description for t in found)
        name = step.id.name
        self.refuse(
            OpenTransaction(
                f"step {step.id.step_key!r} was called inside an open database transaction that the step "
                f"store does not share ({where}). If that transaction rolled back after the step committed, "
                "a retry would get the memo of writes that no longer exist. Either make the step commit in "
                f"that transaction: step.transaction({name!r}, fn, using=...) (the store must be in the same "
                "database), or call the step outside the transaction (commit it first, or open it inside "
                "the step's body). If the body writes nothing there, pass allow_open_transaction=True."
            )
        )

    def close_transactions(self) -> None:
        """Roll back a caller's transaction a transactional step joined and the body left open (C42).

        Called when the task body ends, before the claim's lease stops: the
        open transaction holds the run's row lock, on which the store's own
        writes would wait forever. The attempt then fails with a latched
        [`InvalidTransaction`][flexiq_plugins.errors.InvalidTransaction].
        """
        for step_key, caller in self.joined:
            if caller.is_open():
                caller.rollback()
                if self.latched is None:
                    self.latched = InvalidTransaction(
                        f"the transaction of {caller.description} holding step {step_key!r} was still open "
                        "when the task body returned, so it was rolled back with the step; commit it inside "
                        "the body (e.g. with session.begin(): ... or transaction.atomic())"
                    )
        self.joined.clear()

    def encode(self, step: Step, value: Any) -> tuple[bytes, Any]:
        """Encode ``value`` and read it back: ``(stored bytes, decoded value)`` (C7).

        A value that cannot be encoded, or not read back, is a fatal
        [`EncodeError`][flexiq_plugins.errors.EncodeError]: its body already ran (C29).
        """
        key = step.id.step_key
        try:
            encoded = self._codec.encode(value, step_key=key)
            return encoded, self._codec.read_back(value, encoded, step_key=key)  # never store what cannot be read
        except DecodeError as exc:
            self.refuse(EncodeError(f"step {key!r} returned a value its serializer cannot read back: {exc}"))
            raise  # unreachable: refuse() raises
        except BaseException as exc:
            self.refuse(exc)
            raise

    def commit(
        self,
        step: Step,
        encoded: bytes | None,
        wake_at: float | None,
        *,
        compensate: str | None = None,
        event_id: int | None = None,
        connection: CallerConnection | None = None,
    ) -> None:
        """Check the size limits and commit the step row in one fenced transaction (C9, C22).

        ``compensate`` names the undo the step registered (C32); ``event_id``
        is the event an ``event`` step received (C33). With ``connection`` the
        row is written in the caller's open transaction instead (C42). Without,
        no transaction a transactional step joined may still be open: it holds
        the run's row, and the commit would wait on it.
        """
        row = self.write(step, encoded, wake_at, compensate=compensate, event_id=event_id, connection=connection)
        self.record(row)

    def write(
        self,
        step: Step,
        encoded: bytes | None,
        wake_at: float | None,
        *,
        compensate: str | None = None,
        event_id: int | None = None,
        connection: CallerConnection | None = None,
    ) -> StepRow:
        """`commit` without recording the row in the running sequence; return the row as stored."""
        row = StepRow(
            self.sequence.next_position,
            step.id.step_key,
            step.id.kind,
            encoded,
            wake_at,
            compensate=compensate,
            event_id=event_id,
        )
        self._check_limits(row.step_key, row.size)
        if connection is not None:
            return self._writer.commit_step_on(connection, row)
        self._refuse_while_joined(step)
        return self._written(row, self._writer.commit_step)

    def record(self, stored: StepRow) -> None:
        """Add a committed row to the running sequence and the run's byte total."""
        self.sequence.record(stored)
        self._run_bytes += stored.size

    def commit_failed(self, step: Step, failure: str, attempt: StepAttemptFailure) -> None:
        """Commit a step that failed for good (``failure``: its JSON) and its attempt's failure together (C31)."""
        row = StepRow(self.sequence.next_position, step.id.step_key, "run", failure=failure)
        self._check_limits(row.step_key, row.size)
        stored = self._writer.fail_step_attempt(attempt, row).row
        assert stored is not None
        self.record(stored)

    def commit_compensation_start(self, failure: str) -> None:
        """Commit the row recording why the run is being compensated (C32); no size limit refuses it."""
        row = StepRow(self.sequence.next_position, COMPENSATION_KEY, "compensation", failure=failure)
        self.sequence.record(self._written(row, self._writer.commit_step))

    def _written(self, row: StepRow, write: Callable[[StepRow], StepRow]) -> StepRow:
        """``write(row)``; a cancellation notice carries the committed row and is remembered (C34)."""
        try:
            return write(row)
        except CancelRequested as notice:
            self._notice(notice)
            stored = notice.row
        if not isinstance(stored, StepRow):
            raise TypeError("a commit's cancellation notice must carry the committed row")
        return stored

    def _notice(self, notice: CancelRequested) -> None:
        if self.ignore_cancel or self.cancellation is not None:
            return
        self.cancellation = RunCancelled(notice.reason)
        self._cancel_noticed = True

    def poll_event(self, topic: str, key: str, deadline: float | None) -> EventPoll:
        """Look for the event a waiting step can receive (C33); a requested cancellation stops the wait (C34)."""
        try:
            return self._writer.poll_event(topic, key, deadline)
        except CancelRequested as notice:
            self._notice(notice)
            assert self.cancellation is not None
            self.refuse(self.cancellation)

    def begin_attempt(self, step: Step, max_attempts: int) -> StepAttemptBegin:
        """Journal a new attempt of ``step`` before its body runs (C31); see `StepWriter.begin_step_attempt`."""
        return self._writer.begin_step_attempt(step.id.step_key, max_attempts)

    def fail_attempt(self, attempt: StepAttemptFailure) -> StepAttemptFailed:
        """Record a failed step attempt without committing the step (C31)."""
        return self._writer.fail_step_attempt(attempt)

    def _refuse_while_joined(self, step: Step) -> None:
        for held, caller in self.joined:
            if caller.is_open():
                self.refuse(
                    InvalidTransaction(
                        f"step {step.id.step_key!r} cannot commit while the transaction of {caller.description} "
                        f"holding step {held!r} is open: it holds the run's row until it commits; commit it first"
                    )
                )

    def sleep_until(self, step: Step, wake_at: float) -> None:
        """Raise [`SleepSignal`][flexiq_plugins.errors.SleepSignal] (latched) unless ``wake_at`` has passed on the
        store's clock (C15, C17).

        During a compensation replay a sleep that is not due stops the body
        instead (C32), and so it does in a cancelled run (C34) and in check mode (C48).
        """
        if wake_at > self.now():
            if self.replay_only or self.checking or self.cancellation is not None:
                self._stop_replay(step)
            self.refuse(SleepSignal(step.id.step_key, wake_at))

    def _stop_replay(self, step: Step) -> NoReturn:
        if self.checking:
            self.refuse(CheckStopped(step.id.step_key, self.job_label))
        if self.replay_only or self.cancellation is None:
            self.refuse(ReplayStopped(f"the compensation replay of {self.job_label} stopped at {step.id.step_key!r}"))
        self.refuse(self.cancellation)

    def _check_limits(self, step_key: str, size: int, *, earlier_bytes: int = 0, earlier_steps: int = 0) -> None:
        """Refuse a row over a cap; ``earlier_*``: the rows before it in the same batch (C22)."""
        checks = [
            ("step bytes", size, self._limits.step_bytes),
            ("run bytes", self._run_bytes + earlier_bytes + size, self._limits.run_bytes),
            ("run step count", self.sequence.next_position + earlier_steps + 1, self._limits.run_steps),
        ]
        for what, value, limit in checks:
            if value > limit:
                self.refuse(StepLimitExceeded(f"step {step_key!r} exceeds the {what} limit: {value} > {limit}"))


def _refuse_repeated(entry: StepId, items: list[StepId], job_label: str) -> None:
    """Refuse two items of one step map that derive the same key (C3, C51), before any body runs."""
    seen: set[str] = set()
    for item in items:
        if item.step_key in seen:
            raise DuplicateStepKey(
                f"two items of step map {entry.step_key!r} of {job_label} derive the key {item.step_key!r}; "
                "the key function must give each item its own key (an id, not a value two items share)"
            )
        seen.add(item.step_key)


# ----------------------------------------------------------------- drivers
def drive(protocol: Protocol_, body: Callable[[], Any] | None = None) -> Any:
    """Run a step protocol to its end, calling ``body()`` where it asks; return the step's value."""
    try:
        next(protocol)
        while True:
            assert body is not None, "this step has no body"
            try:
                value = body()
            except BaseException as exc:
                protocol.throw(exc)
            else:
                protocol.send(value)
    except StopIteration as stop:
        return stop.value


def _discard(value: Any) -> None:
    close = getattr(value, "close", None)
    if callable(close):
        close()


async def adrive(protocol: Protocol_, body: Callable[[], Awaitable[Any] | Any]) -> Any:
    """Async `drive`: ``body()`` may return an awaitable, which is awaited.

    Before the body runs the driver yields to the event loop once, so a
    concurrent sibling step (``asyncio.gather``) reaches the guard now and is
    refused (C8).
    """
    try:
        next(protocol)
        await asyncio.sleep(0)
        while True:
            try:
                pending = body()
                value = await pending if inspect.isawaitable(pending) else pending
            except BaseException as exc:
                protocol.throw(exc)
            else:
                protocol.send(value)
    except StopIteration as stop:
        return stop.value
