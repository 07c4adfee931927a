"""Rows to records and back: how the SQL store's columns hold the interface's types.

The job envelope is stored as compact JSON text, so it must be
JSON-compatible; step values are bytes; times are epoch seconds. Column
names stay as the migrations made them: ``step_attempts.outcome`` holds
`StepAttempt.ended` (how a step attempt ended), ``runs.outcome`` the
run's stored outcome (C37).
"""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa

from ..._model.records import DeadLetterRecord, EventRecord, JobEnvelope, RunRecord, StepAttempt, StepRow
from ...errors import StoreError

__all__ = [
    "attempt_values",
    "dead_letter_record",
    "dump_envelope",
    "event_record",
    "load_envelope",
    "run_record",
    "step_attempt",
    "step_row",
    "step_values",
]


def dump_envelope(envelope: JobEnvelope) -> str:
    """Return ``envelope`` as compact JSON text.

    Raises:
      StoreError: the envelope is not JSON-compatible.
    """
    try:
        return json.dumps(envelope.to_dict(), separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise StoreError(f"the job envelope of {envelope.task_name!r} is not JSON-compatible: {exc}") from exc


def load_envelope(text: str, *, task_name: str, framework: str, queue: str | None) -> JobEnvelope:
    """Return the envelope `dump_envelope` wrote, or one marked ``corrupt`` if it cannot be read.

    Never raises, so one damaged row does not fail a whole listing; the
    columns ``task_name``, ``framework`` and ``queue`` fill the marked envelope.
    """
    try:
        data = json.loads(text)
        envelope = JobEnvelope.from_dict(data)
        if not (isinstance(envelope.task_name, str) and isinstance(envelope.framework, str)):
            raise TypeError("task_name and framework must be strings")
        return envelope
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        why = f"{type(exc).__name__}: {exc}"[:200]
        return JobEnvelope(task_name, framework, queue, corrupt=f"the stored job envelope cannot be read ({why})")


def step_values(row: StepRow) -> dict[str, Any]:
    """Return the column values of a step row, its run key excepted."""
    return {
        "position": row.position,
        "step_key": row.step_key,
        "kind": row.kind,
        "value": row.value,
        "wake_at": row.wake_at,
        "committed_at": row.committed_at,
        "attempt": row.attempt,
        "failure": row.failure,
        "compensate": row.compensate,
        "event_id": row.event_id,
    }


def step_row(r: sa.Row[Any]) -> StepRow:
    """Return the [`StepRow`][flexiq_plugins.StepRow] of a ``steps`` row."""
    return StepRow(
        position=r.position,
        step_key=r.step_key,
        kind=r.kind,
        value=bytes(r.value) if r.value is not None else None,
        wake_at=r.wake_at,
        committed_at=r.committed_at,
        attempt=r.attempt,
        failure=r.failure,
        compensate=r.compensate,
        event_id=r.event_id,
    )


def attempt_values(attempt: StepAttempt) -> dict[str, Any]:
    """Return the column values of a step attempt."""
    return {
        "run_key": attempt.run_key,
        "step_key": attempt.step_key,
        "number": attempt.number,
        "run_attempt": attempt.run_attempt,
        "started_at": attempt.started_at,
        "outcome": attempt.ended,  # the column keeps its name: how the attempt ended
        "error_type": attempt.error_type,
        "message": attempt.message,
        "traceback": attempt.traceback,
        "failed_at": attempt.failed_at,
        "retry_at": attempt.retry_at,
    }


def step_attempt(r: sa.Row[Any]) -> StepAttempt:
    """Return the [`StepAttempt`][flexiq_plugins.StepAttempt] of a ``step_attempts`` row."""
    return StepAttempt(
        run_key=r.run_key,
        step_key=r.step_key,
        number=r.number,
        run_attempt=r.run_attempt,
        started_at=r.started_at,
        ended=r.outcome,
        error_type=r.error_type,
        message=r.message,
        traceback=r.traceback,
        failed_at=r.failed_at,
        retry_at=r.retry_at,
    )


def run_record(r: sa.Row[Any]) -> RunRecord:
    """Return the [`RunRecord`][flexiq_plugins.RunRecord] of a ``runs`` row."""
    return RunRecord(
        run_key=r.run_key,
        task_name=r.task_name,
        framework=r.framework,
        queue=r.queue,
        status=r.status,
        owner=r.owner,
        attempt=r.attempt,
        lease_until=r.lease_until,
        takeovers=r.takeovers,
        job_id=r.job_id,
        envelope=load_envelope(r.envelope, task_name=r.task_name, framework=r.framework, queue=r.queue),
        step_count=r.step_count,
        step_bytes=int(r.step_bytes),
        created_at=r.created_at,
        updated_at=r.updated_at,
        wake_at=r.wake_at,
        recovered_at=r.recovered_at,
        wait_topic=r.wait_topic,
        wait_key=r.wait_key,
        cancel_reason=r.cancel_reason,
        outcome=r.outcome,
        trace_context=r.trace_context,
    )


def dead_letter_record(r: sa.Row[Any]) -> DeadLetterRecord:
    """Return the [`DeadLetterRecord`][flexiq_plugins.DeadLetterRecord] of a ``dead_letters`` row."""
    return DeadLetterRecord(
        id=r.id,
        run_key=r.run_key,
        job_id=r.job_id,
        task_name=r.task_name,
        reason=r.reason,
        message=r.message,
        traceback=r.traceback,
        envelope=load_envelope(r.envelope, task_name=r.task_name, framework="unknown", queue=None),
        created_at=r.created_at,
        retried_at=r.retried_at,
    )


def event_record(r: sa.Row[Any]) -> EventRecord:
    """Return the `EventRecord` of an ``events`` row."""
    return EventRecord(
        id=int(r.id),
        topic=r.topic,
        key=r.event_key,
        run_key=r.run_key,
        payload=bytes(r.payload) if r.payload is not None else None,
        created_at=r.created_at,
    )
