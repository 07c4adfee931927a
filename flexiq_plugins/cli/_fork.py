"""``flexiq runs fork``: run a job again from a step, keeping the steps before it (C50)."""

from __future__ import annotations

import click

from ..operations import fork_run
from ._dlq import publisher_options
from ._state import CliState, console, emit_json, pass_state

__all__ = ["fork_command"]


@click.command("fork")
@click.argument("run_key")
@click.option("--from", "from_step", metavar="STEP_KEY", required=True, help="The first step the new run runs again.")
@publisher_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_state
def fork_command(
    state: CliState, *, run_key: str, from_step: str, app_ref: str | None, broker_ref: str | None, as_json: bool
) -> None:
    """Make a new run of RUN_KEY's task with the steps before STEP_KEY copied, and publish it.

    The copied steps replay from their stored values (their bodies do not run
    again); STEP_KEY and every later step run once in the new run, under its
    new run key, so their idempotency keys are new. The old run is not
    changed. An unknown run or step exits 3, a step of another kind 2, each
    naming the steps the run can be forked from; nothing is written then.
    """
    publishers = state.publishers(app_ref, broker_ref)
    forked = fork_run(state.store, run_key, from_step, publishers)
    if as_json:
        emit_json(
            {
                "run_key": forked.run_key,
                "new_run_key": forked.new_run_key,
                "from_step": forked.from_step,
                "copied": forked.copied,
                "framework": forked.framework,
                "job_id": forked.job_id,
            }
        )
        return
    console().print(
        f"forked run {forked.run_key} from {forked.from_step!r} as run {forked.new_run_key} "
        f"({forked.copied} step{'s' if forked.copied != 1 else ''} copied) -> {forked.framework} job {forked.job_id}",
        markup=False,
    )
