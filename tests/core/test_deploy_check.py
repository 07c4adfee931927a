"""Check mode (C48): new code run against the records of the runs in flight, writing nothing.

Runs are made with the shipped ``DurableRun`` helper on one in-memory store
(each run sleeping, retrying or dead-lettered where a test needs it), then
``check_runs`` runs a new version of the task over every unfinished record.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from flexiq_plugins import ConfigurationError, MemoryStepStore, current_job
from flexiq_plugins.operations import check_runs, export_runs
from flexiq_plugins.testing import DurableRun, FakeClock
from flexiq_plugins.testing import check_runs as pytest_form

CALLS: list[str] = []
"""Every step body and every between-steps note the versions below ran, in order."""


def _call(what: str) -> Any:
    CALLS.append(what)
    return {"what": what, "id": f"{what}-1"}


def checkout_v1(order: str) -> str:
    """Version 1: charge, sleep, receipt."""
    step = current_job.step
    charge = step.run("charge", lambda: _call("charge"))
    step.sleep("1h")
    step.run("receipt", lambda: _call("receipt"))
    return str(charge["id"])


def checkout_v2_audit_first(order: str) -> str:
    """Version 2: an ``audit`` step inserted before the sleep (breaks runs asleep)."""
    step = current_job.step
    charge = step.run("charge", lambda: _call("charge"))
    step.run("audit", lambda: _call("audit"))
    step.sleep("1h")
    step.run("receipt", lambda: _call("receipt"))
    return str(charge["id"])


def checkout_v2_audit_last(order: str) -> str:
    """Version 2': the ``audit`` step appended after the receipt (breaks nothing, C14)."""
    step = current_job.step
    charge = step.run("charge", lambda: _call("charge"))
    CALLS.append(f"between, checking={current_job.checking}")
    step.sleep("1h")
    step.run("receipt", lambda: _call("receipt"))
    step.run("audit", lambda: _call("audit"))
    return str(charge["id"])


@pytest.fixture
def clock() -> FakeClock:
    """The store's clock."""
    return FakeClock()


@pytest.fixture
def store(clock: FakeClock) -> MemoryStepStore:
    """One store for every run of a test."""
    CALLS.clear()
    return MemoryStepStore(clock=clock)


def _run(store: MemoryStepStore, clock: FakeClock, body: Any, run_key: str, *, attempts: int = 1) -> DurableRun:
    run = DurableRun(body, "order-1", run_key=run_key, store=store, clock=clock, task_name="checkout")
    for _ in range(attempts):
        run.attempt()
    return run


def _snapshot(store: MemoryStepStore) -> tuple[Any, ...]:
    runs = store.list_runs(limit=1000)
    return tuple((r, tuple(store.get_steps(r.run_key))) for r in runs), tuple(store.list_dead_letters())


def test_c48_a_sleeping_run_replays_and_the_check_stops_at_the_first_step_past_its_record(store, clock):
    """C48: a run asleep after ``charge`` is compatible with version 2' (a step added at the end): every recorded
    step is a memo hit, and the check stops at ``receipt#0``, the first step past the record, once the sleep
    is due."""
    _run(store, clock, checkout_v1, "asleep")
    clock.advance(3601)
    CALLS.clear()

    report = check_runs(store, {"checkout": checkout_v2_audit_last})

    [check] = report.checks
    assert (check.run_key, check.verdict, check.stopped_at, check.replayed) == ("asleep", "compatible", "receipt#0", 2)
    assert report.ok
    assert CALLS == ["between, checking=True"]  # code between steps ran, no step body did


def test_c48_a_check_writes_nothing_runs_no_step_body_and_leaves_the_store_as_it_was(store, clock):
    """C48: checking a run that would diverge and one that would not changes no run, step row or dead letter,
    and calls no step body (``charge`` and ``audit`` are never called)."""
    _run(store, clock, checkout_v1, "r-1")
    _run(store, clock, checkout_v1, "r-2")
    before = _snapshot(store)
    CALLS.clear()

    check_runs(store, {"checkout": checkout_v2_audit_first})
    check_runs(store, {"checkout": checkout_v2_audit_last})

    assert _snapshot(store) == before
    assert [c for c in CALLS if not c.startswith("between")] == []


def test_c48_a_changed_step_is_a_divergence_reported_with_the_workers_diff(store, clock):
    """C48, C12: version 2 asks for ``audit#0`` where the record has ``sleep#0``: the check reports the divergence
    with the same message a worker would dead-letter the run with (job, position, both sequences)."""
    sleeping = _run(store, clock, checkout_v1, "asleep")
    report = check_runs(store, {"checkout": checkout_v2_audit_first})
    [check] = report.checks
    assert check.verdict == "divergent"
    assert not report.ok
    assert (check.position, check.recorded, check.running) == (1, "sleep#0 (sleep)", "audit#0 (run)")

    clock.advance(3601)
    sleeping.body = checkout_v2_audit_first  # the deploy: the next attempt runs version 2
    worker = sleeping.attempt()
    assert worker.dead_lettered
    job = sleeping.results[-1]
    assert job.error is not None
    worker_lines = str(job.error).splitlines()
    check_lines = check.message.splitlines()
    assert check_lines[1:] == worker_lines[1:]  # the same recorded/running sequences, step and advice
    assert check_lines[0].rsplit(" at position ", 1)[1] == worker_lines[0].rsplit(" at position ", 1)[1]


def test_c48_only_the_runs_a_deploy_would_break_are_flagged_grouped_by_task_and_position(store, clock):
    """C48: of three runs of version 1 (one asleep, one asleep but past its sleep, one not yet started), version 2
    breaks the two that recorded the sleep; the report groups them under one divergent position; the run with no
    recorded step is not checked."""
    _run(store, clock, checkout_v1, "a")
    _run(store, clock, checkout_v1, "b")
    store.record_queued("c", "job-c", DurableRun(checkout_v1, "order-1", task_name="checkout").envelope)

    report = check_runs(store, {"checkout": checkout_v2_audit_first})

    assert sorted(c.run_key for c in report.checks) == ["a", "b"]
    [task] = report.by_task()
    assert task.task_name == "checkout"
    assert not task.ok
    [group] = task.divergent
    assert (group.position, group.recorded, group.running) == (1, "sleep#0 (sleep)", "audit#0 (run)")
    assert sorted(c.run_key for c in group.runs) == ["a", "b"]


def test_c48_a_body_that_raises_on_a_replayed_value_is_an_error(store, clock):
    """C48: new code that reads a field the recorded value does not have raises while replaying it: the check
    reports an error naming it (the deploy would break that run though no key changed)."""
    _run(store, clock, checkout_v1, "asleep")

    def reads_a_new_field(order: str) -> str:
        charge = current_job.step.run("charge", lambda: _call("charge"))
        return str(charge["amount"])

    [check] = check_runs(store, {"checkout": reads_a_new_field}).checks
    assert check.verdict == "error"
    assert check.message.startswith("KeyError: 'amount'")


def test_c48_a_run_whose_task_the_new_code_lacks_is_reported_missing(store, clock):
    """C48: a run of a task the new code no longer has could not go on: it is reported ``missing``, not checked."""
    _run(store, clock, checkout_v1, "asleep")
    report = check_runs(store, {"shipping": checkout_v1})
    [check] = report.checks
    assert check.verdict == "missing"
    assert "no task 'checkout'" in check.message
    assert not report.ok


def test_c48_a_dead_letter_is_checked_as_its_retry_would_replay_it(store, clock):
    """C48, C30: a run dead-lettered by a divergence is checked against fixed code from its record, and one whose
    step failed for good is checked without that step (a retry runs it again)."""
    from flexiq_plugins import NonRetryableError

    diverged = _run(store, clock, checkout_v1, "dead")
    clock.advance(3601)
    diverged.body = checkout_v2_audit_first
    assert diverged.attempt().dead_lettered

    def receipt_fails(order: str) -> None:
        step = current_job.step
        step.run("charge", lambda: _call("charge"))

        def receipt() -> None:
            raise NonRetryableError("mail server refused")

        step.run("receipt", receipt)

    failed = DurableRun(receipt_fails, "o", run_key="failed", store=store, clock=clock, task_name="receipt")
    assert failed.attempt().dead_lettered
    assert failed.step_keys == ["charge#0", "receipt#0"]

    report = check_runs(store, {"checkout": checkout_v1, "receipt": receipt_fails})
    verdicts = {c.run_key: (c.verdict, c.stopped_at) for c in report.checks}
    assert verdicts == {"dead": ("compatible", "receipt#0"), "failed": ("compatible", "receipt#0")}


def test_c48_current_job_checking_is_false_in_a_worker_and_true_in_a_check(store, clock):
    """C48: ``current_job.checking`` tells a body it is being checked; a real attempt sees ``False``."""
    seen: list[bool] = []

    def body(order: str) -> None:
        current_job.step.run("charge", lambda: 1)
        seen.append(current_job.checking)
        current_job.step.sleep("1h")

    _run(store, clock, body, "r")
    check_runs(store, {"checkout": body})
    assert seen == [False, True]


def test_c48_an_async_body_is_checked_like_a_sync_one(store, clock):
    """C48: an ``async def`` body is checked on a loop of its own, also when called from a running loop."""

    _run(store, clock, checkout_v1, "asleep")  # the record; the bodies checked below are async

    async def body(order: str) -> None:
        step = current_job.step
        await step.arun("charge", lambda: _call("charge"))
        step.sleep("1h")
        await step.arun("receipt", lambda: _call("receipt"))

    async def changed(order: str) -> None:
        await current_job.step.arun("refund", lambda: _call("refund"))

    assert [c.verdict for c in check_runs(store, {"checkout": changed}).checks] == ["divergent"]

    async def from_a_loop() -> list[str]:
        return [c.verdict for c in check_runs(store, {"checkout": body}).checks]

    assert asyncio.run(from_a_loop()) == ["compatible"]


def test_c48_an_export_file_is_checked_like_the_store(store, clock, tmp_path: Path):
    """C48: ``export_runs`` writes the runs' records (values as stored) to JSON; ``check_runs`` on that file,
    with no store, finds what it finds on the store, and the pytest form in ``flexiq_plugins.testing`` is the
    same function."""
    _run(store, clock, checkout_v1, "a")
    _run(store, clock, checkout_v1, "b")
    path = tmp_path / "runs.json"
    assert export_runs(store, path) == 2
    data = json.loads(path.read_text())
    assert data["format"] == "flexiq-runs/1"
    assert [s["step_key"] for s in data["runs"][0]["steps"]] == ["charge#0", "sleep#0"]

    from_store = check_runs(store, {"checkout": checkout_v2_audit_first})
    from_file = pytest_form(path, {"checkout": checkout_v2_audit_first})
    assert pytest_form is check_runs
    strip = [dataclasses.replace(c, message=c.message) for c in from_file.checks]
    assert sorted((c.run_key, c.verdict, c.position) for c in strip) == sorted(
        (c.run_key, c.verdict, c.position) for c in from_store.checks
    )
    assert export_runs(store, tmp_path / "one.json", ["a"]) == 1


def test_c48_a_file_that_is_not_an_export_is_refused(tmp_path: Path):
    """C48: ``check_runs`` on a JSON file of another shape raises ``ConfigurationError`` naming the file."""
    path = tmp_path / "other.json"
    path.write_text('{"runs": []}')
    with pytest.raises(ConfigurationError, match=r"other\.json is not a file `flexiq runs export` wrote"):
        check_runs(path, {"checkout": checkout_v1})


def test_c48_tasks_must_be_an_app_a_broker_or_a_mapping(store):
    """C48: anything else given as the new code is refused with a message saying what is accepted."""
    with pytest.raises(ConfigurationError, match="mapping of task names to tasks"):
        check_runs(store, object())


def test_c48_a_step_that_failed_for_good_replays_its_failure_without_blaming_the_new_code(store, clock):
    """C48, C31: a record whose step failed for good (as a run being compensated keeps it) replays that failure
    in a check as a worker would: the run is compatible, the message says what was replayed."""
    from flexiq_plugins import DurableConfig, NonRetryableError
    from flexiq_plugins._attempt.check import RecordedRun, check_run

    def receipt_fails(order: str) -> None:
        step = current_job.step
        step.run("charge", lambda: _call("charge"))

        def receipt() -> None:
            raise NonRetryableError("mail server refused")

        step.run("receipt", receipt)

    run = DurableRun(receipt_fails, "o", run_key="failed", store=store, clock=clock)
    run.attempt()
    record = RecordedRun("failed", "checkout", "pending", tuple(run.steps), ["o"], {}, "job-1", 1)
    check = check_run(record, receipt_fails, codec=run.driver.codec, limits=DurableConfig().limits, now=clock())
    assert check.verdict == "compatible"
    assert check.message == "replays the step that failed for good: NonRetryableError: mail server refused"
