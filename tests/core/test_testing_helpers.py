"""``flexiq_plugins.testing`` and its pytest fixtures: what users test their durable bodies with.

These tests use the fixtures exactly as a user's suite gets them, through the
``pytest11`` entry point (``durable_run``, ``flexiq_clock``, ``flexiq_store``).
"""

from __future__ import annotations

from typing import Any

import pytest

from flexiq_plugins import current_job
from flexiq_plugins.testing import START, DurableRun, FakeClock, task_body

CHARGES: list[str] = []


def checkout(order_id: str) -> str:
    """The seed's checkout: charge once, wait an hour, send the receipt."""
    step = current_job.step
    charge = step.run("charge", lambda: CHARGES.append(step.idempotency_key) or {"id": f"ch-{order_id}"})
    step.sleep("1h")
    return step.run("receipt", lambda: f"receipt for {charge['id']}")


@pytest.fixture(autouse=True)
def _no_charges() -> None:
    CHARGES.clear()


def test_testing_a_run_goes_attempt_by_attempt_through_a_crash_and_a_sleep(durable_run):
    """A crash after step 1 keeps the charge; the next attempt replays it, sleeps; after the wake it completes."""
    run = durable_run(checkout, "o-1")
    crashed = run.attempt(crash_after_steps=1)
    assert crashed.crashed
    assert run.step_keys == ["charge#0"]
    assert run.status == "running"  # the dead worker's claim is still held

    slept = run.attempt()
    assert slept.sleeping
    assert slept.number == 2
    assert run.record.takeovers == 1  # the redelivery took the claim over
    assert run.value_of("charge#0") == {"id": "ch-o-1"}

    run.wake()
    done = run.attempt()
    assert done.completed
    assert done.value == "receipt for ch-o-1"
    assert CHARGES == ["run-1:charge#0"]  # one charge, one idempotency key (C5, C10)


def test_testing_until_done_lets_sleeps_elapse_and_retries_failures(durable_run, flexiq_clock):
    """``until_done`` wakes every sleep and retries a failing step; the body's steps each committed once."""
    flaky = iter([ConnectionError("blip"), None])

    def body() -> str:
        step = current_job.step
        step.run("a", lambda: "A")
        step.sleep("10m")

        def b() -> str:
            error = next(flaky)
            if error is not None:
                raise error
            return "B"

        return step.run("b", b)

    run = durable_run(body)
    result = run.until_done()
    assert result.completed
    assert result.value == "B"
    assert [r.sleeping for r in run.results] == [True, False, False]
    assert [r.failed for r in run.results] == [False, True, False]
    assert flexiq_clock() == pytest.approx(START + 600, abs=1)


def test_testing_a_changed_step_sequence_is_dead_lettered(durable_run):
    """Replaying with a renamed step dead-letters the run, as a deploy that changed the body would (C13)."""
    names = iter(["reserve", "hold"])

    def body() -> None:
        current_job.step.run(next(names), lambda: 1)
        raise ConnectionError("fail so the next attempt replays")

    run = durable_run(body)
    assert run.attempt().failed
    result = run.attempt()
    assert result.dead_lettered
    assert [d.reason for d in run.dead_letters] == ["divergence"]
    assert run.status == "dead"


def test_testing_crash_before_the_first_step_commits_nothing():
    """``crash_after_steps=0`` stops the attempt before any step; the next attempt runs every body."""
    run = DurableRun(checkout, "o-2", run_key="order-o-2")
    assert run.attempt(crash_after_steps=0).crashed
    assert run.step_keys == []
    assert run.attempt().sleeping
    assert CHARGES == ["order-o-2:charge#0"]


def test_testing_fake_clock_moves_only_when_told():
    """The fake clock starts at ``START`` and advances by seconds or durations."""
    clock = FakeClock()
    assert clock() == START
    clock.advance("1h30m")
    clock.advance(30)
    assert clock() == START + 5430


def test_testing_wake_without_a_sleep_is_an_error(durable_run):
    """``wake()`` after an attempt that did not sleep says so instead of moving the clock."""
    run = durable_run(lambda: "done")
    assert run.attempt().completed
    with pytest.raises(RuntimeError, match="did not sleep"):
        run.wake()


def test_testing_task_body_unwraps_celery_tasks_and_dramatiq_actors():
    """A Celery task gives its ``run``, a Dramatiq actor its own function, through the adapters."""
    import dramatiq
    from celery import Celery
    from dramatiq.brokers.stub import StubBroker

    import celery_ext
    from dramatiq_ext import DurableSteps

    app = Celery("testing-helpers", broker="memory://")
    celery_ext.install(app, store="memory://")

    @app.task
    def celery_checkout(order_id: str) -> Any:
        return checkout(order_id)

    broker = StubBroker()
    broker.add_middleware(DurableSteps(store="memory://"))

    @dramatiq.actor(broker=broker)
    def dramatiq_checkout(order_id: str) -> Any:
        return checkout(order_id)

    for task in (celery_checkout, dramatiq_checkout):
        run = DurableRun(task, "o-3", run_key=f"run-{task}")
        assert run.attempt().sleeping
        run.wake()
        assert run.attempt().value == "receipt for ch-o-3"
    assert task_body(checkout) is checkout


def test_testing_a_transactional_step_runs_in_the_callers_transaction_on_the_memory_store(durable_run):
    """C42 under ``DurableRun``: ``step.transaction`` runs its body in the caller's transaction and memoizes it.

    The memory store shares no database transaction, so the memo is kept at
    once; the body's writes still go through the caller's (here SQLite) connection.
    """
    import sqlalchemy as sa

    engine = sa.create_engine("sqlite://")
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE orders (id INTEGER PRIMARY KEY)"))
    inserts: list[int] = []

    def create(conn: Any) -> int:
        inserts.append(1)
        return int(conn.execute(sa.text("INSERT INTO orders DEFAULT VALUES RETURNING id")).scalar_one())

    def body() -> int:
        with engine.connect() as conn:
            order = current_job.step.transaction("create_order", lambda: create(conn), using=conn)
        current_job.step.sleep("1m")
        return int(order)

    run = durable_run(body)
    assert run.attempt(crash_after_steps=1).crashed
    assert run.step_keys == ["create_order#0"]
    assert run.until_done().value == 1
    assert inserts == [1]
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT COUNT(*) FROM orders")).scalar_one() == 1
