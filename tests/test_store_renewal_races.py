"""A lease renewal that does not wait for a row lock (``RunLocked``), the MySQL/MariaDB attempt start, psycopg2.

Every test runs against the real databases with real threads and connections. Waits are bounded, on the
database's clock or on thread joins, never a margin.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from uuid import uuid4

import pytest
import sqlalchemy as sa

from flexiq_plugins import JobEnvelope, SqlStepStore
from flexiq_plugins._model.records import Begun, Busy, Claim
from flexiq_plugins._store.sql.errors import is_deadlock
from flexiq_plugins._store.sql.tables import store_tables
from flexiq_plugins.errors import ClaimLost, RunLocked, StoreError
from tests.conftest import drop_store_tables
from tests.polling import wait_for

ENVELOPE = JobEnvelope("tasks.t", "test")
PATIENCE_S = 30.0
"""How long a test waits for what must happen, seconds (a bound on a hang, never a margin)."""

SERVERS = [
    pytest.param("postgres", marks=pytest.mark.postgres),
    pytest.param("mysql", marks=pytest.mark.mysql),
    pytest.param("mariadb", marks=pytest.mark.mysql),
]


def begun(store: SqlStepStore, run_key: str, owner: str, lease_s: float) -> Claim:
    result = store.begin(run_key, f"job-{owner}", ENVELOPE, owner, lease_s)
    assert isinstance(result, Begun), result
    return result.claim


def renewal_of(store: SqlStepStore, claim: Claim) -> object:
    """What one renewal of ``claim`` returns or raises, from another thread (bounded: it must not wait)."""
    got: list[object] = []

    def renew() -> None:
        try:
            got.append(store.renew(claim, 30.0))
        except Exception as exc:  # what the test looks at
            got.append(exc)

    renewer = threading.Thread(target=renew)
    renewer.start()
    renewer.join(PATIENCE_S)
    assert not renewer.is_alive(), "the renewal waited for the row lock"
    return got[0]


# --------------------------------------------------------------------------------------------------------------
# Finding 1 (MySQL/MariaDB): a claim taken over is reported RunLocked, not ClaimLost, while the new owner's
# transaction (its transactional step, C42) holds the row. InnoDB locks the row by its key before it looks at
# the rest of the fence, so the NOWAIT read is refused for a row the claim no longer holds; the old attempt's
# keeper then polls every 0.1 s for as long as the new owner keeps the row, never learning it lost (C25).
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", SERVERS)
def test_c25_a_renewal_of_a_claim_taken_over_is_claim_lost_while_the_new_owner_holds_the_row(
    backend: str, request: pytest.FixtureRequest, make_sql_store: Callable[..., SqlStepStore]
) -> None:
    """An expired claim taken over, whose new owner's transaction holds the row: its renewal is ``ClaimLost`` (C25)."""
    store = make_sql_store(request.getfixturevalue(f"{backend}_url"))
    old = begun(store, "run-taken", "worker-a", 0.2)
    wait_for(lambda: store.now() > old.lease_until, PATIENCE_S, "the first claim's lease to expire")
    new = begun(store, "run-taken", "worker-b", 30.0)
    assert new.attempt == old.attempt + 1
    runs = store_tables(store.table_prefix).runs
    with store.engine.connect() as new_owners:  # worker-b's transactional step holds its run's row
        transaction = new_owners.begin()
        new_owners.execute(sa.select(runs.c.run_key).where(runs.c.run_key == "run-taken").with_for_update())
        while_held = renewal_of(store, old)
        transaction.rollback()
    assert isinstance(while_held, ClaimLost), while_held
    assert store.get_run("run-taken").owner == "worker-b"


# --------------------------------------------------------------------------------------------------------------
# Finding 2 (PostgreSQL through psycopg2, a driver the store accepts as given): the error classifiers read only
# psycopg 3's ``sqlstate``; psycopg2 names it ``pgcode``. A refused NOWAIT was therefore an outage
# (StoreUnavailable: a WARNING, and the next try a third of a lease later instead of 0.1 s), a deadlock was not
# retried, and missing tables were not named as such.
# --------------------------------------------------------------------------------------------------------------

PSYCOPG2_URL = "postgresql+psycopg2://postgres@127.0.0.1:5432/test"


@pytest.fixture
def psycopg2_store(postgres_url: str) -> Iterator[SqlStepStore]:
    pytest.importorskip("psycopg2")
    store = SqlStepStore(PSYCOPG2_URL, table_prefix=f"t{uuid4().hex[:8]}_")
    yield store
    drop_store_tables(store)
    store.close()


@pytest.mark.postgres
def test_c23_psycopg2_a_renewal_refused_the_row_lock_is_run_locked_not_an_outage(psycopg2_store: SqlStepStore) -> None:
    """Through psycopg2, a renewal of a row another transaction holds is ``RunLocked`` (55P03 read as ``pgcode``)."""
    store = psycopg2_store
    claim = begun(store, "run-held", "worker-a", 30.0)
    runs = store_tables(store.table_prefix).runs
    with store.engine.connect() as caller:
        transaction = caller.begin()
        caller.execute(sa.select(runs.c.run_key).where(runs.c.run_key == "run-held").with_for_update())
        while_held = renewal_of(store, claim)
        transaction.rollback()
    assert isinstance(while_held, RunLocked), while_held


@pytest.mark.postgres
def test_c28_psycopg2_a_deadlock_is_recognised(psycopg2_store: SqlStepStore) -> None:
    """Two transactions lock two rows in opposite orders: the one PostgreSQL rolls back is a deadlock (retried)."""
    store = psycopg2_store
    begun(store, "run-1", "w", 30.0)
    begun(store, "run-2", "w", 30.0)
    runs = store_tables(store.table_prefix).runs
    first_locked = threading.Barrier(2, timeout=PATIENCE_S)
    errors: list[BaseException] = []

    def lock(first: str, second: str) -> None:
        with store.engine.connect() as conn, conn.begin():
            try:
                conn.execute(sa.select(runs.c.run_key).where(runs.c.run_key == first).with_for_update())
                first_locked.wait()
                conn.execute(sa.select(runs.c.run_key).where(runs.c.run_key == second).with_for_update())
            except sa.exc.DBAPIError as exc:
                errors.append(exc)

    threads = [threading.Thread(target=lock, args=pair) for pair in (("run-1", "run-2"), ("run-2", "run-1"))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(PATIENCE_S)
    assert len(errors) == 1, errors
    assert is_deadlock(errors[0]), errors[0]


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


# --------------------------------------------------------------------------------------------------------------
# Held up (not covered before): first deliveries of a run not stored yet, through separate stores (their own
# pools), racing the producer's record_queued of the same key on MySQL/MariaDB's locking-read-then-upsert start.
# --------------------------------------------------------------------------------------------------------------


def race_first_deliveries(racers: list[SqlStepStore], run_key: str) -> list[object]:
    """Every third racer records the run queued (the producer, C39), the others start it; all at once."""
    barrier = threading.Barrier(len(racers), timeout=PATIENCE_S)
    results: list[object] = [None] * len(racers)

    def race(i: int, store: SqlStepStore) -> None:
        barrier.wait()
        try:
            if i % 3 == 2:
                store.record_queued(run_key, f"job-{i}", ENVELOPE)
                results[i] = "queued"
            else:
                results[i] = store.begin(run_key, f"job-{i}", ENVELOPE, f"w{i}", 30.0)
        except Exception as exc:  # what the test looks at
            results[i] = exc

    threads = [threading.Thread(target=race, args=(i, s)) for i, s in enumerate(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(PATIENCE_S)
    assert not any(t.is_alive() for t in threads), "a start or record_queued hung"
    return results


@pytest.mark.mysql
@pytest.mark.parametrize("dialect", ["mysql", "mariadb"])
def test_c24_first_deliveries_racing_record_queued_claim_once(
    dialect: str, request: pytest.FixtureRequest, make_sql_store: Callable[..., SqlStepStore]
) -> None:
    """Nine stores race first deliveries and the producer's record of one new run, ten times: one claim each (C24)."""
    url = request.getfixturevalue(f"{dialect}_url")
    main = make_sql_store(url)
    main.describe()  # the tables, before the racers open their stores on them
    racers = [SqlStepStore(url, table_prefix=main.table_prefix) for _ in range(9)]
    tally: Counter[str] = Counter()
    try:
        for n in range(10):
            results = race_first_deliveries(racers, f"run-{n}")
            started = [r for r in results if isinstance(r, Begun)]
            assert len(started) == 1, results
            assert all(isinstance(r, Busy) or r in (started[0], "queued") for r in results), results
            run = main.get_run(f"run-{n}")
            assert (run.status, run.owner, run.attempt) == ("running", started[0].claim.owner, 1)
            tally.update(type(r).__name__ for r in results)
    finally:
        for store in racers:
            store.close()
    assert tally["Begun"] == 10
