"""``flexiq check`` and ``flexiq runs export``: new code against the runs in flight, before the deploy (C48).

``flexiq check`` exits 0 when the new code replays every unfinished run's
record, and 1 when it would break one (a divergence, an error, a task it no
longer has), with the runs grouped by task and by the first position where
the code parts from their record. ``flexiq runs export`` writes the records
to a file, so a CI job checks against them without the store.
"""

from __future__ import annotations

import sys

import click

from ..operations import (
    DEFAULT_TARGET_ATTRS,
    CheckReport,
    RunCheck,
    TaskReport,
    check_runs,
    export_runs,
    load_object,
)
from ._runs import codec_option
from ._state import EXIT_FAILED, EXIT_USAGE, CliState, console, emit_json, fail, pass_state

__all__ = ["check_command", "export_command"]


@click.command("check")
@click.option("--app", "app_ref", metavar="MODULE:APP", help="Celery app whose tasks are the new code.")
@click.option("--broker", "broker_ref", metavar="MODULE:BROKER", help="Dramatiq broker whose actors are the new code.")
@click.option("--task", "task_name", metavar="NAME", help="Only the runs of this task or actor.")
@click.option(
    "--file",
    "path",
    type=click.Path(exists=True, dir_okay=False),
    help="Check the runs of this `flexiq runs export` file instead of the store.",
)
@click.option("--codec", "codec_ref", metavar="MODULE:CHAIN", help="The CodecChain the workers use.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_state
def check_command(
    state: CliState,
    *,
    app_ref: str | None,
    broker_ref: str | None,
    task_name: str | None,
    path: str | None,
    codec_ref: str | None,
    as_json: bool,
) -> None:
    """Check new code against every unfinished run with recorded steps; exit 1 if it would break one.

    Each run's task body (from --app / --broker) runs in check mode over the
    run's record: recorded steps replay from their stored values, the first
    step past the record ends the check, a changed step is a divergence.
    Nothing is written, no step body runs, nothing is published; code between
    steps does run (current_job.checking is true there).
    """
    refs = [ref for ref in (app_ref or state.app_ref, broker_ref or state.broker_ref) if ref]
    if not refs:
        fail("pass --app module:app (Celery) or --broker module:broker (Dramatiq): the new code to check", EXIT_USAGE)
    codec = codec_option(codec_ref)
    source = path if path is not None else state.store
    checks: list[RunCheck] = []
    for ref in refs:
        target = load_object(ref, DEFAULT_TARGET_ATTRS)
        checks += check_runs(source, target, task_name=task_name, codec=codec).checks
    report = CheckReport(checks, path or "the store")
    if as_json:
        emit_json(_report_dict(report))
    else:
        _print_report(report)
    if not report.ok:
        raise click.exceptions.Exit(EXIT_FAILED)


def _print_report(report: CheckReport) -> None:
    out = console()
    broken = len(report.failed)
    total = len(report.checks)
    if not total:
        out.print(f"No unfinished run with recorded steps in {report.source}: nothing to check.", markup=False)
        return
    out.print(
        f"Checked {total} run{'s' if total != 1 else ''} in {report.source}: "
        + (f"the new code would break {broken}." if broken else "the new code replays every one."),
        markup=False,
    )
    for task in report.by_task():
        out.print()
        for line in _task_lines(task):
            out.print(line, markup=False, highlight=False, soft_wrap=True)


def _task_lines(task: TaskReport) -> list[str]:
    runs = len(task.compatible) + sum(len(g.runs) for g in task.divergent) + len(task.errors) + len(task.missing)
    lines = [f"{task.task_name}: {runs} run{'s' if runs != 1 else ''}, {len(task.compatible)} compatible"]
    for group in task.divergent:
        where = f"position {group.position}: recorded {group.recorded!r}, now {group.running!r}"
        lines.append(f"  would diverge at {where}: {_count(group.runs)}")
        lines += [f"    {c.run_key} ({c.status})" for c in group.runs]
        lines += ["    " + line for line in group.runs[0].message.splitlines()]
    for check in task.errors:
        lines.append(f"  would fail: {check.run_key} ({check.status}): {check.message}")
    for check in task.missing:
        lines.append(f"  no such task in the new code: {check.run_key} ({check.status})")
    for use in task.patches:
        if use.safe_to_deprecate:
            lines.append(
                f"  patch {use.patch_id!r}: no run on its old branch: step.patched({use.patch_id!r}) and its old "
                f"branch may be replaced by step.deprecate_patch({use.patch_id!r})"
            )
        else:
            lines.append(
                f"  patch {use.patch_id!r}: {_count(use.old)} on its old branch ({', '.join(use.old)}): "
                "keep the old branch until they finish"
            )
    return lines


def _count(items: list[object] | list[str] | list[RunCheck]) -> str:
    return f"{len(items)} run{'s' if len(items) != 1 else ''}"


def _report_dict(report: CheckReport) -> dict[str, object]:
    return {
        "ok": report.ok,
        "source": report.source,
        "checked": len(report.checks),
        "failed": len(report.failed),
        "tasks": [_task_dict(t) for t in report.by_task()],
        "runs": [_check_dict(c) for c in report.checks],
    }


def _task_dict(task: TaskReport) -> dict[str, object]:
    return {
        "task_name": task.task_name,
        "ok": task.ok,
        "compatible": len(task.compatible),
        "divergent": [
            {
                "position": g.position,
                "recorded": g.recorded,
                "running": g.running,
                "run_keys": [c.run_key for c in g.runs],
            }
            for g in task.divergent
        ],
        "errors": [c.run_key for c in task.errors],
        "missing": [c.run_key for c in task.missing],
        "patches": [
            {"patch_id": u.patch_id, "old": u.old, "new": u.new, "safe_to_deprecate": u.safe_to_deprecate}
            for u in task.patches
        ],
    }


def _check_dict(check: RunCheck) -> dict[str, object]:
    return {
        "run_key": check.run_key,
        "task_name": check.task_name,
        "status": check.status,
        "verdict": check.verdict,
        "replayed": check.replayed,
        "stopped_at": check.stopped_at,
        "position": check.position,
        "recorded": check.recorded,
        "running": check.running,
        "message": check.message,
        "patches": dict(check.patches),
        "unused": list(check.unused),
    }


@click.command("export")
@click.argument("run_keys", nargs=-1)
@click.option("--out", "out", metavar="FILE", required=True, help="The file to write ('-': standard output).")
@click.option("--task", "task_name", metavar="NAME", help="Without RUN_KEYS: only the runs of this task or actor.")
@pass_state
def export_command(state: CliState, *, run_keys: tuple[str, ...], out: str, task_name: str | None) -> None:
    """Write runs' recorded steps (values as stored) to a JSON file for `flexiq check --file` in CI.

    Without RUN_KEYS, every unfinished run with recorded steps is written. The
    file holds step values as the store keeps them (encrypted ones stay
    encrypted) and the jobs' arguments: treat it like the store's data.
    """
    if run_keys and task_name is not None:
        fail("--task goes without RUN_KEYS (it selects the runs to export)", EXIT_USAGE)
    count = export_runs(state.store, sys.stdout if out == "-" else out, run_keys, task_name=task_name)
    where = "standard output" if out == "-" else out
    click.echo(f"exported {count} run{'s' if count != 1 else ''} to {where}", err=out == "-")
