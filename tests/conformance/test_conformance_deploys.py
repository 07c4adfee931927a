"""Deploying without draining on real workers: check, patch, fork (C48–C50), for every adapter on every broker.

Each test runs against ``celery-redis``, ``celery-rabbitmq``, ``dramatiq-redis``
and ``dramatiq-rabbitmq`` through the module's harness and its in-thread
worker. Runs park in ``step.wait_for_event`` (no clock involved), a test
"deploys" a new version of the task bodies (:meth:`Ledger.deploy`), checks the
parked runs against it with ``check_runs`` on the harness's own app or broker,
and then wakes them with events, so what the check predicted is compared with
what the workers then do.
"""

from __future__ import annotations

import importlib
import json
import time
from collections.abc import Iterable

import pytest
from click.testing import CliRunner, Result

import flexiq_plugins
from flexiq_plugins.cli import cli
from flexiq_plugins.operations import CheckReport, check_runs, fork_run
from tests.conformance.harness import Harness, Job
from tests.polling import wait_for

pytestmark = pytest.mark.timeout(180)


def _order() -> str:
    return f"o-{time.monotonic_ns()}"


def _park(harness: Harness, job: Job, at: str) -> None:
    """Wait until ``job``'s run waits with ``at`` as its last recorded step."""
    wait_for(
        lambda: (
            harness.status(job.run_key) == "waiting" and [s.step_key for s in harness.steps(job.run_key)][-1:] == [at]
        ),
        30,
        f"run {job.run_key} to wait at {at}",
    )


def _check(harness: Harness, scenario: str, jobs: Iterable[Job]) -> dict[str, tuple[str, str | None]]:
    """Check ``scenario``'s runs against the code deployed now: ``{run key: (verdict, stopped at)}`` of ``jobs``."""
    report = check_runs(harness.store, harness.tasks, task_name=harness.task_name(scenario))
    mine = {j.run_key for j in jobs}
    return {c.run_key: (c.verdict, c.stopped_at) for c in report.checks if c.run_key in mine}


def _report(harness: Harness, scenario: str) -> CheckReport:
    return check_runs(harness.store, harness.tasks, task_name=harness.task_name(scenario))


def _flexiq_check(harness: Harness, scenario: str) -> Result:
    """``flexiq check --app|--broker <the harness's app or broker> --task <scenario> --json`` on the harness's store.

    The app or broker is reached through the conformance app module's attribute, as a project's ``proj.celery:app``.
    """
    celery = harness.framework == "celery"
    module_name, attr = (
        ("tests.conformance.celery_app", "app") if celery else ("tests.conformance.dramatiq_app", "broker")
    )
    module = importlib.import_module(module_name)
    before = getattr(module, attr, None)
    setattr(module, attr, harness.tasks)
    try:
        option = "--app" if celery else "--broker"
        args = ["--store", harness.config.store_url, "check", option, f"{module_name}:{attr}"]
        return CliRunner().invoke(cli, [*args, "--task", harness.task_name(scenario), "--json"])
    finally:
        setattr(module, attr, before)


def _send(harness: Harness, topic: str, job: Job, order: str) -> None:
    flexiq_plugins.send_event(topic, order, None, run_key=job.run_key, store=harness.store)


def test_c48_a_deploy_that_reorders_steps_is_flagged_for_exactly_the_runs_it_breaks(harness: Harness) -> None:
    """C48, C12: two runs wait before the reordered steps and one after them; the check of version 2 flags only
    the one after. Deployed, version 2 then dead-letters exactly that run, with the report the check gave, and
    the other two finish."""
    harness.ledger.deploy(1)
    orders = {name: _order() for name in ("early-1", "early-2", "late")}
    jobs = {name: harness.publish("deploy_reorder", order) for name, order in orders.items()}
    for job in jobs.values():
        _park(harness, job, "go#0")
    _send(harness, "go", jobs["late"], orders["late"])
    _park(harness, jobs["late"], "ship#0")

    assert _check(harness, "deploy_reorder", jobs.values()) == {
        jobs["early-1"].run_key: ("compatible", "event:go#0"),
        jobs["early-2"].run_key: ("compatible", "event:go#0"),
        jobs["late"].run_key: ("compatible", "event:ship#0"),
    }  # the code they run now replays every one
    harness.ledger.deploy(2)
    verdicts = _check(harness, "deploy_reorder", jobs.values())
    assert verdicts == {
        jobs["early-1"].run_key: ("compatible", "event:go#0"),
        jobs["early-2"].run_key: ("compatible", "event:go#0"),
        jobs["late"].run_key: ("divergent", None),
    }
    [predicted] = [c for c in _report(harness, "deploy_reorder").checks if c.run_key == jobs["late"].run_key]
    result = _flexiq_check(harness, "deploy_reorder")
    assert result.exit_code == 1, result.output
    flagged = {r["run_key"] for r in json.loads(result.stdout)["runs"] if r["verdict"] != "compatible"}
    assert flagged & {j.run_key for j in jobs.values()} == {jobs["late"].run_key}

    for name in ("early-1", "early-2"):
        _send(harness, "go", jobs[name], orders[name])
        _park(harness, jobs[name], "ship#0")
        _send(harness, "ship", jobs[name], orders[name])
    _send(harness, "ship", jobs["late"], orders["late"])
    for name in ("early-1", "early-2"):
        harness.wait_status(jobs[name].run_key, "succeeded")
        assert harness.dead_letters(jobs[name].run_key) == []
        assert harness.ledger.count(jobs[name].run_key, "reserve") == 1
    harness.wait_status(jobs["late"].run_key, "dead")
    [dead] = harness.dead_letters(jobs["late"].run_key)
    assert dead.reason == "divergence"
    assert dead.message.splitlines()[1:] == predicted.message.splitlines()[1:]
    assert harness.ledger.count(jobs["late"].run_key, "dispatch") == 0


def test_c49_a_patched_task_serves_old_and_new_runs_side_by_side_with_no_dead_letter(harness: Harness) -> None:
    """C49, C48: a run waiting under version 1 would break under an unpatched audit step (the check says so);
    version 2 puts the audit behind ``step.patched``: the check passes, a new run takes the new branch, and both
    runs finish with no dead letter, the old one without the audit."""
    harness.ledger.deploy(1)
    old_order, new_order = _order(), _order()
    old = harness.publish("deploy_patch", old_order)
    _park(harness, old, "go#0")

    harness.ledger.deploy(3)
    assert _check(harness, "deploy_patch", [old]) == {old.run_key: ("divergent", None)}
    harness.ledger.deploy(2)
    assert _check(harness, "deploy_patch", [old]) == {old.run_key: ("compatible", "event:go#0")}

    new = harness.publish("deploy_patch", new_order)
    _park(harness, new, "go#0")
    assert [s.step_key for s in harness.steps(new.run_key)] == ["charge#0", "patch:audit-v2", "audit#0", "go#0"]
    [task] = _report(harness, "deploy_patch").by_task()
    [use] = task.patches
    assert old.run_key in use.old
    assert new.run_key in use.new

    _send(harness, "go", old, old_order)
    _send(harness, "go", new, new_order)
    for job in (old, new):
        harness.wait_status(job.run_key, "succeeded")
        assert harness.dead_letters(job.run_key) == []
        assert harness.ledger.count(job.run_key, "dispatch") == 1
    assert harness.ledger.count(old.run_key, "audit") == 0
    assert harness.ledger.count(new.run_key, "audit") == 1


def test_c50_a_forked_run_replays_its_copied_steps_and_runs_the_rest_once(harness: Harness) -> None:
    """C50: a run waiting after ``charge`` and ``receipt`` is forked from ``receipt#0``: the new run's job, on a
    real worker, replays ``charge`` without calling it, sends the receipt once under its own idempotency key,
    and finishes; the old run still waits, its steps unchanged."""
    harness.ledger.deploy(1)
    order = _order()
    job = harness.publish("deploy_fork", order)
    _park(harness, job, "go#0")
    old_steps = harness.steps(job.run_key)

    forked = fork_run(harness.store, job.run_key, "receipt#0", harness.publishers())
    new_key = forked.new_run_key
    wait_for(
        lambda: harness.status(new_key) == "waiting" and [s.step_key for s in harness.steps(new_key)][-1:] == ["go#0"],
        30,
        f"forked run {new_key} to wait",
    )
    flexiq_plugins.send_event("go", order, None, run_key=new_key, store=harness.store)
    harness.wait_status(new_key, "succeeded")

    assert harness.ledger.count(new_key, "charge") == 0
    assert harness.ledger.keys(new_key, "receipt") == [f"{new_key}:receipt#0"]
    assert harness.ledger.count(new_key, "dispatch") == 1
    assert harness.dead_letters(new_key) == []
    assert harness.status(job.run_key) == "waiting"
    assert harness.steps(job.run_key) == old_steps
    assert harness.ledger.count(job.run_key, "receipt") == 1
