"""How a run, its steps and a dead letter are described in words, the same on every operator surface.

``flexiq`` and the dashboard print these sentences as they are, so an operator
reads one wording wherever they look (a sleeping run "wakes at …" in both).
Times are shown in UTC, to the second.
"""

from __future__ import annotations

from datetime import datetime, timezone

from .._model.records import UNSTARTED_STATUSES, DeadLetterRecord, RunRecord

__all__ = ["human_time", "retried_note", "run_note", "steps_note"]


def human_time(t: float | None) -> str:
    """Epoch seconds as ``2025-01-02 03:04:05 UTC`` ('-' for ``None``; beyond year 9999: the seconds).

    Parameters:
      t (float | None): epoch seconds.
    """
    if t is None:
        return "-"
    try:
        return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError):  # e.g. a sleep of timedelta.max
        return f"{t:.0f} seconds since the epoch"


def run_note(run: RunRecord) -> str:
    """What a run waits for, or why it is cancelled or is to be; '-' when there is nothing to say (C15, C33, C34).

    - a sleeping run: ``wakes at <time>`` (its sleep's, or a step retry's, C31);
    - a waiting run: ``event ('payment', 'o-1')``, with `` until <deadline>`` when it has one;
    - a cancelled run: ``cancelled: <reason>``; a run whose cancellation is
      requested: ``cancel requested: <reason>``.

    Parameters:
      run (RunRecord): the run.
    """
    if run.status == "waiting":
        until = f" until {human_time(run.wake_at)}" if run.wake_at is not None else ""
        return f"event ({run.wait_topic!r}, {run.wait_key!r}){until}"
    if run.cancel_reason is not None and run.status == "cancelled":
        return f"cancelled: {run.cancel_reason}"
    if run.cancel_reason is not None:
        return f"cancel requested: {run.cancel_reason}"
    if run.status == "sleeping" and run.wake_at is not None:
        return f"wakes at {human_time(run.wake_at)}"
    return "-"


def steps_note(run: RunRecord) -> str:
    """Why a run shows no step rows, by its state (C27).

    Only a succeeded run's rows are deleted (unless the workers keep them);
    a run no attempt started has none yet; any other run committed none.

    Parameters:
      run (RunRecord): a run without step rows.
    """
    if run.status == "succeeded":
        return (
            "No step rows: a succeeded run's rows are deleted when it succeeds, unless the workers keep "
            "them (keep_succeeded_steps=True)."
        )
    if run.status in UNSTARTED_STATUSES and run.step_count == 0:
        return "No step rows yet: no attempt of this run has committed a step."
    return f"No step rows: this {run.status} run committed no step."


def retried_note(dead: DeadLetterRecord) -> str:
    """``retried at <time>``, or '-' for a dead letter not retried yet (C30).

    Parameters:
      dead (DeadLetterRecord): the dead letter.
    """
    return "-" if dead.retried_at is None else f"retried at {human_time(dead.retried_at)}"
