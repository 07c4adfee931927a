"""What only the SQL store must prove: transactions, clocks, errors, forks, concurrency.

The behaviour every store shares is in ``test_store_contract.py``. Here the
SQL store is checked against the real servers for what a mock cannot show:
that ``begin`` and ``commit_step`` are one transaction each (C9), that the
database's clock decides leases (C23), that an unreachable server surfaces as
``StoreUnavailable`` with nothing from SQLAlchemy leaking, that a forked child
opens its own connections, and that concurrent deliveries claim a run once.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
import traceback
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
import sqlalchemy as sa
from sqlalchemy import event

from benchmarks.counting import on_statements
from flexiq_plugins._model.records import Begun, Busy, Claim, Finished, JobEnvelope, NewDeadLetter, StepRow
from flexiq_plugins._store.base import StepStore
from flexiq_plugins._store.factory import DEFAULT_STORE_URL, STORE_URL_ENV, open_store
from flexiq_plugins._store.memory import MemoryStepStore
from flexiq_plugins._store.sql import SqlStepStore, normalize_url, upgrade_store
from flexiq_plugins._store.sql.engine import READ_ONLY
from flexiq_plugins._store.sql.tables import store_tables
from flexiq_plugins.errors import (
    ClaimLost,
    ConfigurationError,
    RunLocked,
    StoreError,
    StoreMisconfigured,
    StoreUnavailable,
)
from tests.conftest import MYSQL, POSTGRES, PSYCOPG2_URL, PostgresCaller, require_service
from tests.polling import wait_for

ENVELOPE = JobEnvelope(task_name="shop.checkout", framework="test", args=[1])
SQL_BACKENDS = [
    "sqlite",
    pytest.param("postgres", marks=pytest.mark.postgres),
    pytest.param("mysql", marks=pytest.mark.mysql),
]


@pytest.fixture(params=SQL_BACKENDS)
def sql_store(request: pytest.FixtureRequest, make_sql_store: Callable[..., SqlStepStore]) -> SqlStepStore:
    """A fresh SQL store on SQLite, PostgreSQL and MariaDB in turn, its schema already created."""
    store = make_sql_store(request.getfixturevalue(f"{request.param}_url"))
    store.now()  # runs the migration, so tests observe only their own statements
    return store


def claim(store: StepStore, run_key: str, owner: str = "worker-1", lease: float = 30.0) -> Begun:
    result = store.begin(run_key, "job-1", ENVELOPE, owner, lease)
    assert isinstance(result, Begun), result
    return result


class TransactionLog:
    """Counts transactions (SQLAlchemy events) and statements (at the driver) on an engine.

    A new step's statements go straight to pysqlite or psycopg, past
    SQLAlchemy's statement events (``flexiq_plugins/_store/sql/driver.py``):
    ``benchmarks/counting.py`` counts what the driver runs, from the next
    pool checkout on.
    """

    def __init__(self, engine: sa.Engine) -> None:
        self.begins = 0
        self.autocommitted = 0
        self.commits = 0
        self.rollbacks = 0
        self.statements: list[str] = []
        event.listen(engine, "begin", self._begin)
        event.listen(engine, "commit", self._commit)
        event.listen(engine, "rollback", self._rollback)
        on_statements(engine, self.statements.append)

    def _begin(self, conn: Any) -> None:
        self.begins += 1
        if conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT":
            self.autocommitted += 1

    def _commit(self, conn: Any) -> None:
        self.commits += 1

    def _rollback(self, conn: Any) -> None:
        self.rollbacks += 1

    def reset(self) -> None:
        self.begins = self.autocommitted = self.commits = self.rollbacks = 0
        self.statements.clear()

    def round_trips(self, backend: str) -> int:
        """Round trips to the server, as ``benchmarks/bench_store.py`` counts them; SQLite: its statements.

        A statement is one; psycopg sends a transaction's ``BEGIN`` as one more and
        PyMySQL does not; a ``COMMIT`` is one unless the statement was autocommitted.
        """
        transactions = self.begins - self.autocommitted
        if backend == "postgres":
            return len(self.statements) + 2 * transactions
        if backend == "mysql":
            return len(self.statements) + transactions
        return len(self.work_statements())

    def work_statements(self) -> list[str]:
        """The statements other than SQLite's explicit ``BEGIN``."""
        return [s for s in self.statements if not s.startswith("BEGIN")]


# ------------------------------------------------------------ transactions
# Statements of a begin and of a new step: PostgreSQL folds them most, SQLite has
# RETURNING but no DML in WITH, MySQL/MariaDB neither. (new run's begin, new step, redelivery's begin)
FOLDED_STATEMENTS = {
    "sqlite": (1, 2, (1, 3)),  # insert claimed | fenced UPDATE RETURNING, INSERT | + read run and steps, claim
    "postgres": (1, 1, (1, 1)),  # insert claimed | WITH fenced UPDATE, INSERT | WITH insert, claim if untaken, SELECT
    # locking read (none), upsert, locking read + clock, claim, snapshot | fenced UPDATE, INSERT … SELECT the stamp
    # RETURNING it (MariaDB 10.5 or later)
    "mysql": (5, 2, (1, 3)),
}


@pytest.mark.parametrize("backend", SQL_BACKENDS)
def test_c9_begin_and_commit_step_are_one_transaction_each(
    backend: str, request: pytest.FixtureRequest, make_sql_store: Callable[..., SqlStepStore]
) -> None:
    """``begin`` and ``commit_step`` each run in exactly one committed transaction, in few statements (C9).

    A redelivery's ``begin`` on PostgreSQL is one autocommitted statement (the
    insert, which leaves the stored run alone, and the claim of the run that
    holds no claim, with its snapshot); on SQLite one transaction of three
    statements.
    """
    store = make_sql_store(request.getfixturevalue(f"{backend}_url"))
    store.now()
    log = TransactionLog(store.engine)
    begin_statements, step_statements, (redelivery_transactions, redelivery_statements) = FOLDED_STATEMENTS[backend]

    log.reset()
    begun = claim(store, "run-c9")
    assert (log.begins, log.commits, log.rollbacks) == (1, 1, 0)
    assert len(log.work_statements()) == begin_statements

    log.reset()
    store.commit_step(begun.claim, StepRow(0, "charge#0", "run", b"v"))
    assert (log.begins, log.commits, log.rollbacks) == (1, 1, 0)
    assert len(log.work_statements()) == step_statements

    store.finish(begun.claim, "retrying")
    log.reset()
    again = claim(store, "run-c9")
    assert again.claim.attempt == 2
    assert [r.step_key for r in again.snapshot] == ["charge#0"]
    assert (log.begins, log.commits, log.rollbacks) == (redelivery_transactions, redelivery_transactions, 0)
    assert len(log.work_statements()) == redelivery_statements
    begun = again

    log.reset()
    store.finish(begun.claim, "succeeded", drop_steps=True)
    assert (log.begins, log.commits) == (1, 1)


@pytest.mark.parametrize("backend", SQL_BACKENDS)
@pytest.mark.parametrize("rows", [1, 12, 120])
def test_c9_c51_commit_steps_is_one_transaction_of_a_single_steps_statements(
    backend: str, rows: int, request: pytest.FixtureRequest, make_sql_store: Callable[..., SqlStepStore]
) -> None:
    """``commit_steps`` of one row or of twelve (a step map's entry and items) is one committed transaction of
    the statements of one ``commit_step``: one on PostgreSQL, two on SQLite and MariaDB, and one more ``INSERT``
    per 50 rows beyond the first 50 off PostgreSQL; every row is stamped with the run's clock (C9, C23, C51)."""
    store = make_sql_store(request.getfixturevalue(f"{backend}_url"))
    store.now()
    begun = claim(store, "run-c51")
    log = TransactionLog(store.engine)
    batch = [StepRow(0, "price#0", "map")] + [StepRow(i, f"price:{i}", "run", b"v") for i in range(1, rows)]

    log.reset()
    store.commit_steps(begun.claim, batch)

    assert (log.begins, log.commits, log.rollbacks) == (1, 1, 0)
    more_inserts = 0 if backend == "postgres" else (rows - 1) // 50
    assert len(log.work_statements()) == FOLDED_STATEMENTS[backend][1] + more_inserts, log.statements
    run = store.get_run("run-c51")
    assert run.step_count == rows
    assert [row.committed_at for row in store.get_steps("run-c51")] == [pytest.approx(run.updated_at)] * rows


# How an attempt starts, by what is stored: its round trips (SQLite: statements) and its
# transactions. A new run is inserted already claimed; a run recorded at publish (C39), a
# retried and a sleeping run are claimed in the same statement on PostgreSQL (no claim held),
# a taken-over run is read, decided on, then claimed.
START_COST = {
    "sqlite": {"new": (1, 1), "stored": (3, 1)},  # one BEGIN IMMEDIATE transaction each
    # autocommitted statements: no BEGIN, no COMMIT
    "postgres": {"new": (1, 0), "stored": (1, 0), "taken over": (2, 0)},
    # locking read, claim, snapshot, COMMIT; a new run: + upsert and locking read again
    "mysql": {"new": (6, 1), "stored": (4, 1)},
}
STORED_RUNS = ["queued", "retrying", "sleeping", "taken over"]


def stored_run(store: SqlStepStore, run_key: str, how: str) -> None:
    """Leave ``run_key`` as the next delivery finds it: recorded ``queued``, or after one attempt with one step."""
    if how == "queued":
        store.record_queued(run_key, "job-0", ENVELOPE)
        return
    lease = 0.0 if how == "taken over" else 30.0  # a lease of 0 s has expired at once: its worker "died"
    begun = claim(store, run_key, owner="worker-0", lease=lease)
    store.commit_step(begun.claim, StepRow(0, "charge#0", "run", b"v"))
    if how != "taken over":
        store.finish(begun.claim, how, wake_at=store.now() if how == "sleeping" else None)  # type: ignore[arg-type]


@pytest.mark.parametrize("how", ["new", *STORED_RUNS])
@pytest.mark.parametrize("backend", SQL_BACKENDS)
def test_c23_an_attempt_starts_in_one_round_trip_on_postgresql_two_for_a_takeover(
    backend: str, how: str, request: pytest.FixtureRequest, make_sql_store: Callable[..., SqlStepStore]
) -> None:
    """An attempt start costs 1 round trip on PostgreSQL, 2 for a takeover of an expired lease (C23).

    SQLite: 1 and 3 statements in one transaction; MariaDB: 6 and 4 round
    trips (no ``UPDATE … RETURNING``). The claim is still the one :func:`decide_claim`
    grants: attempt n+1, a takeover counted only when the lease had expired,
    the previous attempt's steps in the snapshot.
    """
    store = make_sql_store(request.getfixturevalue(f"{backend}_url"))
    store.now()
    if how != "new":
        stored_run(store, "run-start", how)
    log = TransactionLog(store.engine)

    begun = claim(store, "run-start", owner="worker-1")

    costs = START_COST[backend]
    round_trips, transactions = costs.get(how, costs["new" if how == "new" else "stored"])
    assert (log.round_trips(backend), log.begins - log.autocommitted) == (round_trips, transactions), log.statements
    assert log.rollbacks == 0
    first = how in ("new", "queued")
    assert begun.claim.attempt == (1 if first else 2)
    assert begun.takeovers == (1 if how == "taken over" else 0)
    assert [r.step_key for r in begun.snapshot] == ([] if first else ["charge#0"])
    run = store.get_run("run-start")
    assert (run.status, run.owner, run.attempt, run.job_id) == ("running", "worker-1", begun.claim.attempt, "job-1")
    assert run.lease_until == pytest.approx(begun.claim.lease_until)
    assert begun.now <= begun.claim.lease_until - 30.0 + 1e-3
    assert run.updated_at == pytest.approx(begun.now)


DUPLICATE_COST = {"sqlite": (2, 1), "postgres": (1, 0), "mysql": (2, 1)}  # (round trips, transactions)


@pytest.mark.parametrize("how", ["busy", "finished"])
@pytest.mark.parametrize("backend", SQL_BACKENDS)
def test_c24_a_duplicate_delivery_is_answered_after_one_round_trip_on_postgresql(
    backend: str, how: str, request: pytest.FixtureRequest, make_sql_store: Callable[..., SqlStepStore]
) -> None:
    """A delivery of a run another attempt holds, or of a finished run, writes nothing: 1 round trip on PostgreSQL.

    SQLite: the claimed insert and the read, 2 statements; MariaDB: the
    locking read and the ``COMMIT`` (C24, C26).
    """
    store = make_sql_store(request.getfixturevalue(f"{backend}_url"))
    held = claim(store, "run-dup", owner="worker-0").claim
    if how == "finished":
        store.finish(held, "succeeded", outcome=b"done")
    log = TransactionLog(store.engine)

    result = store.begin("run-dup", "job-2", ENVELOPE, "worker-1", 30.0)

    assert (log.round_trips(backend), log.begins - log.autocommitted) == DUPLICATE_COST[backend], log.statements
    if how == "finished":
        assert result == Finished("succeeded", b"done")
    else:
        assert isinstance(result, Busy)
        assert 0 < result.lease_remaining <= 30.0
    run = store.get_run("run-dup")
    assert (run.owner, run.attempt) == (None if how == "finished" else "worker-0", 1)


RECORD_COST = {"sqlite": (1, 1), "postgres": (1, 0), "mysql": (2, 1)}  # (round trips, transactions)


@pytest.mark.parametrize("exists", [False, True], ids=["new run", "existing run"])
@pytest.mark.parametrize("backend", SQL_BACKENDS)
def test_c46_recording_a_run_at_publish_is_one_round_trip_on_postgresql(
    backend: str, exists: bool, request: pytest.FixtureRequest, make_sql_store: Callable[..., SqlStepStore]
) -> None:
    """A job recorded at publish, with a new key or one whose run exists (a producer's or a derived key), costs
    one statement: 1 autocommitted round trip on PostgreSQL, the statement and its ``COMMIT`` on MariaDB, one
    statement in one transaction on SQLite (C39, C46)."""
    store = make_sql_store(request.getfixturevalue(f"{backend}_url"))
    store.now()
    if exists:
        store.finish(claim(store, "order-46").claim, "succeeded", outcome=b"done")
    log = TransactionLog(store.engine)

    store.record_queued("order-46", "job-2", ENVELOPE)

    assert (log.round_trips(backend), log.begins - log.autocommitted) == RECORD_COST[backend], log.statements
    assert len(log.work_statements()) == 1
    assert store.get_run("order-46").status == ("succeeded" if exists else "queued")


@pytest.mark.postgres
@pytest.mark.parametrize("how", ["new", *STORED_RUNS])
def test_c23_an_attempt_start_is_one_or_two_round_trips_on_the_wire(
    how: str, postgres_url: str, make_sql_store: Callable[..., SqlStepStore], tmp_path: Path
) -> None:
    """What libpq itself sends and receives: one ``ReadyForQuery`` per round trip (C23).

    Independent of SQLAlchemy's events: the protocol trace of every pooled
    connection the start uses counts each exchange the server ends with
    ``ReadyForQuery`` (a statement, a ``BEGIN``, a ``COMMIT``, a ping).
    """
    store = make_sql_store(postgres_url)
    store.now()
    if how != "new":
        stored_run(store, "run-wire", how)
    trace = tmp_path / "libpq.trace"
    with trace.open("w") as out, traced(store.engine, out.fileno()):
        claim(store, "run-wire", owner="worker-1")
    replies = [line for line in trace.read_text().splitlines() if "ReadyForQuery" in line]
    assert len(replies) == (2 if how == "taken over" else 1), trace.read_text()


@contextlib.contextmanager
def traced(engine: sa.Engine, fileno: int) -> Iterator[None]:
    """Trace the libpq protocol of every connection checked out of ``engine`` to ``fileno`` (psycopg 3)."""
    from psycopg import pq

    def checkout(dbapi_connection: Any, *_: Any) -> None:
        dbapi_connection.pgconn.trace(fileno)
        dbapi_connection.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)

    def checkin(dbapi_connection: Any, *_: Any) -> None:
        if dbapi_connection is not None:
            dbapi_connection.pgconn.untrace()

    event.listen(engine, "checkout", checkout)
    event.listen(engine, "checkin", checkin)
    try:
        yield
    finally:
        event.remove(engine, "checkout", checkout)
        event.remove(engine, "checkin", checkin)


@pytest.mark.postgres
@pytest.mark.parametrize("meanwhile", ["claimed elsewhere", "undo marker added"])
def test_c24_a_run_written_while_its_one_statement_claim_waits_is_decided_on_its_new_state(
    meanwhile: str, postgres_url: str, make_sql_store: Callable[..., SqlStepStore]
) -> None:
    """A start whose one-statement claim waits for a row another transaction writes decides on what is committed.

    The run holds no claim when the start's statement reads it; another
    transaction holds its row (a delivery claiming it; or a step row added
    while the run stays unclaimed, as a compensation's marker is) and commits
    while the start waits. The start's claim then writes nothing, whatever
    the committed run now allows, and the start decides again with the row
    locked: ``Busy`` behind the other claim, or granted with the new step in
    its snapshot, never a snapshot that misses it (C24, C25).
    """
    store = make_sql_store(postgres_url)
    stored_run(store, "run-race", "retrying")
    runs, steps = store._t.runs, store._t.steps
    writer = sa.create_engine(postgres_url)
    watcher = sa.create_engine(postgres_url)

    def waiting_on_the_row() -> bool:
        query = sa.text("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE :q")
        with watcher.connect() as conn:
            return bool(conn.execute(query, {"q": f"%claimed AS%UPDATE {runs.name} %"}).scalar_one())

    got: list[object] = []
    with writer.connect() as conn:
        transaction = conn.begin()
        if meanwhile == "claimed elsewhere":
            now = sa.literal_column("extract(epoch from clock_timestamp())")
            conn.execute(
                sa.update(runs)
                .where(runs.c.run_key == "run-race")
                .values(status="running", owner="worker-2", attempt=runs.c.attempt + 1, lease_until=now + 30.0)
            )
        else:
            conn.execute(
                sa.insert(steps).values(
                    run_key="run-race", position=1, step_key="undo#0", kind="compensation", committed_at=0.0, attempt=1
                )
            )
            conn.execute(sa.update(runs).where(runs.c.run_key == "run-race").values(step_count=runs.c.step_count + 1))
        starter = threading.Thread(target=lambda: got.append(store.begin("run-race", "job-1", ENVELOPE, "w1", 30.0)))
        starter.start()
        wait_for(waiting_on_the_row, 30.0, "the start to wait for the run's row")
        transaction.commit()
        starter.join()
    writer.dispose()
    watcher.dispose()

    result = got[0]
    run = store.get_run("run-race")
    if meanwhile == "claimed elsewhere":
        assert isinstance(result, Busy)
        assert (run.owner, run.attempt, run.takeovers) == ("worker-2", 2, 0)
    else:
        assert isinstance(result, Begun)
        assert [r.step_key for r in result.snapshot] == ["charge#0", "undo#0"]
        assert (run.owner, run.attempt) == ("w1", 2)


@pytest.mark.postgres
def test_c24_a_lease_renewed_between_the_read_and_the_write_is_not_taken_over(
    postgres_url: str, make_sql_store: Callable[..., SqlStepStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A delivery that read an expired lease does not take the claim over if its holder renews it first (C24).

    The renewal changes the run's row between the start's read and its
    compare-and-set, which then writes nothing; decided again with the row
    locked, the lease is live: ``Busy``, and the holder keeps the run.
    """
    store = make_sql_store(postgres_url)
    held = claim(store, "run-renewed", owner="worker-0", lease=0.0).claim
    renewed: list[Claim] = []
    between(store, monkeypatch, lambda: renewed.append(store.renew(held, 30.0)))

    result = store.begin("run-renewed", "job-1", ENVELOPE, "worker-1", 30.0)

    assert renewed
    assert isinstance(result, Busy)
    run = store.get_run("run-renewed")
    assert (run.owner, run.attempt, run.takeovers) == ("worker-0", 1, 0)


@pytest.mark.postgres
def test_c25_a_step_committing_while_the_takeover_is_written_is_in_the_snapshot(
    postgres_url: str, make_sql_store: Callable[..., SqlStepStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step the expired attempt commits while the takeover waits for the run's row is replayed, not re-run (C25).

    The old attempt's step is written in an open transaction (C42) after the
    start read the run; the takeover's compare-and-set waits for that row
    lock and, once the step commits, finds the row changed and writes
    nothing; decided again with the row locked, the snapshot has the step.
    """
    store = make_sql_store(postgres_url)
    old = claim(store, "run-zombie", owner="worker-0", lease=0.0).claim
    caller_engine = sa.create_engine(postgres_url)
    watcher = sa.create_engine(postgres_url)
    runs_table = store._t.runs.name

    def waiting_on_the_row() -> bool:
        query = sa.text("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE :q")
        with watcher.connect() as conn:
            return bool(conn.execute(query, {"q": f"%claimed AS%UPDATE {runs_table} %"}).scalar_one())

    with caller_engine.connect() as conn:
        transaction = conn.begin()

        def step_in_flight() -> None:
            store.commit_step_on(PostgresCaller(conn), old, StepRow(0, "charge#0", "run", b"v"))

            def commit_once_waited_on() -> None:
                wait_for(waiting_on_the_row, 30.0, "the takeover to wait for the run's row")
                transaction.commit()

            threading.Thread(target=commit_once_waited_on, daemon=True).start()

        between(store, monkeypatch, step_in_flight)
        begun = claim(store, "run-zombie", owner="worker-1")

    caller_engine.dispose()
    watcher.dispose()
    assert (begun.claim.attempt, begun.takeovers) == (2, 1)
    assert [(r.step_key, r.value, r.attempt) for r in begun.snapshot] == [("charge#0", b"v", 1)]
    with pytest.raises(ClaimLost):
        store.commit_step(old, StepRow(1, "ship#0", "run", b"w"))


def between(store: SqlStepStore, monkeypatch: pytest.MonkeyPatch, meanwhile: Callable[[], object]) -> None:
    """Run ``meanwhile`` once, after a start's read and before its claim's compare-and-set (PostgreSQL)."""
    folded = store._folded
    write = folded.claim_if_unchanged
    pending = [meanwhile]

    def claim_if_unchanged(*args: Any, **kwargs: Any) -> Any:
        if pending:
            pending.pop()()
        return write(*args, **kwargs)

    monkeypatch.setattr(folded, "claim_if_unchanged", claim_if_unchanged)


@pytest.mark.parametrize(
    "backend",
    [
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("mysql", marks=pytest.mark.mysql),
        pytest.param("mariadb", marks=pytest.mark.mysql),
    ],
)
def test_c23_a_renewal_does_not_wait_for_a_row_another_transaction_holds(
    backend: str, request: pytest.FixtureRequest, make_sql_store: Callable[..., SqlStepStore]
) -> None:
    """A renewal of a run whose row an open transaction holds is refused at once (``RunLocked``), not waited (C23).

    A transactional step's write holds its run's row until the caller's
    transaction ends (C42); the process's one renewer must go on with the
    other claims meanwhile. Nothing is written; once the transaction ends,
    the renewal goes through.
    """
    store = make_sql_store(request.getfixturevalue(f"{backend}_url"))
    begun = claim(store, "run-held")
    runs = store_tables(store.table_prefix).runs
    got: list[object] = []

    def renew() -> None:
        try:
            got.append(store.renew(begun.claim, 60.0))
        except Exception as exc:  # what the test looks at
            got.append(exc)

    with store.engine.connect() as other:
        transaction = other.begin()
        other.execute(sa.select(runs.c.run_key).where(runs.c.run_key == "run-held").with_for_update())
        renewer = threading.Thread(target=renew)
        renewer.start()
        renewer.join(20.0)  # a bound on a hang: a renewal that waits for the lock never returns before the rollback
        still_waiting = renewer.is_alive()
        transaction.rollback()
    renewer.join()
    assert not still_waiting, "the renewal waited for the row lock"
    assert isinstance(got[0], RunLocked), got
    assert store.get_run("run-held").lease_until == pytest.approx(begun.claim.lease_until)
    renewed = store.renew(begun.claim, 60.0)
    assert renewed.lease_until > begun.claim.lease_until
    assert store.get_run("run-held").lease_until == pytest.approx(renewed.lease_until)


def test_c25_a_refused_write_rolls_back(sql_store: SqlStepStore) -> None:
    """A fenced write that finds its claim lost rolls its transaction back: nothing is committed (C25)."""
    old = claim(sql_store, "run-fenced", lease=0.2).claim
    while sql_store.now() <= old.lease_until:
        time.sleep(0.01)
    claim(sql_store, "run-fenced", owner="worker-2")
    log = TransactionLog(sql_store.engine)
    with pytest.raises(ClaimLost):
        sql_store.commit_step(old, StepRow(0, "charge#0", "run", b"v"))
    assert (log.commits, log.rollbacks) == (0, 1)
    assert sql_store.get_steps("run-fenced") == []


def test_c23_skewed_worker_clock_cannot_steal_live_claim(
    sql_store: SqlStepStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the worker's clock a day ahead, a live claim is still ``Busy``: leases use the database clock (C23)."""
    claim(sql_store, "run-skew", lease=30.0)
    real_now = time.time()
    monkeypatch.setattr(time, "time", lambda: real_now + 86_400.0)
    result = sql_store.begin("run-skew", "job-2", ENVELOPE, "skewed-worker", 30.0)
    assert isinstance(result, Busy)
    assert 0 < result.lease_remaining <= 30.0
    assert abs(sql_store.now() - real_now) < 60.0
    assert sql_store.get_run("run-skew").owner == "worker-1"


# ------------------------------------------------------------------ errors
UNREACHABLE = [
    "postgresql+psycopg://postgres:s3cret@127.0.0.1:1/test?connect_timeout=2",
    "mysql+pymysql://root:s3cret@127.0.0.1:1/test?connect_timeout=2",
]


def every_public_call(store: StepStore) -> Iterator[tuple[str, Callable[[], object]]]:
    fake = Claim("run-x", "w", 1, 0.0)
    yield "now", store.now
    yield "begin", lambda: store.begin("run-x", "job", ENVELOPE, "w", 30.0)
    yield "renew", lambda: store.renew(fake, 30.0)
    yield "commit_step", lambda: store.commit_step(fake, StepRow(0, "a#0", "run", b"v"))
    yield "finish", lambda: store.finish(fake, "dead", dead_letter=NewDeadLetter("j", "error", "m"))
    yield "settle_failed", lambda: store.settle_failed("run-x", 1)
    yield "get_run", lambda: store.get_run("run-x")
    yield "list_runs", store.list_runs
    yield "get_steps", lambda: store.get_steps("run-x")
    yield "list_dead_letters", store.list_dead_letters
    yield "get_dead_letter", lambda: store.get_dead_letter(1)
    yield "prepare_retry", lambda: store.prepare_retry(1)
    yield "purge_dead_letters", store.purge_dead_letters
    yield "cleanup", lambda: store.cleanup(older_than=0.0)


@pytest.mark.parametrize("url", UNREACHABLE, ids=["postgres", "mysql"])
def test_c28_unreachable_server_raises_store_unavailable(url: str) -> None:
    """Every public method raises ``StoreUnavailable`` for a server that is down, password hidden (C28).

    Nothing from SQLAlchemy leaks: the raised type is ours, the original is its ``__cause__``.
    """
    store = SqlStepStore(url)  # construction does not connect
    for name, call in every_public_call(store):
        with pytest.raises(StoreError) as info:
            call()
        assert type(info.value) is StoreUnavailable, name
        assert isinstance(info.value.__cause__, sa.exc.SQLAlchemyError), name
        assert "s3cret" not in str(info.value)
        assert "***@127.0.0.1:1" in str(info.value)
    store.close()


def test_c41_sqlite_file_in_a_missing_directory_raises_store_misconfigured(tmp_path: Path) -> None:
    """C28, C41: a SQLite file in a missing directory is ``StoreMisconfigured`` naming the directory.

    Still a ``StoreUnavailable`` (a job that meets it is put back), and no
    SQLAlchemy error leaks: the original is the ``__cause__``.
    """
    missing = tmp_path / "missing"
    store = SqlStepStore(f"sqlite:///{missing / 'steps.db'}")
    with pytest.raises(StoreMisconfigured) as info:
        store.begin("run-x", "job", ENVELOPE, "w", 30.0)
    assert isinstance(info.value, StoreUnavailable)
    assert isinstance(info.value.__cause__, sa.exc.SQLAlchemyError)
    assert f"its directory {str(missing)!r} does not exist" in str(info.value)


def test_c41_a_sqlite_uri_in_a_missing_directory_names_the_directory_of_its_file(tmp_path: Path) -> None:
    """C41: with ``uri=true`` the file is read out of the SQLite URI: the missing directory is the file's,
    not ``file:/…``."""
    missing = tmp_path / "missing"
    store = SqlStepStore(f"sqlite:///file:{missing / 'steps.db'}?uri=true")
    with pytest.raises(StoreMisconfigured) as info:
        store.now()
    assert f"its directory {str(missing)!r} does not exist" in str(info.value)
    store.close()


def test_c41_a_read_only_sqlite_uri_reads_and_refuses_writes_as_misconfigured(tmp_path: Path) -> None:
    """C41: ``sqlite:///file:/path/x.db?mode=ro&uri=true`` opens an existing store for reading; a write is
    ``StoreMisconfigured`` naming ``mode=ro`` (no outage to wait out), and so is :meth:`check_writable`,
    which a worker calls as it starts, without connecting. ``mode=ro`` on a missing file says so."""
    path = tmp_path / "steps.db"
    writable = SqlStepStore(f"sqlite:///{path}")
    writable.record_queued("run-1", "job-1", ENVELOPE)
    writable.close()

    store = SqlStepStore(f"sqlite:///file:{path}?mode=ro&uri=true")
    assert store.get_run("run-1").status == "queued"  # reading works
    with pytest.raises(StoreMisconfigured) as write:
        store.record_queued("run-2", "job-2", ENVELOPE)
    assert "the URL opens it read-only (mode=ro), and workers write their steps to it" in str(write.value)
    with pytest.raises(StoreMisconfigured) as start:
        store.check_writable()
    assert "read-only (mode=ro)" in str(start.value)
    store.close()
    SqlStepStore(f"sqlite:///{path}").check_writable()  # a writable store passes

    absent = SqlStepStore(f"sqlite:///file:{tmp_path / 'absent.db'}?mode=ro&uri=true")
    with pytest.raises(StoreMisconfigured) as missing:
        absent.now()
    assert f"its file {str(tmp_path / 'absent.db')!r} does not exist, and mode=ro does not create it" in str(
        missing.value
    )
    absent.close()


REFUSALS = [
    pytest.param(
        "postgresql://postgres@127.0.0.1:5432/flexiq_no_such_db", "does not exist", marks=pytest.mark.postgres
    ),
    pytest.param("postgresql://flexiq_nobody:s3cret@127.0.0.1:5432/test", "flexiq_nobody", marks=pytest.mark.postgres),
    pytest.param("mysql://root@127.0.0.1:3306/flexiq_no_such_db", "Unknown database", marks=pytest.mark.mysql),
    pytest.param("mysql://flexiq_nobody:s3cret@127.0.0.1:3306/test", "Access denied", marks=pytest.mark.mysql),
    pytest.param(
        "postgresql://postgres@127.0.0.1:5432/test?sslmode=require",
        "server does not support SSL, but SSL was required",
        marks=pytest.mark.postgres,
    ),  # the test server runs without SSL
    pytest.param(
        "postgresql+psycopg2://postgres@127.0.0.1:5432/test?sslmode=require",
        "server does not support SSL, but SSL was required",
        marks=pytest.mark.postgres,
    ),
    pytest.param(
        "postgresql+psycopg2://postgres@127.0.0.1:5432/flexiq_no_such_db", "does not exist", marks=pytest.mark.postgres
    ),
    pytest.param(
        "postgresql+psycopg2://flexiq_nobody:s3cret@127.0.0.1:5432/test", "flexiq_nobody", marks=pytest.mark.postgres
    ),
]


@pytest.mark.parametrize(
    ("url", "cause"),
    REFUSALS,
    ids=[
        "pg-database",
        "pg-login",
        "mysql-database",
        "mysql-login",
        "pg-ssl-required",
        "psycopg2-ssl-required",
        "psycopg2-database",
        "psycopg2-login",
    ],
)
def test_c41_an_unknown_database_or_a_refused_login_raises_store_misconfigured(url: str, cause: str) -> None:
    """C41: a server that refuses the login, knows no such database or cannot meet ``sslmode=require``
    raises ``StoreMisconfigured``, through psycopg 3 and psycopg2 alike.

    The message names the cause and hides the password; a plain outage
    (connection refused) stays a plain ``StoreUnavailable``.
    """
    require_service(*(POSTGRES if url.startswith("postgresql") else MYSQL))
    store = SqlStepStore(url)
    with pytest.raises(StoreMisconfigured) as info:
        store.now()
    assert cause in str(info.value)
    assert "s3cret" not in str(info.value)
    store.close()


@pytest.mark.postgres
def test_a_data_error_is_a_store_error_not_unavailable(
    postgres_url: str, make_sql_store: Callable[..., SqlStepStore]
) -> None:
    """A database error that is no outage (a run key over 255 characters) is a plain ``StoreError``."""
    store = make_sql_store(postgres_url)
    store.begin("k" * 255, "job", ENVELOPE, "w", 30.0)  # a long custom task id still fits
    with pytest.raises(StoreError) as info:
        store.begin("k" * 256, "job", ENVELOPE, "w", 30.0)
    assert type(info.value) is StoreError
    assert isinstance(info.value.__cause__, sa.exc.DataError)


def test_missing_tables_without_auto_upgrade_names_the_fix(make_sql_store: Callable[..., SqlStepStore]) -> None:
    """With ``auto_upgrade=False`` and no tables, the error says to run the upgrade."""
    store = make_sql_store("sqlite://", auto_upgrade=False)
    with pytest.raises(StoreError, match="flexiq store upgrade"):
        store.get_run("run-x")


@pytest.mark.postgres
def test_c41_psycopg2_missing_tables_name_the_fix(postgres_url: str) -> None:
    """Through psycopg2, a store without its tables says to run ``flexiq store upgrade`` (42P01 read as ``pgcode``)."""
    pytest.importorskip("psycopg2")
    store = SqlStepStore(PSYCOPG2_URL, table_prefix=f"t{uuid4().hex[:8]}_", auto_upgrade=False)
    try:
        with pytest.raises(StoreError, match="flexiq store upgrade"):
            store.get_run("run-1")
    finally:
        store.close()


def test_an_envelope_that_is_not_json_is_refused(sql_store: SqlStepStore) -> None:
    """A job envelope the store cannot write as JSON raises ``StoreError`` before any write (C35)."""
    bad = JobEnvelope(task_name="t", framework="test", args=[object()])
    with pytest.raises(StoreError, match="JSON"):
        sql_store.begin("run-bad", "job", bad, "w", 30.0)
    assert sql_store.list_runs() == []


# --------------------------------------------------------------- factory
@pytest.mark.parametrize("spec", ["redis://localhost:6379/0", "oracle://scott@db/x", "steps.db", ""])
def test_unknown_store_scheme_raises_configuration_error(spec: str) -> None:
    """An unknown store URL raises ``ConfigurationError`` naming the value and the accepted forms."""
    with pytest.raises(ConfigurationError) as info:
        open_store(spec)
    assert repr(spec) in str(info.value)
    assert "sqlite:///path" in str(info.value)
    assert "memory://" in str(info.value)
    assert isinstance(info.value, ValueError)


def test_open_store_rejects_other_types() -> None:
    """``open_store`` of something that is no URL, engine or store raises ``ConfigurationError``."""
    with pytest.raises(ConfigurationError, match="42"):
        open_store(42)  # type: ignore[arg-type]


def test_open_store_forms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store is returned as is, ``memory://`` is in memory, an engine or URL gives a SQL store."""
    memory = MemoryStepStore()
    assert open_store(memory) is memory
    assert isinstance(open_store("memory://"), MemoryStepStore)
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'engine.db'}")
    from_engine = open_store(engine)
    assert isinstance(from_engine, SqlStepStore)
    assert from_engine.engine is engine
    from_url = open_store(f"sqlite:///{tmp_path / 'url.db'}", table_prefix="x_")
    assert isinstance(from_url, SqlStepStore)
    assert from_url.table_prefix == "x_"
    from_url.close()
    engine.dispose()


def test_open_store_defaults_to_env_then_a_sqlite_file_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No spec: ``FLEXIQ_STORE_URL`` if set, else ``flexiq_steps.db`` in the working directory."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(STORE_URL_ENV, raising=False)
    default = open_store()
    assert isinstance(default, SqlStepStore)
    assert DEFAULT_STORE_URL == "sqlite:///flexiq_steps.db"
    assert default.engine.url.database == str(tmp_path / "flexiq_steps.db")
    claim(default, "run-default")
    assert (tmp_path / "flexiq_steps.db").exists()
    default.close()
    monkeypatch.setenv(STORE_URL_ENV, "memory://")
    assert isinstance(open_store(), MemoryStepStore)


def test_urls_without_a_driver_get_this_packages_drivers() -> None:
    """``postgresql://`` uses psycopg 3, ``mysql://`` and ``mariadb://`` use PyMySQL with utf8mb4."""
    assert normalize_url("postgresql://u@h/db").drivername == "postgresql+psycopg"
    assert normalize_url("postgres://u@h/db").drivername == "postgresql+psycopg"
    assert normalize_url("postgresql+psycopg://u@h/db").drivername == "postgresql+psycopg"
    mysql = normalize_url("mysql://u@h/db")
    assert (mysql.drivername, mysql.query["charset"]) == ("mysql+pymysql", "utf8mb4")
    assert normalize_url("mariadb://u@h/db").drivername == "mariadb+pymysql"
    assert normalize_url("sqlite://").database is None


def test_sqlite_opens_in_wal_mode_with_a_busy_timeout(sqlite_url: str) -> None:
    """A SQLite store uses WAL journaling and a 30 s busy timeout, so processes can share the file."""
    store = SqlStepStore(sqlite_url)
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30_000
    store.close()


@pytest.mark.mysql
def test_mariadb_url_works_end_to_end(mysql_url: str, make_sql_store: Callable[..., SqlStepStore]) -> None:
    """A ``mariadb://`` URL (MariaDB dialect) creates the same schema: a 1 MiB value round-trips."""
    store = make_sql_store(mysql_url.replace("mysql+pymysql://", "mariadb://"))
    begun = claim(store, "run-mariadb")
    value = os.urandom(1024 * 1024)
    store.commit_step(begun.claim, StepRow(0, "blob#0", "run", value))
    assert store.get_steps("run-mariadb")[0].value == value


# ------------------------------------------------------------ processes
@pytest.mark.parametrize("backend", SQL_BACKENDS)
def test_forked_child_uses_its_own_connections(
    backend: str, request: pytest.FixtureRequest, make_sql_store: Callable[..., SqlStepStore], tmp_path: Path
) -> None:
    """A forked child using the parent's store object works while the parent keeps working (prefork safety)."""
    store = make_sql_store(request.getfixturevalue(f"{backend}_url"))
    claim(store, "warm-up")  # the parent's pool now holds a connection
    errors = tmp_path / "child-errors.txt"
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            exercise(store, "child")
            code = 0
        except BaseException:
            errors.write_text(traceback.format_exc())
        finally:
            os._exit(code)
    exercise(store, "parent")
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, errors.read_text() if errors.exists() else status
    assert {r.run_key for r in store.list_runs(status="succeeded")} >= {f"child-{i}" for i in range(10)} | {
        f"parent-{i}" for i in range(10)
    }


def test_the_pool_keeps_a_connection_per_concurrent_user_without_a_limit(sql_store: SqlStepStore) -> None:
    """A process with more threads than SQLAlchemy's default pool (5 kept, 15 at most) neither waits nor reconnects.

    The store's pool keeps every connection it opened: a worker of N threads
    holds N connections and opens no new one per job.
    """
    engine = sql_store.engine
    opened: list[object] = []
    event.listen(engine, "connect", lambda dbapi_connection, _record: opened.append(dbapi_connection))
    users = 16  # SQLAlchemy's default QueuePool would wait 30 s for the 16th, then raise TimeoutError

    def use_at_once() -> None:
        held = [engine.connect().execution_options(**{READ_ONLY: True}) for _ in range(users)]  # SQLite: no write lock
        for conn in held:
            conn.execute(sa.select(1))
        for conn in held:
            conn.close()

    use_at_once()
    first_round = len(opened)
    assert first_round >= users - 1  # one may be the connection the migration left in the pool
    use_at_once()
    assert len(opened) == first_round, "the second round reconnected: the pool closed connections on return"
    assert engine.pool.checkedin() >= users


def exercise(store: SqlStepStore, who: str) -> None:
    for i in range(10):
        begun = claim(store, f"{who}-{i}", owner=who)
        store.commit_step(begun.claim, StepRow(0, "charge#0", "run", b"v"))
        store.finish(begun.claim, "succeeded")


def test_c24_concurrent_begin_claims_once(sql_store: SqlStepStore) -> None:
    """Eight deliveries of one run at once: exactly one claims it, the others are ``Busy`` (C24)."""

    def deliver(i: int) -> object:
        return sql_store.begin("run-new", "job", ENVELOPE, f"w{i}", 30.0)

    for _ in ("a new run", "an existing released run"):
        results = concurrently(deliver)
        begun = [r for r in results if isinstance(r, Begun)]
        assert len(begun) == 1, results
        assert all(isinstance(r, Busy) for r in results if r is not begun[0])
        sql_store.finish(begun[0].claim, "sleeping")
    assert sql_store.get_run("run-new").attempt == 2


def concurrently(call: Callable[[int], object], threads: int = 8) -> list[object]:
    barrier = threading.Barrier(threads)
    results: list[object] = [None] * threads

    def worker(i: int) -> None:
        barrier.wait()
        try:
            results[i] = call(i)
        except Exception as exc:
            results[i] = exc

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return results


# -------------------------------------------------------------- migrations
def migrations_head() -> str:
    """The newest revision of the shipped migrations."""
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    import flexiq_plugins

    config = Config()
    config.set_main_option("script_location", str(Path(flexiq_plugins.__file__).parent / "_store" / "migrations"))
    head = ScriptDirectory.from_config(config).get_current_head()
    assert head is not None
    return head


@pytest.mark.parametrize(
    "backend",
    [
        "sqlite",
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("mysql", marks=pytest.mark.mysql),
    ],
)
def test_upgrade_store_is_idempotent_and_safe_concurrently(
    backend: str, request: pytest.FixtureRequest, make_sql_store: Callable[..., SqlStepStore]
) -> None:
    """``upgrade_store`` run four times at once and again later leaves one schema at head."""
    url = request.getfixturevalue(f"{backend}_url")
    store = make_sql_store(url, auto_upgrade=False)
    results = concurrently(lambda _: upgrade_store(url, table_prefix=store.table_prefix), threads=4)
    assert results == [None] * 4
    upgrade_store(url, table_prefix=store.table_prefix)
    with store.engine.connect() as conn:
        versions = conn.execute(sa.text(f"SELECT version_num FROM {store.table_prefix}alembic_version")).all()
    assert [v[0] for v in versions] == [migrations_head()]
    claim(store, "run-after-upgrade")


@pytest.mark.postgres
def test_c41_a_store_already_at_the_newest_schema_starts_without_waiting_on_the_migration_lock(
    postgres_url: str, make_sql_store: Callable[..., SqlStepStore]
) -> None:
    """A process whose tables are at the newest revision reads and writes while another session holds
    the migration lock (a session cut off mid-upgrade, say): its store waits on no lock. The second
    store gives up on any lock after 2 s, so waiting on this one would fail the test, not hang it."""
    first = make_sql_store(postgres_url)
    claim(first, "run-before-the-lock")  # the tables exist, at head
    holder = sa.create_engine(postgres_url)
    try:
        with holder.connect() as conn:
            number = zlib.crc32(f"flexiq-migrate:{first.table_prefix}".encode())
            assert conn.execute(sa.select(sa.func.pg_try_advisory_lock(number))).scalar_one() is True
            conn.commit()
            impatient = make_sql_store(
                postgres_url + "?options=-c%20lock_timeout%3D2000", table_prefix=first.table_prefix
            )
            claim(impatient, "run-while-the-lock-is-held")
            assert impatient.get_run("run-before-the-lock").status == "running"
    finally:
        holder.dispose()


def test_c41_a_sqlite_store_at_the_newest_schema_starts_while_another_connection_writes(tmp_path: Path) -> None:
    """SQLite: the first call of a store whose file is at the newest schema reads it without taking the
    write lock, so another process's open write transaction does not hold it up (it would wait out the
    busy timeout, then fail with "database is locked")."""
    path = tmp_path / "steps.db"
    url = f"sqlite:///{path}"
    upgrade_store(url)
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")  # another process's write transaction, left open
    store = SqlStepStore(url)
    try:
        assert "schema revision " + migrations_head() in store.describe()
    finally:
        writer.execute("ROLLBACK")
        writer.close()
        store.close()


@pytest.mark.mysql
def test_c41_a_migration_lock_not_granted_in_time_migrates_nothing_and_says_so(
    mysql_url: str, make_sql_store: Callable[..., SqlStepStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """MySQL/MariaDB: an upgrade whose ``GET_LOCK`` times out (another session holds the migration lock)
    raises ``StoreUnavailable`` naming the lock and leaves the schema as it was; it never upgrades without
    the lock. Once the lock is free the same upgrade goes through."""
    from flexiq_plugins._store.sql import migrate as migrate_module

    store = make_sql_store(mysql_url, auto_upgrade=False)
    prefix = store.table_prefix
    upgrade_store(mysql_url, revision="0010", table_prefix=prefix)
    monkeypatch.setattr(migrate_module, "_LOCK_WAIT_S", 1)
    key = f"flexiq-migrate:{prefix}"[:64]  # the migration lock's name
    holder = sa.create_engine(mysql_url)
    try:
        with holder.connect() as conn:
            assert conn.execute(sa.select(sa.func.get_lock(key, 0))).scalar() == 1
            with pytest.raises(StoreUnavailable, match="migration lock"):
                upgrade_store(mysql_url, table_prefix=prefix)
            with store.engine.connect() as reader:
                assert migrate_module.schema_revision(reader, prefix) == "0010"
            conn.execute(sa.select(sa.func.release_lock(key)))
        upgrade_store(mysql_url, table_prefix=prefix)
        with store.engine.connect() as reader:
            assert migrate_module.schema_revision(reader, prefix) == migrations_head()
    finally:
        holder.dispose()


@pytest.mark.parametrize("backend", SQL_BACKENDS)
def test_c9_driver_memo_hit_is_zero_statements_and_a_new_step_one_transaction(
    backend: str, request: pytest.FixtureRequest, make_sql_store: Callable[..., SqlStepStore]
) -> None:
    """Through the attempt driver on a SQL store (C9): starting an attempt is one transaction,
    each new step one transaction, and a replayed step (memo hit) issues no statement at all."""
    from flexiq_plugins import DurableConfig, current_job
    from flexiq_plugins._attempt.decisions import Completed, Failure
    from flexiq_plugins.integration import AttemptDriver, JobInfo

    store = make_sql_store(request.getfixturevalue(f"{backend}_url"))
    store.now()
    driver = AttemptDriver(store, DurableConfig(lease_seconds=600))  # no renewal inside the test
    job = JobInfo("run-c9-driver", "job-1", ENVELOPE)
    log = TransactionLog(store.engine)
    seen: list[tuple[int, int]] = []

    def body(fail: bool) -> str:
        for name in ("a", "b"):
            before = (log.begins, len(log.work_statements()))
            current_job.step.run(name, lambda name=name: name)
            seen.append((log.begins - before[0], len(log.work_statements()) - before[1]))
        if fail:
            raise RuntimeError("end the first attempt with its rows kept")
        return "done"

    log.reset()
    attempt = driver.start(job)
    assert log.begins == 1, "attempt start is one transaction"
    assert isinstance(attempt.run(body, True), Failure)  # type: ignore[union-attr]
    step_statements = FOLDED_STATEMENTS[backend][1]
    assert seen == [(1, step_statements)] * 2, "each new step is one transaction of its folded statements"

    seen.clear()
    attempt = driver.start(job)
    assert isinstance(attempt.run(body, False), Completed)  # type: ignore[union-attr]
    assert seen == [(0, 0), (0, 0)], "memo hits issue no statement"


# ------------------------------------------------------- connections
@pytest.mark.parametrize(("query", "level"), [("", 1), ("?synchronous=full", 2), ("?synchronous=NORMAL", 1)])
def test_c9_sqlite_commits_with_synchronous_normal_unless_the_url_asks_for_full(
    tmp_path: Path, make_sql_store: Callable[..., SqlStepStore], query: str, level: int
) -> None:
    """A SQLite file store runs WAL with ``synchronous=NORMAL`` (1) by default, ``FULL`` (2) on request (C9)."""
    store = make_sql_store(f"sqlite:///{tmp_path / 'steps.db'}{query}")
    store.now()
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar_one() == "wal"
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar_one() == level


def test_c41_an_unknown_sqlite_synchronous_level_is_a_configuration_error(tmp_path: Path) -> None:
    """``?synchronous=off`` (or any other value) is refused when the store is configured (C41)."""
    with pytest.raises(ConfigurationError, match="synchronous"):
        SqlStepStore(f"sqlite:///{tmp_path / 'steps.db'}?synchronous=off")


@pytest.mark.postgres
def test_c28_a_pooled_connection_the_server_closed_is_replaced_before_anything_commits(
    postgres_url: str, make_sql_store: Callable[..., SqlStepStore]
) -> None:
    """No pre-ping per use: a pooled connection the server killed fails its first statement, and the
    transaction runs once more on a new connection, since nothing was committed (C28)."""
    store = make_sql_store(postgres_url)
    store.now()
    with store.engine.connect() as conn:
        pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
    killer = sa.create_engine(normalize_url(postgres_url))
    with killer.begin() as conn:
        assert conn.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid}).scalar_one()
    alive = sa.text("SELECT count(*) FROM pg_stat_activity WHERE pid = :pid")
    wait_for(lambda: _scalar(killer, alive, pid=pid) == 0, timeout=30, what="the backend to exit")
    killer.dispose()

    begun = claim(store, "run-after-kill")

    assert begun.claim.attempt == 1
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one() != pid


@pytest.mark.mysql
def test_c25_a_mysql_connection_returned_inside_a_transaction_is_rolled_back(
    mysql_url: str, make_sql_store: Callable[..., SqlStepStore]
) -> None:
    """The pool does not send a ROLLBACK after every commit on MySQL/MariaDB, but a connection returned
    with a transaction open is still rolled back: nothing it wrote commits, no lock stays held (C25)."""
    store = make_sql_store(mysql_url)
    begun = claim(store, "run-returned")
    raw = store.engine.raw_connection()
    cursor = raw.cursor()
    cursor.execute(f"UPDATE {store.table_prefix}runs SET owner = 'intruder'")
    cursor.close()
    raw.close()  # back to the pool, the transaction still open

    assert store.get_run("run-returned").owner == begun.claim.owner
    store.commit_step(begun.claim, StepRow(0, "charge#0", "run", b"v"))  # the row is not locked


def _scalar(engine: sa.Engine, query: sa.TextClause, **params: Any) -> Any:
    with engine.connect() as conn:
        return conn.execute(query, params).scalar_one()


@pytest.mark.postgres
@pytest.mark.parametrize(
    "meanwhile", ["cancel requested", "old holder dead-letters", "old holder succeeds", "recovered"]
)
def test_c25_a_run_changed_between_the_start_read_and_its_write_is_decided_on_its_new_state(
    meanwhile: str, postgres_url: str, make_sql_store: Callable[..., SqlStepStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A takeover of an expired lease decided on a read the run no longer matches writes nothing (C24–C26, C35).

    Between the start's read and its compare-and-set the run gets a
    cancellation request, its old holder ends it (dead, succeeded), or a
    recoverer stamps it: the start decides again on what is stored now.
    """
    store = make_sql_store(postgres_url)
    old = claim(store, "run-moved", owner="worker-0", lease=0.0).claim
    store.commit_step(old, StepRow(0, "charge#0", "run", b"v"))
    read = store.get_run("run-moved")

    def act() -> None:
        if meanwhile == "cancel requested":
            store.request_cancel("run-moved", "operator")
        elif meanwhile == "old holder dead-letters":
            store.finish(old, "dead", dead_letter=NewDeadLetter("job-0", "divergence", "changed"))
        elif meanwhile == "old holder succeeds":
            store.finish(old, "succeeded", drop_steps=True, outcome=b"done")
        else:
            assert store.mark_recovered("run-moved", status=read.status, updated_at=read.updated_at)

    between(store, monkeypatch, act)
    result = store.begin("run-moved", "job-1", ENVELOPE, "worker-1", 30.0)

    if meanwhile == "cancel requested":
        assert isinstance(result, Begun)
        assert result.cancel_reason == "operator"
        assert [r.step_key for r in result.snapshot] == ["charge#0"]
    elif meanwhile == "recovered":
        assert isinstance(result, Begun)
        assert (result.claim.attempt, result.takeovers) == (2, 1)
    else:
        assert isinstance(result, Finished)
        assert result.status == ("dead" if "dead" in meanwhile else "succeeded")
        run = store.get_run("run-moved")
        assert (run.owner, run.attempt) == (None, 1)
