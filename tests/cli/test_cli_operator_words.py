"""``flexiq`` says what the dashboard says: a sleeping run's wake time, why a run has no steps, a retry (C52).

Each sentence comes from ``flexiq_plugins.operations`` (``run_note``,
``steps_note``, ``retried_note``), the same functions the dashboard's pages
render, so the two surfaces never word one fact two ways.
"""

from __future__ import annotations

from collections.abc import Callable

from click.testing import Result

from flexiq_plugins import operations
from flexiq_plugins._store.sql import SqlStepStore
from tests.cli.conftest import Runs


def _line(output: str, run_key: str) -> str:
    (line,) = [line for line in output.splitlines() if run_key in line]
    return line


def test_c15_runs_list_shows_when_a_sleeping_run_wakes(runs: Runs, store: SqlStepStore, flexiq: Callable[..., Result]):
    """C15: the DETAIL of a sleeping run is ``wakes at <time>``, the wording of ``operations.run_note``."""
    runs.sleeping("run-nap")
    wake_at = store.get_run("run-nap").wake_at

    listed = flexiq("runs", "list")

    assert listed.exit_code == 0, listed.output
    assert f"wakes at {operations.human_time(wake_at)}" in _line(listed.stdout, "run-nap")


def test_c27_runs_show_of_a_dead_run_without_steps_does_not_speak_of_success(
    store: SqlStepStore, flexiq: Callable[..., Result]
) -> None:
    """C27: a dead run with no step rows says it committed none, not that a succeeded run's rows were deleted."""
    from flexiq_plugins import JobEnvelope
    from flexiq_plugins.integration import Attempt, AttemptDriver, JobInfo

    attempt = AttemptDriver(store).start(JobInfo("run-dead", "job-1", JobEnvelope("t", "test")))
    assert isinstance(attempt, Attempt)
    store.finish(attempt.claim, "dead")  # dead-lettered before its first step committed (a worker_lost run)

    shown = flexiq("runs", "show", "run-dead")

    assert shown.exit_code == 0, shown.output
    assert "No step rows: this dead run committed no step." in shown.stdout
    assert "succeeded" not in shown.stdout


def test_c30_dlq_list_all_has_a_retried_column(runs: Runs, store: SqlStepStore, flexiq: Callable[..., Result]):
    """C30: ``dlq list --all`` shows when each dead letter was retried ('-' for one not retried)."""
    first = runs.dead("run-a")
    runs.dead("run-b")
    store.prepare_retry(first)
    retried_at = store.get_dead_letter(first).retried_at

    listed = flexiq("dlq", "list", "--all")

    assert listed.exit_code == 0, listed.output
    assert "RETRIED" in listed.stdout
    assert f"retried at {operations.human_time(retried_at)}" in _line(listed.stdout, "run-a")
    assert "retried at" not in _line(listed.stdout, "run-b")
