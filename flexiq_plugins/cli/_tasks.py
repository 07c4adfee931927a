"""``flexiq tasks``: the tasks and actors known to take steps (C43)."""

from __future__ import annotations

import click

from ..operations import known_tasks
from . import _render as render
from ._state import CliState, console, emit_json, pass_state

__all__ = ["tasks_command"]


@click.command("tasks")
@click.option(
    "--framework", type=click.Choice(["celery", "dramatiq"]), default=None, help="Only this framework's tasks."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_state
def tasks_command(state: CliState, *, framework: str | None, as_json: bool) -> None:
    """List the tasks and actors known to take steps: name, framework, when one first took a step (C43).

    Only these are recorded when their jobs are published, and on Celery
    acknowledged late from a worker's next start; a task that never took a
    step is not touched by the integration. Producers and workers read this
    list again at most every ``known_tasks_refresh_seconds`` (default 30 s).
    """
    tasks = known_tasks(state.store, framework=framework)
    if as_json:
        emit_json([render.known_task_dict(t) for t in tasks])
        return
    if not tasks:
        console().print("No task has taken a step yet.")
        return
    console().print(render.known_tasks_table(tasks))
