"""Regressions found by the adversarial review: each reproduces a reported failure first."""

from __future__ import annotations

import contextlib
from unittest.mock import ANY

from flexiq_plugins import JobEnvelope, MemoryStepStore, StoreUnavailable, current_job
from flexiq_plugins._attempt import decisions
from flexiq_plugins._model.records import Claim, NewDeadLetter, RunStatus
from flexiq_plugins._steps.context import no_current_job
from flexiq_plugins.errors import NotInStep
from flexiq_plugins.integration import AttemptDriver, JobInfo


def test_c6_a_step_retried_inside_the_body_keeps_its_key_and_place(harness, clock):
    """C6/C12: a step whose body raised commits nothing and takes no key, so an in-body retry loop
    commits ``fetch#0`` and the replay after a sleep is a memo hit, not a false divergence."""
    calls: list[int] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("first call fails")
        return "data"

    def body() -> str:
        for _ in range(2):
            try:
                value = current_job.step.run("fetch", flaky)
                break
            except ConnectionError:
                continue
        current_job.step.sleep("10s")
        return value

    assert harness.run(body) == decisions.PutBack(decisions.PutBackReason.SLEEP, ANY, ANY, ANY)
    assert [s.step_key for s in harness.store.get_steps("run-1")] == ["fetch#0", "sleep#0"]
    clock.advance(11)
    decision = harness.run(body)
    assert decision == decisions.Completed("data")
    assert len(calls) == 2


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


def test_c10_a_nested_job_does_not_see_the_outer_steps_idempotency_key(make_harness):
    """C10: a durable job started inside another job's step body has no step of its own running,
    so reading its ``idempotency_key`` raises ``NotInStep`` instead of naming the outer step."""
    outer, inner = make_harness("outer"), make_harness("inner")
    seen: list[str] = []

    def inner_body() -> None:
        try:
            seen.append(current_job.step.idempotency_key)
        except NotInStep:
            seen.append("NotInStep")
        seen.append(current_job.step.run("own", lambda: current_job.step.idempotency_key))

    def outer_body() -> None:
        current_job.step.run("sub", lambda: str(inner.run(inner_body)))

    assert isinstance(outer.run(outer_body), decisions.Completed)
    assert seen == ["NotInStep", "inner:own#0"]


def test_no_current_job_hides_the_outer_job():
    """A durable task called as a plain function runs with no current job (the integrations use this)."""
    with no_current_job():
        assert not current_job
        assert current_job.get() is None


def test_c28_a_cleanup_error_while_a_sleep_unwinds_is_retryable_not_a_swallowed_signal(harness):
    """C28/C21: cleanup code that fails while the sleep signal unwinds (``__exit__`` raising) is an
    ordinary retryable error; only catching the signal and hiding it is ``SwallowedStepSignal``."""

    @contextlib.contextmanager
    def connection():
        try:
            yield
        finally:
            raise ConnectionError("close failed")

    def body() -> None:
        with connection():
            current_job.step.sleep("1h")

    decision = harness.run(body)
    assert isinstance(decision, decisions.Failure)
    assert isinstance(decision.error, ConnectionError)
