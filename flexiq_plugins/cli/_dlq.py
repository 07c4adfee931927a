"""``flexiq dlq``: list, inspect, retry and purge dead letters (C30)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import click

from ..errors import StoreError
from ..operations import OperationError, Retried, purge_dead_letters, retry_dead_letter, retry_dead_letters
from . import _render as render
from ._state import EXIT_FAILED, EXIT_USAGE, CliState, console, emit_json, fail, pass_state
from ._types import DEAD_LETTER_ID, ID_COMMAND

__all__ = ["dlq", "publisher_options"]

F = TypeVar("F", bound=Callable[..., Any])


def publisher_options(fn: F) -> F:
    """Add ``--app`` and ``--broker`` (they may also be given before the command)."""
    fn = click.option("--broker", "broker_ref", metavar="MODULE:BROKER", help="Dramatiq broker to publish with.")(fn)
    return click.option("--app", "app_ref", metavar="MODULE:APP", help="Celery app to publish with.")(fn)


@click.group()
def dlq() -> None:
    """Dead letters: list, show, retry, purge."""


@dlq.command("list")
@click.option("--task", "task_name", metavar="NAME", help="Only dead letters of this task or actor.")
@click.option("--all", "include_retried", is_flag=True, help="Include dead letters already retried.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_state
def list_command(state: CliState, *, task_name: str | None, include_retried: bool, as_json: bool) -> None:
    """List dead letters, oldest first (those not yet retried, unless --all)."""
    letters = state.store.list_dead_letters(task_name=task_name, include_retried=include_retried)
    if as_json:
        emit_json([render.dead_letter_dict(d) for d in letters])
    elif letters:
        console().print(render.dead_letter_table(letters, retried=include_retried))
    else:
        console().print("No dead letters.")


@dlq.command("show", context_settings=ID_COMMAND)
@click.argument("dead_letter_id", type=DEAD_LETTER_ID)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_state
def show_command(state: CliState, *, dead_letter_id: int, as_json: bool) -> None:
    """Show one dead letter: reason, message, traceback and the job to re-publish."""
    dead = state.store.get_dead_letter(dead_letter_id)
    data = render.dead_letter_dict(dead, full=True)
    if as_json:
        emit_json(data)
        return
    out = console()
    for name in ("id", "task_name", "framework", "run_key", "job_id", "reason", "created_at", "retried_at"):
        out.print(f"{name}: {data[name] if data[name] is not None else '-'}", markup=False)
    out.print(f"message: {dead.message}", markup=False)
    out.print(f"envelope: {json.dumps(data['envelope'])}", markup=False)
    out.print("traceback:", markup=False)
    out.print(dead.traceback or "(none)", markup=False)


@dlq.command("retry", context_settings=ID_COMMAND)
@click.argument("ids", nargs=-1, type=DEAD_LETTER_ID)
@click.option("--all", "retry_all", is_flag=True, help="Retry every dead letter not yet retried.")
@click.option("--task", "task_name", metavar="NAME", help="With --all: only those of this task or actor.")
@click.option("--reset-from", metavar="STEP_KEY", help="Drop the memo of this step and every later one.")
@publisher_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_state
def retry_command(
    state: CliState,
    *,
    ids: tuple[int, ...],
    retry_all: bool,
    task_name: str | None,
    reset_from: str | None,
    app_ref: str | None,
    broker_ref: str | None,
    as_json: bool,
) -> None:
    """Re-publish dead-lettered jobs with a new job id and the same run key (C11, C30)."""
    _check_selection(ids, retry_all, task_name)
    if reset_from is not None and len(ids) != 1:
        fail("--reset-from needs exactly one dead-letter ID (step keys differ between runs)", EXIT_USAGE)
    publishers = state.publishers(app_ref, broker_ref)
    if not publishers:
        fail("pass --app module:app (Celery) or --broker module:broker (Dramatiq) to re-publish", EXIT_USAGE)
    if reset_from is not None:
        done = [retry_dead_letter(state.store, ids[0], publishers, reset_from=reset_from)]
        failed: list[tuple[int, OperationError | StoreError]] = []
    else:
        done, failed = retry_dead_letters(state.store, publishers, ids=ids or None, task_name=task_name)
    if len(ids) == 1 and failed:
        raise failed[0][1]  # one ID: its own error and exit code (3 for an unknown one)
    _report_retries(done, [(i, str(e)) for i, e in failed], as_json)
    if failed:
        raise click.exceptions.Exit(EXIT_FAILED)


def _check_selection(ids: tuple[int, ...], every: bool, task_name: str | None) -> None:
    if bool(ids) == every:
        fail("give dead-letter IDs or --all (not both)", EXIT_USAGE)
    if task_name is not None and not every:
        fail("--task goes with --all", EXIT_USAGE)


def _report_retries(done: list[Retried], failed: list[tuple[int, str]], as_json: bool) -> None:
    if as_json:
        emit_json(
            {
                "retried": [
                    {"id": r.dead_letter_id, "run_key": r.run_key, "framework": r.framework, "job_id": r.job_id}
                    for r in done
                ],
                "failed": [{"id": i, "error": error} for i, error in failed],
            }
        )
        return
    out = console()
    for r in done:
        out.print(f"retried dead letter {r.dead_letter_id}: run {r.run_key} -> {r.framework} job {r.job_id}")
    for i, error in failed:
        click.echo(f"Error: dead letter {i}: {error}", err=True)
    if not done and not failed:
        out.print("No dead letters to retry.")


@dlq.command("purge", context_settings=ID_COMMAND)
@click.argument("ids", nargs=-1, type=DEAD_LETTER_ID)
@click.option("--all", "purge_all", is_flag=True, help="Delete every dead letter.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_state
def purge_command(state: CliState, *, ids: tuple[int, ...], purge_all: bool, as_json: bool) -> None:
    """Delete dead letters (their runs stay until cleanup)."""
    _check_selection(ids, purge_all, None)
    count = purge_dead_letters(state.store, None if purge_all else list(ids))
    if as_json:
        emit_json({"purged": count})
    else:
        console().print(f"purged {count} dead letter{'s' if count != 1 else ''}")
