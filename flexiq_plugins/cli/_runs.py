"""``flexiq runs list``, ``flexiq runs show`` and ``flexiq runs cancel``: what the store knows about runs."""

from __future__ import annotations

import click

from .._model.codec import CodecChain
from .._model.records import RunStatus
from ..operations import DecodedValue, RunDetails, cancel_run, decode_step_value, list_runs, load_object, show_run
from . import _render as render
from ._dlq import publisher_options
from ._state import EXIT_USAGE, CliState, console, emit_json, fail, pass_state
from ._types import DURATION

__all__ = ["codec_option", "runs"]

STATUSES = list(RunStatus.__args__)  # type: ignore[attr-defined]


@click.group()
def runs() -> None:
    """Inspect runs and their steps."""


@runs.command("list")
@click.option("--status", type=click.Choice(STATUSES), help="Only runs in this status.")
@click.option("--task", "task_name", metavar="NAME", help="Only runs of this task or actor.")
@click.option("--since", type=DURATION, metavar="DURATION", help="Only runs updated within this window (1h, 7d).")
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True, help="At most this many runs.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_state
def list_command(
    state: CliState, *, status: str | None, task_name: str | None, since: float | None, limit: int, as_json: bool
) -> None:
    """List runs, most recently updated first; DETAIL says what a waiting run waits for, why a run was cancelled."""
    found = list_runs(state.store, status=status, task_name=task_name, since=since, limit=limit)
    if as_json:
        emit_json([render.run_dict(r) for r in found])
        return
    out = console()
    if not found:
        out.print("No runs.")
        return
    out.print(render.runs_table(found))


@runs.command("show")
@click.argument("run_key")
@click.option("--values", is_flag=True, help="Decode and print step values (they may be sensitive).")
@click.option("--codec", "codec_ref", metavar="MODULE:CHAIN", help="The CodecChain the workers use, for --values.")
@click.option("--errors", is_flag=True, help="Print error messages and tracebacks of failed steps (may be sensitive).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_state
def show_command(
    state: CliState, *, run_key: str, values: bool, codec_ref: str | None, errors: bool, as_json: bool
) -> None:
    """Show one run: state, attempts, claim, its step sequence and its step attempts."""
    details = show_run(state.store, run_key)
    codec = codec_option(codec_ref) if values else None
    decoded = [decode_step_value(s, codec) for s in details.steps] if values else None
    if as_json:
        _emit_details(details, decoded, errors=errors)
        return
    out = console()
    if details.job_id is not None:
        click.echo(
            f"{details.job_id} is the id of the run's current job, not a run key; its run key is {details.run.run_key}",
            err=True,
        )
    out.print(render.run_fields(details))
    out.print()
    if details.steps:
        out.print(render.steps_table(details.steps, decoded))
    else:
        out.print(
            "No step rows: a succeeded run's rows are deleted when it succeeds, unless the workers keep "
            "them (keep_succeeded_steps=True)."
        )
    if details.attempts:
        out.print()
        out.print("Step attempts:")
        committed = {s.step_key for s in details.steps}
        out.print(render.attempts_table(details.attempts, committed, errors=errors))
        if errors:
            _print_tracebacks(details)


@runs.command("cancel")
@click.argument("run_key")
@click.option("--reason", default="", help="Why; shown by runs list (default: cancelled on request).")
@publisher_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_state
def cancel_command(
    state: CliState, *, run_key: str, reason: str, app_ref: str | None, broker_ref: str | None, as_json: bool
) -> None:
    """Cancel a run: at once if it is sleeping, waiting or pending; at its next step if it is running.

    Its compensations run and it ends cancelled. A run with undos to run is
    re-published through --app/--broker (else by `flexiq recover`).
    """
    done = cancel_run(run_key, reason=reason, store=state.store, publishers=state.publishers(app_ref, broker_ref))
    if as_json:
        emit_json(
            {"run_key": done.run_key, "outcome": done.outcome, "status": done.status, "job_id": done.job_id}
            | ({"note": done.note} if done.note else {})
        )
        return
    out = console()
    said = {
        "cancelled": "cancelled",
        "compensating": "cancelled; its undos run next"
        + (f" (job {done.job_id})" if done.job_id else f" ({done.note})" if done.note else ""),
        "requested": "cancellation requested: its running attempt stops at its next step",
        "finished": f"already {done.status}: nothing to cancel",
    }
    out.print(f"run {done.run_key}: {said[done.outcome]}", markup=False)


def _emit_details(details: RunDetails, decoded: list[DecodedValue] | None, *, errors: bool) -> None:
    steps = [render.step_dict(s, decoded[i] if decoded else None, errors=errors) for i, s in enumerate(details.steps)]
    run = {**render.run_dict(details.run), "wake_at": render.iso_time(details.wake_at)}
    attempts = [render.attempt_dict(a, errors=errors) for a in details.attempts]
    emit_json({"run": run, "steps": steps, "attempts": attempts})


def _print_tracebacks(details: RunDetails) -> None:
    out = console()
    for a in details.attempts:
        if a.traceback:
            out.print()
            out.print(f"{a.step_key} attempt {a.number} ({a.outcome}):", markup=False)
            out.print(a.traceback.rstrip(), markup=False, highlight=False)


def codec_option(ref: str | None) -> CodecChain | None:
    """The ``--codec MODULE:CHAIN`` given: a ``CodecChain``, or a function returning one; ``None`` without."""
    if ref is None:
        return None
    chain = load_object(ref)
    if callable(chain) and not isinstance(chain, CodecChain):
        chain = chain()
    if not isinstance(chain, CodecChain):
        fail(f"--codec {ref} is not a CodecChain (or a function returning one)", EXIT_USAGE)
    return chain
