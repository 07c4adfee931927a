"""Claims, fencing and terminal state, C23–C27.

Most tests move the fake store clock to expire leases. The lease-renewal test
(C23) needs real time, because renewal runs in a background thread: it uses a
real-clock store with a 0.3 s lease and waits on an ``Event`` with a timeout.
"""

from __future__ import annotations

import os
import random
import socket
import threading
from unittest.mock import ANY

import pytest

from flexiq_plugins import DeadLettered, DurableConfig, JobEnvelope, MemoryStepStore, StoreUnavailable, current_job
from flexiq_plugins._attempt import decisions
from flexiq_plugins._attempt.driver import default_owner
from flexiq_plugins._model.records import Claim, NewDeadLetter, RunStatus
from flexiq_plugins.errors import ClaimLost
from flexiq_plugins.integration import Attempt, AttemptDriver, JobInfo

JOB = JobInfo("run-1", "job-1", JobEnvelope("task", "test"))


# ----------------------------------------------------------------- C23 lease
def test_c23_lease_is_renewed_while_a_long_body_runs():
    """A body running three leases long keeps its claim: a second delivery meanwhile is Busy."""
    store = MemoryStepStore()
    driver = AttemptDriver(store, DurableConfig(lease_seconds=0.6, busy_retry_seconds=5))
    seen: dict[str, object] = {}

    def body():
        threading.Event().wait(1.8)  # three leases; nobody sets it
        seen["second"] = driver.start(JOB, owner="w2")
        seen["lease_left"] = store.get_run("run-1").lease_until - store.now()
        return current_job.step.run("after", lambda: "committed under the renewed claim")

    decision = driver.start(JOB, owner="w1").run(body)
    assert seen["second"] == decisions.PutBack(decisions.PutBackReason.BUSY, ANY, ANY)
    assert 0 < seen["second"].delay <= 0.6
    assert 0 < seen["lease_left"] <= 0.6
    assert decision == decisions.Completed("committed under the renewed claim")


def test_c23_without_a_running_body_the_lease_is_not_renewed():
    """Control for the renewal test: an idle claim's lease runs out and the next delivery takes over."""
    store = MemoryStepStore()
    driver = AttemptDriver(store, DurableConfig(lease_seconds=0.3))
    first = driver.start(JOB, owner="w1")
    assert isinstance(first, Attempt)
    threading.Event().wait(0.5)
    second = driver.start(JOB, owner="w2")
    assert isinstance(second, Attempt)
    assert second.number == 2


def test_c23_claim_uses_the_store_clock_not_the_worker_clock(make_harness, clock):
    """The lease is stamped from the store's clock: ``lease_until`` = store now + lease."""
    harness = make_harness(lease_seconds=30)
    attempt = harness.start()
    assert attempt.claim.lease_until == clock() + 30
    assert attempt.number == 1
    assert attempt.now() == pytest.approx(clock(), abs=1)


# ------------------------------------------------------------------ C24 busy
def test_c24_second_delivery_under_a_live_claim_is_busy_and_runs_nothing(make_harness, clock):
    """While a live claim holds the run, another delivery is Busy for ≤ busy_retry and ≤ lease left."""
    harness = make_harness(lease_seconds=30, busy_retry_seconds=5)
    harness.start(owner="w1")

    busy = harness.driver.start(harness.job(), owner="w2")
    assert busy == decisions.PutBack(decisions.PutBackReason.BUSY, 5.0, busy.detail)

    clock.advance(28)  # 2 s of lease left
    busy = harness.driver.start(harness.job(), owner="w2")
    assert busy == decisions.PutBack(decisions.PutBackReason.BUSY, ANY, ANY)
    assert busy.delay == pytest.approx(2.0)
    run = harness.store.get_run(harness.run_key)
    assert (run.owner, run.attempt) == ("w1", 1)


def test_c24_c37_duplicate_after_the_run_succeeded_replays_its_value_without_running(harness):
    """Once the run succeeded, a duplicate delivery gets Replay('succeeded', value) and no attempt."""
    assert harness.run(lambda: "done") == decisions.Completed("done")
    assert harness.driver.start(harness.job()) == decisions.Replay("succeeded", "done")


# -------------------------------------------------------------- C25 takeover
def test_c25_expired_claim_is_taken_over_and_the_old_attempts_step_is_refused(harness, clock):
    """After takeover, the old attempt's next commit raises ClaimLost and its decision is ``Ack(DROPPED)``."""
    taken: list[object] = []
    errors: list[BaseException] = []

    def old_body():
        current_job.step.run("a", lambda: "old-a")
        clock.advance(31)  # the old worker stalls past its lease
        taken.append(harness.driver.start(harness.job("job-1"), owner="w2"))
        try:
            current_job.step.run("b", lambda: "old-b")
        except ClaimLost as exc:
            errors.append(exc)
            raise

    decision = harness.run(old_body, owner="w1")
    assert decision == decisions.Ack(decisions.AckReason.DROPPED, decision.detail)
    assert len(errors) == 1
    (new,) = taken
    assert isinstance(new, Attempt)
    assert new.number == 2
    assert [r.step_key for r in harness.store.get_steps(harness.run_key)] == ["a#0"]
    run = harness.store.get_run(harness.run_key)
    assert (run.status, run.owner, run.attempt, run.takeovers) == ("running", "w2", 2, 1)
    assert harness.store.list_dead_letters(include_retried=True) == []

    calls: list[str] = []

    def new_body():
        step = current_job.step
        return [step.run("a", lambda: calls.append("a")), step.run("b", lambda: calls.append("b") or "new-b")]

    assert new.run(new_body) == decisions.Completed(["old-a", "new-b"])
    assert calls == ["b"]


@pytest.mark.parametrize(
    "ending",
    ["return", "raise", "sleep", "dead_letter"],
)
def test_c25_old_attempt_decision_is_dropped_however_it_ends(harness, clock, ending):
    """Returning, raising, sleeping or dead-lettering after a takeover: Dropped, the new claim untouched."""

    def old_body():
        clock.advance(31)
        assert isinstance(harness.driver.start(harness.job(), owner="w2"), Attempt)
        if ending == "raise":
            raise RuntimeError("late failure")
        if ending == "sleep":
            current_job.step.sleep("1h")
        if ending == "dead_letter":
            current_job.step.run("x", object)
        return "late success"

    decision = harness.run(old_body, owner="w1")
    assert decision == decisions.Ack(decisions.AckReason.DROPPED, decision.detail)
    run = harness.store.get_run(harness.run_key)
    assert (run.status, run.owner, run.attempt) == ("running", "w2", 2)
    assert harness.store.list_dead_letters(include_retried=True) == []
    assert harness.store.get_steps(harness.run_key) == []


def test_c25_released_claims_are_not_takeovers(make_harness, clock):
    """A retry or a sleep releases the claim: the next delivery is no takeover, even with max_takeovers=0."""
    harness = make_harness(max_takeovers=0)

    def body():
        if current_job.attempt == 1:
            raise RuntimeError("retry")
        current_job.step.sleep("1s")
        return "ok"

    assert isinstance(harness.run(body), decisions.Failure)
    assert harness.run(body) == decisions.PutBack(decisions.PutBackReason.SLEEP, ANY, ANY, ANY)
    clock.advance(2)
    assert harness.run(body) == decisions.Completed("ok")
    assert harness.store.get_run(harness.run_key).takeovers == 0


class _BlippingStore(MemoryStepStore):
    """A memory store whose ``finish`` fails a given number of times first."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    def finish(
        self,
        claim: Claim,
        status: RunStatus,
        *,
        drop_steps: bool = False,
        dead_letter: NewDeadLetter | None = None,
        wake_at: float | None = None,
        outcome: bytes | None = None,
    ) -> None:
        if self.failures:
            self.failures -= 1
            raise StoreUnavailable("blip")
        super().finish(claim, status, drop_steps=drop_steps, dead_letter=dead_letter, wake_at=wake_at, outcome=outcome)


def test_c25_a_store_blip_while_ending_the_attempt_still_releases_the_claim():
    """C25/C28: a brief outage at the end of an attempt does not leave the claim held, so the next
    delivery is not made to wait for the lease nor counted as a dead worker's takeover."""
    store = _BlippingStore(failures=2)
    attempt = AttemptDriver(store).start(JobInfo("run-1", "job-1", JobEnvelope("task", "test")))
    assert attempt.run(lambda: current_job.step.run("a", lambda: 1)) == decisions.Completed(1)  # type: ignore[union-attr]
    run = store.get_run("run-1")
    assert (run.status, run.owner, run.takeovers) == ("succeeded", None, 0)


def test_c25_takeovers_beyond_the_limit_dead_letter_with_worker_lost(make_harness, clock):
    """With ``max_takeovers=2`` the third takeover of a dead worker's claim is DeadLetter('worker_lost')."""
    harness = make_harness(max_takeovers=2, lease_seconds=30)
    harness.start(owner="w0")
    for n in (1, 2):
        clock.advance(31)
        attempt = harness.start(owner=f"w{n}")
        assert attempt.number == n + 1
    clock.advance(31)
    decision = harness.driver.start(harness.job(), owner="w3")
    assert isinstance(decision, decisions.DeadLetter)
    assert decision.reason == "worker_lost"
    assert "3 times" in decision.message
    assert "limit 2" in decision.message
    (letter,) = harness.store.list_dead_letters()
    assert letter.reason == "worker_lost"
    assert harness.store.get_run(harness.run_key).status == "dead"
    replay = harness.driver.start(harness.job(), owner="w4")
    assert isinstance(replay, decisions.Replay)
    assert (replay.status, type(replay.error)) == ("dead", DeadLettered)
    assert str(replay.error).startswith("worker_lost: ")


def test_c25_worker_lost_run_runs_again_after_a_dead_letter_retry(make_harness, clock):
    """A ``worker_lost`` dead letter, once retried, starts with a fresh takeover count and runs."""
    harness = make_harness(max_takeovers=0)
    harness.start(owner="w0")
    clock.advance(31)
    assert isinstance(harness.driver.start(harness.job(), owner="w1"), decisions.DeadLetter)
    (letter,) = harness.store.list_dead_letters()
    harness.store.prepare_retry(letter.id)
    assert harness.run(lambda: "finally", job_id="job-2") == decisions.Completed("finally")


def test_c25_default_takeover_limit_is_five(harness, clock):
    """By default five takeovers are allowed and the sixth dead-letters."""
    harness.start(owner="w0")
    for n in range(1, 6):
        clock.advance(31)
        harness.start(owner=f"w{n}")
    clock.advance(31)
    decision = harness.driver.start(harness.job(), owner="w6")
    assert isinstance(decision, decisions.DeadLetter)
    assert decision.reason == "worker_lost"


# --------------------------------------------------------------- C26 terminal
@pytest.mark.parametrize("status", ["succeeded", "dead", "failed"])
def test_c26_c37_terminal_run_is_a_duplicate_replayed_and_the_body_is_not_called(harness, status):
    """A redelivered job of a succeeded, dead-lettered or failed run replays its outcome; no attempt, no body."""
    if status == "succeeded":
        harness.run(lambda: "ok")
    elif status == "dead":
        harness.run(lambda: current_job.step.run("x", object))
    else:
        failure = harness.start().run(lambda: 1 / 0)
        assert isinstance(failure, decisions.Failure)
        assert harness.driver.settle_failed(failure) is True
    assert harness.store.get_run(harness.run_key).status == status

    again = harness.driver.start(harness.job("job-redelivered"))
    assert isinstance(again, decisions.Replay)  # a decision, not an Attempt: there is no body to call
    expected = {"succeeded": type(None), "dead": DeadLettered, "failed": ZeroDivisionError}
    value = "ok" if status == "succeeded" else None
    assert (again.status, again.value, type(again.error)) == (status, value, expected[status])
    assert harness.store.get_run(harness.run_key).attempt == 1


def test_c26_terminal_state_is_committed_before_the_decision_is_returned(harness):
    """By the time ``run`` returns Completed, the store already says ``succeeded`` with the claim released."""
    decision = harness.run(lambda: "ok")
    run = harness.store.get_run(harness.run_key)
    assert decision == decisions.Completed("ok")
    assert (run.status, run.owner) == ("succeeded", None)


# ------------------------------------------------------------- C27 retention
def _two_steps():
    current_job.step.run("a", lambda: 1)
    current_job.step.run("b", lambda: 2)
    return "ok"


def test_c27_step_rows_of_a_succeeded_run_are_dropped(harness):
    """On success the run's step rows are deleted."""
    assert harness.run(_two_steps) == decisions.Completed("ok")
    assert harness.store.get_steps(harness.run_key) == []
    assert harness.store.get_run(harness.run_key).step_count == 0


def test_c27_keep_succeeded_steps_keeps_the_rows(make_harness):
    """With ``keep_succeeded_steps`` the rows of a succeeded run stay for inspection."""
    harness = make_harness(keep_succeeded_steps=True)
    assert harness.run(_two_steps) == decisions.Completed("ok")
    assert [r.step_key for r in harness.store.get_steps(harness.run_key)] == ["a#0", "b#0"]


def test_c27_rows_of_a_dead_lettered_run_are_kept_and_replayed_on_retry(harness):
    """A dead-lettered run keeps its rows; after ``prepare_retry`` a new job replays them as memo hits."""
    calls: list[str] = []

    def body():
        step = current_job.step
        first = step.run("a", lambda: calls.append("a") or "A")
        last = step.run("b", lambda: calls.append("b") or (object() if current_job.attempt == 1 else "B"))
        return [first, last]

    assert isinstance(harness.run(body), decisions.DeadLetter)
    assert [r.step_key for r in harness.store.get_steps(harness.run_key)] == ["a#0"]
    (letter,) = harness.store.list_dead_letters()
    harness.store.prepare_retry(letter.id)
    assert harness.run(body, job_id="job-2") == decisions.Completed(["A", "B"])
    assert calls == ["a", "b", "b"]


def test_c25_claim_owners_name_the_process_and_differ_per_attempt_and_in_a_forked_child() -> None:
    """An owner is ``host:pid:`` and 48 random bits: unique per attempt, the child's pid after a fork (C25)."""
    owners = {default_owner() for _ in range(1000)}
    assert len(owners) == 1000
    prefix = f"{socket.gethostname()}:{os.getpid()}:"
    assert all(o.startswith(prefix) and len(o) == len(prefix) + 12 for o in owners)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child writes its owner and exits at once
        os.write(write, default_owner().encode())
        os._exit(0)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    child = os.read(read, 200).decode()
    os.close(read)
    assert os.waitstatus_to_exitcode(status) == 0
    assert child.startswith(f"{socket.gethostname()}:{pid}:")
    assert child not in owners
    assert child.rsplit(":", 1)[1] != default_owner().rsplit(":", 1)[1]  # the child does not repeat the parent


def test_c25_claim_owners_leave_the_process_random_alone_and_differ_after_a_user_reseeds_it() -> None:
    """An owner draws nothing from the global `random`, whose seed user code owns (C25).

    A task that seeds `random` gets the same numbers with or without attempts
    started in between, and two attempts started right after the same
    ``random.seed`` (two threads of one process, or a restarted process with
    the same pid and host) still get different owners.
    """
    state = random.getstate()
    try:
        random.seed(1234)
        alone = [random.random() for _ in range(3)]
        random.seed(1234)
        between = []
        for _ in range(3):
            default_owner()
            between.append(random.random())
        random.seed(7)
        first = default_owner()
        random.seed(7)
        second = default_owner()
    finally:
        random.setstate(state)
    assert between == alone
    assert first != second
