"""Patching a step sequence (C49): ``step.patched(id)`` serves old runs and new runs side by side.

Version 1 of the task charges, sleeps and sends a receipt. Version 2 adds an
``audit`` step after the charge, behind ``step.patched("audit-v2")``. A run
asleep under version 1 is woken under version 2: it takes the old branch, with
no divergence; a new run takes the new branch and records the marker.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from flexiq_plugins import JobEnvelope, MemoryStepStore, StepDivergence, current_job
from flexiq_plugins.errors import DuplicateStepKey, InvalidStepKey
from flexiq_plugins.integration import AttemptDriver, JobInfo
from flexiq_plugins.operations import check_runs
from flexiq_plugins.testing import DurableRun, FakeClock

AUDITS: list[str] = []


def v1(order: str) -> str:
    """Charge, sleep, receipt."""
    step = current_job.step
    step.run("charge", lambda: "ch_1")
    step.sleep("1h")
    return str(step.run("receipt", lambda: "sent"))


def v2(order: str) -> str:
    """Version 1 with an ``audit`` step after the charge for runs that reach it under this code."""
    step = current_job.step
    step.run("charge", lambda: "ch_1")
    if step.patched("audit-v2"):
        step.run("audit", lambda: AUDITS.append(current_job.run_key))
    step.sleep("1h")
    return str(step.run("receipt", lambda: "sent"))


def v2_unpatched(order: str) -> str:
    """Version 2 without the patch: the audit step for every run (breaks runs asleep under version 1)."""
    step = current_job.step
    step.run("charge", lambda: "ch_1")
    step.run("audit", lambda: AUDITS.append(current_job.run_key))
    step.sleep("1h")
    return str(step.run("receipt", lambda: "sent"))


def v3(order: str) -> str:
    """Version 3: the old branch removed, ``deprecate_patch`` in place of ``patched``."""
    step = current_job.step
    step.run("charge", lambda: "ch_1")
    step.deprecate_patch("audit-v2")
    step.run("audit", lambda: AUDITS.append(current_job.run_key))
    step.sleep("1h")
    return str(step.run("receipt", lambda: "sent"))


@pytest.fixture
def clock() -> FakeClock:
    """The store's clock."""
    AUDITS.clear()
    return FakeClock()


@pytest.fixture
def store(clock: FakeClock) -> MemoryStepStore:
    """One store for the old and the new runs."""
    return MemoryStepStore(clock=clock)


def _run(store: MemoryStepStore, clock: FakeClock, body: Any, run_key: str) -> DurableRun:
    return DurableRun(body, "order-1", run_key=run_key, store=store, clock=clock, task_name="checkout")


def test_c49_old_and_new_runs_finish_side_by_side_with_no_dead_letter(store, clock):
    """C49: a run asleep under version 1 and a run started under version 2 both finish under version 2: the old
    one without the audit and without a marker, the new one with the audit and the marker ``patch:audit-v2``
    where it took the branch."""
    old = _run(store, clock, v1, "old")
    assert old.attempt().sleeping
    old.body = v2  # the deploy
    new = _run(store, clock, v2, "new")
    assert new.attempt().sleeping
    assert new.step_keys == ["charge#0", "patch:audit-v2", "audit#0", "sleep#0"]

    clock.advance(3601)
    assert old.attempt().completed
    assert new.attempt().completed
    assert old.dead_letters == []
    assert new.dead_letters == []
    assert AUDITS == ["new"]


def test_c49_without_the_patch_the_same_deploy_dead_letters_the_old_run(store, clock):
    """C49, C12: the contrast: version 2 without ``patched`` diverges on the run asleep under version 1."""
    old = _run(store, clock, v1, "old")
    old.attempt()
    old.body = v2_unpatched
    clock.advance(3601)
    result = old.attempt()
    assert result.dead_lettered
    assert isinstance(result.error, StepDivergence)


def test_c49_a_replay_of_a_new_branch_run_answers_true_from_its_marker(store, clock):
    """C49, C9: a run that took the new branch answers ``True`` on every replay (its marker is a memo hit),
    runs the audit once, and an old-branch run answers ``False`` on every replay, recording nothing."""
    answers: list[tuple[str, bool]] = []

    def body(order: str) -> None:
        step = current_job.step
        step.run("charge", lambda: "ch_1")
        answers.append((current_job.run_key, step.patched("audit-v2")))
        answers.append((current_job.run_key, step.patched("audit-v2")))  # asked again: the same answer
        step.sleep("1h")
        step.run("receipt", lambda: "sent")

    new = _run(store, clock, body, "new")
    new.until_done()
    old = _run(store, clock, v1, "old")
    old.attempt()
    old.body = body
    old.until_done()
    assert answers == [("new", True)] * 4 + [("old", False)] * 4


def test_c49_other_steps_keep_their_keys(store, clock):
    """C49, C1: the marker is keyed, so the ``name#n`` keys of the steps around it are the same as without it."""
    new = _run(store, clock, v2, "new")
    new.attempt()
    plain = _run(store, clock, v2_unpatched, "plain")
    plain.attempt()
    assert [k for k in new.step_keys if not k.startswith("patch:")] == plain.step_keys


def test_c49_deprecate_patch_replays_markers_records_nothing_new_and_refuses_old_branch_runs(store, clock):
    """C49: under version 3 a run that took the new branch replays its marker, a new run records no marker, and a
    run still on the old branch diverges (dead-lettered) rather than running new steps against old records."""
    took_new = _run(store, clock, v2, "took-new")
    took_new.attempt()
    on_old = _run(store, clock, v1, "on-old")
    on_old.attempt()
    on_old.body = v2
    clock.advance(3601)
    assert on_old.attempt().completed is True  # finished on the old branch: not in flight any more
    still_old = _run(store, clock, v1, "still-old")
    still_old.attempt()

    for run in (took_new, still_old):
        run.body = v3
    fresh = _run(store, clock, v3, "fresh")
    assert fresh.attempt().sleeping
    assert fresh.step_keys == ["charge#0", "audit#0", "sleep#0"]
    clock.advance(3601)
    assert took_new.attempt().completed
    refused = still_old.attempt()
    assert refused.dead_lettered
    assert isinstance(refused.error, StepDivergence)
    assert "old branch of patch 'audit-v2'" in str(refused.error)


def test_c49_check_says_when_a_patch_may_be_deprecated(store, clock):
    """C49, C48: the check reports, per patch id, the runs on each branch: deprecation is safe once none is on
    the old branch."""
    _run(store, clock, v1, "old").attempt()
    _run(store, clock, v2, "new").attempt()
    [task] = check_runs(store, {"checkout": v2}).by_task()
    [use] = task.patches
    assert (use.patch_id, use.old, use.new, use.safe_to_deprecate) == ("audit-v2", ["old"], ["new"], False)

    only_new = MemoryStepStore(clock=clock)
    _run(only_new, clock, v2, "new").attempt()
    [task] = check_runs(only_new, {"checkout": v2}).by_task()
    assert task.patches[0].safe_to_deprecate
    assert check_runs(only_new, {"checkout": v3}).ok


def test_c49_a_patched_async_body_serves_old_and_new_runs(store, clock):
    """C49: ``step.patched`` in an ``async def`` body answers as in a sync one: old branch for the run asleep
    under version 1, new branch (and the marker) for a new run."""
    driver = AttemptDriver(store)
    old = _run(store, clock, v1, "old")
    old.attempt()
    clock.advance(3601)

    async def v2_async(order: str) -> str:
        step = current_job.step
        await step.arun("charge", lambda: "ch_1")
        branch = "new" if step.patched("audit-v2") else "old"
        step.sleep("1h")
        await step.arun("receipt", lambda: "sent")
        return branch

    def attempt(run_key: str, job_id: str) -> Any:
        job = JobInfo(run_key, job_id, JobEnvelope("checkout", "test"))
        return asyncio.run(driver.arun_job(job, lambda: v2_async("order-1")))

    assert attempt("old", "j-1").value == "old"
    attempt("new", "j-2")
    assert [r.step_key for r in store.get_steps("new")] == ["charge#0", "patch:audit-v2", "sleep#0"]
    clock.advance(3601)
    assert attempt("new", "j-3").value == "new"


def test_c49_a_bad_patch_id_or_a_taken_key_is_refused(store, clock):
    """C49, C2, C3: a patch id that is not a non-empty str is refused before anything runs; a step of the body
    that took the key ``patch:<id>`` makes the patch a duplicate key."""

    def bad(order: str) -> None:
        current_job.step.patched("")

    assert isinstance(_run(store, clock, bad, "bad").attempt().error, InvalidStepKey)

    def taken(order: str) -> None:
        step = current_job.step
        step.run("patch", lambda: 1, key="audit-v2")
        step.patched("audit-v2")

    assert isinstance(_run(store, clock, taken, "taken").attempt().error, DuplicateStepKey)
