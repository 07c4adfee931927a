"""Bad command lines and bad rows: one clear line and the documented exit code.

Exit codes: 2 for a usage mistake, 3 for something not found. Each message
names what was wrong and what is accepted, never click's generic guess.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import sqlalchemy as sa
from cli_support import Runs
from click.testing import CliRunner, Result

from flexiq_plugins._store.sql import SqlStepStore
from flexiq_plugins.cli import cli


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["runs", "list", "--store"], id="last"),
        pytest.param(["runs", "list", "--store", "--json"], id="before-an-option"),
        pytest.param(["--store=", "runs", "list"], id="empty"),
    ],
)
def test_store_option_without_a_url_says_it_needs_one(args: list[str]) -> None:
    """``--store`` with no value is a usage error naming the forms, not "No such option" or a store named --json."""
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2
    assert "--store needs a URL, e.g. --store sqlite:///flexiq_steps.db" in result.output


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["dlq", "show", "-1"], id="show-negative"),
        pytest.param(["dlq", "retry", "-3"], id="retry-negative"),
        pytest.param(["dlq", "purge", "0"], id="purge-zero"),
    ],
)
def test_c30_a_dead_letter_id_below_one_is_named_as_a_bad_id(flexiq: Callable[..., Result], args: list[str]) -> None:
    """``dlq show -1`` says ids are positive integers, instead of click's "No such option '-1'"."""
    result = flexiq(*args)
    assert result.exit_code == 2
    assert "is not a dead-letter id; ids are positive integers (see flexiq dlq list)" in result.output


def test_c30_an_unknown_option_after_dlq_show_is_still_an_unknown_option(flexiq: Callable[..., Result]) -> None:
    """Accepting ``-1`` as an id does not hide a mistyped option."""
    result = flexiq("dlq", "show", "--jsn")
    assert result.exit_code == 2
    assert "no such option: --jsn" in result.output


def test_c11_runs_show_of_a_task_id_finds_its_run_and_says_so(runs: Runs, flexiq: Callable[..., Result]) -> None:
    """A Celery task id given to ``runs show`` is looked up as the run's current job, with a note naming the run key."""
    runs.succeeded("01936c1e-run-key", job_id="3f2b9a0e-task-id")
    result = flexiq("runs", "show", "3f2b9a0e-task-id")
    assert result.exit_code == 0, result.output
    assert "3f2b9a0e-task-id is the id of the run's current job, not a run key" in result.stderr
    assert "its run key is 01936c1e-run-key" in result.stderr
    assert "01936c1e-run-key" in result.stdout


def test_c11_runs_show_of_an_unknown_key_says_where_run_keys_come_from(
    store: SqlStepStore, flexiq: Callable[..., Result]
) -> None:
    """Neither a run key nor a current job id: exit 3, and the message explains run keys and how to list them."""
    store.now()  # creates the store's tables
    result = flexiq("runs", "show", "no-such-thing")
    assert result.exit_code == 3
    assert "flexiq_run_key header (Celery) or message option (Dramatiq)" in result.output
    assert "flexiq runs list --task NAME" in result.output


def test_c11_runs_show_of_a_key_with_a_nul_is_a_usage_error(store: SqlStepStore, flexiq: Callable[..., Result]) -> None:
    """A run key that cannot exist (a NUL) is ``InvalidRunKey``: exit 2, before the store is asked."""
    store.now()  # creates the store's tables
    result = flexiq("runs", "show", "a\x00b")
    assert result.exit_code == 2
    assert "control character" in result.output


def test_c27_runs_show_of_a_succeeded_run_says_its_steps_were_deleted(
    store: SqlStepStore, flexiq: Callable[..., Result]
) -> None:
    """The first ``runs show`` of a user's own run says why it has no steps, and how to keep them."""
    from flexiq_plugins import JobEnvelope, current_job
    from flexiq_plugins.integration import AttemptDriver, JobInfo

    attempt = AttemptDriver(store).start(JobInfo("run-mine", "job-1", JobEnvelope("t", "test")))
    attempt.run(lambda: current_job.step.run("charge", lambda: 1))  # type: ignore[union-attr]
    result = flexiq("runs", "show", "run-mine")
    assert result.exit_code == 0, result.output
    assert "keep_succeeded_steps=True" in result.stdout
    assert "Steps:" in result.stdout


def test_c35_runs_list_shows_a_run_whose_envelope_is_not_json(
    runs: Runs, store: SqlStepStore, flexiq: Callable[..., Result]
) -> None:
    """One damaged envelope does not fail ``runs list``; ``runs show`` names the damage."""
    runs.succeeded("run-good")
    runs.succeeded("run-bad")
    table = sa.table(f"{store.table_prefix}runs", sa.column("run_key"), sa.column("envelope"))
    with store.engine.begin() as conn:
        conn.execute(sa.update(table).where(table.c.run_key == "run-bad").values(envelope="{not json"))

    listed = flexiq("runs", "list")
    assert listed.exit_code == 0, listed.output
    assert "run-good" in listed.stdout
    assert "run-bad" in listed.stdout
    shown = flexiq("runs", "show", "run-bad")
    assert shown.exit_code == 0, shown.output
    assert "the stored job envelope cannot be read" in shown.stdout
