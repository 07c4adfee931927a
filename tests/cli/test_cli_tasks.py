"""``flexiq tasks``: the tasks and actors known to take steps (C43)."""

from __future__ import annotations

import json
from collections.abc import Callable

from cli_support import Runs
from click.testing import Result

from flexiq_plugins import current_job
from flexiq_plugins._store.sql import SqlStepStore


def test_c43_tasks_lists_each_task_that_took_a_step_once_and_no_step_less_one(
    runs: Runs, store: SqlStepStore, flexiq: Callable[..., Result]
) -> None:
    """C43: a task is listed once one of its jobs took a step (twice is still one line, its first time kept); a
    job that took no step adds nothing; ``--framework`` filters and ``--json`` gives name, framework, first_seen."""
    assert store.durable_tasks() == []  # the store exists, its tables created
    empty = flexiq("tasks")
    assert (empty.exit_code, empty.stdout.strip()) == (0, "No task has taken a step yet.")
    assert json.loads(flexiq("tasks", "--json").stdout) == []

    stepping = lambda: current_job.step.run("one", lambda: 1)  # noqa: E731
    runs.driver.run_job(runs.job("r-1", task="shop.checkout"), stepping)
    runs.driver.run_job(runs.job("r-2", task="shop.checkout"), stepping)
    runs.driver.run_job(runs.job("r-3", task="mail.send", framework="dramatiq"), stepping)
    runs.driver.run_job(runs.job("r-4", task="shop.ping"), lambda: "pong")  # no step: not known

    listed = json.loads(flexiq("tasks", "--json").stdout)
    assert [(t["framework"], t["name"]) for t in listed] == [("celery", "shop.checkout"), ("dramatiq", "mail.send")]
    assert all(t["first_seen"].endswith("+00:00") for t in listed)
    only = json.loads(flexiq("tasks", "--framework", "dramatiq", "--json").stdout)
    assert [t["name"] for t in only] == ["mail.send"]
    table = flexiq("tasks")
    assert table.exit_code == 0, table.output
    assert "shop.checkout" in table.stdout
    assert "mail.send" in table.stdout
    assert "shop.ping" not in table.stdout
