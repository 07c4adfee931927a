"""How runs, steps and dead letters look: rich tables for people, stable dicts for ``--json``.

The JSON key names are an interface (scripts parse them) and are listed in
``docs/operations.md``; times are ISO 8601 in UTC. Step values appear only when
the caller decoded them on request.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from rich.table import Table

from .._store.base import DeadLetterRecord, RunRecord, StepRow
from ..operations import DecodedValue, RunDetails, Stranded

__all__ = [
    "dead_letter_dict",
    "dead_letter_table",
    "human_time",
    "iso_time",
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


def human_time(t: float | None) -> str:
    """Epoch seconds as ``2025-01-02 03:04:05 UTC`` ('-' for ``None``; beyond year 9999: the seconds)."""
    if t is None:
        return "-"
    moment = _utc(t)
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC") if moment else f"{t:.0f} seconds since the epoch"


def _utc(t: float) -> datetime | None:
    try:
        return datetime.fromtimestamp(t, timezone.utc)
    except (OverflowError, OSError, ValueError):  # e.g. a sleep of timedelta.max
        return None


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
    }


def runs_table(runs: list[RunRecord]) -> Table:
    """The ``runs list`` table."""
    table = Table("RUN KEY", "TASK", "FRAMEWORK", "STATUS", "ATTEMPT", "STEPS", "BYTES", "UPDATED", box=None)
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
        ("Created", human_time(run.created_at)),
        ("Updated", human_time(run.updated_at)),
    ]
    if run.envelope.corrupt:
        rows.append(("Envelope", run.envelope.corrupt))
    for name, value in rows:
        table.add_row(f"{name}:", value)
    return table


def _steps_field(run: RunRecord) -> str:
    text = f"{run.step_count} ({run.step_bytes} bytes)"
    if run.status == "succeeded" and run.step_count == 0:
        text += "; a succeeded run's steps are deleted unless the workers keep them (keep_succeeded_steps=True)"
    return text


def step_dict(row: StepRow, decoded: DecodedValue | None = None) -> dict[str, Any]:
    """A step for ``--json``; ``value`` and ``value_note`` only when values were asked for."""
    data: dict[str, Any] = {
        "position": row.position,
        "step_key": row.step_key,
        "kind": row.kind,
        "size": row.size,
        "attempt": row.attempt,
        "committed_at": iso_time(row.committed_at),
        "wake_at": iso_time(row.wake_at),
    }
    if decoded is not None:
        data["value"] = decoded.value if decoded.ok else None
        data["value_note"] = None if decoded.ok else decoded.note
    return data


def steps_table(steps: list[StepRow], values: list[DecodedValue] | None = None) -> Table:
    """The ``runs show`` step table, with a VALUE column only when values were asked for."""
    columns = ["#", "STEP KEY", "KIND", "SIZE", "COMMITTED AT", "WAKE AT"]
    table = Table(*columns, *(["VALUE"] if values is not None else []), box=None)
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
            cells.append("-" if row.kind == "sleep" else repr(shown.value) if shown.ok else f"({shown.note})")
        table.add_row(*cells)
    return table


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


def dead_letter_table(letters: list[DeadLetterRecord]) -> Table:
    """The ``dlq list`` table (messages cut to one line)."""
    table = Table("ID", "TASK", "FRAMEWORK", "RUN KEY", "REASON", "CREATED", "MESSAGE", box=None)
    for d in letters:
        first_line = (d.message.splitlines() or [""])[0]
        message = first_line if len(first_line) <= 60 else first_line[:59] + "…"
        table.add_row(
            str(d.id), d.task_name, d.envelope.framework, d.run_key, d.reason, human_time(d.created_at), message
        )
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
