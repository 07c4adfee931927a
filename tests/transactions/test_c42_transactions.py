"""C42: steps and the caller's database transactions, on real PostgreSQL and MariaDB.

Two halves:

- a *transactional* step (``step.transaction(name, fn, using=...)``) writes
  its step row in the caller's transaction, so the body's business writes and
  the memo commit or roll back together, through Django, an SQLAlchemy
  ``Session`` and an SQLAlchemy ``Connection``;
- a *plain* step called inside an open transaction the store does not share
  is refused (``OpenTransaction``, dead-lettered at once), unless the call
  says ``allow_open_transaction=True``.

The store and the business table live in the same database; a connection to
another database is refused clearly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from uuid import uuid4

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from flexiq_plugins import DurableConfig, JobEnvelope, SqlStepStore, current_job
from flexiq_plugins._attempt import decisions
from flexiq_plugins.errors import InvalidTransaction, OpenTransaction
from flexiq_plugins.integration import Attempt, AttemptDriver, JobInfo
from tests.polling import wait_for
from tests.transactions.tx_support import Api, Orders


def _keys(store: SqlStepStore, run_key: str) -> list[str]:
    return [row.step_key for row in store.get_steps(run_key)]


def test_c42_a_transactional_steps_memo_and_writes_commit_or_roll_back_together(
    api: Api, orders: Orders, tx_store: SqlStepStore, attempt: Callable[..., Any], run_key: str
) -> None:
    """Rolled back with the caller's transaction, the step leaves neither its row nor the order; then it commits once.

    Attempt 1 runs the step inside the caller's transaction (joined as a
    savepoint), which then rolls back: no order, no step row. Attempt 2 runs
    it with no transaction open (the step opens and commits its own) and then
    fails: the order and the memo are committed together. Attempt 3 replays
    the memo without writing a second order.
    """
    bodies: list[int] = []

    def create(using: Any) -> int:
        bodies.append(1)
        return api.insert(using, 42)

    def inside_a_transaction_that_rolls_back() -> None:
        with api.handle() as using, api.outer(using):
            current_job.step.transaction("create_order", lambda: create(using), using=using)
            raise RuntimeError("the caller's transaction rolls back after the step")

    def on_its_own(fail: bool) -> int:
        with api.handle() as using:
            order = current_job.step.transaction("create_order", lambda: create(using), using=using)
        if fail:
            raise ConnectionError("after the commit")
        return int(order)

    first = attempt(inside_a_transaction_that_rolls_back, run_key)
    assert isinstance(first, decisions.Failure)
    assert (orders.ids(), _keys(tx_store, run_key)) == ([], [])

    second = attempt(lambda: on_its_own(fail=True), run_key)
    assert isinstance(second, decisions.Failure)
    assert (orders.ids(), _keys(tx_store, run_key)) == ([42], ["create_order#0"])

    third = attempt(lambda: on_its_own(fail=False), run_key)
    assert third == decisions.Completed(42)
    assert orders.ids() == [42]
    assert len(bodies) == 2  # attempts 1 and 2; attempt 3 was a memo hit


def test_c42_a_transactional_step_joined_to_the_callers_transaction_commits_with_it(
    api: Api, orders: Orders, tx_store: SqlStepStore, attempt: Callable[..., Any], run_key: str
) -> None:
    """Inside the caller's transaction, the memo is committed by the caller's commit, with the writes after it."""

    def body() -> int:
        with api.handle() as using, api.outer(using):
            order = current_job.step.transaction("create_order", lambda: api.insert(using, 7), using=using)
            api.insert(using, 8)  # more writes of the same transaction, after the step
        return int(order)

    assert attempt(body, run_key) == decisions.Completed(7)
    assert orders.ids() == [7, 8]
    assert _keys(tx_store, run_key) == ["create_order#0"]


def test_c42_a_plain_step_inside_an_open_transaction_is_refused_before_its_body(
    api: Api, orders: Orders, tx_store: SqlStepStore, attempt: Callable[..., Any], run_key: str
) -> None:
    """A plain ``step.run`` in a transaction that has written is ``OpenTransaction``: no body, no memo, no order.

    The error propagates through the caller's transaction, which rolls back;
    it names the hazard and both ways out, and the job is dead-lettered at
    once (a retry would do the same).
    """
    calls: list[int] = []

    def body() -> None:
        with api.handle() as using, api.outer(using):
            api.insert(using, 1)
            current_job.step.run("notify", lambda: calls.append(1))

    decision = attempt(body, run_key)
    assert isinstance(decision, decisions.DeadLetter)
    assert isinstance(decision.error, OpenTransaction)
    assert decision.reason == "open_transaction"
    assert "does not share" in decision.message
    assert "step.transaction('notify', fn, using=...)" in decision.message
    assert "call the step outside the transaction" in decision.message
    assert "allow_open_transaction=True" in decision.message
    assert calls == []
    assert (orders.ids(), _keys(tx_store, run_key)) == ([], [])


@pytest.mark.parametrize("api", ["session", "connection"], indirect=True)
def test_c42_a_plain_step_whose_body_writes_in_an_open_transaction_is_refused_before_its_commit(
    api: Api, orders: Orders, tx_store: SqlStepStore, attempt: Callable[..., Any], run_key: str
) -> None:
    """SQLAlchemy: a transaction with no write yet is let in; the body's write is seen before the memo commits."""

    def body() -> None:
        with api.handle() as using, api.outer(using):
            current_job.step.run("create_order", lambda: api.insert(using, 5))

    decision = attempt(body, run_key)
    assert isinstance(decision.error, OpenTransaction)
    assert "that has written" in decision.message
    assert (orders.ids(), _keys(tx_store, run_key)) == ([], [])


@pytest.mark.parametrize("api", ["django", "session"], indirect=True)
def test_c42_allow_open_transaction_opts_a_plain_step_out(
    api: Api, orders: Orders, tx_store: SqlStepStore, attempt: Callable[..., Any], run_key: str
) -> None:
    """``allow_open_transaction=True`` runs and commits the step at once, inside the caller's transaction."""

    def body() -> str:
        with api.handle() as using, api.outer(using):
            api.insert(using, 3)
            return current_job.step.run("notify", lambda: "sent", allow_open_transaction=True)

    assert attempt(body, run_key) == decisions.Completed("sent")
    assert orders.ids() == [3]
    assert _keys(tx_store, run_key) == ["notify#0"]


def test_c42_a_transaction_that_has_only_read_does_not_refuse_a_plain_step(
    user_engine: sa.Engine, orders: Orders, tx_store: SqlStepStore, attempt: Callable[..., Any], run_key: str
) -> None:
    """An SQLAlchemy session whose open transaction has only read cannot undo anything: the step runs."""

    def body() -> int:
        with Session(user_engine) as session:
            session.execute(sa.text(f"SELECT COUNT(*) FROM {orders.name}"))
            assert session.in_transaction()
            return int(current_job.step.run("count", lambda: 1))

    assert attempt(body, run_key) == decisions.Completed(1)


def test_c42_a_transactional_step_on_another_database_is_refused(
    backend: str, tx_store: SqlStepStore, attempt: Callable[..., Any], run_key: str, request: Any
) -> None:
    """``using=`` on another database (another server kind, or the same server's other database) is refused.

    The body's writes there roll back with the refusal, and the job is
    dead-lettered ``invalid_transaction`` with a message naming both.
    """
    if backend == "postgres":
        elsewhere = sa.create_engine(tx_store.engine.url.set(database="postgres"))  # same server, no store tables
        other_kind = sa.create_engine(request.getfixturevalue("mysql_url"))
    else:
        elsewhere = other_kind = sa.create_engine(request.getfixturevalue("postgres_url"))
    try:
        for engine in {elsewhere, other_kind}:

            def body(engine: sa.Engine = engine) -> None:
                with Session(engine) as session:
                    current_job.step.transaction("create", lambda: session.scalar(sa.text("SELECT 1")), using=session)

            key = f"{run_key}-{engine.dialect.name}-{engine.url.database}"
            decision = attempt(body, key)
            assert isinstance(decision, decisions.DeadLetter), decision
            assert isinstance(decision.error, InvalidTransaction)
            assert decision.reason == "invalid_transaction"
            assert "not the step store's database" in decision.message
            assert _keys(tx_store, key) == []
    finally:
        elsewhere.dispose()
        other_kind.dispose()
    if backend == "postgres":  # a Django alias whose database lacks the store's tables
        request.getfixturevalue("django_configured")
        decision = attempt(lambda: current_job.step.transaction("create", lambda: 1, using="elsewhere"), run_key)
        assert decision.reason == "invalid_transaction"
        assert "Django database 'elsewhere' reaches a database without the store's tables" in decision.message


@pytest.mark.timeout(60)
def test_c42_a_transaction_left_open_when_the_body_returns_is_rolled_back_and_dead_lettered(
    user_engine: sa.Engine, orders: Orders, tx_store: SqlStepStore, attempt: Callable[..., Any], run_key: str
) -> None:
    """A session left open holds the run's row: it is rolled back with the memo, not waited on forever."""
    session = Session(user_engine)
    try:

        def body() -> int:
            session.execute(sa.text(f"SELECT COUNT(*) FROM {orders.name}"))  # autobegins: the step joins it
            order = sa.text(f"INSERT INTO {orders.name} (id) VALUES (9)")
            return int(current_job.step.transaction("create", lambda: session.execute(order) and 9, using=session))

        decision = attempt(body, run_key)
    finally:
        session.close()
    assert isinstance(decision, decisions.DeadLetter), decision
    assert decision.reason == "invalid_transaction"
    assert "still open when the task body returned" in decision.message
    assert (orders.ids(), _keys(tx_store, run_key)) == ([], [])


def test_c42_a_plain_step_cannot_commit_while_a_joined_transaction_holds_the_run(
    user_engine: sa.Engine, orders: Orders, tx_store: SqlStepStore, attempt: Callable[..., Any], run_key: str
) -> None:
    """Even opted out, a plain step after a transactional one in the same open transaction is refused, not hung."""

    def body() -> None:
        with Session(user_engine) as session, session.begin():
            insert = sa.text(f"INSERT INTO {orders.name} (id) VALUES (4)")
            current_job.step.transaction("create", lambda: session.execute(insert) and 4, using=session)
            current_job.step.run("notify", lambda: 1, allow_open_transaction=True)

    decision = attempt(body, run_key)
    assert decision.reason == "invalid_transaction"
    assert "cannot commit while the transaction" in decision.message
    assert (orders.ids(), _keys(tx_store, run_key)) == ([], [])


def test_c42_c25_a_transactional_step_of_a_taken_over_attempt_writes_nothing(
    user_engine: sa.Engine, orders: Orders, tx_store: SqlStepStore, run_key: str
) -> None:
    """The step row is fenced on the claim: an attempt whose claim was taken over is dropped, its order rolled back."""
    driver = AttemptDriver(tx_store, DurableConfig(lease_seconds=0.5))
    job = JobInfo(run_key, uuid4().hex, JobEnvelope("shop.checkout", "test"))
    stale = driver.start(job, owner="w1")
    assert isinstance(stale, Attempt)
    wait_for(lambda: tx_store.now() > stale.claim.lease_until, 10, "the first claim's lease to expire")
    assert isinstance(driver.start(job, owner="w2"), Attempt)  # a redelivery takes the run over

    def body() -> int:
        with Session(user_engine) as session:
            insert = sa.text(f"INSERT INTO {orders.name} (id) VALUES (6)")
            return int(current_job.step.transaction("create", lambda: session.execute(insert) and 6, using=session))

    decision = stale.run(body)
    assert isinstance(decision, decisions.Ack)
    assert decision.reason is decisions.AckReason.DROPPED
    assert (orders.ids(), _keys(tx_store, run_key)) == ([], [])


def test_c42_once_the_joined_transaction_committed_plain_steps_run_again(
    api: Api, orders: Orders, tx_store: SqlStepStore, attempt: Callable[..., Any], run_key: str
) -> None:
    """After the caller commits, a later transaction of the same session or connection (even one that
    has only read) does not hold the run's row: a plain step runs and commits."""

    def body() -> str:
        with api.handle() as using:
            with api.outer(using):
                current_job.step.transaction("create_order", lambda: api.insert(using, 11), using=using)
            if api.kind != "django":
                using.execute(sa.text(f"SELECT COUNT(*) FROM {orders.name}"))  # autobegins a new transaction
            return current_job.step.run("notify", lambda: "sent")

    assert attempt(body, run_key) == decisions.Completed("sent")
    assert orders.ids() == [11]
    assert _keys(tx_store, run_key) == ["create_order#0", "notify#0"]
