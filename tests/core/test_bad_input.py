"""Bad input to the step API: a typed error, before anything runs, and a dead letter at once (C2, C19, C29).

Every mistake here is deterministic: a retry would make it again. So each
raises a :class:`StepUsageError` subclass naming the value and what is
accepted, commits nothing, and, escaping the task body, is dead-lettered at
once with a reason of the ``invalid_*`` family, never retried under the task's
policy (Dramatiq's default would retry 20 times). Store-side bad rows (a step
row without a value, a job envelope that is not JSON) are in
``tests/test_store_bad_rows.py``; the command line's in ``tests/cli/test_cli_bad_input.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from flexiq_plugins import InvalidRunKey, StepRow, current_job
from flexiq_plugins._attempt import decisions
from flexiq_plugins._model.identity import check_run_key
from flexiq_plugins.errors import (
    CorruptRecord,
    Disposition,
    InvalidDuration,
    InvalidStepBody,
    InvalidStepKey,
    InvalidStepName,
    InvalidWakeTime,
    NotInStep,
    StepUsageError,
    classify,
)

START = 1_700_000_000.0
"""Where the core tests' fake store clock starts (``tests/core/conftest.py``)."""

CHARGES: list[str] = []


def charge(order: str) -> dict[str, str]:
    """A side effect that must run only inside a step."""
    CHARGES.append(order)
    return {"order": order}


async def fetch() -> int:
    """An async step body, wrongly given to ``step.run``."""
    return 1


def _step() -> Any:
    return current_job.step


BAD_CALLS: list[tuple[str, Callable[[], Any], type[StepUsageError], str, str]] = [
    ("duration-words", lambda: _step().sleep("1 hour"), InvalidDuration, "invalid_duration", "'1h30m'"),
    ("duration-10**400", lambda: _step().sleep(10**400), InvalidDuration, "invalid_duration", "too large"),
    ("duration-1e18", lambda: _step().sleep(1e18), InvalidDuration, "invalid_duration", "longest sleep"),
    (
        "duration-a-datetime",
        lambda: _step().sleep(datetime(2030, 1, 1, tzinfo=timezone.utc)),
        InvalidDuration,
        "invalid_duration",
        "sleep_until",
    ),
    ("wake-naive", lambda: _step().sleep_until(datetime(2030, 1, 1)), InvalidWakeTime, "invalid_wake_time", "aware"),
    (
        "wake-beyond-366-days",
        lambda: _step().sleep_until(datetime.fromtimestamp(START, timezone.utc) + timedelta(days=367)),
        InvalidWakeTime,
        "invalid_wake_time",
        "366 days",
    ),
    ("body-a-value", lambda: _step().run("charge", charge("o-1")), InvalidStepBody, "invalid_step_body", "lambda"),
    ("body-a-coroutine", lambda: _step().run("fetch", fetch), InvalidStepBody, "invalid_step_body", "arun"),
    ("name-surrogate", lambda: _step().run("a\ud800", lambda: 1), InvalidStepName, "invalid_step_name", "surrogate"),
    (
        "key-surrogate",
        lambda: _step().run("a", lambda: 1, key="k\udcff"),
        InvalidStepKey,
        "invalid_step_key",
        "surrogate",
    ),
    ("name-empty", lambda: _step().run("", lambda: 1), InvalidStepName, "invalid_step_name", "is empty"),
    ("key-read-outside-a-step", lambda: _step().idempotency_key, NotInStep, "invalid_idempotency_key_read", "inside"),
]


@pytest.mark.parametrize(("body", "error", "reason", "hint"), [c[1:] for c in BAD_CALLS], ids=[c[0] for c in BAD_CALLS])
def test_c29_a_step_usage_error_is_dead_lettered_at_once_with_an_invalid_reason(harness, body, error, reason, hint):
    """Each bad call raises its typed error naming the fix, commits nothing, and dead-letters: no retry."""
    CHARGES.clear()
    decision = harness.run(body)
    assert isinstance(decision, decisions.DeadLetter), decision
    assert isinstance(decision.error, error)
    assert classify(decision.error) is Disposition.DEAD_LETTER
    assert decision.reason == reason
    assert reason.startswith("invalid_")  # one family: nothing a retry could fix
    assert hint in decision.message
    assert harness.store.get_steps(harness.run_key) == []
    assert harness.store.get_run(harness.run_key).status == "dead"
    assert len(CHARGES) <= 1  # the value passed as a body ran once, outside the step, before it


def test_c29_a_value_given_as_the_body_is_refused_before_the_step_runs_anything(harness):
    """``step.run("charge", charge("o-1"))`` says the value was computed outside the step; no step is entered."""
    CHARGES.clear()
    decision = harness.run(lambda: _step().run("charge", charge("o-1")))
    assert isinstance(decision.error, InvalidStepBody)
    assert "got a dict as its body, not a callable" in decision.message
    assert "outside it, and is not memoized" in decision.message
    assert CHARGES == ["o-1"]  # by Python, before step.run was called; the step itself called nothing


def test_c29_a_coroutine_returned_to_run_is_closed_and_named(harness, recwarn):
    """A body returning a coroutine is dead-lettered as ``invalid_step_body`` and the coroutine never warns."""
    decision = harness.run(lambda: _step().run("fetch", fetch))
    assert decision.reason == "invalid_step_body"
    assert "returned an awaitable (coroutine)" in decision.message
    assert not [w for w in recwarn if "never awaited" in str(w.message)]


def test_c29_a_coroutine_object_given_to_arun_is_refused_and_closed(harness, recwarn):
    """``await step.arun("fetch", fetch())`` (a coroutine, not a function) is ``InvalidStepBody``; no warning."""

    async def body() -> Any:
        return await _step().arun("fetch", fetch())

    decision = asyncio.run(harness.start().arun(body))
    assert isinstance(decision.error, InvalidStepBody)
    assert not [w for w in recwarn if "never awaited" in str(w.message)]


def test_c19_usage_errors_are_value_errors_callers_may_still_catch(harness):
    """The typed errors stay ``ValueError``/``TypeError``: a body that catches one and goes on completes (C19)."""

    def body() -> str:
        step = _step()
        with pytest.raises(ValueError, match="'1h30m'"):
            step.sleep("1 hour")
        with pytest.raises(TypeError, match="not a callable"):
            step.run("x", 42)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="timezone-aware"):
            step.sleep_until(datetime(2030, 1, 1))
        return "handled"

    assert harness.run(body) == decisions.Completed("handled")


@pytest.mark.parametrize(
    "run_key",
    [pytest.param("a\x00b", id="nul"), pytest.param("r\ud800", id="lone-surrogate"), pytest.param("a\nb", id="nl")],
)
def test_c11_a_run_key_with_a_nul_or_a_surrogate_is_invalid_run_key_before_the_store(harness, run_key):
    """A run key the database could not store (a NUL, a lone surrogate) is ``InvalidRunKey``, not a SQL error."""
    with pytest.raises(InvalidRunKey, match="control character or a lone surrogate"):
        check_run_key(run_key)
    with pytest.raises(InvalidRunKey):
        harness.driver.start(harness.job(run_key=run_key))
    assert harness.store.list_runs() == []


def test_c5_a_stored_run_step_without_a_value_is_a_corrupt_record(harness):
    """A ``run`` row whose value is NULL is ``CorruptRecord`` on replay, dead-lettered ``corrupt_record``."""
    begun = harness.store.begin(harness.run_key, "job-0", harness.job().envelope, "w", 30.0)
    harness.store.commit_step(begun.claim, StepRow(0, "charge#0", "run", None))
    harness.store.finish(begun.claim, "retrying")
    calls: list[int] = []

    decision = harness.run(lambda: _step().run("charge", lambda: calls.append(1)))
    assert isinstance(decision, decisions.DeadLetter)
    assert isinstance(decision.error, CorruptRecord)
    assert decision.reason == "corrupt_record"
    assert "'charge#0'" in decision.message
    assert "has no stored value (NULL)" in decision.message
    assert calls == []


def test_c17_a_stored_sleep_step_without_a_wake_time_is_a_corrupt_record(harness):
    """A ``sleep`` row without its wake time is ``CorruptRecord`` too, not a sleep that is always due."""
    begun = harness.store.begin(harness.run_key, "job-0", harness.job().envelope, "w", 30.0)
    harness.store.commit_step(begun.claim, StepRow(0, "sleep#0", "sleep", None, None))
    harness.store.finish(begun.claim, "sleeping")

    decision = harness.run(lambda: _step().sleep("1h"))
    assert decision.reason == "corrupt_record"
    assert "has no wake time" in decision.message
