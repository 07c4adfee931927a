"""Compensation: undoing the committed steps of a run that failed for good (C32).

**What is recorded.** A step committed with ``compensate=undo`` records the
undo's *name* in its row, never the callable: a function cannot be stored,
and a closure (``lambda charge: refund(charge["id"])``) is the natural way to
write one. The callable is registered again by the ``step.run`` call itself,
each time the body passes it, in the attempt's journal.

**When a run fails for good inside an attempt** (an exhausted step budget, a
non-retryable error, an error marked final), the body has just replayed
every committed step before it, so their undos are registered:
:func:`settle` commits a ``compensation:start`` row holding the failure, and
runs the undos at once, in the same attempt, under its claim.

**When the undos are not in memory** (the framework gave up retrying an
ordinary error after the attempt ended; a worker died mid-compensation; an
undo failed with attempts left and its job came back), the run's
``compensation:start`` row tells the next delivery to compensate: its body
is replayed *replay-only* (memo hits register their undos; the first step
that never ran, or a sleep not due, stops it with
:class:`~flexiq_plugins.errors.ReplayStopped`), then the undos run.
:meth:`AttemptDriver.give_up` is the adapters' entry point for the first
case: it records the failure and asks them to put the job back once.

**How the undos run.** In reverse commit order, each once: each is a step of
its own, ``compensate:<step key>``, memoized, with its own idempotency key
and its own :class:`~flexiq_plugins.RetryPolicy` (the undo's, else the task's
``step_retry``, else ``RetryPolicy()``); a failure with attempts left ends
the attempt and the job comes back like any step retry. A committed step
whose undo is not registered again, or an undo that fails for good, ends the
run ``dead`` with reason ``compensation_failed`` naming it: an undo is never
silently skipped. When all have run the run is ``compensated``: if it failed
inside an attempt the job then goes to the dead letters with its original
reason; if the framework had already reported the failure, the job is
acknowledged.

A cancellation (C34) enters the same way: :func:`begin_compensation` for a
run that is not running (with a ``cancelled`` :class:`RunFailure`), or
:func:`settle` with the :class:`~flexiq_plugins.errors.RunCancelled` that
ends an attempt; the run then ends ``cancelled`` instead of ``compensated``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import inspect
import logging
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from .._model.failures import Origin, RunFailure, load_failure
from .._model.identity import StepId
from .._model.policies import Compensation, RetryPolicy
from .._model.records import StepRow
from .._steps.journal import COMPENSATION_KEY, StepJournal, drive
from .._steps.run import StepRunVerb
from .._store.base import StepStore
from ..errors import ClaimLost, CompensationFailed, RunCancelled, StepRetrySignal, StoreUnavailable, compensates

__all__ = [
    "COMPENSATE_PREFIX",
    "Compensated",
    "CompensationHost",
    "begin_compensation",
    "is_compensating",
    "pending_undos",
    "settle",
    "start_after_failure",
]

logger = logging.getLogger("flexiq_plugins")

COMPENSATE_PREFIX = "compensate:"
"""An undo's step key is this prefix and the key of the step it undoes: ``compensate:charge#0``."""

_UNREADABLE = RunFailure("dead_letter", "error", "?", "the compensation:start row could not be read", "")


@dataclass(frozen=True)
class Compensated:
    """Every undo of the run ran: how the attempt ends (status ``compensated``).

    Parameters:
      failure(RunFailure): why the run was compensated.
      undone(tuple[str, ...]): the undos' step keys, in the order they ran.
    """

    failure: RunFailure
    undone: tuple[str, ...]

    @property
    def message(self) -> str:
        """The failure's message, saying what was undone."""
        return f"{self.failure.message} (compensated: {', '.join(self.undone) or 'nothing to undo'})"


class CompensationHost(Protocol):
    """What the compensation phase needs from the attempt it runs in."""

    @property
    def journal(self) -> StepJournal:
        """The attempt's step journal."""

    def activate(self) -> AbstractContextManager[Any]:
        """Set ``current_job`` and keep the claim's lease alive for the ``with`` block."""


# ------------------------------------------------------------------- rows
def _undo_key(step_key: str) -> str:
    return COMPENSATE_PREFIX + step_key


def pending_undos(rows: Iterable[StepRow]) -> list[StepRow]:
    """The committed steps whose undo has not run yet, last committed first (C32)."""
    rows = list(rows)
    done = {r.step_key for r in rows}
    undoable = [r for r in rows if r.kind == "run" and r.compensate is not None and r.failure is None]
    return sorted((r for r in undoable if _undo_key(r.step_key) not in done), key=lambda r: -r.position)


def _undos(rows: Iterable[StepRow]) -> list[StepRow]:
    """Every committed step with an undo, last committed first (done or not: a done one replays)."""
    undoable = [r for r in rows if r.kind == "run" and r.compensate is not None and r.failure is None]
    return sorted(undoable, key=lambda r: -r.position)


def is_compensating(rows: Iterable[StepRow]) -> bool:
    """Whether a run with these step rows is being compensated (it has a ``compensation:start`` row, C32)."""
    return any(r.kind == "compensation" for r in rows)


def _marker(rows: Iterable[StepRow]) -> RunFailure | None:
    for row in rows:
        if row.kind == "compensation" and row.failure is not None:
            with contextlib.suppress(ValueError, TypeError):
                failure = load_failure(row.failure)
                if isinstance(failure, RunFailure):
                    return failure
    return None


# ------------------------------------------------------ inside an attempt
def settle(host: CompensationHost, error: BaseException | None) -> Compensated | BaseException | None:
    """Run the compensation phase if the attempt calls for one; return what now ends it (C32).

    - The run is being compensated (a ``compensation:start`` row): whatever
      the replay-only body did, the undos run now.
    - ``error`` fails the run for good (:func:`~flexiq_plugins.errors.compensates`)
      and committed steps have undos: the failure is recorded, the undos run now.
    - Otherwise ``error`` is returned unchanged.

    Returns :class:`Compensated` when every undo has run; a
    :class:`~flexiq_plugins.errors.StepRetrySignal` when an undo failed with
    attempts left; a :class:`~flexiq_plugins.errors.CompensationFailed` when one
    failed for good or is missing.

    Raises:
      ClaimLost, StoreUnavailable: as every store write of the attempt.
    """
    journal = host.journal
    if journal.replay_only:
        if isinstance(error, (ClaimLost, StoreUnavailable)):
            return error
        failure = _marker(journal.sequence.recorded) or _UNREADABLE
        return _compensate(host, failure)
    if error is None or not compensates(error) or not pending_undos(journal.sequence.recorded):
        return error
    origin: Origin = "cancelled" if isinstance(error, RunCancelled) else "dead_letter"
    failure = RunFailure.of(error, origin, max_traceback=journal.limits.step_bytes)
    journal.commit_compensation_start(failure.to_json())
    what = "is cancelled" if origin == "cancelled" else "failed for good"
    logger.warning("%s %s (%s); compensating its committed steps", journal.job_label, what, failure.summary)
    return _compensate(host, failure)


def _compensate(host: CompensationHost, failure: RunFailure) -> Compensated | BaseException:
    journal = host.journal
    journal.replay_only = False  # the body is over: the undos are new steps
    journal.latched = None  # a ReplayStopped that ended the body must not refuse them
    journal.ignore_cancel = True  # nor does a cancellation requested meanwhile (C34)
    undone: list[str] = []
    with host.activate():
        for row in _undos(journal.sequence.recorded):
            ended = _undo(journal, row, failure)
            if ended is not None:
                return ended
            undone.append(_undo_key(row.step_key))
    logger.info("%s compensated: %s", journal.job_label, ", ".join(undone) or "nothing to undo")
    return Compensated(failure, tuple(undone))


def _undo(journal: StepJournal, row: StepRow, failure: RunFailure) -> BaseException | None:
    """Run (or replay) the undo of ``row`` as the step ``compensate:<key>``; return what ends the attempt, if any."""
    key = _undo_key(row.step_key)
    done = any(r.step_key == key for r in journal.sequence.recorded)
    undo = journal.compensations.get(row.step_key)
    if undo is None and not done:
        return CompensationFailed(
            f"compensation {key!r} cannot run: step {row.step_key!r} registered the undo {row.compensate!r} "
            "when it committed, but the replay of the body did not register it again (the step.run call no "
            f"longer passes compensate=, or the body no longer reaches it); the run had failed with {failure.summary}"
        )
    policy = (undo.retry if undo is not None else None) or journal.step_retry or RetryPolicy()
    step_id = StepId("compensate", row.step_key, key, "run")
    try:
        drive(journal.protocol_for(StepRunVerb(policy), step_id), _body(undo, journal.value_of(row)))
    except StepRetrySignal as signal:
        return signal
    except (ClaimLost, StoreUnavailable):
        raise
    except Exception as exc:
        name = undo.label if undo is not None else row.compensate
        return _failed(key, name, exc, failure)
    return None


def _failed(key: str, name: str | None, exc: Exception, failure: RunFailure) -> CompensationFailed:
    error = CompensationFailed(
        f"compensation {key!r} ({name}) failed for good: {type(exc).__name__}: {exc}; "
        f"the run had failed with {failure.summary}"
    )
    error.__cause__ = exc
    return error


def _body(undo: Compensation | None, value: Any) -> Callable[[], Any]:
    def call() -> Any:
        assert undo is not None, "a done undo is replayed, never called"
        return _settled(undo.fn(value))

    return call


def _settled(result: Any) -> Any:
    """``result``, or what it resolves to if it is awaitable (run on a private event loop in a helper thread)."""
    if not inspect.isawaitable(result):
        return result

    async def wait() -> Any:
        return await result

    context = contextvars.copy_context()  # current_job and the step key go along
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="flexiq-undo") as pool:
        return pool.submit(context.run, asyncio.run, wait()).result()


# ------------------------------------------------------ outside an attempt
def begin_compensation(store: StepStore, run_key: str, failure: RunFailure, *, status: str, attempt: int) -> bool:
    """Make a run that is not running compensate at its next delivery (C32); return whether it applied.

    The caller then publishes the run's job (an adapter puts it back; an
    operator command re-publishes its envelope). Applies only while the run
    has ``status`` at ``attempt`` with no claim, has undos left and is not
    already being compensated.

    Raises:
      StoreError: the store cannot be read or written.
    """
    rows = store.get_steps(run_key)
    if _marker(rows) is not None or not pending_undos(rows):
        return False
    marker = StepRow(0, COMPENSATION_KEY, "compensation", failure=failure.to_json())
    return store.start_compensation(run_key, marker, status=status, attempt=attempt)


def start_after_failure(store: StepStore, run_key: str, attempt: int, error: BaseException) -> bool:
    """The framework gave up retrying ``error`` at ``attempt`` (the run is ``retrying``): compensate it (C32).

    Returns whether the run now waits for its compensation delivery.

    Raises:
      StoreError: the store cannot be read or written.
    """
    failure = RunFailure.of(error, "framework")
    return begin_compensation(store, run_key, failure, status="retrying", attempt=attempt)
