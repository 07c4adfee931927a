"""Compensation of committed steps when a run fails for good (C32), unit-level.

Driven attempt by attempt with ``flexiq_plugins.testing``: a
``SimulatedCrash`` inside an undo is a worker killed between two
compensations; ``DurableRun.give_up`` is a framework that stops retrying.
The real-worker proofs are in ``tests/celery`` and ``tests/dramatiq``.
"""

from __future__ import annotations

from typing import Any

import pytest

from flexiq_plugins import Compensation, DurableConfig, NonRetryableError, RetryPolicy, current_job
from flexiq_plugins._attempt.decisions import Ack, AckReason, DeadLetter, PutBack, PutBackReason
from flexiq_plugins.errors import CompensationFailed, RunCompensated
from flexiq_plugins.operations import retry_dead_letter
from flexiq_plugins.testing import SimulatedCrash


class Shop:
    """Records what each step and undo did, with the idempotency key it saw."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str]] = []
        self.crash_refund = 0
        self.refund_failures = 0

    def do(self, what: str) -> Any:
        self.log.append((what, current_job.step.idempotency_key))
        return {"id": f"{what}-1", "items": ("a", "b")}

    def refund(self, charge: dict[str, Any]) -> None:
        if self.crash_refund:
            self.crash_refund -= 1
            raise SimulatedCrash("killed between the two undos")
        if self.refund_failures:
            self.refund_failures -= 1
            raise ConnectionError("payments API down")
        self.log.append((f"refund {charge['id']}", current_job.step.idempotency_key))

    def release(self, reservation: dict[str, Any]) -> None:
        self.log.append((f"release {reservation['id']}", current_job.step.idempotency_key))

    def undos(self) -> list[str]:
        return [what for what, _ in self.log if what.startswith(("refund", "release"))]


def saga(shop: Shop, failure: Exception, *, refund: Any = None) -> Any:
    """Charge, reserve, then ship, which fails with ``failure`` (after a sleep, so replays happen)."""

    def body() -> None:
        step = current_job.step
        step.run("charge", lambda: shop.do("charge"), compensate=refund or shop.refund)
        step.run("reserve", lambda: shop.do("reserve"), compensate=shop.release)
        step.sleep("1m")

        def ship() -> None:
            raise failure

        step.run("ship", ship, retry=RetryPolicy(max_attempts=2, initial_delay=0))

    return body


def test_c32_undos_run_once_each_in_reverse_commit_order(durable_run):
    """The third step fails for good: the reservation is released, then the charge refunded, each once,
    each with its own idempotency key; the run ends ``compensated`` and is dead-lettered with its reason."""
    shop = Shop()
    run = durable_run(saga(shop, NonRetryableError("carrier refused the parcel")))
    result = run.until_done()

    assert shop.undos() == ["release reserve-1", "refund charge-1"]
    assert dict(shop.log)["refund charge-1"] == "run-1:compensate:charge#0"
    assert dict(shop.log)["release reserve-1"] == "run-1:compensate:reserve#0"
    assert run.status == "compensated"
    assert isinstance(result.decision, DeadLetter)
    assert result.decision.reason == "non_retryable"
    assert "compensated: compensate:reserve#0, compensate:charge#0" in result.decision.message
    assert [d.reason for d in run.dead_letters] == ["non_retryable"]
    assert run.step_keys[-3:] == ["compensation:start", "compensate:reserve#0", "compensate:charge#0"]


def test_c32_an_exhausted_budget_compensates_and_the_undo_gets_the_decoded_value(durable_run):
    """``StepRetryExhausted`` fails the run for good too; each undo receives the step's value as stored
    (a tuple comes back a list under JSON, C7)."""
    shop = Shop()
    seen: list[Any] = []

    def refund(charge: dict[str, Any]) -> None:
        seen.append(charge["items"])

    run = durable_run(saga(shop, ConnectionError("carrier down"), refund=refund))
    result = run.until_done()

    assert result.decision.reason == "step_retry_exhausted"
    assert run.status == "compensated"
    assert seen == [["a", "b"]]


def test_c32_a_worker_killed_between_two_undos_runs_each_once(durable_run):
    """Killed inside the second undo: the next delivery replays the body only to register the undos,
    does not run the first undo again (memoized), runs the second, and ends ``compensated``."""
    shop = Shop()
    shop.crash_refund = 1
    run = durable_run(saga(shop, NonRetryableError("refused")))
    for _ in range(10):
        result = run.attempt()
        if result.sleeping:
            run.wake()
        elif not (result.crashed or result.step_retrying):
            break

    assert shop.undos() == ["release reserve-1", "refund charge-1"]
    assert run.status == "compensated"
    assert [d.reason for d in run.dead_letters] == ["non_retryable"]
    refunds = [(a.number, a.ended) for a in run.step_attempts if a.step_key == "compensate:charge#0"]
    assert refunds == [(1, "lost"), (2, None)]  # the killed undo used an attempt of its own budget


def test_c32_an_undo_that_fails_with_attempts_left_comes_back_after_its_backoff(durable_run):
    """An undo is a step with its own budget: a failure with attempts left is a step-retry put-back."""
    shop = Shop()
    shop.refund_failures = 1
    undo = Compensation(shop.refund, retry=RetryPolicy(max_attempts=3, initial_delay=30), name="refund")
    run = durable_run(saga(shop, NonRetryableError("refused"), refund=undo))
    decisions_seen = []
    for _ in range(10):
        result = run.attempt()
        decisions_seen.append(result.decision)
        if result.sleeping or result.step_retrying:
            run.wake()
        else:
            break

    retries = [o for o in decisions_seen if isinstance(o, PutBack) and o.reason is PutBackReason.STEP_RETRY]
    assert [o.detail for o in retries] == ["compensate:charge#0"]
    assert retries[0].delay == 30.0
    assert shop.undos() == ["release reserve-1", "refund charge-1"]
    assert run.status == "compensated"


def test_c32_an_undo_that_fails_for_good_dead_letters_compensation_failed(durable_run):
    """An undo whose budget is spent ends the run ``dead`` with reason ``compensation_failed``, naming the
    undo, its step and the failure that started the compensation."""
    shop = Shop()
    shop.refund_failures = 99
    undo = Compensation(shop.refund, retry=RetryPolicy(max_attempts=2, initial_delay=0), name="refund")
    run = durable_run(saga(shop, NonRetryableError("refused"), refund=undo))
    result = run.until_done()

    assert isinstance(result.error, CompensationFailed)
    assert run.status == "dead"
    (dead,) = run.dead_letters
    assert dead.reason == "compensation_failed"
    assert "compensate:charge#0" in dead.message
    assert "(refund)" in dead.message
    assert "non_retryable: refused" in dead.message
    assert shop.undos() == ["release reserve-1"]


def test_c32_an_undo_the_replay_no_longer_registers_is_compensation_failed(durable_run):
    """A committed step recorded an undo, but the code that replays it no longer passes ``compensate=``:
    the run is dead-lettered ``compensation_failed`` naming it, never silently left undone."""
    shop = Shop()
    version = {"v": 1}

    def body() -> None:
        step = current_job.step
        undo = Compensation(shop.refund, name="refund") if version["v"] == 1 else None
        step.run("charge", lambda: shop.do("charge"), compensate=undo)
        step.sleep("1m")
        step.run("ship", failing_with(NonRetryableError("refused")))

    run = durable_run(body)
    assert run.attempt().sleeping
    version["v"] = 2  # deployed while the run slept
    run.wake()
    result = run.attempt()

    assert isinstance(result.error, CompensationFailed)
    assert "'refund'" in str(result.error)
    assert "charge#0" in str(result.error)
    assert run.status == "dead"


def failing_with(error: Exception) -> Any:
    def body() -> None:
        raise error

    return body


def test_c32_when_the_framework_gives_up_the_next_delivery_compensates(durable_run):
    """An ordinary error that the framework stops retrying: ``give_up`` records it and asks for one more
    delivery, which replays the body only up to its last committed step (the failing step is not called
    again), runs the undos and is acknowledged: the framework already reported the failure."""
    shop = Shop()
    ship_calls: list[int] = []

    def body() -> None:
        step = current_job.step
        step.run("charge", lambda: shop.do("charge"), compensate=shop.refund)
        step.run("reserve", lambda: shop.do("reserve"), compensate=shop.release)

        def ship() -> None:
            ship_calls.append(1)
            raise ConnectionError("carrier down")

        step.run("ship", ship)

    run = durable_run(body)
    assert run.attempt().failed
    after = run.give_up()
    assert isinstance(after, PutBack)
    assert after.reason is PutBackReason.COMPENSATE
    assert run.status == "pending"

    result = run.attempt()
    assert result.decision == Ack(AckReason.COMPENSATED, result.decision.detail)
    assert shop.undos() == ["release reserve-1", "refund charge-1"]
    assert len(ship_calls) == 1
    assert run.status == "compensated"
    assert run.dead_letters == []


def test_c32_giving_up_on_a_run_without_undos_settles_it_failed(durable_run):
    """No committed step registered an undo: ``give_up`` marks the run ``failed`` as before (C26)."""

    def body() -> None:
        current_job.step.run("a", lambda: 1)
        current_job.step.run("b", failing_with(ValueError("bad")))

    run = durable_run(body)
    assert run.attempt().failed
    assert run.give_up() is None
    assert run.status == "failed"


def test_c32_a_step_that_failed_for_good_is_not_compensated(durable_run):
    """Only committed steps are undone: the failing step's own undo is never called."""
    shop = Shop()

    def body() -> None:
        step = current_job.step
        step.run("charge", lambda: shop.do("charge"), compensate=shop.refund)
        step.run("ship", failing_with(NonRetryableError("refused")), compensate=shop.release)

    run = durable_run(body)
    run.attempt()
    assert shop.undos() == ["refund charge-1"]


def test_c32_defects_dead_letter_without_compensating(durable_run):
    """A dead letter that points at a defect (here a duplicate step key) is fixed and retried by an
    operator: nothing is undone."""
    shop = Shop()

    def body() -> None:
        step = current_job.step
        step.run("charge", lambda: shop.do("charge"), compensate=shop.refund)
        step.run("x", lambda: 1, key="k")
        step.run("x", lambda: 2, key="k")

    run = durable_run(body)
    result = run.attempt()
    assert result.decision.reason == "duplicate_step_key"
    assert shop.undos() == []
    assert run.status == "dead"


def test_c32_async_undos_are_awaited(durable_run):
    """An undo may be ``async``: it is awaited, and sees its own idempotency key."""
    keys: list[str] = []

    async def refund(charge: Any) -> None:
        keys.append(current_job.step.idempotency_key)

    def body() -> None:
        current_job.step.run("charge", lambda: "ch_1", compensate=refund)
        current_job.step.run("ship", failing_with(NonRetryableError("refused")))

    run = durable_run(body)
    run.attempt()
    assert keys == ["run-1:compensate:charge#0"]
    assert run.status == "compensated"


def test_c32_a_compensated_run_is_not_retried_from_its_dead_letter(durable_run):
    """Retrying a compensated run's dead letter would only replay its compensation: refused, unless the
    operator resets it from a step."""
    shop = Shop()
    run = durable_run(saga(shop, NonRetryableError("refused")))
    run.until_done()
    (dead,) = run.dead_letters
    with pytest.raises(RunCompensated, match="reset-from"):
        retry_dead_letter(run.store, dead.id, {"test": lambda envelope, run_key: "job-2"})


def test_c32_a_dead_letter_retry_runs_the_failed_step_again_with_its_whole_budget(durable_run):
    """A run dead-lettered by an exhausted budget (no undos) is retried from the step that failed: that step
    and its attempts are dropped, so it runs again with all its attempts; earlier steps replay."""
    calls: list[int] = []
    charges: list[int] = []
    healthy = {"ok": False}

    def ship() -> str:
        calls.append(1)
        if not healthy["ok"]:
            raise ConnectionError("carrier down")
        return "shipped"

    def body() -> str:
        current_job.step.run("charge", lambda: charges.append(1) or "ch_1")
        return current_job.step.run("ship", ship, retry=RetryPolicy(max_attempts=2, initial_delay=0))

    run = durable_run(body, config=DurableConfig(keep_succeeded_steps=True))
    assert run.until_done().dead_lettered
    (dead,) = run.dead_letters
    healthy["ok"] = True
    retry_dead_letter(run.store, dead.id, {"test": lambda envelope, run_key: "job-2"})
    assert run.step_keys == ["charge#0"]
    assert run.attempt().completed
    assert (len(calls), len(charges)) == (3, 1)
    assert [(a.number, a.ended) for a in run.step_attempts] == [(1, None)]


def test_c32_retrying_a_compensation_failed_dead_letter_finishes_the_compensation(durable_run):
    """``flexiq dlq retry`` of a ``compensation_failed`` run drops only the failed undo (and its attempts):
    the next delivery replays, skips the undos already done and runs the failed one again with its whole
    budget; the run ends ``compensated``."""
    shop = Shop()
    shop.refund_failures = 2
    undo = Compensation(shop.refund, retry=RetryPolicy(max_attempts=2, initial_delay=0), name="refund")
    run = durable_run(saga(shop, NonRetryableError("refused"), refund=undo))
    assert isinstance(run.until_done().error, CompensationFailed)
    (dead,) = run.dead_letters

    retry_dead_letter(run.store, dead.id, {"test": lambda envelope, run_key: "job-2"})
    assert "compensate:charge#0" not in run.step_keys
    result = run.attempt()

    assert run.status == "compensated"
    assert shop.undos() == ["release reserve-1", "refund charge-1"]  # the release was not run again
    assert isinstance(result.decision, DeadLetter)
    assert result.decision.reason == "non_retryable"
