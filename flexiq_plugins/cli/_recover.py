"""``flexiq recover``: re-publish runs that no broker message will wake (C35)."""

from __future__ import annotations

import click

from ..operations import DEFAULT_GRACE_SECONDS, DEFAULT_QUEUED_SECONDS, DEFAULT_STALE_SECONDS, RecoveryReport, recover
from . import _render as render
from ._dlq import publisher_options
from ._state import EXIT_FAILED, EXIT_USAGE, CliState, console, emit_json, fail, pass_state
from ._types import DURATION

__all__ = ["recover_command"]


@click.command("recover")
@click.option("--dry-run", is_flag=True, help="Only list what would be re-published.")
@click.option(
    "--grace",
    type=DURATION,
    default=DEFAULT_GRACE_SECONDS,
    show_default="10s",
    help="How far past its wake time or deadline a run must be (an expired lease: at once).",
)
@click.option(
    "--stale-after",
    type=DURATION,
    default=DEFAULT_STALE_SECONDS,
    show_default="1h",
    help="How long a pending or retrying run may go without an update.",
)
@click.option(
    "--queued-after",
    type=DURATION,
    default=DEFAULT_QUEUED_SECONDS,
    show_default="30s",
    help="How long a run recorded at publish may stay queued without a start (C39).",
)
@publisher_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_state
def recover_command(
    state: CliState,
    *,
    dry_run: bool,
    grace: float,
    stale_after: float,
    queued_after: float,
    app_ref: str | None,
    broker_ref: str | None,
    as_json: bool,
) -> None:
    """Re-publish runs whose message was lost before they started, sleeping runs past their wake time, runs
    whose worker died, and stale pending runs; settle a run whose job its framework reports finished (C47).

    Workers run this by themselves by default (C39); the command is for a
    worker set-up with ``recovery=False``, or to look with ``--dry-run``.

    Safe to run from several places at once: each stranded run is re-published
    by exactly one of them.
    """
    publishers = state.publishers(app_ref, broker_ref)
    if not publishers and not dry_run:
        fail("pass --app module:app (Celery) and/or --broker module:broker (Dramatiq)", EXIT_USAGE)
    if dry_run:
        publishers = publishers or {"celery": _never, "dramatiq": _never}
    report = recover(
        state.store, publishers, grace=grace, stale_after=stale_after, queued_after=queued_after, dry_run=dry_run
    )
    _print(report, as_json)
    if report.failed:
        raise click.exceptions.Exit(EXIT_FAILED)


def _never(*_: object, **__: object) -> str:
    raise AssertionError("a dry run publishes nothing")


def _print(report: RecoveryReport, as_json: bool) -> None:
    if as_json:
        emit_json(
            {
                "dry_run": report.dry_run,
                "recovered": [render.stranded_dict(s, job_id=job or None) for s, job in report.recovered],
                "skipped": [render.stranded_dict(s, note=note) for s, note in report.skipped],
                "failed": [render.stranded_dict(s, error=error) for s, error in report.failed],
                "settled": [render.stranded_dict(s, settled=status) for s, status in report.settled],
            }
        )
        return
    out = console()
    verb = "would re-publish" if report.dry_run else "re-published"
    for s, job in report.recovered:
        suffix = f" as job {job}" if job else ""
        out.print(f"{verb} run {s.run.run_key} ({s.run.task_name}, {s.why}){suffix}", markup=False)
    settle = "would settle" if report.dry_run else "settled"
    for s, status in report.settled:
        line = f"{settle} run {s.run.run_key} ({s.run.task_name}) {status}: its framework reported its job finished"
        out.print(line, markup=False)
    for s, note in report.skipped:
        out.print(f"skipped run {s.run.run_key} ({s.run.task_name}): {note}", markup=False)
    for s, error in report.failed:
        click.echo(f"Error: run {s.run.run_key}: {error}", err=True)
    if not (report.recovered or report.skipped or report.failed or report.settled):
        out.print("Nothing to recover.")
