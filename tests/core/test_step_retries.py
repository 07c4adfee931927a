"""Per-step durable retry budgets, non-retryable errors and stored failures (C31), unit-level.

Each test drives a body attempt by attempt with ``flexiq_plugins.testing``
(``durable_run``), the way a worker would: a step retry is a put-back whose
backoff the fake clock lets pass, a ``SimulatedCrash`` inside a step body is a
killed worker. What must be proven with real processes and brokers is in
``tests/celery/test_celery_step_retries.py`` and ``tests/dramatiq/test_dramatiq_step_retries.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from flexiq_plugins import (
    ConfigurationError,
    DurableConfig,
    NonRetryableError,
    RetryPolicy,
    StepRetryExhausted,
    current_job,
)
from flexiq_plugins._attempt.decisions import PutBack, PutBackReason
from flexiq_plugins._model.failures import MAX_MESSAGE_CHARS, error_text, rebuild_error
from flexiq_plugins.errors import (
    Disposition,
    InvalidStepOption,
    classify,
    compensates,
    final_reason,
    mark_final,
    reason_of,
)
from flexiq_plugins.testing import SimulatedCrash


class Declined(Exception):
    """A payment error with its own constructor, as user code has."""

    def __init__(self, code: str, detail: str = "") -> None:
        super().__init__(f"declined ({code}) {detail}".strip())
        self.code = code


def failing(calls: list[int], error: Exception | None = None) -> Any:
    """A step body that records each call and always raises ``error`` (a ``ConnectionError`` by default)."""

    def body() -> Any:
        calls.append(1)
        raise error if error is not None else ConnectionError(f"carrier down (call {len(calls)})")

    return body


def test_c31_an_always_failing_step_runs_exactly_max_attempts_times(durable_run):
    """``max_attempts=5``: five calls, each failure a put-back (``step_retry``, not a task retry), the last
    one exhausted: one dead letter ``step_retry_exhausted`` and attempts 1..5 recorded, the last marked exhausted."""
    calls: list[int] = []

    def body() -> None:
        current_job.step.run("ship", failing(calls), retry=RetryPolicy(max_attempts=5, initial_delay=1))

    run = durable_run(body)
    reasons = []
    for _ in range(4):
        result = run.attempt()
        assert result.step_retrying
        assert not result.failed
        reasons.append(result.decision.reason)
        run.wake()
    last = run.attempt()

    assert last.dead_lettered
    assert isinstance(last.error, StepRetryExhausted)
    assert len(calls) == 5
    assert reasons == [PutBackReason.STEP_RETRY] * 4
    assert [(a.number, a.ended) for a in run.step_attempts] == [
        (1, "failed"),
        (2, "failed"),
        (3, "failed"),
        (4, "failed"),
        (5, "exhausted"),
    ]
    assert all(a.error_type == "ConnectionError" and "carrier down" in (a.message or "") for a in run.step_attempts)
    assert [d.reason for d in run.dead_letters] == ["step_retry_exhausted"]
    assert run.status == "dead"
    assert last.error.attempts == 5
    assert isinstance(last.error.last_error, ConnectionError)


def test_c31_backoff_grows_by_the_multiplier_up_to_max_delay(durable_run, flexiq_clock):
    """Delays 1, 2, 4 then capped at 5 s; each put-back's wake time is the failure time plus the delay (store clock)."""
    calls: list[int] = []
    policy = RetryPolicy(max_attempts=6, initial_delay=1, multiplier=2, max_delay=5)

    def body() -> None:
        current_job.step.run("ship", failing(calls), retry=policy)

    run = durable_run(body)
    delays = []
    for _ in range(4):
        before = flexiq_clock()
        result = run.attempt()
        assert isinstance(result.decision, PutBack)
        delays.append(result.decision.delay)
        assert result.decision.wake_at == before + result.decision.delay
        run.wake()
    assert delays == [1.0, 2.0, 4.0, 5.0]


def test_c31_jitter_adds_at_most_jitter_seconds():
    """``jitter`` adds a random share of up to ``jitter`` seconds to each computed delay."""
    policy = RetryPolicy(initial_delay=10, jitter=3)
    assert policy.delay_after(1, rng=lambda: 0.0) == 10.0
    assert policy.delay_after(1, rng=lambda: 0.5) == 11.5
    assert policy.delay_after(2, rng=lambda: 0.999) < 23.0


def test_c31_a_worker_killed_inside_the_body_uses_an_attempt(durable_run):
    """Attempts are journaled before the body runs: three crashes inside the body with ``max_attempts=3``
    spend the budget; the next delivery raises ``StepRetryExhausted`` without calling the body."""
    calls: list[int] = []

    def crash() -> None:
        calls.append(1)
        raise SimulatedCrash("killed inside the step body")

    def body() -> None:
        current_job.step.run("charge", crash, retry=RetryPolicy(max_attempts=3))

    run = durable_run(body)
    assert [run.attempt().crashed for _ in range(3)] == [True, True, True]
    last = run.attempt()

    assert len(calls) == 3
    assert last.dead_lettered
    assert isinstance(last.error, StepRetryExhausted)
    assert last.error.last_error is None  # no error was raised: the worker died
    assert [(a.number, a.ended) for a in run.step_attempts] == [(1, "lost"), (2, "lost"), (3, "exhausted")]
    assert "worker was lost" in (run.step_attempts[-1].message or "")
    assert run.record.takeovers == 3


def test_c31_an_early_delivery_waits_for_the_backoff_without_an_attempt(durable_run, flexiq_clock):
    """A copy delivered before the retry is due (a duplicate, a hop, a recovery) is put back for the time
    left: the body is not called and no attempt is journaled."""
    calls: list[int] = []

    def body() -> None:
        current_job.step.run("ship", failing(calls), retry=RetryPolicy(max_attempts=3, initial_delay=60))

    run = durable_run(body)
    first = run.attempt()
    flexiq_clock.advance(20)
    early = run.attempt()

    assert early.step_retrying
    assert early.decision.wake_at == first.decision.wake_at
    assert early.decision.delay == pytest.approx(40.0)
    assert len(calls) == 1
    assert len(run.step_attempts) == 1


def test_c31_a_step_that_succeeds_on_a_later_attempt_commits_once(durable_run):
    """Two failures then a success: the value is committed and replayed; the task completes."""
    errors = iter([ConnectionError("a"), ConnectionError("b"), None])

    def flaky() -> str:
        error = next(errors)
        if error is not None:
            raise error
        return "shipped"

    def body() -> str:
        shipped = current_job.step.run("ship", flaky, retry=RetryPolicy(max_attempts=5))
        current_job.step.sleep("1m")
        return shipped

    run = durable_run(body, config=DurableConfig(keep_succeeded_steps=True))
    done = run.until_done()

    assert done.completed
    assert done.value == "shipped"
    assert [(a.number, a.ended) for a in run.step_attempts] == [(1, "failed"), (2, "failed"), (3, None)]


def test_c31_exhausted_is_catchable_and_replays_identically(durable_run):
    """The body may catch ``StepRetryExhausted`` and carry on; every replay raises it again, with the
    attempts and the last error, without calling the body."""
    calls: list[int] = []
    seen: list[tuple[int, str]] = []

    def body() -> str:
        step = current_job.step
        try:
            step.run("ship", failing(calls), retry=RetryPolicy(max_attempts=2, initial_delay=0))
        except StepRetryExhausted as exc:
            seen.append((exc.attempts, type(exc.last_error).__name__))
        step.sleep("1m")
        return "notified the customer"

    run = durable_run(body)
    done = run.until_done()

    assert done.completed
    assert done.value == "notified the customer"
    assert len(calls) == 2
    assert seen == [(2, "ConnectionError"), (2, "ConnectionError")]  # the exhausting attempt, then the replay


def test_c31_a_non_retryable_error_runs_the_body_once(durable_run):
    """A ``NonRetryableError`` inside a step with a budget: one call, the step failed for good, the run
    dead-lettered ``non_retryable``, no retry of any kind."""
    calls: list[int] = []

    def body() -> None:
        current_job.step.run("charge", failing(calls, NonRetryableError("card expired")), retry=RetryPolicy())

    run = durable_run(body)
    result = run.attempt()

    assert result.dead_lettered
    assert isinstance(result.error, NonRetryableError)
    assert len(calls) == 1
    assert [(a.number, a.ended, a.error_type) for a in run.step_attempts] == [
        (1, "non_retryable", "flexiq_plugins.errors.NonRetryableError")
    ]
    assert [d.reason for d in run.dead_letters] == ["non_retryable"]


def test_c31_a_failed_step_replays_the_same_error_type_and_message(durable_run):
    """``no_retry_on`` fails the step for good on the user's own error; a body that catches it sees the
    same class and message on the first attempt and on every replay, and the body is never called again."""
    calls: list[int] = []
    caught: list[tuple[type, str]] = []

    def body() -> str:
        step = current_job.step
        try:
            step.run(
                "charge", failing(calls, Declined("51", "insufficient funds")), retry=RetryPolicy(no_retry_on=Declined)
            )
        except Declined as exc:
            caught.append((type(exc), str(exc)))
        step.sleep("1m")
        return "declined"

    run = durable_run(body)
    assert run.until_done().completed

    assert len(calls) == 1
    assert caught == [(Declined, "declined (51) insufficient funds")] * 2


def test_c31_an_error_outside_retry_on_fails_the_step_for_good(durable_run):
    """``retry_on`` names what the budget retries; any other error fails the step for good at once."""
    calls: list[int] = []

    def body() -> None:
        current_job.step.run("ship", failing(calls, KeyError("sku")), retry=RetryPolicy(retry_on=(ConnectionError,)))

    run = durable_run(body)
    result = run.attempt()
    assert result.dead_lettered
    assert isinstance(result.error, KeyError)
    assert final_reason(result.error) == "non_retryable"
    assert len(calls) == 1


def test_c31_a_final_error_is_never_retried_by_the_task(durable_run):
    """The error of a step that failed for good is marked final: classified as a dead letter before any
    retry filter, so ``autoretry_for=(Exception,)`` or Dramatiq's ``Retries`` never see it as retryable."""
    error = mark_final(Declined("05"), "non_retryable")
    assert classify(error) is Disposition.DEAD_LETTER
    assert reason_of(error) == "non_retryable"
    assert compensates(error)
    assert classify(NonRetryableError("x")) is Disposition.DEAD_LETTER
    assert not compensates(ValueError("ordinary"))


def test_c31_non_retryable_in_a_step_without_a_budget_fails_it_for_good(durable_run):
    """A step with no budget that raises ``NonRetryableError`` is stored failed too: replays re-raise it."""
    calls: list[int] = []

    def body() -> None:
        current_job.step.run("charge", failing(calls, NonRetryableError("fraud suspected")))

    run = durable_run(body)
    assert run.attempt().dead_lettered
    assert run.step_keys == ["charge#0"]
    assert len(calls) == 1


def test_c31_a_plain_step_failure_is_recorded_and_left_to_the_task(durable_run):
    """Without a budget a failing step commits nothing and the task's retry policy decides (C6, C28); the
    failure is recorded: its error type, message, traceback, attempt number and time."""
    errors = iter([ConnectionError("smtp down"), None])

    def send() -> str:
        error = next(errors)
        if error is not None:
            raise error
        return "sent"

    def body() -> str:
        return current_job.step.run("receipt", send)

    run = durable_run(body)
    assert run.attempt().failed
    (recorded,) = run.step_attempts
    assert (recorded.number, recorded.ended, recorded.error_type, recorded.message) == (
        1,
        "failed",
        "ConnectionError",
        "smtp down",
    )
    assert "ConnectionError: smtp down" in (recorded.traceback or "")
    assert recorded.failed_at is not None
    assert recorded.retry_at is None
    assert run.attempt().completed


def test_c31_the_task_default_policy_applies_unless_the_step_says_otherwise(durable_run):
    """``step_retry`` (here the integration option) budgets every step; ``retry=`` overrides it and
    ``retry=False`` opts a step out (its failure goes to the task's own retries)."""
    calls: dict[str, list[int]] = {"default": [], "own": [], "none": []}

    def body(which: str) -> None:
        retry = {"default": None, "own": RetryPolicy(max_attempts=2), "none": False}[which]
        current_job.step.run("s", failing(calls[which]), retry=retry)

    config = DurableConfig(step_retry={"max_attempts": 4, "initial_delay": 0})
    for which in calls:
        run = durable_run(body, which, config=config)
        result = run.until_done(max_attempts=10) if which != "none" else run.attempt()
        assert result.failed if which == "none" else result.dead_lettered
    assert {k: len(v) for k, v in calls.items()} == {"default": 4, "own": 2, "none": 1}


def test_c31_a_task_attribute_step_retry_is_used_by_durable_run(durable_run):
    """A task's own ``step_retry`` (the Celery task attribute / Dramatiq actor option) is its steps' default."""
    calls: list[int] = []

    def body() -> None:
        current_job.step.run("s", failing(calls))

    body.step_retry = RetryPolicy(max_attempts=2, initial_delay=0)  # type: ignore[attr-defined]
    assert durable_run(body).until_done().dead_lettered
    assert len(calls) == 2


def test_c31_arun_has_the_same_budget(durable_run):
    """``await step.arun(..., retry=...)`` counts and backs off exactly like ``run``."""
    calls: list[int] = []

    async def ship() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("later")
        return "shipped"

    async def body() -> str:
        return await current_job.step.arun("ship", ship, retry=RetryPolicy(max_attempts=3, initial_delay=0))

    def sync_body() -> str:
        return asyncio.run(body())

    run = durable_run(sync_body)
    done = run.until_done()
    assert done.completed
    assert done.value == "shipped"
    assert len(calls) == 3


def test_c31_a_step_retry_cannot_be_swallowed(durable_run):
    """The step-retry signal is a ``BaseException`` and latched: a body that catches it and returns fails
    with ``SwallowedStepSignal`` (C21) instead of silently skipping the retry."""

    def body() -> str:
        with contextlib.suppress(BaseException):  # the mistake under test
            current_job.step.run("ship", failing([]), retry=RetryPolicy())
        return "done?"

    result = durable_run(body).attempt()
    assert result.dead_lettered
    assert result.decision.reason == "swallowed_signal"


def test_c31_bad_retry_and_compensate_arguments_are_refused(durable_run):
    """``retry=3`` or ``compensate="refund"`` raise ``InvalidStepOption`` (a ``TypeError``) naming what is accepted."""

    def body(kind: str) -> None:
        options: dict[str, Any] = {"retry": 3} if kind == "retry" else {"compensate": "refund"}
        current_job.step.run("s", lambda: 1, **options)

    for kind in ("retry", "compensate"):
        result = durable_run(body, kind).attempt()
        assert isinstance(result.error, InvalidStepOption)
        assert isinstance(result.error, TypeError)
        assert "RetryPolicy" in str(result.error) or "callable" in str(result.error)
        assert result.decision.reason == "invalid_step_option"


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"max_attempts": 0}, "max_attempts"),
        ({"max_attempts": True}, "max_attempts"),
        ({"initial_delay": -1}, "initial_delay"),
        ({"max_delay": "soon"}, "max_delay"),
        ({"multiplier": 0.5}, "multiplier"),
        ({"retry_on": "ConnectionError"}, "retry_on"),
        ({"no_retry_on": (ValueError, 3)}, "no_retry_on"),
    ],
)
def test_c31_retry_policy_refuses_bad_values(fields: dict[str, Any], named: str):
    """A bad field raises ``ConfigurationError`` (a ``ValueError``) naming the field."""
    with pytest.raises(ConfigurationError, match=named):
        RetryPolicy(**fields)


def test_c31_retry_policy_accepts_durations_and_a_settings_dict():
    """Delays take seconds or duration strings; a settings dict builds a policy; unknown fields are refused."""
    policy = RetryPolicy.from_mapping({"max_attempts": 4, "initial_delay": "500ms", "max_delay": "2m"})
    assert (policy.max_attempts, policy.initial_delay, policy.max_delay) == (4, 0.5, 120.0)
    with pytest.raises(ConfigurationError, match="attempts"):
        RetryPolicy.from_mapping({"attempts": 4})
    with pytest.raises(ConfigurationError, match="step_retry"):
        DurableConfig(step_retry=5)  # type: ignore[arg-type]


def test_c31_stored_failures_are_cut_to_their_longest_lengths():
    """A huge message is cut to ``MAX_MESSAGE_CHARS``; a traceback keeps its end within the given length."""
    try:
        raise ValueError("x" * 10_000)
    except ValueError as exc:
        text = error_text(exc, max_traceback=500)
    assert len(text.message) == MAX_MESSAGE_CHARS
    assert len(text.traceback) <= 500 + len("… (truncated)\n")
    assert text.traceback.startswith("… (truncated)")
    assert text.traceback.rstrip().endswith("x" * 20)


def test_c31_a_stored_error_class_that_is_gone_replays_as_non_retryable():
    """A class that cannot be imported any more (renamed by a deploy) is replayed as ``NonRetryableError``
    naming it, never as a crash of the replay."""
    error = rebuild_error("shop.payments.GoneError", "declined")
    assert isinstance(error, NonRetryableError)
    assert "shop.payments.GoneError: declined" in str(error)
    assert isinstance(rebuild_error("ConnectionError", "down"), ConnectionError)
    rebuilt = rebuild_error(f"{__name__}.Declined", "declined (51)")
    assert isinstance(rebuilt, Declined)
    assert str(rebuilt) == "declined (51)"


def test_c31_recovery_waits_for_a_step_retry_not_for_an_older_sleep(durable_run, flexiq_clock):
    """A run waiting for a step retry is ``sleeping`` until the retry is due: recovery (C35) takes it only
    once the retry time is overdue, not because an earlier sleep's wake time has long passed."""
    from flexiq_plugins.operations import find_stranded, show_run

    def body() -> None:
        step = current_job.step
        step.sleep("1m")
        step.run("ship", failing([]), retry=RetryPolicy(max_attempts=3, initial_delay=600))

    run = durable_run(body)
    run.attempt()
    run.wake()
    retrying = run.attempt()
    assert retrying.step_retrying
    assert show_run(run.store, run.run_key).wake_at == retrying.decision.wake_at

    flexiq_clock.advance(300)
    assert find_stranded(run.store, grace=60) == []
    flexiq_clock.advance(400)
    (stranded,) = find_stranded(run.store, grace=60)
    assert (stranded.why, stranded.due_at) == ("sleep_overdue", retrying.decision.wake_at)
