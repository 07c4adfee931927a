"""Cancelling runs (C34), unit-level: on request, and over a cap of the task, with compensation (C32).

Driven attempt by attempt with ``flexiq_plugins.testing.DurableRun``:
``run.cancel()`` is ``flexiq runs cancel`` from another process, the next
``run.attempt()`` is the delivery of the job's pending message. The
real-worker proofs are in ``tests/conformance``.
"""

from __future__ import annotations

from typing import Any

import pytest

from flexiq_plugins import CancellationPolicy, ConfigurationError, DurableConfig, JobCancelled, current_job
from flexiq_plugins._attempt.decisions import PutBack, PutBackReason, Replay
from flexiq_plugins.errors import RunCancelled
from flexiq_plugins.operations import cancel_run, find_stranded
from flexiq_plugins.testing import DurableRun


class Shop:
    """What the steps and undos did, in order."""

    def __init__(self) -> None:
        self.log: list[str] = []

    def do(self, what: str) -> str:
        self.log.append(what)
        return what

    def undo(self, what: str) -> None:
        self.log.append(f"undo {what}")


def sleepy(shop: Shop) -> Any:
    """Charge (with an undo), sleep an hour, ship."""
    step = current_job.step
    step.run("charge", lambda: shop.do("charge"), compensate=shop.undo)
    step.sleep("1h", name="cool_off")
    return step.run("ship", lambda: shop.do("ship"))


def test_c34_cancelling_a_sleeping_run_without_undos_ends_it_at_once_and_drops_its_wake_up() -> None:
    """A sleeping run with nothing to undo is ``cancelled`` at once with its reason; when its wake-up message
    arrives the run is finished, so the next step never runs (C26, C34)."""
    shop = Shop()

    def body() -> Any:
        step = current_job.step
        step.run("charge", lambda: shop.do("charge"))
        step.sleep("1h")
        return step.run("ship", lambda: shop.do("ship"))

    run = DurableRun(body)
    assert run.attempt().sleeping
    done = run.cancel("the customer changed their mind")
    assert (done.effect, done.status) == ("cancelled", "cancelled")
    assert (run.status, run.record.cancel_reason) == ("cancelled", "the customer changed their mind")
    run.wake()
    woken = run.attempt()
    assert isinstance(woken.decision, Replay)  # the wake-up replays the cancellation (C37)
    assert (woken.decision.status, str(woken.decision.error)) == (
        "cancelled",
        "the run was cancelled: the customer changed their mind",
    )
    assert shop.log == ["charge"]


def test_c34_cancelling_a_sleeping_run_with_undos_compensates_it_at_its_next_delivery() -> None:
    """With a committed undo the run waits for its compensation (``pending``); that delivery replays the body up
    to the sleep, runs the undo and ends the run ``cancelled``; ``ship`` never runs (C32, C34)."""
    shop = Shop()
    run = DurableRun(sleepy, shop)
    run.attempt()
    done = run.cancel("fraud check failed")
    assert (done.effect, done.status) == ("compensating", "pending")
    result = run.attempt()
    assert result.cancelled
    assert "compensated: compensate:charge#0" in result.decision.detail  # type: ignore[union-attr]
    assert shop.log == ["charge", "undo charge"]
    assert (run.status, run.record.cancel_reason) == ("cancelled", "fraud check failed")
    assert run.cancel("again").effect == "finished"


def test_c34_a_running_attempt_stops_at_its_next_step_boundary_and_runs_its_undos() -> None:
    """Cancelled while a step runs: that step still commits (its undo registered), then the body unwinds with an
    uncatchable ``RunCancelled``: no later code or step runs, the undos run, the run is ``cancelled`` (C34)."""
    shop = Shop()

    def body() -> Any:
        step = current_job.step

        def reserve() -> str:
            run.cancel("out of stock")  # from another process, while this step runs
            return shop.do("reserve")

        step.run("charge", lambda: shop.do("charge"), compensate=shop.undo)
        step.run("reserve", reserve, compensate=shop.undo)
        shop.do("after reserve")  # never reached
        return step.run("ship", lambda: shop.do("ship"))

    run = DurableRun(body)
    result = run.attempt()
    assert result.cancelled
    assert shop.log == ["charge", "reserve", "undo reserve", "undo charge"]
    assert run.record.cancel_reason == "out of stock"


def test_c34_a_body_that_swallows_the_cancellation_is_cancelled_all_the_same() -> None:
    """``except BaseException`` around a step does not save the run: the next step re-raises the signal and the
    attempt ends cancelled whatever the body returns (C21, C34)."""
    shop = Shop()

    def body() -> Any:
        step = current_job.step
        try:
            step.run("charge", lambda: run.cancel() and shop.do("charge"))
        except BaseException as exc:
            shop.do(type(exc).__name__)
        with pytest.raises(RunCancelled):
            step.run("ship", lambda: shop.do("ship"))
        return "shipped anyway"

    run = DurableRun(body)
    result = run.attempt()
    assert result.cancelled
    assert result.value is None
    assert shop.log == ["charge", "RunCancelled"]
    assert run.record.cancel_reason == "cancelled on request"


def test_c34_cancelling_a_waiting_run_ends_it_and_a_later_event_runs_nothing() -> None:
    """A run waiting for an event is cancelled at once; the event sent afterwards wakes nothing (C33, C34)."""
    shop = Shop()

    def body() -> Any:
        current_job.step.wait_for_event("payment", key="o-1")
        return shop.do("ship")

    run = DurableRun(body)
    assert run.attempt().waiting
    assert run.cancel("order abandoned").effect == "cancelled"
    sent = run.send_event("payment", "o-1", "paid")
    assert sent.left == []
    assert sent.woken == []
    replayed = run.attempt().decision
    assert isinstance(replayed, Replay)
    assert (replayed.status, type(replayed.error)) == ("cancelled", JobCancelled)
    assert shop.log == []


def test_c34_a_run_over_its_suspension_cap_is_put_back_at_the_cap_and_cancelled() -> None:
    """A one-hour sleep under a 10-minute suspension cap comes back after 10 minutes (not an hour) and ends
    ``cancelled`` with the cap as reason, its undo run (C32, C34)."""
    shop = Shop()
    run = DurableRun(sleepy, shop, config=DurableConfig(max_suspended_seconds="10m"))
    first = run.attempt()
    assert isinstance(first.decision, PutBack)
    assert first.decision.wake_at == run.clock() + 600
    run.wake()
    result = run.attempt()
    assert result.cancelled
    assert shop.log == ["charge", "undo charge"]
    assert "suspended longer than its cap of 600 s" in str(run.record.cancel_reason)


def test_c34_a_wait_without_a_timeout_comes_back_at_the_suspension_cap() -> None:
    """Under a cap, a wait that has no timeout still keeps a message in the broker: it is put back for the cap,
    and cancelled then if no event came (C33, C34)."""

    def body() -> Any:
        return current_job.step.wait_for_event("payment", key="o-1")

    run = DurableRun(body, config=DurableConfig(max_suspended_seconds=120))
    first = run.attempt()
    assert isinstance(first.decision, PutBack)
    assert first.decision.reason is PutBackReason.WAIT
    assert first.decision.wake_at == run.clock() + 120
    run.wake()
    assert run.attempt().cancelled


def test_c34_suspension_adds_up_over_sleeps_and_waits() -> None:
    """The cap counts all suspensions of the run: two 40-second sleeps and a 30-second wait go over 100 s (C34)."""

    def body() -> Any:
        step = current_job.step
        step.sleep(40, name="a")
        step.sleep(40, name="b")
        return step.wait_for_event("payment", key="o-1", timeout=60)

    run = DurableRun(body, config=DurableConfig(max_suspended_seconds=100))
    for _ in range(2):
        assert run.attempt().sleeping
        run.wake()
    waiting = run.attempt()
    assert isinstance(waiting.decision, PutBack)
    assert waiting.decision.wake_at == run.clock() + 20
    run.wake()
    assert run.attempt().cancelled


def test_c34_the_duration_cap_is_checked_before_each_new_step() -> None:
    """A run past ``max_run_seconds`` in the middle of an attempt stops before its next new step (C34)."""
    shop = Shop()

    def body() -> Any:
        step = current_job.step
        step.run("charge", lambda: shop.do("charge"), compensate=shop.undo)
        step.run("slow", lambda: run.clock.advance("2h") or shop.do("slow"))
        return step.run("ship", lambda: shop.do("ship"))

    run = DurableRun(body, config=DurableConfig(max_run_seconds="1h"))
    assert run.attempt().cancelled
    assert shop.log == ["charge", "slow", "undo charge"]
    assert "lasted longer than its cap of 3600 s" in str(run.record.cancel_reason)


def test_c34_a_task_option_overrides_the_integrations_cap() -> None:
    """A task's (or actor's) own ``max_suspended_seconds`` wins over the integration's option (C34)."""

    class Task:
        max_suspended_seconds = "1m"
        max_run_seconds = None

        def __call__(self) -> Any:
            current_job.step.sleep("1h")

    run = DurableRun(Task(), config=DurableConfig(max_suspended_seconds="1d"))
    first = run.attempt()
    assert isinstance(first.decision, PutBack)
    assert first.decision.wake_at == run.clock() + 60


@pytest.mark.parametrize("bad", [0, -5, "soon", "1 hour"])
def test_c34_a_cap_that_is_not_a_positive_duration_is_refused(bad: Any) -> None:
    """Caps are positive durations; anything else is a ``ConfigurationError`` naming the option (C34)."""
    with pytest.raises(ConfigurationError, match="max_run_seconds"):
        DurableConfig(max_run_seconds=bad)
    with pytest.raises(ConfigurationError, match="max_suspended_seconds"):
        CancellationPolicy(max_suspended_seconds=bad)


def test_c34_a_cancellation_that_lands_as_the_attempt_suspends_is_carried_out_by_recovery(
    flexiq_store: Any, flexiq_clock: Any
) -> None:
    """A request that no commit saw (the run suspended right after it) leaves the run ``sleeping`` with the
    request: recovery lists it at once, and the next delivery cancels it before any new step (C34, C35)."""
    shop = Shop()

    def body() -> Any:
        step = current_job.step
        step.run("charge", lambda: shop.do("charge"))
        step.sleep("1h")
        return step.run("ship", lambda: shop.do("ship"))

    run = DurableRun(body, store=flexiq_store, clock=flexiq_clock)
    run.attempt()
    flexiq_store.request_cancel("run-1", "late request")  # what a cancel during the last instant leaves
    assert [s.why for s in find_stranded(flexiq_store)] == ["cancel_requested"]
    assert run.attempt().cancelled
    assert shop.log == ["charge"]


def test_c34_cancel_run_of_an_unknown_or_finished_run() -> None:
    """An unknown run raises ``UnknownRun`` (the CLI exits 3); a finished one is left alone (C34)."""
    from flexiq_plugins import UnknownRun

    run = DurableRun(lambda: current_job.step.run("a", lambda: 1))
    assert run.attempt().completed
    assert cancel_run("run-1", store=run.store, publishers={}).effect == "finished"
    with pytest.raises(UnknownRun):
        cancel_run("nope", store=run.store, publishers={})
