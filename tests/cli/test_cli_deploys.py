"""``flexiq check``, ``flexiq runs export`` and ``flexiq runs fork`` (C48–C50), in-process on a SQLite store.

The runs are made through the real attempt driver; the new code is a Celery
app imported by ``--app fq_cli_apps:check_app`` (no broker is needed to read
its tasks), and forks publish on Dramatiq's ``StubBroker`` (its real enqueue
code, in memory). Forks and checks on real brokers with real workers are in
``tests/conformance/test_conformance_deploys.py``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fq_cli_apps
import pytest
from celery import Celery
from click.testing import CliRunner, Result
from dramatiq import Message
from dramatiq.brokers.stub import StubBroker

from dramatiq_ext import RUN_KEY_OPTION
from flexiq_plugins import JobEnvelope, current_job
from flexiq_plugins._store.sql import SqlStepStore
from flexiq_plugins.cli import cli
from flexiq_plugins.integration import Attempt, AttemptDriver, JobInfo

VERSION = {"value": 1}
"""The deployed code of ``shop.checkout``: 1 charges then sleeps; 2 audits before the sleep; 3 behind a patch."""


def checkout(order: int, express: bool = False) -> str:
    """``shop.checkout`` in the version :data:`VERSION` says."""
    step = current_job.step
    step.run("charge", lambda: {"id": f"ch_{order}"})
    if VERSION["value"] == 2 or (VERSION["value"] == 3 and step.patched("audit-v2")):
        step.run("audit", lambda: True)
    step.sleep("1h")
    return str(step.run("receipt", lambda: "sent"))


@pytest.fixture(autouse=True)
def version_1() -> None:
    """Every test starts with version 1 deployed."""
    VERSION["value"] = 1


@pytest.fixture
def app() -> Iterator[Celery]:
    """``fq_cli_apps:check_app``, a Celery app with the task ``shop.checkout``."""
    app = Celery("cli-check", set_as_current=False)
    app.task(name="shop.checkout")(checkout)
    fq_cli_apps.check_app = app
    yield app
    fq_cli_apps.check_app = None


@pytest.fixture
def stub_broker() -> Iterator[StubBroker]:
    """A Dramatiq stub broker reachable as ``fq_cli_apps:dramatiq_broker``."""
    broker = StubBroker()
    fq_cli_apps.dramatiq_broker = broker
    yield broker
    fq_cli_apps.dramatiq_broker = None
    broker.close()


def asleep(store: SqlStepStore, run_key: str, framework: str = "celery") -> None:
    """A run of ``shop.checkout`` (order 7) that ran under the deployed version and sleeps."""
    attempt = AttemptDriver(store).start(
        JobInfo(run_key, f"job-{run_key}", JobEnvelope("shop.checkout", framework, "orders", [7], {"express": True}))
    )
    assert isinstance(attempt, Attempt)
    attempt.run(lambda: checkout(7, express=True))
    assert store.get_run(run_key).status == "sleeping"


def test_c48_check_exits_0_when_the_new_code_replays_every_run(store, app, flexiq: Callable[..., Result]):
    """C48: two runs asleep under version 1; version 3 (the audit behind a patch) replays both: exit 0, and the
    report says the patch's old branch still has runs."""
    asleep(store, "run-a")
    asleep(store, "run-b")
    VERSION["value"] = 3
    result = flexiq("check", "--app", "fq_cli_apps:check_app")
    assert result.exit_code == 0, result.output
    assert "Checked 2 runs in the store: the new code replays every one." in result.stdout
    assert "shop.checkout: 2 runs, 2 compatible" in result.stdout
    assert "patch 'audit-v2': 2 runs on its old branch (run-a, run-b): keep the old branch" in result.stdout


def test_c48_check_exits_1_and_groups_the_runs_it_would_break(store, app, flexiq: Callable[..., Result]):
    """C48: version 2 inserts a step before the sleep: both runs would diverge at position 1; the text report
    groups them with the worker's divergence report, and ``--json`` gives the same verdicts."""
    asleep(store, "run-a")
    asleep(store, "run-b")
    VERSION["value"] = 2
    before = [(r, store.get_steps(r.run_key)) for r in store.list_runs()]
    result = flexiq("check", "--app", "fq_cli_apps:check_app")
    assert result.exit_code == 1
    assert "the new code would break 2." in result.stdout
    assert "would diverge at position 1: recorded 'sleep#0 (sleep)', now 'audit#0 (run)': 2 runs" in result.stdout
    assert "step sequence changed for job job-run-a (run run-a) at position 1" in result.stdout
    data = json.loads(flexiq("check", "--app", "fq_cli_apps:check_app", "--json").stdout)
    assert (data["ok"], data["checked"], data["failed"]) == (False, 2, 2)
    [task] = data["tasks"]
    assert task["divergent"] == [
        {"position": 1, "recorded": "sleep#0 (sleep)", "running": "audit#0 (run)", "run_keys": ["run-a", "run-b"]}
    ]
    assert [(r["run_key"], r["verdict"]) for r in data["runs"]].count(("run-a", "divergent")) == 1
    assert [(r, store.get_steps(r.run_key)) for r in store.list_runs()] == before  # nothing written


def test_c48_check_needs_the_new_code(flexiq: Callable[..., Result]):
    """C48: without --app or --broker the check has nothing to run: usage error, exit 2."""
    result = flexiq("check")
    assert result.exit_code == 2
    assert "pass --app module:app (Celery) or --broker module:broker (Dramatiq)" in result.stderr


def test_c48_an_exported_file_is_checked_without_the_store(store, app, flexiq: Callable[..., Result], tmp_path: Path):
    """C48: ``runs export`` writes the records; ``check --file`` reads them with no store at all (a store URL
    that does not exist is never opened) and reaches the same verdict."""
    asleep(store, "run-a")
    out = tmp_path / "runs.json"
    assert flexiq("runs", "export", "--out", str(out)).stdout == f"exported 1 run to {out}\n"
    VERSION["value"] = 2

    result = CliRunner().invoke(
        cli,
        [
            "--store",
            f"sqlite:///{tmp_path / 'absent.db'}",
            "check",
            "--file",
            str(out),
            "--app",
            "fq_cli_apps:check_app",
        ],
    )
    assert result.exit_code == 1, result.output
    assert "in " + str(out) in result.stdout
    assert not (tmp_path / "absent.db").exists()
    assert flexiq("runs", "export", "nobody", "--out", str(tmp_path / "x.json")).exit_code == 3


def _enqueued(broker: StubBroker) -> list[dict[str, Any]]:
    return [Message.decode(m).asdict() for q in broker.queues.values() for m in list(q.queue)]


def test_c50_runs_fork_publishes_a_new_run_from_the_step(store, stub_broker, flexiq: Callable[..., Result]):
    """C50: ``runs fork RUN --from sleep#0 --broker`` copies the steps before it into a new run and publishes
    it on the broker with the new run key; the old run is unchanged."""
    stub_broker.declare_queue("orders")
    asleep(store, "run-d", framework="dramatiq")
    before = (store.get_run("run-d"), store.get_steps("run-d"))
    result = flexiq("runs", "fork", "run-d", "--from", "sleep#0", "--broker", "fq_cli_apps:dramatiq_broker", "--json")
    assert result.exit_code == 0, result.output
    forked = json.loads(result.stdout)
    assert (forked["run_key"], forked["from_step"], forked["copied"], forked["framework"]) == (
        "run-d",
        "sleep#0",
        1,
        "dramatiq",
    )
    [message] = _enqueued(stub_broker)
    assert message["options"][RUN_KEY_OPTION] == forked["new_run_key"] != "run-d"
    assert (message["actor_name"], list(message["args"]), message["kwargs"]) == (
        "shop.checkout",
        [7],
        {"express": True},
    )
    assert [s.step_key for s in store.get_steps(forked["new_run_key"])] == ["charge#0"]
    assert (store.get_run("run-d"), store.get_steps("run-d")) == before


def test_c50_runs_fork_refuses_bad_input_with_the_valid_steps_and_writes_nothing(
    store, stub_broker, flexiq: Callable[..., Result]
):
    """C50: an unknown run or step exits 3, a step of another kind exits 2, each naming the steps the run can be
    forked from; no run is made and nothing is published."""
    stub_broker.declare_queue("orders")
    VERSION["value"] = 3
    asleep(store, "run-p", framework="dramatiq")
    broker = ("--broker", "fq_cli_apps:dramatiq_broker")
    unknown_run = flexiq("runs", "fork", "nobody", "--from", "charge#0", *broker)
    assert unknown_run.exit_code == 3
    unknown_step = flexiq("runs", "fork", "run-p", "--from", "refund#0", *broker)
    assert unknown_step.exit_code == 3
    assert "fork it from one of: charge#0, audit#0, sleep#0" in unknown_step.stderr
    other_kind = flexiq("runs", "fork", "run-p", "--from", "patch:audit-v2", *broker)
    assert other_kind.exit_code == 2
    assert "not a run, sleep or wait step of the body; fork it from one of: charge#0, audit#0, sleep#0" in (
        other_kind.stderr
    )
    no_publisher = flexiq("runs", "fork", "run-p", "--from", "charge#0")
    assert no_publisher.exit_code == 2
    assert [r.run_key for r in store.list_runs()] == ["run-p"]
    assert _enqueued(stub_broker) == []
