"""``flexiq store upgrade`` and ``flexiq store cleanup`` (C27)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from conftest import Runs

from flexiq_plugins._store.sql import SqlStepStore
from flexiq_plugins.cli import cli
from flexiq_plugins.errors import UnknownRun


def test_store_upgrade_creates_the_tables_and_is_idempotent(tmp_path: Path) -> None:
    """``store upgrade`` on an empty database creates the schema; a second run changes nothing."""
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    runner = CliRunner()
    first = runner.invoke(cli, ["--store", url, "store", "upgrade"])
    assert first.exit_code == 0, first.output
    assert "is at the newest schema" in first.stdout
    again = runner.invoke(cli, ["--store", url, "store", "upgrade", "--json"])
    assert set(json.loads(again.stdout)) == {"upgraded"}
    listed = runner.invoke(cli, ["--store", url, "runs", "list", "--json"])
    assert (listed.exit_code, json.loads(listed.stdout)) == (0, [])


def test_c27_cleanup_drops_what_retention_allows_and_nothing_else(
    runs: Runs, store: SqlStepStore, flexiq: Callable[..., Result]
) -> None:
    """``cleanup --older-than`` deletes old succeeded, failed and cancelled runs only (C27).

    Old dead-lettered, sleeping, retrying and running runs stay (a dead run's
    rows let a retry replay), and so do finished runs inside the retention.
    """
    runs.succeeded("old-ok")
    runs.failed("old-failed")
    runs.failed("old-cancelled", status="cancelled")
    runs.dead("old-dead")
    runs.sleeping("old-sleeping")
    runs.driver.start(runs.job("old-running"))
    time.sleep(1.2)
    runs.succeeded("new-ok")
    runs.failed("new-failed")
    result = flexiq("store", "cleanup", "--older-than", "1s", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert set(data) == {"deleted", "older_than"}
    assert data["deleted"] == 3
    for gone in ("old-ok", "old-failed", "old-cancelled"):
        with pytest.raises(UnknownRun):
            store.get_run(gone)
        assert store.get_steps(gone) == []
    kept = {"old-dead": "dead", "old-sleeping": "sleeping", "old-running": "running", "new-ok": "succeeded"}
    for key, status in kept.items():
        assert store.get_run(key).status == status
    assert len(store.get_steps("old-dead")) == 2
    assert len(store.list_dead_letters()) == 1
    human = flexiq("store", "cleanup", "--older-than", "1s")
    assert human.stdout.strip().startswith("deleted 0 finished runs last updated before ")


def test_cleanup_needs_a_valid_retention(flexiq: Callable[..., Result], runs: Runs) -> None:
    """A missing or unparsable ``--older-than`` is a usage error (exit 2)."""
    runs.succeeded("r")
    assert flexiq("store", "cleanup").exit_code == 2
    assert flexiq("store", "cleanup", "--older-than", "soon").exit_code == 2
