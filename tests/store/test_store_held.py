"""One connection per attempt: what ``StepStore.held`` checks out, keeps, replaces and gives back.

Real databases: pool checkouts are counted with SQLAlchemy's pool events, a
held PostgreSQL connection is killed with ``pg_terminate_backend``.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import threading
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event

from flexiq_plugins import DurableConfig, current_job
from flexiq_plugins._attempt.decisions import Completed, Failure, PutBack
from flexiq_plugins._model.records import Begun, JobEnvelope, StepRow
from flexiq_plugins._store.memory import MemoryStepStore
from flexiq_plugins._store.sql import SqlStepStore, normalize_url
from flexiq_plugins._store.sql import connections as sql_connections_module
from flexiq_plugins._store.sql import engine as engine_module
from flexiq_plugins.errors import StoreUnavailable
from flexiq_plugins.integration import AttemptDriver, JobInfo
from tests.polling import wait_for

ENVELOPE = JobEnvelope(task_name="shop.checkout", framework="test", args=[1])
BACKENDS = [
    "sqlite",
    pytest.param("postgres", marks=pytest.mark.postgres),
    pytest.param("mariadb", marks=pytest.mark.mysql),
]


class Checkouts:
    """Pool checkouts and checkins of an engine, by thread, through SQLAlchemy's pool events."""

    def __init__(self, engine: sa.Engine) -> None:
        self.lock = threading.Lock()
        self.out: list[tuple[int, Any]] = []  # (thread ident, driver connection)
        self.back = 0
        event.listen(engine, "checkout", self._checkout)
        event.listen(engine, "checkin", self._checkin)

    def _checkout(self, dbapi_connection: Any, *_: Any) -> None:
        with self.lock:
            self.out.append((threading.get_ident(), dbapi_connection))

    def _checkin(self, *_: Any) -> None:
        with self.lock:
            self.back += 1

    def by(self, ident: int) -> list[Any]:
        """The driver connections checked out by thread ``ident``."""
        with self.lock:
            return [conn for who, conn in self.out if who == ident]

    def others(self, ident: int) -> list[Any]:
        """The driver connections checked out by any other thread."""
        with self.lock:
            return [conn for who, conn in self.out if who != ident]


@pytest.fixture
def sql_store(request: pytest.FixtureRequest, make_sql_store: Callable[..., SqlStepStore]) -> SqlStepStore:
    """A SQL store (file SQLite, PostgreSQL, MariaDB) with its tables created."""
    store = make_sql_store(request.getfixturevalue(f"{request.param}_url"))
    store.now()
    return store


def steps(n: int) -> Callable[[], str]:
    def body() -> str:
        for i in range(n):
            current_job.step.run(f"s{i}", functools.partial(int, i))
        return "done"

    return body


@pytest.mark.parametrize("sql_store", BACKENDS, indirect=True)
def test_c9_an_attempt_with_n_steps_checks_out_one_connection(sql_store: SqlStepStore) -> None:
    """Start, five new steps and the finish of an attempt take one pool checkout, given back at the end (C9)."""
    driver = AttemptDriver(sql_store, DurableConfig(lease_seconds=600))  # no renewal inside the test
    checkouts = Checkouts(sql_store.engine)

    decision = driver.run_job(JobInfo("run-held", "job-1", ENVELOPE), steps(5))

    assert decision == Completed("done")
    assert len(checkouts.out) == 1, checkouts.out
    assert checkouts.back == 1
    assert sql_store.engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    assert sql_store.get_run("run-held").status == "succeeded"


@pytest.mark.parametrize("sql_store", BACKENDS, indirect=True)
def test_c9_without_a_hold_every_call_checks_out(sql_store: SqlStepStore) -> None:
    """The baseline the hold saves: outside ``held`` each store call is a checkout of its own."""
    checkouts = Checkouts(sql_store.engine)
    result = sql_store.begin("run-loose", "job-1", ENVELOPE, "w", 600)
    assert isinstance(result, Begun)
    sql_store.commit_step(result.claim, StepRow(0, "a#0", "run", b"1"))
    assert len(checkouts.out) == 2


@pytest.mark.parametrize("sql_store", BACKENDS, indirect=True)
@pytest.mark.parametrize("how", ["raises", "sleeps", "soft_time_limit"])
def test_c28_the_held_connection_goes_back_to_the_pool_however_the_attempt_ends(
    sql_store: SqlStepStore, how: str
) -> None:
    """A body that raises, sleeps (a suspend) or is stopped by a time limit gives its connection back (C18, C28)."""
    driver = AttemptDriver(sql_store, DurableConfig(lease_seconds=600))
    checkouts = Checkouts(sql_store.engine)
    inside: list[int] = []

    class SoftTimeLimitExceeded(Exception):  # what Celery raises in the body at its soft time limit
        pass

    def body() -> None:
        current_job.step.run("a", lambda: 1)
        inside.append(sql_store.engine.pool.checkedout())  # type: ignore[attr-defined]
        if how == "sleeps":
            current_job.step.sleep("1h")
        raise (ValueError("boom") if how == "raises" else SoftTimeLimitExceeded())

    decision = driver.run_job(JobInfo(f"run-{how}", "job-1", ENVELOPE), body)

    assert isinstance(decision, PutBack if how == "sleeps" else Failure), decision
    assert inside == [1], "the connection is held while the body runs"
    assert sql_store.engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    assert len(checkouts.out) == 1
    assert checkouts.back == 1
    assert sql_store.get_run(f"run-{how}").status == ("sleeping" if how == "sleeps" else "retrying")


@pytest.mark.parametrize("sql_store", BACKENDS, indirect=True)
def test_c23_the_lease_thread_uses_the_pool_not_the_held_connection(sql_store: SqlStepStore) -> None:
    """The lease keeper renews on a connection of its own while the attempt's thread holds one (C23)."""
    driver = AttemptDriver(sql_store, DurableConfig(lease_seconds=0.3))  # renewed every 0.1 s
    checkouts = Checkouts(sql_store.engine)
    me = threading.get_ident()
    seen: dict[str, Any] = {}

    def body() -> str:
        current_job.step.run("a", lambda: 1)
        held = checkouts.by(me)
        wait_for(lambda: checkouts.others(me), timeout=30, what="the lease thread to renew")
        seen["held"], seen["lease"] = held, checkouts.others(me)
        current_job.step.run("b", lambda: 2)
        return "done"

    assert driver.run_job(JobInfo("run-lease", "job-1", ENVELOPE), body) == Completed("done")
    assert len(seen["held"]) == 1
    assert seen["held"][0] not in seen["lease"], "the lease thread was handed the held connection"
    assert len(checkouts.by(me)) == 1, "the attempt's thread checked out once"


def _backend_pid(dbapi_connection: Any) -> int:
    return int(dbapi_connection.info.backend_pid)


def _terminate(postgres_url: str, pid: int) -> None:
    killer = sa.create_engine(normalize_url(postgres_url))
    try:
        with killer.begin() as conn:
            assert conn.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid}).scalar_one()
        alive = sa.text("SELECT count(*) FROM pg_stat_activity WHERE pid = :pid")

        def gone() -> bool:
            with killer.connect() as conn:
                return bool(conn.execute(alive, {"pid": pid}).scalar_one() == 0)

        wait_for(gone, timeout=30, what="the backend to exit")
    finally:
        killer.dispose()


@pytest.mark.postgres
@pytest.mark.parametrize("sql_store", ["postgres"], indirect=True)
def test_c28_a_held_connection_the_server_killed_mid_attempt_is_replaced_and_the_next_step_commits(
    sql_store: SqlStepStore, postgres_url: str
) -> None:
    """``pg_terminate_backend`` on the held connection between two steps: the next step commits on a new one (C28)."""
    driver = AttemptDriver(sql_store, DurableConfig(lease_seconds=600))
    checkouts = Checkouts(sql_store.engine)
    me = threading.get_ident()

    pids: list[int] = []

    def body() -> str:
        current_job.step.run("a", lambda: 1)
        pids.append(_backend_pid(checkouts.by(me)[0]))
        _terminate(postgres_url, pids[0])
        current_job.step.run("b", lambda: 2)
        pids.append(_backend_pid(checkouts.by(me)[-1]))
        raise ValueError("end the attempt with its steps kept")

    assert isinstance(driver.run_job(JobInfo("run-killed", "job-1", ENVELOPE), body), Failure)
    assert len(checkouts.by(me)) == 2, "the killed connection was replaced once"
    assert [row.step_key for row in sql_store.get_steps("run-killed")] == ["a#0", "b#0"]
    assert pids[1] != pids[0]
    assert sql_store.engine.pool.checkedout() == 0  # type: ignore[attr-defined]


@pytest.mark.postgres
@pytest.mark.parametrize("sql_store", ["postgres"], indirect=True)
def test_c28_a_held_connection_found_dead_by_its_statement_retries_a_transaction_but_not_an_autocommit(
    sql_store: SqlStepStore, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the pre-use check blinded, the kill shows at the statement: a read transaction runs again on a
    new connection (nothing committed); a step, one autocommitted statement, has an unknown result and
    raises :class:`StoreUnavailable` instead of running twice; the hold then goes on on a new connection (C28)."""
    checkouts = Checkouts(sql_store.engine)
    monkeypatch.setattr(sql_connections_module, "dead_after_idle", lambda *_: None)
    with sql_store.held():
        begun = sql_store.begin("run-blind", "job-1", ENVELOPE, "w", 600)
        assert isinstance(begun, Begun)
        _terminate(postgres_url, _backend_pid(checkouts.out[-1][1]))
        assert sql_store.get_run("run-blind").status == "running"  # retried on a new connection
        assert len(checkouts.out) == 2

        _terminate(postgres_url, _backend_pid(checkouts.out[-1][1]))
        with pytest.raises(StoreUnavailable):
            sql_store.commit_step(begun.claim, StepRow(0, "a#0", "run", b"1"))
        assert len(checkouts.out) == 2, "an unknown result is not retried"

        sql_store.commit_step(begun.claim, StepRow(1, "b#0", "run", b"2"))
        assert len(checkouts.out) == 3
        assert sql_store.engine.pool.checkedout() == 1  # type: ignore[attr-defined]
    assert sql_store.engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    assert [row.step_key for row in sql_store.get_steps("run-blind")][-1] == "b#0"


@pytest.mark.parametrize("sql_store", BACKENDS, indirect=True)
def test_c9_a_call_that_raised_leaves_no_transaction_and_the_next_call_works(sql_store: SqlStepStore) -> None:
    """A fenced step refused inside a hold is rolled back; its connection goes back and the next call gets another."""
    checkouts = Checkouts(sql_store.engine)
    with sql_store.held():
        begun = sql_store.begin("run-fenced", "job-1", ENVELOPE, "w", 600)
        assert isinstance(begun, Begun)
        stale = dataclasses.replace(begun.claim, owner="someone-else")
        with pytest.raises(Exception):  # noqa: B017,PT011 - ClaimLost, whatever the folded statement says
            sql_store.commit_step(stale, StepRow(0, "a#0", "run", b"1"))
        assert sql_store.engine.pool.checkedout() == 0  # type: ignore[attr-defined]
        sql_store.commit_step(begun.claim, StepRow(0, "a#0", "run", b"1"))
        assert len(checkouts.out) == 2
    assert [row.step_key for row in sql_store.get_steps("run-fenced")] == ["a#0"]


@pytest.mark.parametrize("sql_store", BACKENDS, indirect=True)
def test_c9_holds_are_reentrant_and_per_thread(sql_store: SqlStepStore) -> None:
    """A nested hold keeps the outer one's connection; the connection goes back when the outer block ends."""
    checkouts = Checkouts(sql_store.engine)
    with sql_store.held():
        sql_store.now()
        with sql_store.held():
            sql_store.now()
        sql_store.now()
        assert sql_store.engine.pool.checkedout() == 1  # type: ignore[attr-defined]
        other = threading.Thread(target=sql_store.now)
        other.start()
        other.join()
        assert len(checkouts.others(threading.get_ident())) == 1
    assert len(checkouts.by(threading.get_ident())) == 1
    assert sql_store.engine.pool.checkedout() == 0  # type: ignore[attr-defined]


def test_c9_shared_memory_sqlite_and_the_memory_store_hold_nothing(make_sql_store: Callable[..., SqlStepStore]) -> None:
    """In-memory SQLite (one connection for all threads, serialized) and the memory store work inside holds."""
    for store in (make_sql_store("sqlite://"), MemoryStepStore()):
        driver = AttemptDriver(store, DurableConfig(lease_seconds=600))
        assert driver.run_job(JobInfo("run-mem", "job-1", ENVELOPE), steps(3)) == Completed("done")
        assert store.get_run("run-mem").status == "succeeded"


def _store_backend_pid(store: SqlStepStore) -> int:
    return int(store._read(lambda conn: conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()))


@pytest.mark.postgres
@pytest.mark.parametrize("sql_store", ["postgres"], indirect=True)
def test_c9_a_fork_inside_a_hold_leaves_the_parents_connection_alone(sql_store: SqlStepStore) -> None:
    """A child forked while its parent holds a connection opens its own, and leaving the hold in the child
    neither closes nor rolls back the parent's: the parent goes on on the same live connection (C9)."""
    in_child, status = False, 1
    try:
        with sql_store.held():
            parent_backend = _store_backend_pid(sql_store)
            child = os.fork()
            if child == 0:
                in_child = True
                status = 0 if _store_backend_pid(sql_store) != parent_backend else 2
            else:
                _, code = os.waitpid(child, 0)
                assert os.waitstatus_to_exitcode(code) == 0
                assert _store_backend_pid(sql_store) == parent_backend, "the parent keeps its held connection"
    except BaseException:
        if in_child:
            os._exit(3)
        raise
    if in_child:
        os._exit(status)  # the hold ended in the child too (without touching the parent's connection)
    with sql_store.held():
        assert _store_backend_pid(sql_store) == parent_backend, "given back alive to the parent's pool"


@pytest.mark.postgres
@pytest.mark.parametrize("sql_store", ["postgres"], indirect=True)
def test_c28_a_held_connection_idle_past_the_threshold_is_pinged_before_use(
    sql_store: SqlStepStore, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A held connection idle longer than the ping threshold (a long step body) is pinged before its next
    use; one found dead so is replaced before the step's autocommitted statement is sent, which then
    commits instead of failing with an unknown result (C28). The socket check is blinded here, so only
    the ping can see the kill."""
    monkeypatch.setattr(engine_module, "_PING_IF_IDLE_S", 0.0)  # every pause counts as a long idle
    monkeypatch.setattr(engine_module, "_closed_by_server", lambda _conn: False)
    pings: list[bool] = []
    real_ping = sql_store.engine.dialect.do_ping

    def counted_ping(dbapi_connection: Any) -> bool:
        pings.append(True)
        return real_ping(dbapi_connection)

    monkeypatch.setattr(sql_store.engine.dialect, "do_ping", counted_ping)
    checkouts = Checkouts(sql_store.engine)
    with sql_store.held():
        begun = sql_store.begin("run-idle", "job-1", ENVELOPE, "w", 600)
        assert isinstance(begun, Begun)
        before = len(pings)  # the checkout of a pooled connection that idled pings as well
        sql_store.commit_step(begun.claim, StepRow(0, "a#0", "run", b"1"))
        assert len(pings) == before + 1, "the second use of the held connection pinged it"
        _terminate(postgres_url, _backend_pid(checkouts.out[-1][1]))
        sql_store.commit_step(begun.claim, StepRow(1, "b#0", "run", b"2"))
        assert len(checkouts.out) == 2, "the dead connection was replaced before use"
    assert [row.step_key for row in sql_store.get_steps("run-idle")] == ["a#0", "b#0"]


@pytest.mark.parametrize("sql_store", BACKENDS, indirect=True)
def test_c43_a_lazy_attempt_that_takes_no_step_checks_nothing_out(sql_store: SqlStepStore) -> None:
    """A first delivery claimed at its first step, whose body takes none, never touches the pool (C43)."""
    driver = AttemptDriver(sql_store, DurableConfig(lease_seconds=600))
    checkouts = Checkouts(sql_store.engine)

    decision = driver.run_job(JobInfo("run-lazy-none", "job-1", ENVELOPE, lazy=True), lambda: "plain")

    assert decision == Completed("plain", claimed=False)
    assert checkouts.out == []


@pytest.mark.parametrize("sql_store", BACKENDS, indirect=True)
@pytest.mark.parametrize("how", ["returns", "raises", "sleeps"])
def test_c9_a_lazy_attempt_holds_one_connection_from_its_claim(sql_store: SqlStepStore, how: str) -> None:
    """A lazy attempt's claim, steps and finish share one checkout, taken at its first step and given back (C9, C23)."""
    driver = AttemptDriver(sql_store, DurableConfig(lease_seconds=600))
    checkouts = Checkouts(sql_store.engine)
    before: list[int] = []

    def body() -> str:
        before.append(len(checkouts.out))
        for i in range(3):
            current_job.step.run(f"s{i}", functools.partial(int, i))
        if how == "sleeps":
            current_job.step.sleep("1h")
        if how == "raises":
            raise ValueError("boom")
        return "done"

    decision = driver.run_job(JobInfo(f"run-lazy-{how}", "job-1", ENVELOPE, lazy=True), body)

    expected = {"returns": Completed, "raises": Failure, "sleeps": PutBack}[how]
    assert isinstance(decision, expected), decision
    assert before == [0], "nothing is checked out before the first step"
    assert len(checkouts.out) == 1, checkouts.out
    assert checkouts.back == 1
    assert sql_store.engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    status = {"returns": "succeeded", "raises": "retrying", "sleeps": "sleeping"}[how]
    assert sql_store.get_run(f"run-lazy-{how}").status == status


@pytest.mark.parametrize("sql_store", BACKENDS, indirect=True)
def test_c23_a_lazy_claim_from_another_thread_holds_nothing(sql_store: SqlStepStore) -> None:
    """A lazy run first claimed by a thread the body started keeps no connection in that thread (C23)."""
    driver = AttemptDriver(sql_store, DurableConfig(lease_seconds=600))

    def body() -> str:
        job = current_job.get()
        assert job is not None
        done: list[Any] = []
        worker = threading.Thread(target=lambda: done.append(job.step.run("a", lambda: 1)))
        worker.start()
        worker.join()
        assert done == [1]
        return "done"

    assert driver.run_job(JobInfo("run-lazy-thread", "job-1", ENVELOPE, lazy=True), body) == Completed("done")
    assert sql_store.engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    assert sql_store.get_run("run-lazy-thread").status == "succeeded"


@pytest.mark.postgres
@pytest.mark.parametrize("engine_autocommit", [False, True])
def test_c9_a_held_connection_goes_back_to_the_pool_in_the_autocommit_mode_it_came_in(
    postgres_url: str, make_sql_store: Callable[..., SqlStepStore], engine_autocommit: bool
) -> None:
    """The start and finish autocommit on the held psycopg connection; the pool gets it back as it lent it.

    A transaction in between (a cancellation request) runs in the connection's
    own mode, and the isolation level stays as the engine set it.
    """
    options: dict[str, Any] = {"isolation_level": "AUTOCOMMIT"} if engine_autocommit else {}
    engine = sa.create_engine(normalize_url(postgres_url), **options)
    store = make_sql_store(engine)
    store.now()
    lent: list[tuple[bool, Any]] = []
    back: list[tuple[bool, Any]] = []

    @event.listens_for(engine, "checkout")
    def _checkout(dbapi_connection: Any, *_: Any) -> None:
        lent.append((dbapi_connection.autocommit, dbapi_connection.isolation_level))

    @event.listens_for(engine, "checkin")
    def _checkin(dbapi_connection: Any, *_: Any) -> None:
        back.append((dbapi_connection.autocommit, dbapi_connection.isolation_level))

    with store.held():
        begun = store.begin("run-mode", "job-1", ENVELOPE, "w", 600)
        assert isinstance(begun, Begun)
        assert store.request_cancel("run-mode", "asked")
        store.finish(begun.claim, "cancelled")

    assert len(lent) == len(back) == 1
    assert back == lent
    assert lent[0][0] is engine_autocommit
    assert store.get_run("run-mode").status == "cancelled"
    engine.dispose()
