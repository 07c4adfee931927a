"""Lazy claims: a job claims its run at the body's first step, so a body that takes no step costs nothing (C23).

A ``lazy`` job (what the adapters use for a first delivery) starts its
attempt without touching the store; the first read of ``current_job.step``
(or ``current_job.attempt``) claims the run. When that claim is refused (the
run is busy, finished, past its takeover limit, or the store is down), the
body unwinds from that first step with :class:`ClaimRefused` and the attempt
ends exactly as an eager claim would have ended it (C24–C28).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from typing import Any

import pytest

from flexiq_plugins import DurableConfig, JobEnvelope, MemoryStepStore, current_job
from flexiq_plugins._attempt.decisions import Ack, Completed, DeadLetter, Failure, PutBack, PutBackReason, Replay
from flexiq_plugins.errors import ClaimRefused, StoreUnavailable
from flexiq_plugins.integration import AttemptDriver, JobInfo, claims_before_body, resume_mark_at_publish
from tests.core.conftest import FakeClock


class CountingStore(MemoryStepStore):
    """A memory store that counts every call the driver makes on it."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock=clock)
        self.calls: list[str] = []
        self.down = False

    def __getattribute__(self, name: str) -> Any:
        value = super().__getattribute__(name)
        if callable(value) and not name.startswith("_") and name not in {"calls", "down", "held"}:  # held: no I/O
            if super().__getattribute__("down"):
                raise StoreUnavailable("the store is down (test)")
            super().__getattribute__("calls").append(name)
        return value


@pytest.fixture
def store(clock: FakeClock) -> CountingStore:
    return CountingStore(clock)


@pytest.fixture
def driver(store: CountingStore) -> AttemptDriver:
    driver = AttemptDriver(store, DurableConfig(max_takeovers=1))
    store.calls.clear()
    return driver


def lazy(run_key: str = "run-1", job_id: str = "job-1") -> JobInfo:
    return JobInfo(run_key, job_id, JobEnvelope("task", "test"), lazy=True)


def test_c23_a_lazy_job_that_takes_no_step_does_no_store_io(driver: AttemptDriver, store: CountingStore) -> None:
    """C23: no claim, no settle, no run: the decision carries the body's value."""
    decision = driver.run_job(lazy(), lambda: (current_job.run_key, current_job.job_id, current_job.task_name))
    assert decision == Completed(("run-1", "job-1", "task"), claimed=False)
    assert store.calls == []
    assert store.list_runs() == []


def test_c23_a_lazy_job_that_fails_before_any_step_is_a_failure_of_no_run(
    driver: AttemptDriver, store: CountingStore
) -> None:
    """C23, C28: a failure before the first step is left to the framework; giving up on it writes nothing."""

    def body() -> None:
        raise ValueError("no step")

    decision = driver.run_job(lazy(), body)
    assert isinstance(decision, Failure)
    assert not decision.claimed
    assert driver.give_up(decision) is None
    assert driver.settle_failed(decision) is False
    assert store.calls == []


def test_c23_the_first_step_claims_the_run(driver: AttemptDriver, store: CountingStore) -> None:
    """C23: the first read of ``current_job.step`` claims; the run then ends as with an eager claim."""
    seen: list[Any] = []

    def body() -> int:
        seen.append(list(store.calls))
        value = current_job.step.run("one", lambda: 1)
        seen.append(current_job.attempt)
        return value

    assert driver.run_job(lazy(), body) == Completed(1)
    assert seen == [[], 1]
    assert [r.status for r in store.list_runs()] == ["succeeded"]


def test_c23_reading_the_attempt_number_claims_the_run(driver: AttemptDriver, store: CountingStore) -> None:
    """C23: ``current_job.attempt`` needs the claim too."""
    assert driver.run_job(lazy(), lambda: current_job.attempt) == Completed(1)
    assert [r.status for r in store.list_runs()] == ["succeeded"]


def test_c24_a_lazy_claim_of_a_busy_run_unwinds_the_body_and_puts_the_job_back(driver: AttemptDriver) -> None:
    """C24: another live claim holds the run: the body stops at its first step, the job goes back."""
    holder = driver.start(JobInfo("run-1", "job-0", JobEnvelope("task", "test")))
    after: list[str] = []

    def body() -> None:
        current_job.step.run("one", lambda: 1)
        after.append("ran on")

    decision = driver.run_job(lazy(), body)
    assert isinstance(decision, PutBack)
    assert decision.reason is PutBackReason.BUSY
    assert after == []
    assert holder is not None


def test_c37_a_lazy_duplicate_of_a_finished_run_replays_its_outcome(driver: AttemptDriver) -> None:
    """C26, C37: the run already finished: the duplicate stops at its first step and replays the run's value."""
    assert driver.run_job(lazy(), lambda: current_job.step.run("one", lambda: 1)) == Completed(1)
    decision = driver.run_job(lazy(job_id="job-2"), lambda: current_job.step.run("one", lambda: 2))
    assert decision == Replay("succeeded", 1, None)


def test_c21_a_body_that_swallows_the_refused_claim_still_ends_with_it(driver: AttemptDriver) -> None:
    """C21: catching ``ClaimRefused`` does not let the body go on as if it had its run."""
    driver.run_job(lazy(), lambda: current_job.step.run("one", lambda: 1))

    def body() -> str:
        with contextlib.suppress(BaseException):  # what the test is about
            current_job.step.run("one", lambda: 2)
        with pytest.raises(ClaimRefused):
            current_job.step.run("two", lambda: 3)
        return "returned anyway"

    assert driver.run_job(lazy(job_id="job-2"), body) == Replay("succeeded", 1, None)


def test_c25_a_lazy_claim_past_the_takeover_limit_dead_letters(
    driver: AttemptDriver, store: CountingStore, clock: FakeClock
) -> None:
    """C25: a run whose workers keep dying is dead-lettered ``worker_lost`` from its first step."""
    for n in range(2):
        started = driver.start(JobInfo("run-1", f"job-{n}", JobEnvelope("task", "test")))
        assert not isinstance(started, (Ack, PutBack, DeadLetter, Failure, Completed))
        clock.advance(driver.config.lease_seconds + 1)
    decision = driver.run_job(lazy(job_id="job-9"), lambda: current_job.step.run("one", lambda: 1))
    assert isinstance(decision, DeadLetter)
    assert decision.reason == "worker_lost"
    assert store.get_run("run-1").status == "dead"


def test_c28_a_lazy_claim_during_a_store_outage_puts_the_job_back(driver: AttemptDriver, store: CountingStore) -> None:
    """C28: the store is down at the first step: the job goes back, no retry counted."""

    def body() -> None:
        store.down = True
        current_job.step.run("one", lambda: 1)

    decision = driver.run_job(lazy(), body)
    store.down = False
    assert isinstance(decision, PutBack)
    assert decision.reason is PutBackReason.STORE_UNAVAILABLE


def test_c23_an_async_lazy_body_claims_at_its_first_step(driver: AttemptDriver, store: CountingStore) -> None:
    """C23: the same for an ``async def`` body: none without a step, a claim with one."""

    async def no_step() -> int:
        return 1

    async def one_step() -> int:
        return await current_job.step.arun("one", lambda: 2)

    assert asyncio.run(driver.arun_job(lazy(), no_step)) == Completed(1, claimed=False)
    assert store.calls == []
    assert asyncio.run(driver.arun_job(lazy("run-2"), one_step)) == Completed(2)
    assert [r.status for r in store.list_runs()] == ["succeeded"]


@pytest.mark.parametrize(
    ("resume", "given", "redelivered", "first"),
    [
        (False, True, False, False),  # stamped at publish: a new run, claimed at its first step
        (True, True, False, True),  # a re-publish, a put-back, a producer's own run key
        (None, True, False, True),  # a run key from a producer without the integration
        (None, False, False, False),  # no run key at all: a new run
        (False, True, True, True),  # delivered again by the broker
    ],
)
def test_c37_a_delivery_that_may_name_an_existing_run_claims_before_its_body(
    resume: bool | None, given: bool, redelivered: bool, first: bool
) -> None:
    """C23, C37: only a job the integration itself stamped as new waits for its first step to claim."""
    assert claims_before_body(resume, run_key_given=given, redelivered=redelivered) is first


def test_c39_a_job_recorded_at_publish_claims_before_its_body() -> None:
    """C23, C39: a recorded run exists, and recovery publishes a run left ``queued``: its job claims first,
    so neither a long body before its first step nor a copy from recovery runs it twice."""
    assert claims_before_body(False, run_key_given=True, recorded=True) is True
    assert claims_before_body(False, run_key_given=True, recorded=False) is False


def test_c37_a_producers_own_run_key_is_marked_to_claim_first() -> None:
    """C37: the publish hook marks a producer's run key as possibly an existing run's; a stamped one as new."""
    assert resume_mark_at_publish(None, run_key_given=True) is True
    assert resume_mark_at_publish(None, run_key_given=False) is False
    assert resume_mark_at_publish(False, run_key_given=True) is False  # a retry of a new run stays lazy
    assert resume_mark_at_publish(True, run_key_given=True) is True


def test_c23_two_threads_of_one_body_that_first_ask_at_once_share_one_claim(
    driver: AttemptDriver, store: CountingStore
) -> None:
    """C23, C24: the body's threads that read ``current_job.attempt`` together claim the run once, not twice."""
    ready = threading.Barrier(4)
    seen: list[object] = []

    def ask() -> None:
        ready.wait()
        try:
            seen.append(current_job.attempt)
        except BaseException as exc:  # a second claim would be refused as busy
            seen.append(exc)

    def body() -> str:
        threads = [threading.Thread(target=contextvars.copy_context().run, args=(ask,)) for _ in range(4)]
        ready.reset()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return current_job.step.run("after", lambda: "done")

    decision = driver.run_job(lazy(), body)
    assert seen == [1, 1, 1, 1]
    assert decision == Completed("done", claimed=True)
    assert store.calls.count("begin") == 1
    assert store.get_run("run-1").status == "succeeded"


def test_c23_a_thread_the_body_left_behind_cannot_claim_its_ended_run(
    driver: AttemptDriver, store: CountingStore
) -> None:
    """C23, C43: a step asked for after the body ended is refused; the job stays one that took no step."""
    asked = threading.Event()
    answers: list[BaseException] = []

    def late() -> None:
        asked.wait()
        try:
            current_job.step.run("late", lambda: "never")
        except BaseException as exc:
            answers.append(exc)

    left: list[threading.Thread] = []

    def body() -> str:
        left.append(threading.Thread(target=contextvars.copy_context().run, args=(late,)))
        left[0].start()
        return "returned"

    decision = driver.run_job(lazy(), body)
    asked.set()
    left[0].join()
    assert decision == Completed("returned", claimed=False)
    assert len(answers) == 1
    assert isinstance(answers[0], RuntimeError)
    assert "has ended" in str(answers[0])
    assert store.calls == []
    assert store.list_runs() == []


class SlowClaimStore(MemoryStepStore):
    """A memory store whose claim waits until released: a claim in flight over the network."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()

    def begin(self, *args: Any, **kwargs: Any) -> Any:
        self.entered.set()
        assert self.release.wait(10)
        return super().begin(*args, **kwargs)


def test_c23_a_claim_in_flight_when_the_body_returns_is_settled_with_the_job() -> None:
    """C23, C25, C38: a thread of the body starts the first claim and the body returns meanwhile: the attempt waits
    for that claim and settles the run, instead of ending as a job of no step and leaving the run ``running``."""
    store = SlowClaimStore()
    driver = AttemptDriver(store, DurableConfig())
    left: list[threading.Thread] = []
    got: list[object] = []

    def late() -> None:
        try:
            got.append(current_job.step.run("x", lambda: "side effect"))
        except BaseException as exc:
            got.append(exc)

    def body() -> str:
        left.append(threading.Thread(target=contextvars.copy_context().run, args=(late,)))
        left[0].start()
        assert store.entered.wait(10)
        threading.Timer(0.05, store.release.set).start()  # the claim lands while the attempt concludes
        return "returned"

    decision = driver.run_job(lazy("run-race", "job-race"), body)
    left[0].join(10)
    assert decision == Completed("returned", claimed=True)
    assert store.get_run("run-race").status == "succeeded"


class Interrupted(BaseException):
    """What a framework raises into a worker thread from outside (Dramatiq's ``TimeLimitExceeded``)."""


def test_c38_an_exception_raised_into_the_body_as_its_claim_is_granted_still_settles_the_run(
    driver: AttemptDriver, store: CountingStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """C38: an exception that lands between the store granting the first step's claim and the attempt holding it
    (a time limit) ends the attempt as that exception, its run settled: never left ``running`` for recovery."""
    from flexiq_plugins._attempt.attempt import Attempt

    take = Attempt._take
    landed: list[bool] = []

    def interrupted_once(self: Attempt, *args: Any, **kwargs: Any) -> None:
        if not landed:
            landed.append(True)
            raise Interrupted("time limit")
        take(self, *args, **kwargs)

    monkeypatch.setattr(Attempt, "_take", interrupted_once)
    decision = driver.run_job(lazy(), lambda: current_job.step.run("one", lambda: 1))
    assert landed == [True]
    assert isinstance(decision, Failure)
    assert decision.claimed
    assert isinstance(decision.error, Interrupted)
    assert store.get_run("run-1").status != "running"
