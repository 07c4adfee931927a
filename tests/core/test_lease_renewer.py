"""One lease renewer thread per process renews every running attempt's claim (C23).

Each attempt used to start a renewal thread and join it at its end; a
worker now has one renewer thread that renews the claims of all its running
attempts, each every third of its lease. These tests run it against a real
SQLite file and PostgreSQL, through :class:`WatchedStore`: the real SQL
store, counting each run's renewals and able to hold one renewal until the
test lets it go on. Leases are short (0.3 s, renewed every 0.1 s) and every
wait is on a renewal count or an event, never on a wall-clock margin.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import threading
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any
from uuid import uuid4

import pytest

from flexiq_plugins import DurableConfig, JobEnvelope, SqlStepStore, current_job
from flexiq_plugins._attempt import decisions, lease
from flexiq_plugins._attempt.attempt import Attempt
from flexiq_plugins._attempt.lease import RENEWER_THREAD_NAME, LeaseKeeper
from flexiq_plugins._model.records import Begun, Claim
from flexiq_plugins.integration import AttemptDriver, JobInfo
from tests.conftest import drop_store_tables
from tests.polling import wait_for

ENVELOPE = JobEnvelope("tasks.t", "test")
LEASE_S = 0.3
"""The keepers' lease, seconds: renewed every 0.1 s."""
PATIENCE_S = 30.0
"""How long a test waits for what must happen, seconds (a bound on a hang, never a margin)."""


class WatchedStore(SqlStepStore):
    """A real SQL store that counts each run's renewals and can hold one renewal until told to go on."""

    def __init__(self, url: str, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        self.watch()

    def watch(self) -> None:
        """Start counting afresh (a forked child calls it: a lock of the parent's may have been held at the fork)."""
        self.changed = threading.Condition()
        self.renewals: Counter[str] = Counter()
        self.hold: str | None = None  # the run whose next renewal waits for go_on
        self.holding = threading.Event()
        self.go_on = threading.Event()
        self.during_renewal: Callable[[Claim], None] | None = None

    def renew(self, claim: Claim, lease_seconds: float) -> Claim:
        if claim.run_key == self.hold:
            self.hold = None
            self.holding.set()
            self.go_on.wait(PATIENCE_S)
        if self.during_renewal is not None:
            self.during_renewal(claim)
        renewed = super().renew(claim, lease_seconds)
        with self.changed:
            self.renewals[claim.run_key] += 1
            self.changed.notify_all()
        return renewed

    def wait_renewals(self, run_key: str, count: int) -> bool:
        """Wait until ``run_key``'s claim was renewed ``count`` times; return whether it was."""
        with self.changed:
            return self.changed.wait_for(lambda: self.renewals[run_key] >= count, PATIENCE_S)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def watched(request: pytest.FixtureRequest) -> Iterator[WatchedStore]:
    """A :class:`WatchedStore` on a fresh SQLite file, then on PostgreSQL (its own tables, dropped after)."""
    store = WatchedStore(request.getfixturevalue(f"{request.param}_url"), table_prefix=f"t{uuid4().hex[:8]}_")
    yield store
    if store.engine.dialect.name != "sqlite":
        drop_store_tables(store)
    store.close()


def claimed(store: SqlStepStore, run_key: str | None = None) -> Claim:
    """A claim of a new run (its lease 30 s: the test's keeper renews it with its own lease)."""
    run_key = run_key or f"run-{uuid4().hex[:8]}"
    begun = store.begin(run_key, f"job-{run_key}", ENVELOPE, "w1", 30.0)
    assert isinstance(begun, Begun)
    return begun.claim


def renewer_threads() -> list[threading.Thread]:
    """The live lease renewal threads of this process (the per-attempt ones were named ``flexiq-lease``)."""
    return [t for t in threading.enumerate() if t.name.startswith("flexiq-lease")]


def test_c23_attempts_running_at_once_share_one_renewer_thread(watched: WatchedStore) -> None:
    """Six attempts whose bodies outlive their lease are all renewed, by one thread: while they run, the process
    has one lease renewal thread, not one per attempt; and each completes under its renewed claim."""
    driver = AttemptDriver(watched, DurableConfig(lease_seconds=LEASE_S))
    n = 6
    all_renewed = threading.Barrier(n + 1, timeout=PATIENCE_S)
    release = threading.Event()
    results: dict[str, decisions.Decision] = {}

    def body() -> str:
        assert watched.wait_renewals(current_job.run_key, 2), "the lease was not renewed while the body ran"
        all_renewed.wait()
        assert release.wait(PATIENCE_S)
        return current_job.step.run("after", lambda: "committed under the renewed claim")

    def attempt(i: int) -> None:
        results[f"run-{i}"] = driver.run_job(JobInfo(f"run-{i}", f"job-{i}", ENVELOPE), body)

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    try:
        all_renewed.wait()
        running = renewer_threads()
    finally:
        release.set()
        for thread in threads:
            thread.join(PATIENCE_S)
    assert [t.name for t in running] == [RENEWER_THREAD_NAME]
    assert results == {f"run-{i}": decisions.Completed("committed under the renewed claim") for i in range(n)}
    assert all(watched.renewals[f"run-{i}"] >= 2 for i in range(n))


def test_c23_stop_returns_after_the_renewal_in_progress_and_none_starts_after(watched: WatchedStore) -> None:
    """A keeper stopped while its claim is being renewed returns only once that renewal has ended, and its claim
    is renewed no more: a keeper started after the stop, due later, is renewed twice, the stopped one not again."""
    keeper = LeaseKeeper(watched, claimed(watched, "run-stopped"), LEASE_S)
    watched.hold = "run-stopped"
    keeper.start()
    assert watched.holding.wait(PATIENCE_S)
    stop_called = threading.Event()
    seen_at_return: list[int] = []

    def stop() -> None:
        stop_called.set()
        keeper.stop()
        seen_at_return.append(watched.renewals["run-stopped"])

    stopper = threading.Thread(target=stop)
    stopper.start()
    assert stop_called.wait(PATIENCE_S)
    watched.go_on.set()  # the held renewal goes on only once stop() was called
    stopper.join(PATIENCE_S)
    assert seen_at_return == [1], "stop() returned before the renewal in progress had ended"

    later = LeaseKeeper(watched, claimed(watched, "run-later"), LEASE_S)
    later.start()
    try:
        assert watched.wait_renewals("run-later", 2)
    finally:
        later.stop()
    assert watched.renewals["run-stopped"] == 1


def test_c23_a_keeper_stopped_from_the_renewer_thread_itself_does_not_deadlock(watched: WatchedStore) -> None:
    """A keeper stopped by code its own renewal runs (in the renewer thread) returns at once; that claim is renewed
    no more, and the renewer goes on renewing the other claims."""
    keeper = LeaseKeeper(watched, claimed(watched, "run-self"), LEASE_S)
    stopped_inside = threading.Event()

    def stop_self(claim: Claim) -> None:
        if claim.run_key == "run-self":
            keeper.stop()
            stopped_inside.set()

    watched.during_renewal = stop_self
    keeper.start()
    assert stopped_inside.wait(PATIENCE_S)
    other = LeaseKeeper(watched, claimed(watched, "run-other"), LEASE_S)
    other.start()
    try:
        assert watched.wait_renewals("run-other", 2)
    finally:
        other.stop()
    assert watched.renewals["run-self"] == 1


def test_c32_a_keeper_started_again_after_its_stop_renews_again(watched: WatchedStore) -> None:
    """A keeper is started again after its stop (an attempt's compensation runs after its body, C32): its claim
    is renewed again, by the same renewer thread."""
    keeper = LeaseKeeper(watched, claimed(watched, "run-again"), LEASE_S)
    keeper.start()
    assert watched.wait_renewals("run-again", 1)
    keeper.stop()
    after_stop = watched.renewals["run-again"]
    keeper.start()
    try:
        assert watched.wait_renewals("run-again", after_stop + 2)
        assert [t.name for t in renewer_threads()] == [RENEWER_THREAD_NAME]
    finally:
        keeper.stop()
    assert keeper.claim.lease_until == pytest.approx(watched.get_run("run-again").lease_until), "its last renewal's"


def test_c23_an_attempt_whose_open_transactions_fail_to_close_still_stops_its_keeper(watched: WatchedStore) -> None:
    """Leaving an attempt's ``activate`` stops its keeper even when closing the caller transactions it left open
    raises (a rollback on a dropped connection, C42): as in a compensation, where no later stop follows (C32)."""
    driver = AttemptDriver(watched, DurableConfig(lease_seconds=LEASE_S))
    attempt = driver.start(JobInfo("run-left", "job-left", ENVELOPE))
    assert isinstance(attempt, Attempt), attempt

    def dropped() -> None:
        raise ConnectionError("the caller's connection dropped during the rollback")

    def body_then_leave() -> None:
        with attempt.activate():
            current_job.step.run("charge", lambda: 1)  # the claim, and its keeper started
            assert watched.wait_renewals("run-left", 1)
            attempt.journal.close_transactions = dropped  # type: ignore[method-assign]

    with pytest.raises(ConnectionError):
        body_then_leave()
    after_leave = watched.renewals["run-left"]
    other = LeaseKeeper(watched, claimed(watched, "run-other"), LEASE_S)
    other.start()
    try:
        assert watched.wait_renewals("run-other", 3)  # the renewer ran past two of run-left's renewal times
    finally:
        other.stop()
    assert watched.renewals["run-left"] == after_leave, "the left attempt's claim is still renewed"


class TimeLimitHit(BaseException):
    """What a time limit raises into the task's thread (Celery's ``SoftTimeLimitExceeded``, Dramatiq's)."""


def test_c23_a_lazy_claims_keeper_start_interrupted_and_caught_is_started_at_the_next_step(
    watched: WatchedStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A time limit that lands in the keeper's start at a lazy claim, which the body catches and carries on
    from: the body's next use of ``current_job.step`` starts the keeper (the claim is renewed) and claims
    nothing again; the attempt then succeeds with both steps (C23). Before, the context was bound with the
    keeper never started: the body went on under a claim nothing renewed, taken over after one lease."""
    driver = AttemptDriver(watched, DurableConfig(lease_seconds=LEASE_S))
    attempt = driver.start(JobInfo("run-cut", "job-cut", ENVELOPE, lazy=True))
    assert isinstance(attempt, Attempt), attempt
    real_start = LeaseKeeper.start
    interrupted: list[LeaseKeeper] = []

    def start_cut_once(keeper: LeaseKeeper) -> None:
        if not interrupted:
            interrupted.append(keeper)
            raise TimeLimitHit("the soft time limit, raised inside the keeper's start")
        real_start(keeper)

    monkeypatch.setattr(LeaseKeeper, "start", start_cut_once)
    claims_taken: list[JobInfo] = []
    real_claim = driver.claim
    monkeypatch.setattr(driver, "claim", lambda job, owner: claims_taken.append(job) or real_claim(job, owner))

    def body() -> int:
        with contextlib.suppress(TimeLimitHit):  # the body catches the time limit and carries on
            current_job.step.run("charge", lambda: 1)
        value = current_job.step.run("charge", lambda: 2) + current_job.step.run("receipt", lambda: 10)
        assert watched.wait_renewals("run-cut", 2), "the claim is not renewed after the interrupted start"
        return value

    decision = attempt.run(body)
    assert len(interrupted) == 1, interrupted
    assert len(claims_taken) == 1, "the run was claimed again"
    assert isinstance(decision, decisions.Completed), decision
    assert decision.value == 12
    assert watched.get_run("run-cut").status == "succeeded"


def test_c25_a_keeper_whose_claim_was_taken_over_records_it_and_renews_no_more(watched: WatchedStore) -> None:
    """A renewal that finds the claim taken over (C25) sets ``lost`` and the claim is not renewed again."""
    expired = watched.begin("run-lost", "job-1", ENVELOPE, "w1", -1.0)  # its lease ended a second ago
    assert isinstance(expired, Begun)
    taken = watched.begin("run-lost", "job-2", ENVELOPE, "w2", 30.0)
    assert isinstance(taken, Begun)
    assert taken.claim.attempt == 2
    keeper = LeaseKeeper(watched, expired.claim, LEASE_S)
    keeper.start()
    try:
        wait_for(lambda: keeper.lost is not None, PATIENCE_S, "the renewal to find the claim lost")
        later = LeaseKeeper(watched, claimed(watched), LEASE_S)
        later.start()
        assert watched.wait_renewals(later.claim.run_key, 2)
        later.stop()
    finally:
        keeper.stop()
    assert watched.renewals["run-lost"] == 0


def _child_renews(store: WatchedStore) -> dict[str, Any]:
    """In a forked child: start a keeper and report whether its claim was renewed twice, and by which threads."""
    store.watch()
    keeper = LeaseKeeper(store, claimed(store, "run-child"), LEASE_S)
    keeper.start()
    try:
        renewed = store.wait_renewals("run-child", 2)
        threads = [t.name for t in renewer_threads()]
    finally:
        keeper.stop()
    return {"renewed": renewed, "threads": threads}


def test_c23_a_forked_child_renews_its_claims_with_its_own_renewer(watched: WatchedStore) -> None:
    """A child forked after its parent's renewer thread started (a Celery prefork child) does not inherit that
    dead thread as its renewer: the child's keepers are renewed, by one renewer thread of its own."""
    parent = LeaseKeeper(watched, claimed(watched, "run-parent"), LEASE_S)
    parent.start()
    try:
        assert watched.wait_renewals("run-parent", 1)  # the parent's renewer thread is running
        reading, writing = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            code = 1
            try:
                os.close(reading)
                report = _child_renews(watched)
                code = 0
            except BaseException:
                report = {"error": traceback.format_exc()}
            finally:
                os.write(writing, json.dumps(report).encode())
                os._exit(code)
        os.close(writing)
        with os.fdopen(reading, "rb") as pipe:
            report = json.loads(pipe.read() or b"{}")
        _, status = os.waitpid(pid, 0)
    finally:
        parent.stop()
    assert os.waitstatus_to_exitcode(status) == 0, report
    assert report == {"renewed": True, "threads": [RENEWER_THREAD_NAME]}


class _CountingDoorbell:
    """The renewer's doorbell, counting how often a keeper rings it."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.rings = 0

    def put(self, item: None) -> None:
        self.rings += 1
        self.inner.put(item)

    def get(self, timeout: float | None = None) -> None:
        self.inner.get(timeout=timeout)


def test_c23_attempts_shorter_than_their_renewal_interval_do_not_wake_the_renewer_each(
    watched: WatchedStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker's short attempts start and stop keepers without waking the renewer thread each time (C23).

    The renewer sleeps until the last renewal it was handed is due; a keeper
    started later is due later and does not ring. A keeper with a shorter
    interval, due earlier, does ring, and is renewed.
    """
    doorbell = _CountingDoorbell(lease._RENEWER._doorbell)
    monkeypatch.setattr(lease._RENEWER, "_doorbell", doorbell)
    first = LeaseKeeper(watched, claimed(watched), 30.0)
    first.start()
    first.stop()
    wait_for(  # the first keeper rang: the renewer took its registration and sleeps until it was due
        lambda: not lease._RENEWER._submitted and lease._RENEWER._wake_at != -math.inf,
        timeout=PATIENCE_S,
        what="the renewer took the registration",
    )
    before = doorbell.rings
    claim = claimed(watched)
    for _ in range(300):
        keeper = LeaseKeeper(watched, claim, 30.0)
        keeper.start()
        keeper.stop()
    assert doorbell.rings - before <= 2  # at most when 256 registrations wait to be taken
    assert _a_short_lease_is_renewed(watched)


def _a_short_lease_is_renewed(watched: WatchedStore) -> bool:
    """Whether a new keeper of a short lease is renewed twice (the renewer is awake for it)."""
    short = LeaseKeeper(watched, claimed(watched), LEASE_S)
    short.start()
    try:
        return watched.wait_renewals(short.claim.run_key, 2)
    finally:
        short.stop()


def test_c23_a_lease_of_years_puts_the_renewer_to_sleep_without_an_error(
    watched: WatchedStore, caplog: pytest.LogCaptureFixture
) -> None:
    """A keeper whose renewal is due beyond the longest timeout a wait takes does not make the renewer fail (C23).

    The renewer sleeps at most ``threading.TIMEOUT_MAX`` at a time; a keeper
    due sooner still wakes it and is renewed.
    """
    years = LeaseKeeper(watched, claimed(watched), 1e11)
    years.start()
    try:
        wait_for(
            lambda: lease._RENEWER._wake_at > 1e9,
            timeout=PATIENCE_S,
            what="the renewer sleeping until the long lease's renewal",
        )
        assert _a_short_lease_is_renewed(watched)
    finally:
        years.stop()
    assert [r for r in caplog.records if "lease renewer failed" in r.getMessage()] == []
