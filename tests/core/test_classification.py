"""Failure classification, C28 and C29: retryable or dead-letter, decided by the core.

``errors.classify`` is the table every adapter reads before any retry filter;
the attempt tests check that the driver's decisions follow it, including store
outages that happen inside the attempt.
"""

from __future__ import annotations

import pytest

from flexiq_plugins import (
    DurableConfig,
    JobEnvelope,
    MemoryStepStore,
    StepDivergence,
    StoreError,
    StoreUnavailable,
    current_job,
)
from flexiq_plugins._attempt import decisions
from flexiq_plugins.errors import (
    ClaimLost,
    ConcurrentStep,
    DecodeError,
    Disposition,
    DuplicateStepKey,
    EncodeError,
    InvalidStepKey,
    InvalidStepName,
    NotInStep,
    SleepSignal,
    StepLimitExceeded,
    StepRetryExhausted,
    StoreMisconfigured,
    SwallowedStepSignal,
    WorkerInterrupted,
    classify,
    reason_of,
)
from flexiq_plugins.integration import AttemptDriver, JobInfo

CLASSIFICATION = [
    (ValueError("user"), Disposition.RETRY, "error"),
    (RuntimeError("user"), Disposition.RETRY, "error"),
    (KeyError("user"), Disposition.RETRY, "error"),
    (DecodeError("other chain"), Disposition.RETRY, "error"),
    (NotInStep("outside"), Disposition.DEAD_LETTER, "invalid_idempotency_key_read"),
    (StoreError("store"), Disposition.RETRY, "error"),
    (StoreUnavailable("down"), Disposition.RETRY_ALWAYS, "error"),
    (StoreMisconfigured("login refused"), Disposition.RETRY_ALWAYS, "error"),
    (WorkerInterrupted("shutdown"), Disposition.INTERRUPTED, "error"),
    (ClaimLost("taken over"), Disposition.DROP, "error"),
    (SleepSignal("sleep#0", 1_700_000_000.0), Disposition.SLEEP, "error"),
    (StepDivergence("changed"), Disposition.DEAD_LETTER, "divergence"),
    (DuplicateStepKey("dup"), Disposition.DEAD_LETTER, "duplicate_step_key"),
    (ConcurrentStep("two"), Disposition.DEAD_LETTER, "concurrent_step"),
    (SwallowedStepSignal("caught"), Disposition.DEAD_LETTER, "swallowed_signal"),
    (StepLimitExceeded("too big"), Disposition.DEAD_LETTER, "size_limit"),
    (EncodeError("object()"), Disposition.DEAD_LETTER, "unencodable_value"),
    (InvalidStepName("bad"), Disposition.DEAD_LETTER, "invalid_step_name"),
    (InvalidStepKey("bad"), Disposition.DEAD_LETTER, "invalid_step_key"),
    (StepRetryExhausted("spent"), Disposition.DEAD_LETTER, "step_retry_exhausted"),
]


@pytest.mark.parametrize(
    ("error", "disposition", "reason"), CLASSIFICATION, ids=[type(e).__name__ for e, _, _ in CLASSIFICATION]
)
def test_c29_classification_table(error, disposition, reason):
    """Each error type has one disposition and one dead-letter reason, whatever a retry filter says."""
    assert classify(error) is disposition
    assert reason_of(error) == reason


def test_c28_user_exception_is_retry_left_to_the_framework(harness):
    """An exception from user code is Retry with ``always=False``: the framework's policy decides."""
    decision = harness.run(lambda: int("not a number"))
    assert isinstance(decision, decisions.Failure)
    assert isinstance(decision.error, ValueError)
    assert not isinstance(decision, decisions.PutBack)
    run = harness.store.get_run(harness.run_key)
    assert (run.status, run.owner) == ("retrying", None)


def test_c28_store_unavailable_raised_in_the_body_is_always_retried(harness):
    """``StoreUnavailable`` escaping the body is Retry(always=True), even for a task that filters retries."""

    def body():
        raise StoreUnavailable("database went away")

    decision = harness.run(body)
    assert isinstance(decision, decisions.PutBack)
    assert decision.reason is decisions.PutBackReason.STORE_UNAVAILABLE
    assert harness.store.get_run(harness.run_key).status == "retrying"


class FlakyStore(MemoryStepStore):
    """A memory store whose chosen methods raise ``StoreUnavailable`` while ``down`` names them."""

    def __init__(self) -> None:
        super().__init__()
        self.down: set[str] = set()

    def _check(self, name: str) -> None:
        if name in self.down:
            raise StoreUnavailable(f"{name}: connection refused")

    def commit_step(self, claim, row):
        self._check("commit_step")
        return super().commit_step(claim, row)

    def finish(self, claim, status, **kwargs):
        self._check("finish")
        return super().finish(claim, status, **kwargs)


JOB = JobInfo("run-1", "job-1", JobEnvelope("task", "test"))


def test_c28_store_outage_at_step_commit_is_always_retried_and_commits_nothing():
    """The store failing a step commit: Retry(always=True), no row; the next attempt runs the body again."""
    store = FlakyStore()
    driver = AttemptDriver(store, DurableConfig())
    calls: list[int] = []

    def body():
        return current_job.step.run("charge", lambda: calls.append(current_job.attempt) or "ok")

    store.down = {"commit_step"}
    decision = driver.start(JOB).run(body)
    assert isinstance(decision, decisions.PutBack)
    assert decision.reason is decisions.PutBackReason.STORE_UNAVAILABLE
    assert decision.detail == "commit_step: connection refused"  # the StoreUnavailable's message
    assert store.get_steps("run-1") == []

    store.down = set()
    assert driver.start(JOB).run(body) == decisions.Completed("ok")
    assert calls == [1, 2]


def test_c28_store_outage_while_concluding_is_always_retried():
    """Even a dead-letter verdict becomes Retry(always=True) when the store cannot record it."""
    store = FlakyStore()
    driver = AttemptDriver(store, DurableConfig())
    store.down = {"finish"}
    decision = driver.start(JOB).run(lambda: current_job.step.run("x", object))
    assert isinstance(decision, decisions.PutBack)
    assert decision.reason is decisions.PutBackReason.STORE_UNAVAILABLE
    assert store.list_dead_letters() == []


def test_c28_store_outage_caught_by_the_body_as_exception_is_still_always_retried():
    """Wrapping ``StoreUnavailable`` in a user error keeps the attempt retryable (not dead-lettered)."""
    store = FlakyStore()
    driver = AttemptDriver(store, DurableConfig())
    store.down = {"commit_step"}

    def body():
        try:
            current_job.step.run("charge", lambda: "ok")
        except StoreUnavailable as exc:
            raise RuntimeError("charge failed") from exc

    decision = driver.start(JOB).run(body)
    assert isinstance(decision, decisions.Failure)
    assert isinstance(decision.error, RuntimeError)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        pytest.param(lambda: current_job.step.run("x", object), "unencodable_value", id="unencodable"),
        pytest.param(lambda: current_job.step.run("x#", lambda: 1), "invalid_step_name", id="bad-name"),
        pytest.param(lambda: current_job.step.run("x", lambda: 1, key=1.5), "invalid_step_key", id="bad-key"),
    ],
)
def test_c29_dead_letter_errors_from_the_step_api_are_never_retried(harness, body, reason):
    """Errors the contract dead-letters end as DeadLetter with their reason, never Retry."""
    decision = harness.run(body)
    assert isinstance(decision, decisions.DeadLetter)
    assert decision.reason == reason
    assert harness.store.get_run(harness.run_key).status == "dead"
    (letter,) = harness.store.list_dead_letters()
    assert letter.reason == reason
    assert letter.traceback


def test_c30_dead_letter_records_the_job_envelope_reason_and_traceback(memory_store):
    """The stored dead letter carries task name, arguments, options, run key, reason and traceback (C30, C35)."""
    envelope = JobEnvelope("shop.checkout", "test", "orders", ["o-1"], {"amount": 5}, {"headers": {"h": 1}})
    driver = AttemptDriver(memory_store, DurableConfig())
    decision = driver.start(JobInfo("run-9", "job-9", envelope)).run(lambda: current_job.step.run("x", object))
    assert isinstance(decision, decisions.DeadLetter)
    assert memory_store.get_run("run-9").envelope == envelope
    (letter,) = memory_store.list_dead_letters()
    assert (letter.run_key, letter.job_id, letter.task_name) == ("run-9", "job-9", "shop.checkout")
    assert letter.envelope == envelope
    assert letter.reason == "unencodable_value"
    assert "EncodeError" in letter.traceback
