"""``flexiq store upgrade`` and ``flexiq store cleanup`` (C27, C30)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_support import Runs
from click.testing import CliRunner, Result

from flexiq_plugins import JobEnvelope
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
    runs.age("old-ok", "old-failed", "old-cancelled", "old-dead", "old-sleeping", "old-running", seconds=7200)
    runs.succeeded("new-ok")
    runs.failed("new-failed")
    result = flexiq("store", "cleanup", "--older-than", "1h", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert set(data) == {"deleted", "older_than", "events_deleted"}
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
    human = flexiq("store", "cleanup", "--older-than", "1h")
    assert human.stdout.strip().startswith("deleted 0 finished runs last updated before ")


def test_c27_c30_cleanup_removes_the_run_of_a_purged_dead_letter(
    runs: Runs, store: SqlStepStore, flexiq: Callable[..., Result]
) -> None:
    """After ``dlq purge``, the next ``store cleanup`` deletes the dead run and its steps; another stays (C27, C30)."""
    runs.dead("purged-dead")
    runs.dead("lettered-dead")
    (purged,) = [d.id for d in store.list_dead_letters() if d.run_key == "purged-dead"]
    assert json.loads(flexiq("store", "cleanup", "--older-than", "0s", "--json").stdout)["deleted"] == 0
    assert flexiq("dlq", "purge", str(purged)).exit_code == 0
    result = flexiq("store", "cleanup", "--older-than", "0s", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["deleted"] == 1
    with pytest.raises(UnknownRun):
        store.get_run("purged-dead")
    assert store.get_steps("purged-dead") == []
    assert store.get_run("lettered-dead").status == "dead"
    assert len(store.get_steps("lettered-dead")) == 2


def test_cleanup_needs_a_valid_retention(flexiq: Callable[..., Result], runs: Runs) -> None:
    """A missing or unparsable ``--older-than`` is a usage error (exit 2)."""
    runs.succeeded("r")
    assert flexiq("store", "cleanup").exit_code == 2
    assert flexiq("store", "cleanup", "--older-than", "soon").exit_code == 2


def test_store_option_is_accepted_after_the_command(tmp_path: Path) -> None:
    """``flexiq runs list --store URL`` works like ``flexiq --store URL runs list``."""
    url = f"sqlite:///{tmp_path / 'after.db'}"
    runner = CliRunner()
    assert runner.invoke(cli, ["store", "upgrade", f"--store={url}"]).exit_code == 0
    listed = runner.invoke(cli, ["runs", "list", "--json", "--store", url])
    assert (listed.exit_code, json.loads(listed.stdout)) == (0, [])


def test_a_missing_sqlite_store_is_an_error_not_a_new_empty_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without ``--store`` (or with a wrong path) the CLI says where it looked and creates nothing."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FLEXIQ_STORE_URL", raising=False)
    result = CliRunner().invoke(cli, ["runs", "list"])
    assert result.exit_code == 1
    assert f"no step store at {tmp_path / 'flexiq_steps.db'}" in result.output
    assert not (tmp_path / "flexiq_steps.db").exists()


def test_c41_a_read_only_sqlite_uri_lists_runs_and_refuses_a_write_with_exit_1(tmp_path: Path) -> None:
    """``--store 'sqlite:///file:/path?mode=ro&uri=true'`` reads the store (its file is found in the URI);
    ``store cleanup``, which writes, exits 1 naming ``mode=ro``; a URI to a missing file names that file."""
    path = tmp_path / "steps.db"
    writable = SqlStepStore(f"sqlite:///{path}")
    writable.record_queued("run-ro", "job-1", JobEnvelope("shop.checkout", "test"))
    writable.close()
    url = f"sqlite:///file:{path}?mode=ro&uri=true"
    runner = CliRunner()

    listed = runner.invoke(cli, ["--store", url, "runs", "list", "--json"])
    assert listed.exit_code == 0, listed.output
    assert [run["run_key"] for run in json.loads(listed.stdout)] == ["run-ro"]
    cleanup = runner.invoke(cli, ["--store", url, "store", "cleanup", "--older-than", "1s"])
    assert cleanup.exit_code == 1, cleanup.output
    assert "the URL opens it read-only (mode=ro)" in cleanup.stderr
    missing = runner.invoke(cli, ["--store", f"sqlite:///file:{tmp_path / 'absent.db'}?uri=true", "runs", "list"])
    assert missing.exit_code == 1
    assert f"no step store at {tmp_path / 'absent.db'}:" in missing.stderr
