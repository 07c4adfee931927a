"""How runs, steps and dead letters look: rich tables for people, stable dicts for ``--json``.

The JSON key names are an interface (scripts parse them) and are listed in
``docs/operations.md``; times are ISO 8601 in UTC. Step values appear only when
the caller decoded them on request, error messages and tracebacks only when
asked for (``--errors``): both may hold personal or payment data.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from rich.table import Table

from .._model.failures import RunFailure, StepFailure, load_failure
from .._model.records import DeadLetterRecord, KnownTask, RunRecord, StepAttempt, StepRow
from ..operations import DecodedValue, RunDetails, Stranded, human_time, retried_note, run_note

__all__ = [
    "attempt_dict",
    "attempts_table",
    "dead_letter_dict",
    "dead_letter_table",
    "human_time",
    "iso_time",
    "run_detail",
    "run_dict",
    "run_fields",
    "runs_table",
    "step_dict",
    "steps_table",
    "stranded_dict",
]


def iso_time(t: float | None) -> str | None:
    """Epoch seconds as ISO 8601 UTC (``None`` stays ``None``; beyond year 9999: the seconds)."""
    if t is None:
        return None
    moment = _utc(t)
    return moment.isoformat() if moment else f"{t:.0f} seconds since the epoch"


def _utc(t: float) -> datetime | None:
    try:
        return datetime.fromtimestamp(t, timezone.utc)
    except (OverflowError, OSError, ValueError):  # e.g. a sleep of timedelta.max
        return None


# ------------------------------------------------------------------- tasks
def known_task_dict(task: KnownTask) -> dict[str, Any]:
    """A known task for ``flexiq tasks --json``: ``name``, ``framework``, ``first_seen`` (ISO 8601 UTC)."""
    return {"name": task.name, "framework": task.framework, "first_seen": iso_time(task.first_seen)}


def known_tasks_table(tasks: list[KnownTask]) -> Table:
    """The ``flexiq tasks`` table."""
    table = Table("TASK", "FRAMEWORK", "FIRST SEEN", box=None)
    for task in tasks:
        table.add_row(task.name, task.framework, human_time(task.first_seen))
    return table


# -------------------------------------------------------------------- runs
def run_dict(run: RunRecord) -> dict[str, Any]:
    """A run for ``--json`` (no arguments, no values)."""
    return {
        "run_key": run.run_key,
        "task_name": run.task_name,
        "framework": run.framework,
        "queue": run.queue,
        "status": run.status,
        "attempt": run.attempt,
        "owner": run.owner,
        "lease_until": iso_time(run.lease_until),
        "takeovers": run.takeovers,
        "job_id": run.job_id,
        "step_count": run.step_count,
        "step_bytes": run.step_bytes,
        "created_at": iso_time(run.created_at),
        "updated_at": iso_time(run.updated_at),
        "wake_at": iso_time(run.wake_at),
        "recovered_at": iso_time(run.recovered_at),
        "wait_topic": run.wait_topic if run.status == "waiting" else None,
        "wait_key": run.wait_key if run.status == "waiting" else None,
        "cancel_reason": run.cancel_reason,
    }


def run_detail(run: RunRecord) -> str:
    """What a run waits for (a sleep's wake time, an event, C15, C33), or why it is cancelled, or is to be (C34).

    The wording of [`run_note`][flexiq_plugins.operations.run_note], the same on the dashboard.
    """
    return run_note(run)


def runs_table(runs: list[RunRecord]) -> Table:
    """The ``runs list`` table; DETAIL says when a sleeping run wakes, what a waiting run waits for and why a
    cancelled run was cancelled."""
    columns = ("RUN KEY", "TASK", "FRAMEWORK", "STATUS", "ATTEMPT", "STEPS", "BYTES", "UPDATED", "DETAIL")
    table = Table(*columns, box=None)
    for r in runs:
        table.add_row(
            r.run_key,
            r.task_name,
            r.framework,
            r.status,
            str(r.attempt),
            str(r.step_count),
            str(r.step_bytes),
            human_time(r.updated_at),
            run_detail(r),
        )
    return table


def run_fields(details: RunDetails) -> Table:
    """The ``runs show`` header: one field per line."""
    run = details.run
    claim = f"{run.owner}, lease until {human_time(run.lease_until)}" if run.owner else "none"
    table = Table(show_header=False, box=None)
    rows = [
        ("Run key", run.run_key),
        ("Task", run.task_name),
        ("Framework", run.framework),
        ("Queue", run.queue or "-"),
        ("Status", run.status),
        ("Attempts", str(run.attempt)),
        ("Claim", claim),
        ("Takeovers", str(run.takeovers)),
        ("Job id", run.job_id or "-"),
        ("Steps", _steps_field(run)),
        ("Wake at", human_time(details.wake_at)),
        ("Detail", run_detail(run)),
        ("Created", human_time(run.created_at)),
        ("Updated", human_time(run.updated_at)),
    ]
    if run.envelope.corrupt:
        rows.append(("Envelope", run.envelope.corrupt))
    for name, value in rows:
        table.add_row(f"{name}:", value)
    return table


def _steps_field(run: RunRecord) -> str:
    return f"{run.step_count} ({run.step_bytes} bytes)"


def step_dict(row: StepRow, decoded: DecodedValue | None = None, *, errors: bool = False) -> dict[str, Any]:
    """A step for ``--json``; ``value`` and ``value_note`` only when values were asked for.

    ``failure`` is ``null`` unless the step failed for good (C31) or records why
    the run is compensated (C32); its ``message`` only with ``errors``.
    ``compensate`` names the undo the step registered (C32).
    """
    data: dict[str, Any] = {
        "position": row.position,
        "step_key": row.step_key,
        "kind": row.kind,
        "size": row.size,
        "attempt": row.attempt,
        "committed_at": iso_time(row.committed_at),
        "wake_at": iso_time(row.wake_at),
        "failure": _failure_dict(row, errors=errors),
        "compensate": row.compensate,
        "event_id": row.event_id,
    }
    if decoded is not None:
        data["value"] = decoded.value if decoded.ok else None
        data["value_note"] = None if decoded.ok else decoded.note
    return data


def _failure_of(row: StepRow) -> StepFailure | RunFailure | None:
    if row.failure is None:
        return None
    try:
        return load_failure(row.failure)
    except (ValueError, TypeError):
        return None


def _failure_dict(row: StepRow, *, errors: bool) -> dict[str, Any] | None:
    failure = _failure_of(row)
    if failure is None:
        return None
    data: dict[str, Any] = {"reason": failure.reason, "error_type": failure.error_type}
    if isinstance(failure, StepFailure):
        data["attempts"] = failure.attempts
    else:
        data["origin"] = failure.origin
    if errors:
        data["message"] = failure.message
    return data


def _note(row: StepRow) -> str:
    """What the NOTE column says about a step: failed for good, the undo it registered, why the run compensates."""
    failure = _failure_of(row)
    notes = []
    if isinstance(failure, StepFailure):
        tries = "attempt" if failure.attempts == 1 else "attempts"
        notes.append(
            f"failed for good: {failure.reason} ({failure.error_type or 'worker lost'}, {failure.attempts} {tries})"
        )
    elif isinstance(failure, RunFailure):
        notes.append(f"compensating: {failure.reason} ({failure.error_type})")
    if row.compensate:
        notes.append(f"undo: {row.compensate}")
    if row.kind == "event":
        notes.append(f"event {row.event_id}" if row.event_id is not None else "timed out")
    return "; ".join(notes) or "-"


def steps_table(steps: list[StepRow], values: list[DecodedValue] | None = None) -> Table:
    """The ``runs show`` step table, with a VALUE column only when values were asked for."""
    columns = ["#", "STEP KEY", "KIND", "SIZE", "COMMITTED AT", "WAKE AT"]
    table = Table(*columns, *(["VALUE"] if values is not None else []), "NOTE", box=None)
    for i, row in enumerate(steps):
        cells = [
            str(row.position),
            row.step_key,
            row.kind,
            str(row.size),
            human_time(row.committed_at),
            human_time(row.wake_at),
        ]
        if values is not None:
            shown = values[i]
            cells.append(_shown_value(row, shown))
        table.add_row(*cells, _note(row))
    return table


def _shown_value(row: StepRow, shown: DecodedValue) -> str:
    if row.kind not in ("run", "event") or row.value is None:
        return "-"
    return repr(shown.value) if shown.ok else f"({shown.note})"


# ------------------------------------------------------------ step attempts
def attempt_dict(attempt: StepAttempt, *, errors: bool = False) -> dict[str, Any]:
    """A step attempt for ``--json`` (C31); ``message`` and ``traceback`` only with ``errors``."""
    data: dict[str, Any] = {
        "step_key": attempt.step_key,
        "number": attempt.number,
        "run_attempt": attempt.run_attempt,
        "ended": attempt.ended,
        "error_type": attempt.error_type,
        "started_at": iso_time(attempt.started_at),
        "failed_at": iso_time(attempt.failed_at),
        "retry_at": iso_time(attempt.retry_at),
    }
    if errors:
        data["message"] = attempt.message
        data["traceback"] = attempt.traceback
    return data


def attempts_table(attempts: list[StepAttempt], committed: set[str], *, errors: bool = False) -> Table:
    """The ``runs show`` step attempts table (C31), with a MESSAGE column only with ``errors``.

    An attempt that has not ended ``succeeded`` if it is the last of a
    committed step, else it is ``running``.
    """
    columns = ["STEP KEY", "#", "RUN ATTEMPT", "ENDED", "ERROR", "STARTED", "FAILED", "RETRY AT"]
    table = Table(*columns, *(["MESSAGE"] if errors else []), box=None)
    last: dict[str, int] = {}
    for a in attempts:
        last[a.step_key] = max(last.get(a.step_key, 0), a.number)
    for a in attempts:
        done = a.step_key in committed and a.number == last[a.step_key]
        cells = [
            a.step_key,
            str(a.number),
            str(a.run_attempt),
            a.ended or ("succeeded" if done else "running"),
            a.error_type or "-",
            human_time(a.started_at),
            human_time(a.failed_at),
            human_time(a.retry_at),
        ]
        if errors:
            cells.append(_first_line(a.message or "-"))
        table.add_row(*cells)
    return table


def _first_line(text: str, limit: int = 80) -> str:
    first = (text.splitlines() or [""])[0]
    return first if len(first) <= limit else first[: limit - 1] + "…"


# ------------------------------------------------------------ dead letters
def dead_letter_dict(dead: DeadLetterRecord, *, full: bool = False) -> dict[str, Any]:
    """A dead letter for ``--json``; ``full`` adds the traceback and the envelope."""
    data: dict[str, Any] = {
        "id": dead.id,
        "run_key": dead.run_key,
        "job_id": dead.job_id,
        "task_name": dead.task_name,
        "framework": dead.envelope.framework,
        "reason": dead.reason,
        "message": dead.message,
        "created_at": iso_time(dead.created_at),
        "retried_at": iso_time(dead.retried_at),
    }
    if full:
        data["traceback"] = dead.traceback
        data["envelope"] = dead.envelope.to_dict()
    return data


def dead_letter_table(letters: list[DeadLetterRecord], *, retried: bool = False) -> Table:
    """The ``dlq list`` table (messages cut to one line); with ``retried`` (``--all``) a RETRIED column."""
    columns = ["ID", "TASK", "FRAMEWORK", "RUN KEY", "REASON", "CREATED", *(["RETRIED"] if retried else []), "MESSAGE"]
    table = Table(*columns, box=None)
    for d in letters:
        first_line = (d.message.splitlines() or [""])[0]
        message = first_line if len(first_line) <= 60 else first_line[:59] + "…"
        cells = [str(d.id), d.task_name, d.envelope.framework, d.run_key, d.reason, human_time(d.created_at)]
        table.add_row(*cells, *([retried_note(d)] if retried else []), message)
    return table


# ---------------------------------------------------------------- recovery
def stranded_dict(stranded: Stranded, **extra: Any) -> dict[str, Any]:
    """A recovery candidate for ``--json``."""
    run = stranded.run
    return {
        "run_key": run.run_key,
        "task_name": run.task_name,
        "framework": run.framework,
        "status": run.status,
        "why": stranded.why,
        "due_at": iso_time(stranded.due_at),
        **extra,
    }
