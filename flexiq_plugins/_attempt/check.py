"""Check mode (C48): a task body run against a run's recorded steps, writing nothing.

Before a deploy, the new code of a task can be run against the record of
every run in flight. A check is an attempt without a claim and without a
store: the body runs with ``current_job`` set (``current_job.checking`` is
true) over the run's step rows, through the one step journal
(`flexiq_plugins._steps.journal`) in its check mode, so the memo, the
identity rules and the divergence check are exactly a worker's (C1–C3, C12):

- every recorded step is a memo hit and returns its stored value (C5, C7);
- the first step past the record ends the check: the run is *compatible*
  with the new code up to there ([`CheckStopped`][flexiq_plugins.errors.CheckStopped]);
  so does a sleep or wait that has not ended yet;
- a step whose key differs from the record is a *divergence*, with the
  report a worker would raise ([`StepDivergence`][flexiq_plugins.errors.StepDivergence]);
- the failure of a step that failed for good replays as it would in a
  worker: the record's own, not the new code's (a run being compensated);
- anything else the body raises is an *error* the new code would meet.

No step body runs, nothing is written (the journal's writer here refuses
every write) and nothing is published. Code between steps does run.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from .._model.codec import CodecChain
from .._model.config import Limits
from .._model.records import EventPoll, StepAttemptBegin, StepAttemptFailed, StepAttemptFailure, StepRow
from .._steps.context import JobContext
from .._steps.journal import StepJournal, current_step_key
from .._store.caller import CallerConnection
from ..errors import CheckStopped, StepDivergence, StepRetryExhausted, StepSignal, final_reason

__all__ = ["CheckVerdict", "RecordedRun", "RunCheck", "check_run"]

CheckVerdict = Literal["compatible", "divergent", "error", "missing"]
"""What a check found: the new code replays the record (``compatible``), asks for another step at a recorded
place (``divergent``), or raises while replaying it (``error``); or the new code has no task of the run's
name (``missing``, decided by the report, not by `check_run`)."""


@dataclass(frozen=True)
class RecordedRun:
    """A run as a check reads it: who it is, its job's arguments and its committed steps.

    Parameters:
      run_key (str): the run.
      task_name (str): its task or actor.
      status (str): its status in the store (``sleeping``, ``dead`` …).
      steps (tuple[StepRow, ...]): its step rows by position.
      args (Sequence[Any]): its job's positional arguments.
      kwargs (Mapping[str, Any]): its job's keyword arguments.
      job_id (str | None): its current job's id, if known.
      attempt (int): its last attempt's number (0: none started).
      framework (str): the framework that runs it (``"celery"``, ``"dramatiq"``).
    """

    run_key: str
    task_name: str
    status: str
    steps: tuple[StepRow, ...]
    args: Sequence[Any] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    job_id: str | None = None
    attempt: int = 0
    framework: str = ""

    @property
    def label(self) -> str:
        """How messages name the run's job, as a worker's do: ``job <id> (run <key>)``."""
        return f"job {self.job_id or '-'} (run {self.run_key})"


@dataclass(frozen=True)
class RunCheck:
    """The result of checking one run against new code (C48).

    Parameters:
      run_key (str): the run.
      task_name (str): its task or actor.
      status (str): its status in the store.
      verdict (CheckVerdict): ``compatible``, ``divergent``, ``error`` or ``missing``.
      replayed (int): how many recorded steps the new code reached and matched.
      stopped_at (str | None): for a compatible run, the step past the record where the check stopped
        (``None``: the body returned).
      message (str): the divergence report (as a worker would raise it) or the error; '' when compatible.
      position (int | None): for a divergence, the recorded position where the sequences part.
      recorded (str | None): the step recorded there.
      running (str | None): the step the new code asked for there.
      patches (Mapping[str, bool]): what each ``step.patched(id)`` answered, by patch id (C49):
        ``False`` for a run on the old branch.
      unused (tuple[str, ...]): recorded steps the new code never reached although it returned (C14).
    """

    run_key: str
    task_name: str
    status: str
    verdict: CheckVerdict
    replayed: int = 0
    stopped_at: str | None = None
    message: str = ""
    position: int | None = None
    recorded: str | None = None
    running: str | None = None
    patches: Mapping[str, bool] = field(default_factory=dict)
    unused: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """Whether the new code replays this run's record (``compatible``)."""
        return self.verdict == "compatible"


class CheckWriter:
    """The journal's writer in check mode: refuses every write by ending the check there (C48).

    The journal stops a check at the first step past the record before it
    would write; this writer is the guard behind that, for a verb that asks
    the store anything. ``stopped_at`` keeps the step it refused, as a body
    could swallow the signal.

    Parameters:
      now (float): the clock of the check, epoch seconds (the store's, read once).
      job_label (str): how messages name the job.
    """

    def __init__(self, now: float, job_label: str) -> None:
        self._now = now
        self._label = job_label
        self.stopped_at: str | None = None

    def _stop(self, step_key: str | None) -> CheckStopped:
        key = step_key or current_step_key() or "?"
        if self.stopped_at is None:
            self.stopped_at = key
        return CheckStopped(key, self._label)

    def commit_step(self, row: StepRow) -> StepRow:
        """Refused: the step is past the record."""
        raise self._stop(row.step_key)

    def commit_steps(self, rows: list[StepRow]) -> tuple[StepRow, ...]:
        """A step map's items past the record: the check stops at the first of them (C48, C51)."""
        raise self._stop(rows[0].step_key if rows else None)

    def begin_step_attempt(self, step_key: str, max_attempts: int) -> StepAttemptBegin:
        """Refused: the step is past the record."""
        raise self._stop(step_key)

    def fail_step_attempt(self, failure: StepAttemptFailure, row: StepRow | None = None) -> StepAttemptFailed:
        """Refused: the step is past the record."""
        raise self._stop(failure.step_key)

    def poll_event(self, topic: str, key: str, deadline: float | None) -> EventPoll:
        """Refused: what the wait receives is past the record."""
        raise self._stop(None)

    def commit_step_on(self, connection: CallerConnection, row: StepRow) -> StepRow:
        """Refused: the step is past the record."""
        raise self._stop(row.step_key)

    def now(self) -> float:
        """The check's clock, epoch seconds."""
        return self._now


def check_run(run: RecordedRun, body: Callable[..., Any], *, codec: CodecChain, limits: Limits, now: float) -> RunCheck:
    """Run ``body`` in check mode against ``run``'s recorded steps and say what it found (C48).

    Parameters:
      run (RecordedRun): the run and its step rows.
      body (Callable[..., Any]): the new task body (sync or async), called with the run's arguments.
      codec (CodecChain): the chain the run's values were stored with (C7).
      limits (Limits): the size limits (C22).
      now (float): the clock, epoch seconds: a recorded sleep or wait not over by then ends the check there.

    Returns:
      RunCheck: ``compatible``, ``divergent`` (with the worker's report) or ``error``.

    Raises:
      KeyboardInterrupt: passed on.
    """
    writer = CheckWriter(now, run.label)
    journal = StepJournal(run.steps, run.label, writer, codec, limits)
    journal.checking = True
    context = JobContext(run.run_key, run.job_id or "-", run.attempt + 1, run.task_name, journal, checking=True)
    error: BaseException | None = None
    try:
        with context.activate():
            value = body(*run.args, **run.kwargs)
            if inspect.isawaitable(value):
                _await(value)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        error = exc
    return _verdict(run, journal, writer, error)


def _verdict(run: RecordedRun, journal: StepJournal, writer: CheckWriter, error: BaseException | None) -> RunCheck:
    sequence = journal.sequence
    unreached = {r.step_key for r in sequence.recorded if r.kind not in ("patch", "compensation")}
    unused = tuple(k for k in sequence.unused() if k in unreached)
    base = RunCheck(
        run.run_key, run.task_name, run.status, "compatible", len(unreached) - len(unused), patches=journal.patches
    )
    latched = journal.latched
    diverged = next((e for e in (latched, error) if isinstance(e, StepDivergence)), None)
    if diverged is not None:
        return replace(
            base,
            verdict="divergent",
            message=str(diverged),
            position=diverged.position,
            recorded=diverged.recorded,
            running=diverged.running,
        )
    stopped = next((e for e in (latched, error) if isinstance(e, CheckStopped)), None)
    if stopped is not None or writer.stopped_at is not None:
        return replace(base, stopped_at=stopped.step_key if stopped is not None else writer.stopped_at)
    problem = latched if latched is not None and not isinstance(latched, StepSignal) else error
    if problem is None:
        return replace(base, unused=unused)
    text = f"{type(problem).__name__}: {problem}"
    if _replayed_failure(problem):  # the record's own failure, met by the old code too: not the deploy's doing
        return replace(base, message=f"replays the step that failed for good: {text}")
    return replace(base, verdict="error", message=text)


def _replayed_failure(error: BaseException) -> bool:
    """Whether ``error`` is a recorded step failure replayed (C31): in a check no step body runs, so it is one."""
    return isinstance(error, StepRetryExhausted) or final_reason(error) is not None


def _await(awaitable: Awaitable[Any]) -> Any:
    """Run an async body to its end on a loop of its own (in a thread if this one already runs a loop)."""

    async def wrapped() -> Any:
        return await awaitable

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(wrapped())
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(contextvars.copy_context().run, asyncio.run, wrapped()).result()
