"""One attempt's fault does not stop the shared lease renewer from renewing the process's other claims (C23).

The renewer (:mod:`flexiq_plugins._attempt.lease`) is one thread per process; what one attempt does to it
(a transaction holding its run's row, a time limit landing inside a keeper's start, a ``BaseException`` out of
its renewal) must leave every other claim renewed, and that attempt's own claim renewed once it starts again.
The renewer's ordinary work is in ``test_lease_renewer.py``.

Each test runs real threads (and, where it says so, a real signal handler in a fresh interpreter) against a
real SQLite file or PostgreSQL. Waits are on events or renewal counts, bounded by ``PATIENCE_S``; where a
test is about a duration (a transaction shorter than the lease), the duration is the scenario, not a margin.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
import sqlalchemy as sa

from flexiq_plugins import JobEnvelope, SqlStepStore
from flexiq_plugins._attempt.lease import RENEWER_THREAD_NAME, LeaseKeeper
from flexiq_plugins._model.records import Begun, Claim, StepRow
from tests.conftest import PostgresCaller, drop_store_tables
from tests.core.test_lease_renewer import WatchedStore

ENVELOPE = JobEnvelope("tasks.t", "test")
PATIENCE_S = 30.0
"""How long a test waits for what must happen, seconds (a bound on a hang, never a margin)."""


@pytest.fixture
def pg_store(postgres_url: str) -> Iterator[WatchedStore]:
    store = WatchedStore(postgres_url, table_prefix=f"r{uuid4().hex[:8]}_")
    yield store
    drop_store_tables(store)
    store.close()


def claimed(store: SqlStepStore, run_key: str, lease_s: float = 30.0) -> Claim:
    begun = store.begin(run_key, f"job-{run_key}", ENVELOPE, "w1", lease_s)
    assert isinstance(begun, Begun)
    return begun.claim


# --------------------------------------------------------------------------------------------------------------
# One attempt's transactional step (C42) holds its run's row: a renewal locks with NOWAIT, so a refused one
# (RunLocked) is tried again shortly while the renewals of the process's other attempts go on.
# --------------------------------------------------------------------------------------------------------------

LEASE_S = 3.0
"""The lease of both attempts, seconds (renewed every 1 s)."""


@pytest.mark.postgres
@pytest.mark.timeout(120)
def test_c23_a_transaction_holding_one_runs_row_does_not_stop_other_claims_being_renewed(
    pg_store: WatchedStore, postgres_url: str
) -> None:
    """Attempt A runs a transactional step and keeps its transaction open for less than the lease (as the
    docs allow); attempt B, in the same process, does nothing wrong. B's claim must stay renewed, so no other
    worker can take B over while A's transaction is open.

    Order (driven by events in the renewal hook): B's first renewal starts keeper A, so A's renewal falls due
    just before B's next one; as A's renewal begins, the caller's transaction takes A's row lock."""
    store = pg_store
    keeper_a = LeaseKeeper(store, claimed(store, "run-a"), LEASE_S)
    keeper_b = LeaseKeeper(store, claimed(store, "run-b"), LEASE_S)
    lock_now, locked = threading.Event(), threading.Event()
    a_started = threading.Event()

    def hook(claim: Claim) -> None:  # in the renewer thread, before the renewal's UPDATE
        if claim.run_key == "run-b" and not a_started.is_set():
            a_started.set()
            keeper_a.start()  # due a third of a lease from now: just before B's next renewal
        elif claim.run_key == "run-a" and not lock_now.is_set():
            lock_now.set()
            assert locked.wait(PATIENCE_S), "the caller's transaction did not take the run's row"

    store.during_renewal = hook
    caller_engine = sa.create_engine(postgres_url)

    def db_now() -> float:  # the database's clock now (lease times are on it, C23), outside the open transaction
        with caller_engine.connect() as clock:
            return float(clock.execute(sa.text("SELECT extract(epoch FROM clock_timestamp())")).scalar_one())

    expired_after: float | None = None
    takeover: Any = None
    try:
        keeper_b.start()
        assert lock_now.wait(PATIENCE_S), "run-a's renewal never started"
        with caller_engine.connect() as conn:
            transaction = conn.begin()
            try:
                store.commit_step_on(PostgresCaller(conn), keeper_a.claim, StepRow(0, "charge#0", "run", b"v"))
                opened = time.monotonic()
                locked.set()  # run-a's renewal now waits on the row lock
                while (age := time.monotonic() - opened) < 0.9 * LEASE_S:  # a transaction shorter than the lease
                    run_b = store.get_run("run-b")
                    if run_b.lease_until is not None and run_b.lease_until < db_now():
                        expired_after = age
                        takeover = store.begin("run-b", "job-b-redelivered", ENVELOPE, "w2", 30.0)
                        break
                    time.sleep(0.02)  # polling the database's row, not synchronising threads
            finally:
                transaction.rollback()
    finally:
        locked.set()
        keeper_a.stop()
        keeper_b.stop()
        caller_engine.dispose()
    assert expired_after is None, (
        f"run-b's claim (lease {LEASE_S}s, its keeper running) expired {expired_after:.2f}s into run-a's "
        f"transaction and was taken over by another worker: {takeover!r}"
    )


# --------------------------------------------------------------------------------------------------------------
# A time limit (raised from a signal handler, anywhere in the task's thread) that lands inside a keeper's start()
# or stop() must not leave the keeper "started" with nothing scheduled, nor a renewer lock held.
# --------------------------------------------------------------------------------------------------------------

_INTERRUPTED_REGISTRATIONS = r'''
import json, os, signal, sys, threading
from flexiq_plugins import JobEnvelope, SqlStepStore
from flexiq_plugins._attempt.lease import LeaseKeeper, _Renewer

class CountingStore(SqlStepStore):
    def __init__(self, url):
        super().__init__(url)
        self.renewed = {}
        self.changed = threading.Condition()

    def renew(self, claim, lease_seconds):
        renewed = super().renew(claim, lease_seconds)
        with self.changed:
            self.renewed[claim.run_key] = self.renewed.get(claim.run_key, 0) + 1
            self.changed.notify_all()
        return renewed

class TimeLimit(Exception):
    """What Celery's soft time limit raises from its signal handler (SoftTimeLimitExceeded)."""

REGISTRATION = {_Renewer.submit.__code__, LeaseKeeper.interval.fget.__code__}
store = CountingStore(sys.argv[1])
envelope = JobEnvelope("tasks.t", "test")
armed = False

def time_limit(signum, frame):  # the time limit lands only while a start() hands its registration over
    if armed and frame.f_code in REGISTRATION:
        raise TimeLimit()

warm = LeaseKeeper(store, store.begin("run-warm", "job-warm", envelope, "w1", 30.0).claim, 300.0)
warm.start()  # the renewer thread runs before the storm
warm.stop()
free = [store.begin(f"run-{i}", f"job-{i}", envelope, "w1", 300.0).claim for i in range(int(sys.argv[2]) + 1)]
interrupted = []
signal.signal(signal.SIGALRM, time_limit)
signal.setitimer(signal.ITIMER_REAL, 0.0001, 0.0001)
tries = 0
while len(interrupted) < int(sys.argv[2]) and tries < 5_000_000:
    tries += 1
    keeper = LeaseKeeper(store, free[-1], 0.3)
    try:
        armed = True
        keeper.start()
        armed = False
    except TimeLimit:
        armed = False
        interrupted.append(keeper)  # the task caught its time limit and goes on (Celery's documented pattern)
        free.pop()
        continue
    keeper.stop()
signal.setitimer(signal.ITIMER_REAL, 0, 0)
for keeper in interrupted:  # started again: each claim must now be renewed
    keeper.start()
keys = [k.claim.run_key for k in interrupted]
with store.changed:
    store.changed.wait_for(lambda: all(store.renewed.get(k, 0) >= 2 for k in keys), 30)
never = [k for k in keys if not store.renewed.get(k)]
for keeper in interrupted:
    keeper.stop()
print(json.dumps({"interrupted": len(keys), "never_renewed": never}))
'''


@pytest.mark.timeout(180)
def test_c23_a_keeper_whose_start_was_interrupted_is_renewed_once_started_again(sqlite_url: str) -> None:
    """A time limit (Celery's soft one, raised by a signal handler) lands while ``start()`` hands the keeper's
    registration over to the renewer; the task catches it and goes on. Whatever the interrupted start did, a
    later ``start()`` of that keeper must have its claim renewed: it must not find the keeper 'already
    started' while nothing of it is scheduled (the claim would then expire under a running attempt)."""
    done = subprocess.run(
        [sys.executable, "-c", _INTERRUPTED_REGISTRATIONS, sqlite_url, "60"],
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )
    report = json.loads(done.stdout.splitlines()[-1]) if done.stdout.strip() else {"stderr": done.stderr[-3000:]}
    assert done.returncode == 0, done.stderr[-3000:]
    assert report["interrupted"] == 60, report
    assert report["never_renewed"] == [], (
        f"{len(report['never_renewed'])} of 60 keepers interrupted in start() were never renewed after "
        f"being started again: {report}"
    )


_INTERRUPTED_STARTS_AND_STOPS = r'''
import json, os, signal, sys, threading
from flexiq_plugins import JobEnvelope, SqlStepStore
from flexiq_plugins._attempt.lease import RENEWER_THREAD_NAME, LeaseKeeper

class CountingStore(SqlStepStore):
    def __init__(self, url):
        super().__init__(url)
        self.renewed = {}
        self.twice = threading.Event()

    def renew(self, claim, lease_seconds):
        renewed = super().renew(claim, lease_seconds)
        self.renewed[claim.run_key] = self.renewed.get(claim.run_key, 0) + 1
        if claim.run_key == "run-after" and self.renewed[claim.run_key] >= 2:
            self.twice.set()
        return renewed

class TimeLimit(Exception):
    """What Celery's soft time limit raises from its signal handler (SoftTimeLimitExceeded)."""

store = CountingStore(sys.argv[1])
envelope = JobEnvelope("tasks.t", "test")
storm_claim = store.begin("run-storm", "job-storm", envelope, "w1", 300.0).claim
armed = False

def time_limit(signum, frame):
    if armed:
        raise TimeLimit()

landed = tries = 0
finished = threading.Event()

def watchdog():  # a leaked lock leaves this process's starts waiting forever: say so, rather than hang
    if not finished.wait(60):
        print(json.dumps({"landed": landed, "hung": True}), flush=True)
        os._exit(3)

threading.Thread(target=watchdog, daemon=True).start()
signal.signal(signal.SIGALRM, time_limit)
signal.setitimer(signal.ITIMER_REAL, 0.0001, 0.0001)
while landed < int(sys.argv[2]) and tries < 5_000_000:
    keeper = LeaseKeeper(store, storm_claim, 300.0)
    tries += 1
    try:
        armed = True
        keeper.start()
        keeper.stop()
        armed = False
    except TimeLimit:
        armed = False
        landed += 1
signal.setitimer(signal.ITIMER_REAL, 0, 0)
after = LeaseKeeper(store, store.begin("run-after", "job-after", envelope, "w1", 30.0).claim, 0.3)
after.start()
renewed = store.twice.wait(30)
after.stop()
finished.set()
threads = [t.name for t in threading.enumerate() if t.name.startswith("flexiq-lease")]
print(json.dumps({"landed": landed, "renewed": renewed, "threads": threads}))
'''


@pytest.mark.timeout(180)
def test_c23_starts_and_stops_interrupted_by_a_time_limit_leave_the_renewer_working(sqlite_url: str) -> None:
    """Celery's soft time limit raises from a signal handler wherever the task's thread is (Dramatiq's TimeLimit
    and shutdown raise asynchronous exceptions the same way). In a fresh interpreter, such an exception lands
    inside 2,000 keeper starts and stops (a SIGALRM every 0.1 ms); then a keeper's claim is still renewed, by
    one renewer thread. (A renewer lock taken by Python code leaked under this within milliseconds: the next
    start waited on it forever.)"""
    done = subprocess.run(
        [sys.executable, "-c", _INTERRUPTED_STARTS_AND_STOPS, sqlite_url, "2000"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )
    report = json.loads(done.stdout.splitlines()[-1]) if done.stdout.strip() else {"stderr": done.stderr[-3000:]}
    assert "hung" not in report, f"a start or stop waited a minute (a lock left held): {report}"
    assert done.returncode == 0, done.stderr[-3000:]
    assert report == {"landed": 2000, "renewed": True, "threads": [RENEWER_THREAD_NAME]}, report


# --------------------------------------------------------------------------------------------------------------
# A BaseException out of one claim's renewal must not end the process's one renewer thread.
# --------------------------------------------------------------------------------------------------------------


_BASE_EXCEPTION_IN_A_RENEWAL = r'''
import json, sys, threading
from flexiq_plugins import JobEnvelope, SqlStepStore
from flexiq_plugins._attempt.lease import LeaseKeeper

class DriverTimeout(BaseException):
    """A BaseException a store's driver can raise (as gevent.Timeout is one): not an ``Exception``."""

class FlakyStore(SqlStepStore):
    def __init__(self, url):
        super().__init__(url)
        self.renewed = {}
        self.changed = threading.Condition()
        self.raised = threading.Event()

    def renew(self, claim, lease_seconds):
        if claim.run_key == "run-bad" and not self.raised.is_set():
            self.raised.set()
            raise DriverTimeout("renewal timed out")
        renewed = super().renew(claim, lease_seconds)
        with self.changed:
            self.renewed[claim.run_key] = self.renewed.get(claim.run_key, 0) + 1
            self.changed.notify_all()
        return renewed

store = FlakyStore(sys.argv[1])
envelope = JobEnvelope("tasks.t", "test")
bad = LeaseKeeper(store, store.begin("run-bad", "job-bad", envelope, "w1", 30.0).claim, 0.3)
bad.start()
raised = store.raised.wait(30)
good = LeaseKeeper(store, store.begin("run-good", "job-good", envelope, "w1", 30.0).claim, 0.3)
good.start()
with store.changed:
    renewed = store.changed.wait_for(lambda: store.renewed.get("run-good", 0) >= 2, 10)
good.stop()
bad.stop()
threads = [t.name for t in threading.enumerate() if t.name.startswith("flexiq-lease")]
print(json.dumps({"raised": raised, "other_renewed": renewed, "threads": threads}))
'''


@pytest.mark.timeout(120)
def test_c23_a_base_exception_in_one_renewal_leaves_the_other_claims_renewed(sqlite_url: str) -> None:
    """One claim's renewal raises a BaseException (a driver's timeout that is not an ``Exception``, as
    gevent.Timeout). With a thread per attempt that ended that attempt's renewals; the shared renewer must
    likewise go on renewing the process's other claims. (In a fresh interpreter: before the fix the
    renewer thread died of it, and no claim of the process was renewed again.)"""
    done = subprocess.run(
        [sys.executable, "-c", _BASE_EXCEPTION_IN_A_RENEWAL, sqlite_url],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert report == {"raised": True, "other_renewed": True, "threads": ["flexiq-lease-renewer"]}, (
        f"after one renewal raised a BaseException, the process's other claims were not renewed: {report}"
    )
