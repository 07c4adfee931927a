"""Signals that cannot be caught away, C20 and C21.

The sleep and divergence signals are not ``Exception``s, and a body that catches
them anyway (bare ``except:``) and returns is failed regardless, naming what it
swallowed.
"""

from __future__ import annotations

from unittest.mock import ANY

import pytest

from flexiq_plugins import StepDivergence, current_job
from flexiq_plugins._attempt import decisions
from flexiq_plugins.errors import SleepSignal, StepSignal, SwallowedStepSignal


@pytest.mark.parametrize("signal", [SleepSignal, StepDivergence, StepSignal])
def test_c20_signals_derive_from_base_exception_not_exception(signal):
    """Sleep and divergence signals are ``BaseException`` subclasses that ``except Exception`` misses."""
    assert issubclass(signal, BaseException)
    assert not issubclass(signal, Exception)


def test_c20_except_exception_around_a_sleep_does_not_catch_it(harness):
    """A task's ``except Exception`` lets the sleep through: the attempt ends Sleeping."""
    caught: list[Exception] = []

    def body():
        try:
            current_job.step.sleep("1h")
        except Exception as exc:
            caught.append(exc)
        return "ran on"

    assert harness.run(body) == decisions.PutBack(decisions.PutBackReason.SLEEP, ANY, ANY, ANY)
    assert caught == []


def test_c21_swallowed_sleep_with_bare_except_is_dead_lettered(harness):
    """A bare ``except:`` that swallows the sleep and returns ends in DeadLetter naming SleepSignal."""
    after: list[str] = []

    def body():
        try:  # noqa: SIM105 - a task body swallowing on purpose is the case under test
            current_job.step.sleep("1h")
        except:  # noqa: E722 - the point of the test
            pass
        after.append("ran without a claim")
        return "returned anyway"

    decision = harness.run(body)
    assert isinstance(decision, decisions.DeadLetter)
    assert decision.reason == "swallowed_signal"
    assert isinstance(decision.error, SwallowedStepSignal)
    assert "SleepSignal" in decision.message
    assert "returned anyway" in decision.message
    assert after == ["ran without a claim"]
    assert harness.store.get_run(harness.run_key).status == "dead"


def test_c21_swallowed_sleep_then_another_step_re_raises_the_sleep(harness):
    """After a swallowed sleep, the next step raises the latched signal again and runs nothing."""
    calls: list[str] = []

    def body():
        try:  # noqa: SIM105 - a task body swallowing on purpose is the case under test
            current_job.step.sleep("1h")
        except BaseException:
            pass
        current_job.step.run("after", lambda: calls.append("after"))

    decision = harness.run(body)
    assert calls == []
    assert decision == decisions.PutBack(decisions.PutBackReason.SLEEP, ANY, ANY, ANY)


def test_c21_swallowed_divergence_is_dead_lettered_naming_step_divergence(harness):
    """``except BaseException`` around a diverged step, then returning: DeadLetter naming StepDivergence."""

    def record():
        current_job.step.run("charge", lambda: 1)
        raise RuntimeError("keep the row")

    harness.run(record)

    def body():
        try:  # noqa: SIM105 - a task body swallowing on purpose is the case under test
            current_job.step.run("refund", lambda: 2)
        except BaseException:
            pass
        return "wrong answer"

    decision = harness.run(body)
    assert isinstance(decision, decisions.DeadLetter)
    assert isinstance(decision.error, SwallowedStepSignal)
    assert decision.reason == "swallowed_signal"
    assert "StepDivergence" in decision.message


def test_c21_swallowed_signal_replaced_by_another_error_is_still_dead_lettered(harness):
    """Catching the sleep and raising an ordinary error instead is not a retry: it is SwallowedStepSignal."""

    def body():
        try:
            current_job.step.sleep("1h")
        except BaseException:
            raise ValueError("converted") from None

    decision = harness.run(body)
    assert isinstance(decision, decisions.DeadLetter)
    assert isinstance(decision.error, SwallowedStepSignal)
    assert "raised ValueError instead" in decision.message
