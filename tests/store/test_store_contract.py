"""One contract suite for every step store (memory, SQLite, PostgreSQL, MariaDB).

Each test states the rule of ``StepStore`` (``flexiq_plugins/_store/base.py``)
and of CONTRACT.md it proves. The ``store`` fixture runs every test against
all four stores, so the SQL store is held to exactly the behaviour of the
in-memory reference. Lease expiry is waited for by polling the store's own
clock, never by a bare sleep.
"""

from __future__ import annotations

import dataclasses
import os
import time
from uuid import uuid4

import pytest

from flexiq_plugins._model.records import (
    AttemptNotDue,
    AttemptsSpent,
    AttemptStarted,
    Begun,
    Busy,
    Claim,
    Finished,
    JobEnvelope,
    NewDeadLetter,
    StepAttemptFailure,
    StepRow,
)
from flexiq_plugins._store.base import StepStore
from flexiq_plugins.errors import (
    CancelRequested,
    ClaimLost,
    InvalidForkStep,
    InvalidRunKey,
    StoreError,
    UnknownDeadLetter,
    UnknownRun,
    UnknownStep,
)

ENVELOPE = JobEnvelope(
    task_name="shop.checkout",
    framework="test",
    queue="default",
    args=[1, "two"],
    kwargs={"order": "A-1"},
    options={"headers": {"flexiq_run_key": "x"}},
)
SHORT_LEASE = 0.2


def new_key() -> str:
    return uuid4().hex


def claim_run(
    store: StepStore,
    run_key: str,
    *,
    owner: str = "worker-1",
    lease: float = 30.0,
    envelope: JobEnvelope = ENVELOPE,
    job_id: str = "job-1",
) -> Begun:
    result = store.begin(run_key, job_id, envelope, owner, lease)
    assert isinstance(result, Begun), result
    return result


def wait_past(store: StepStore, moment: float, timeout: float = 10.0) -> None:
    """Poll the store's clock until it is past ``moment``."""
    deadline = time.monotonic() + timeout
    while store.now() <= moment:
        assert time.monotonic() < deadline, "the store's clock did not pass the moment"
        time.sleep(0.01)


def tick(store: StepStore) -> float:
    """Wait until the store's clock has moved on (SQLite's ticks in milliseconds); return the new time."""
    wait_past(store, store.now())
    return store.now()


def run_row(position: int, key: str, value: bytes = b"value") -> StepRow:
    return StepRow(position=position, step_key=key, kind="run", value=value)


def commit_rows(store: StepStore, claim: Claim, count: int) -> list[StepRow]:
    return [store.commit_step(claim, run_row(i, f"step#{i}", b"v" * (i + 1))) for i in range(count)]


def terminal_run(store: StepStore, status: str, *, steps: int = 0, task: str = "shop.checkout") -> str:
    key = new_key()
    envelope = JobEnvelope(task_name=task, framework="test")
    claim = claim_run(store, key, envelope=envelope).claim
    commit_rows(store, claim, steps)
    store.finish(claim, status)  # type: ignore[arg-type]
    return key


def dead_letter(store: StepStore, *, steps: int = 3, task: str = "shop.checkout") -> tuple[str, int]:
    key = new_key()
    envelope = JobEnvelope(task_name=task, framework="test", args=[7])
    claim = claim_run(store, key, envelope=envelope, job_id="job-dead").claim
    commit_rows(store, claim, steps)
    store.finish(
        claim,
        "dead",
        dead_letter=NewDeadLetter("job-dead", "divergence", "step changed", "Traceback ..."),
    )
    (record,) = [d for d in store.list_dead_letters() if d.run_key == key]
    return key, record.id


# ----------------------------------------------------------------- begin
def test_c23_begin_creates_and_claims_a_new_run(store: StepStore) -> None:
    """A first ``begin`` creates the run with its envelope and claims attempt 1 (C23, C35)."""
    key = new_key()
    begun = claim_run(store, key, lease=30.0)
    assert begun.claim == Claim(key, "worker-1", 1, begun.now + 30.0)
    assert begun.snapshot == ()
    assert begun.takeovers == 0
    assert begun.envelope.to_dict() == ENVELOPE.to_dict()
    run = store.get_run(key)
    assert (run.status, run.owner, run.attempt, run.job_id) == ("running", "worker-1", 1, "job-1")
    assert (run.task_name, run.framework, run.queue) == ("shop.checkout", "test", "default")
    assert run.lease_until == pytest.approx(begun.claim.lease_until)
    assert (run.step_count, run.step_bytes, run.takeovers) == (0, 0, 0)
    assert run.envelope.to_dict() == ENVELOPE.to_dict()
    assert run.created_at <= run.updated_at


def test_c35_begin_keeps_the_first_envelope(store: StepStore) -> None:
    """The run keeps the envelope it was created with; a later ``begin`` updates only the job id (C35)."""
    key = new_key()
    store.finish(claim_run(store, key).claim, "sleeping")
    other = JobEnvelope(task_name="other.task", framework="test", args=[99])
    begun = claim_run(store, key, envelope=other, job_id="job-2")
    assert begun.envelope.to_dict() == ENVELOPE.to_dict()
    run = store.get_run(key)
    assert run.envelope.to_dict() == ENVELOPE.to_dict()
    assert run.job_id == "job-2"


def test_c5_begin_returns_the_snapshot_by_position(store: StepStore) -> None:
    """A new attempt's snapshot holds every committed row in position order, values intact (C5, C9)."""
    key = new_key()
    first = claim_run(store, key)
    committed = commit_rows(store, first.claim, 3)
    store.finish(first.claim, "retrying")
    second = claim_run(store, key, owner="worker-2")
    assert second.snapshot == tuple(committed)
    assert [s.position for s in second.snapshot] == [0, 1, 2]
    assert second.claim.attempt == 2
    assert second.takeovers == 0


def test_c24_begin_is_busy_while_the_lease_is_live(store: StepStore) -> None:
    """A second delivery while the claim's lease is live gets ``Busy`` and writes nothing (C24)."""
    key = new_key()
    claim_run(store, key, lease=30.0)
    before = store.get_run(key)
    result = store.begin(key, "job-dup", ENVELOPE, "worker-2", 30.0)
    assert isinstance(result, Busy)
    assert 0 < result.lease_remaining <= 30.0
    after = store.get_run(key)
    assert (after.owner, after.attempt, after.job_id, after.updated_at) == (
        before.owner,
        before.attempt,
        before.job_id,
        before.updated_at,
    )


@pytest.mark.parametrize("status", ["succeeded", "failed", "dead", "cancelled", "compensated"])
def test_c26_begin_on_a_terminal_run_is_finished(store: StepStore, status: str) -> None:
    """A redelivered job of a terminal run gets ``Finished`` and writes nothing (C26)."""
    key = terminal_run(store, status)
    before = store.get_run(key)
    assert store.begin(key, "job-again", ENVELOPE, "worker-2", 30.0) == Finished(status)
    assert store.get_run(key) == before


def test_c15_a_released_claim_is_taken_without_takeover(store: StepStore) -> None:
    """After ``finish`` released the claim (a sleep), the next ``begin`` claims at once and is no takeover (C15)."""
    key = new_key()
    first = claim_run(store, key, lease=30.0)
    store.finish(first.claim, "sleeping")
    run = store.get_run(key)
    assert (run.status, run.owner, run.lease_until) == ("sleeping", None, None)
    second = claim_run(store, key, owner="worker-2")
    assert (second.claim.attempt, second.takeovers) == (2, 0)


# --------------------------------------------------------- claims, fencing
def test_c23_lease_uses_the_store_clock(store: StepStore) -> None:
    """``Begun.now`` is the store's clock and the lease is ``now + lease_seconds`` on it (C23)."""
    before = store.now()
    begun = claim_run(store, new_key(), lease=12.5)
    after = store.now()
    assert before <= begun.now <= after
    assert begun.claim.lease_until == pytest.approx(begun.now + 12.5)


def test_c25_takeover_after_lease_expiry(store: StepStore) -> None:
    """A claim whose lease expired is taken over: attempt and takeovers go up by one (C25)."""
    key = new_key()
    old = claim_run(store, key, lease=SHORT_LEASE)
    wait_past(store, old.claim.lease_until)
    new = claim_run(store, key, owner="worker-2", job_id="job-2")
    assert (new.claim.attempt, new.claim.owner, new.takeovers) == (2, "worker-2", 1)
    run = store.get_run(key)
    assert (run.owner, run.attempt, run.takeovers, run.job_id) == ("worker-2", 2, 1, "job-2")


def test_c25_takeover_fences_the_old_claim(store: StepStore) -> None:
    """Every write of a taken-over claim raises ``ClaimLost`` and writes nothing (C25)."""
    key = new_key()
    old = claim_run(store, key, lease=SHORT_LEASE).claim
    wait_past(store, old.lease_until)
    claim_run(store, key, owner="worker-2")
    before = store.get_run(key)
    with pytest.raises(ClaimLost):
        store.renew(old, 30.0)
    with pytest.raises(ClaimLost):
        store.commit_step(old, run_row(0, "charge#0"))
    with pytest.raises(ClaimLost):
        store.finish(old, "dead", drop_steps=True, dead_letter=NewDeadLetter("job-1", "error", "boom"))
    assert store.get_steps(key) == []
    assert store.get_run(key) == before
    assert [d for d in store.list_dead_letters(include_retried=True) if d.run_key == key] == []


def test_c25_takeovers_accumulate(store: StepStore) -> None:
    """Each takeover from a dead worker counts, so the driver can dead-letter at its limit (C25)."""
    key = new_key()
    claim = claim_run(store, key, lease=SHORT_LEASE).claim
    for n in (1, 2):
        wait_past(store, claim.lease_until)
        begun = claim_run(store, key, owner=f"worker-{n + 1}", lease=SHORT_LEASE)
        assert begun.takeovers == n
        claim = begun.claim
    assert store.get_run(key).takeovers == 2


def test_c23_renew_extends_the_lease_on_the_store_clock(store: StepStore) -> None:
    """``renew`` moves the lease to the store's ``now + lease_seconds``: the run stays Busy (C23, C24)."""
    key = new_key()
    claim = claim_run(store, key, lease=SHORT_LEASE).claim
    before = store.now()
    renewed = store.renew(claim, 30.0)
    assert renewed == Claim(claim.run_key, claim.owner, claim.attempt, renewed.lease_until)
    assert renewed.lease_until >= before + 30.0
    assert store.get_run(key).lease_until == pytest.approx(renewed.lease_until)
    wait_past(store, claim.lease_until)
    assert isinstance(store.begin(key, "job-2", ENVELOPE, "worker-2", 30.0), Busy)


def test_c25_a_finished_claim_is_fenced(store: StepStore) -> None:
    """Once ``finish`` released the claim, the same claim can write nothing more (C25)."""
    claim = claim_run(store, new_key()).claim
    store.finish(claim, "sleeping")
    with pytest.raises(ClaimLost):
        store.finish(claim, "succeeded")
    with pytest.raises(ClaimLost):
        store.renew(claim, 30.0)
    with pytest.raises(ClaimLost):
        store.commit_step(claim, run_row(0, "late#0"))


# ------------------------------------------------------------ commit_step
def test_c9_commit_step_updates_totals_and_returns_committed_at(store: StepStore) -> None:
    """``commit_step`` stores the row, stamps ``committed_at`` and the attempt, and updates the totals (C9)."""
    key = new_key()
    claim = claim_run(store, key).claim
    before = store.now()
    first = store.commit_step(claim, run_row(0, "charge#0", b"12345"))
    second = store.commit_step(claim, run_row(1, "receipt:A-1", b"678"))
    after = store.now()
    for row in (first, second):
        assert row.committed_at is not None
        assert before <= row.committed_at <= after
        assert row.attempt == 1
    assert (first.step_key, first.value, first.kind) == ("charge#0", b"12345", "run")
    assert store.get_steps(key) == [first, second]
    run = store.get_run(key)
    assert (run.step_count, run.step_bytes) == (2, 8)


def test_c3_commit_of_an_already_committed_key_is_refused(store: StepStore) -> None:
    """A second commit of the same step key raises ``ClaimLost`` and changes nothing (C3, C5)."""
    key = new_key()
    claim = claim_run(store, key).claim
    store.commit_step(claim, run_row(0, "charge#0", b"first"))
    with pytest.raises(ClaimLost):
        store.commit_step(claim, run_row(1, "charge#0", b"second"))
    assert [s.value for s in store.get_steps(key)] == [b"first"]
    run = store.get_run(key)
    assert (run.step_count, run.step_bytes) == (1, 5)


def test_c51_commit_steps_stores_every_row_at_once_and_counts_them_all(store: StepStore) -> None:
    """``commit_steps`` stores a step map's rows (its entry and its items) as given, each stamped with the same
    ``committed_at`` and the attempt, and adds them all to the run's totals (C9, C51)."""
    key = new_key()
    claim = claim_run(store, key).claim
    store.commit_step(claim, run_row(0, "charge#0", b"12"))
    before = store.now()
    rows = [
        StepRow(position=1, step_key="price#0", kind="map"),
        run_row(2, "price:a", b"345"),
        dataclasses.replace(run_row(3, "price:b", b"6789"), compensate="refund"),
    ]
    stored = store.commit_steps(claim, rows)
    after = store.now()

    assert [(r.position, r.step_key, r.kind, r.value, r.compensate) for r in stored] == [
        (1, "price#0", "map", None, None),
        (2, "price:a", "run", b"345", None),
        (3, "price:b", "run", b"6789", "refund"),
    ]
    assert len({r.committed_at for r in stored}) == 1
    assert stored[0].committed_at is not None
    assert before <= stored[0].committed_at <= after
    assert {r.attempt for r in stored} == {1}
    assert store.get_steps(key)[1:] == list(stored)
    run = store.get_run(key)
    assert (run.step_count, run.step_bytes) == (4, 9)


@pytest.mark.parametrize("repeated", ["charge#0", "price:a"])
def test_c3_c51_commit_steps_with_a_key_committed_or_repeated_writes_none_of_them(
    store: StepStore, repeated: str
) -> None:
    """One key of the batch already committed, or given twice in it: ``ClaimLost`` and none of the rows is
    written, the totals unchanged (C3, C51)."""
    key = new_key()
    claim = claim_run(store, key).claim
    store.commit_step(claim, run_row(0, "charge#0", b"12"))
    with pytest.raises(ClaimLost):
        store.commit_steps(claim, [run_row(1, "price:a"), run_row(2, "price:b"), run_row(3, repeated)])
    assert [r.step_key for r in store.get_steps(key)] == ["charge#0"]
    run = store.get_run(key)
    assert (run.step_count, run.step_bytes) == (1, 2)


def test_c25_commit_steps_of_a_taken_over_claim_writes_nothing(store: StepStore) -> None:
    """After a takeover the old claim's ``commit_steps`` raises ``ClaimLost`` and writes none of its rows (C25)."""
    key = new_key()
    old = claim_run(store, key, lease=SHORT_LEASE).claim
    wait_past(store, old.lease_until)
    claim_run(store, key, owner="worker-2")
    before = store.get_run(key)
    with pytest.raises(ClaimLost):
        store.commit_steps(old, [StepRow(position=0, step_key="price#0", kind="map"), run_row(1, "price:a")])
    assert store.get_steps(key) == []
    assert store.get_run(key) == before


def test_c34_commit_steps_reports_a_requested_cancellation_with_the_committed_rows(store: StepStore) -> None:
    """After ``request_cancel``, ``commit_steps`` still commits its rows and raises ``CancelRequested`` carrying
    them as a tuple (C34, C51)."""
    key = new_key()
    claim = claim_run(store, key).claim
    store.request_cancel(key, "customer asked")
    with pytest.raises(CancelRequested) as raised:
        store.commit_steps(claim, [StepRow(position=0, step_key="price#0", kind="map"), run_row(1, "price:a")])
    assert raised.value.reason == "customer asked"
    assert isinstance(raised.value.row, tuple)
    assert [r.step_key for r in raised.value.row] == ["price#0", "price:a"]
    assert [r.step_key for r in store.get_steps(key)] == ["price#0", "price:a"]


def test_c15_sleep_step_keeps_its_wake_time(store: StepStore) -> None:
    """A sleep row stores its wake time and no value; it adds no bytes (C15, C17)."""
    key = new_key()
    claim = claim_run(store, key).claim
    wake_at = store.now() + 3600.0
    store.commit_step(claim, StepRow(position=0, step_key="sleep#0", kind="sleep", wake_at=wake_at))
    (row,) = store.get_steps(key)
    assert (row.kind, row.value) == ("sleep", None)
    assert row.wake_at == pytest.approx(wake_at)
    run = store.get_run(key)
    assert (run.step_count, run.step_bytes) == (1, 0)


def test_c22_a_four_mib_value_round_trips(store: StepStore) -> None:
    """A 4 MiB step value (the default run bytes limit) is stored and read back byte for byte (C22, C5)."""
    key = new_key()
    value = os.urandom(4 * 1024 * 1024)
    claim = claim_run(store, key).claim
    store.commit_step(claim, run_row(0, "render#0", value))
    store.finish(claim, "sleeping")
    begun = claim_run(store, key, owner="worker-2")
    assert begun.snapshot[0].value == value
    assert store.get_steps(key)[0].value == value
    assert store.get_run(key).step_bytes == len(value)


def test_c1_step_keys_are_exact_strings(store: StepStore) -> None:
    """Step keys differing only in case or by non-ASCII text are distinct steps (C1, C2)."""
    key = new_key()
    claim = claim_run(store, key).claim
    keys = ["charge#0", "Charge#0", "prix:café", "prix:cafe"]
    for i, step_key in enumerate(keys):
        store.commit_step(claim, run_row(i, step_key))
    assert [s.step_key for s in store.get_steps(key)] == keys


# ------------------------------------------------------------ exact keys
def look_alikes(base: str) -> list[str]:
    """Keys equal to ``base`` only under a lenient comparison: trailing space, case, Unicode normal form."""
    return [f"{base}caf\u00e9", f"{base}caf\u00e9 ", f"{base}CAF\u00c9", f"{base}cafe\u0301"]


def test_c40_step_keys_differing_by_trailing_space_case_or_normal_form_are_distinct(store: StepStore) -> None:
    """C40: step keys that differ only by a trailing space, case, or NFC/NFD form are four steps.

    Each commit is accepted (none is refused as "already committed"), the
    snapshot of the next attempt holds all four, each with its own value,
    and each key reads back exactly as written.
    """
    key = new_key()
    claim = claim_run(store, key).claim
    keys = look_alikes("pay:")
    for i, step_key in enumerate(keys):
        store.commit_step(claim, run_row(i, step_key, f"v{i}".encode()))
    store.finish(claim, "sleeping")
    snapshot = claim_run(store, key, owner="worker-2").snapshot
    assert [(r.step_key, r.value) for r in snapshot] == [(k, f"v{i}".encode()) for i, k in enumerate(keys)]
    assert [s.step_key for s in store.get_steps(key)] == keys


def test_c40_run_keys_differing_by_trailing_space_case_or_normal_form_are_distinct_runs(store: StepStore) -> None:
    """C40: run keys that differ only by a trailing space, case, or NFC/NFD form are four runs.

    The first run finishes; a job carrying each look-alike key is a new run
    (claimed at attempt 1, never ``Finished`` or ``Busy`` because of the
    first), and each run reads back under its exact key.
    """
    first, *others = look_alikes(new_key())
    store.finish(claim_run(store, first).claim, "succeeded")
    for other in others:
        begun = claim_run(store, other)
        assert begun.claim.attempt == 1, repr(other)
    assert store.get_run(first).status == "succeeded"
    assert {o: store.get_run(o).status for o in others} == dict.fromkeys(others, "running")
    assert {r.run_key for r in store.list_runs(limit=1000)} >= {first, *others}


def test_c40_dead_letters_keep_their_exact_run_key(store: StepStore) -> None:
    """C40: two runs whose keys differ only by a trailing space each keep their own dead letter."""
    plain = new_key()
    padded = plain + " "
    for run_key in (plain, padded):
        claim = claim_run(store, run_key, job_id=f"job{run_key}").claim
        store.finish(claim, "dead", dead_letter=NewDeadLetter(f"job{run_key}", "divergence", run_key))
    dead = {d.run_key: d.job_id for d in store.list_dead_letters() if d.run_key.strip() == plain}
    assert dead == {plain: f"job{plain}", padded: f"job{padded}"}


# ----------------------------------------------------------------- finish
def test_c27_finish_with_drop_steps_deletes_the_rows(store: StepStore) -> None:
    """A succeeded run's step rows are dropped and its totals reset; the claim is released (C27, C26)."""
    key = new_key()
    claim = claim_run(store, key).claim
    commit_rows(store, claim, 3)
    store.finish(claim, "succeeded", drop_steps=True)
    assert store.get_steps(key) == []
    run = store.get_run(key)
    assert (run.status, run.owner, run.lease_until, run.step_count, run.step_bytes) == (
        "succeeded",
        None,
        None,
        0,
        0,
    )


def test_c27_finish_without_drop_keeps_the_rows(store: StepStore) -> None:
    """A dead-lettered run keeps its step rows so its retry replays (C27)."""
    key = new_key()
    claim = claim_run(store, key).claim
    rows = commit_rows(store, claim, 2)
    store.finish(claim, "dead")
    assert store.get_steps(key) == rows
    assert store.get_run(key).step_count == 2


def test_c30_finish_with_a_dead_letter_records_it_with_the_envelope(store: StepStore) -> None:
    """``finish(dead_letter=…)`` records job, task, reason, message, traceback and envelope (C30)."""
    key = new_key()
    claim = claim_run(store, key, job_id="job-9").claim
    before = store.now()
    store.finish(claim, "dead", dead_letter=NewDeadLetter("job-9", "divergence", "step 0 changed", "Tb"))
    (dead,) = [d for d in store.list_dead_letters() if d.run_key == key]
    assert (dead.job_id, dead.task_name, dead.reason, dead.message, dead.traceback) == (
        "job-9",
        "shop.checkout",
        "divergence",
        "step 0 changed",
        "Tb",
    )
    assert dead.envelope.to_dict() == ENVELOPE.to_dict()
    assert dead.created_at >= before
    assert dead.retried_at is None
    assert store.get_dead_letter(dead.id) == dead
    assert store.get_run(key).status == "dead"


# ----------------------------------------------------------- settle_failed
def test_c28_settle_failed_applies_only_to_the_retrying_attempt(store: StepStore) -> None:
    """``settle_failed`` marks a retrying run failed only at its attempt, once (C28)."""
    key = new_key()
    claim = claim_run(store, key).claim
    store.finish(claim, "retrying")
    assert store.settle_failed(key, attempt=2) is False
    assert store.settle_failed(key, attempt=1) is True
    assert store.get_run(key).status == "failed"
    assert store.settle_failed(key, attempt=1) is False
    assert store.settle_failed("no-such-run", attempt=1) is False


def test_c28_settle_failed_ignores_a_run_that_moved_on(store: StepStore) -> None:
    """A newer attempt started after ``retrying``: settling the old attempt changes nothing (C28)."""
    key = new_key()
    store.finish(claim_run(store, key).claim, "retrying")
    claim_run(store, key, owner="worker-2")
    assert store.settle_failed(key, attempt=1) is False
    assert store.get_run(key).status == "running"


# ------------------------------------------------------------- release_run
LIVE = ("pending", "running", "sleeping", "retrying")


def test_c38_release_run_settles_a_claimed_run_and_fences_its_attempt(store: StepStore) -> None:
    """C38: ``release_run`` ends a run whose claim is live (the framework killed its worker) and fences the attempt.

    The run is ``failed`` with no owner, lease or wake time; its steps are
    kept; the old attempt's next write is refused (``ClaimLost``); a new
    delivery finds the run finished.
    """
    key = new_key()
    claim = claim_run(store, key).claim
    store.commit_step(claim, run_row(0, "charge#0"))
    assert store.release_run(key, "failed", while_status=LIVE) is True
    run = store.get_run(key)
    assert (run.status, run.owner, run.lease_until, run.wake_at, run.step_count) == ("failed", None, None, None, 1)
    with pytest.raises(ClaimLost):
        store.commit_step(claim, run_row(1, "ship#0"))
    assert store.begin(key, "job-2", ENVELOPE, "worker-2", 30.0) == Finished("failed")


def test_c38_release_run_applies_only_from_the_given_statuses(store: StepStore) -> None:
    """C38: ``release_run`` changes nothing for a run in another status, a terminal one, or an unknown one."""
    sleeping = new_key()
    store.finish(claim_run(store, sleeping).claim, "sleeping", wake_at=store.now() + 60)
    assert store.release_run(sleeping, "pending", while_status={"running"}) is False
    assert store.get_run(sleeping).status == "sleeping"
    assert store.release_run(sleeping, "cancelled", while_status=LIVE) is True
    assert (store.get_run(sleeping).status, store.get_run(sleeping).wake_at) == ("cancelled", None)
    done = terminal_run(store, "succeeded")
    assert store.release_run(done, "failed", while_status=LIVE) is False
    assert store.get_run(done).status == "succeeded"
    assert store.release_run("no-such-run", "failed", while_status=LIVE) is False


def test_c38_a_run_released_to_pending_is_claimed_again_without_a_takeover(store: StepStore) -> None:
    """C38: a run put back to ``pending`` from ``running`` (its worker shut down) is claimed at once, no takeover."""
    key = new_key()
    claim_run(store, key)
    assert store.release_run(key, "pending", while_status={"running"}) is True
    begun = claim_run(store, key, owner="worker-2")
    assert (begun.claim.attempt, begun.takeovers) == (2, 0)


# ---------------------------------------------------------- record_queued
OTHER_JOB = JobEnvelope(task_name="shop.other", framework="test", queue="other", args=[2])


def test_c46_record_queued_of_a_chosen_key_records_it_once_and_never_touches_an_existing_run(store: StepStore) -> None:
    """C46, C39, C44: a producer-chosen (or derived) key no run has is recorded ``queued`` with its job; a second
    publish of it changes nothing; a run that exists, whatever its status, keeps its row exactly (status,
    attempt, owner, job id, envelope, wake time, outcome)."""
    chosen = f"order-{new_key()}/link/0"
    store.record_queued(chosen, "job-1", ENVELOPE, delay_seconds=60)
    recorded = store.get_run(chosen)
    assert (recorded.status, recorded.attempt, recorded.owner, recorded.job_id) == ("queued", 0, None, "job-1")
    store.record_queued(chosen, "job-2", OTHER_JOB)
    assert store.get_run(chosen) == recorded
    running = new_key()
    claim_run(store, running)
    sleeping = new_key()
    store.finish(claim_run(store, sleeping).claim, "sleeping", wake_at=store.now() + 60)
    finished = new_key()
    store.finish(claim_run(store, finished).claim, "succeeded", outcome=b"V-21")
    existing = [running, sleeping, finished, terminal_run(store, "failed"), terminal_run(store, "dead")]
    before = [store.get_run(key) for key in existing]
    for key in existing:
        store.record_queued(key, "job-new", OTHER_JOB, delay_seconds=5)
    assert [store.get_run(key) for key in existing] == before
    assert store.begin(finished, "job-new", OTHER_JOB, "worker-2", 30.0) == Finished("succeeded", b"V-21")


# --------------------------------------------------- dead_letter_unstarted
UNREGISTERED = NewDeadLetter("job-u", "unregistered_task", "the worker does not have the task 'shop.chekcout'")


def test_c39_dead_letter_unstarted_ends_a_queued_run_once_with_its_dead_letter(store: StepStore) -> None:
    """C39, C30: a run recorded ``queued`` whose message the framework dropped becomes ``dead`` with one dead
    letter carrying its envelope, its outcome written and its due time cleared; a second call changes nothing."""
    key = new_key()
    store.record_queued(key, "job-u", ENVELOPE, delay_seconds=60)
    assert store.dead_letter_unstarted(key, UNREGISTERED, outcome=b"E-dead") is True
    run = store.get_run(key)
    assert (run.status, run.owner, run.wake_at, run.attempt, run.outcome) == ("dead", None, None, 0, b"E-dead")
    [letter] = store.list_dead_letters()
    assert (letter.run_key, letter.job_id, letter.reason, letter.task_name) == (
        key,
        "job-u",
        "unregistered_task",
        "shop.checkout",
    )
    assert (letter.message, letter.envelope) == (UNREGISTERED.message, ENVELOPE)
    assert store.dead_letter_unstarted(key, UNREGISTERED) is False
    assert len(store.list_dead_letters()) == 1
    assert store.begin(key, "job-2", ENVELOPE, "worker-2", 30.0) == Finished("dead", b"E-dead")


def test_c39_dead_letter_unstarted_never_touches_a_run_an_attempt_started(store: StepStore) -> None:
    """C39, C25: a run claimed by an attempt (running, put back ``pending``, sleeping, finished) or an unknown
    one is left exactly as it is, with no dead letter: a late copy of its message cannot harm it."""
    running = new_key()
    store.record_queued(running, "job-1", ENVELOPE)
    claim = claim_run(store, running).claim
    assert store.dead_letter_unstarted(running, UNREGISTERED) is False
    assert store.get_run(running).status == "running"
    store.commit_step(claim, run_row(0, "charge#0"))  # the attempt still holds its claim
    put_back = new_key()
    claim_run(store, put_back)
    assert store.release_run(put_back, "pending", while_status={"running"}) is True
    sleeping = new_key()
    store.finish(claim_run(store, sleeping).claim, "sleeping", wake_at=store.now() + 60)
    done = terminal_run(store, "succeeded")
    for key, status in ((put_back, "pending"), (sleeping, "sleeping"), (done, "succeeded")):
        assert store.dead_letter_unstarted(key, UNREGISTERED) is False
        assert store.get_run(key).status == status
    assert store.dead_letter_unstarted("no-such-run", UNREGISTERED) is False
    assert store.list_dead_letters() == []


def test_c39_a_retried_dead_letter_of_a_never_started_run_can_be_dead_lettered_again(store: StepStore) -> None:
    """C39, C30: a dead-letter retry makes the never-started run ``pending`` (attempt 0); if its new message is
    dropped too, it is dead-lettered again rather than left for recovery."""
    key = new_key()
    store.record_queued(key, "job-u", ENVELOPE)
    assert store.dead_letter_unstarted(key, UNREGISTERED) is True
    [first] = store.list_dead_letters()
    store.prepare_retry(first.id)
    assert (store.get_run(key).status, store.get_run(key).attempt) == ("pending", 0)
    assert store.dead_letter_unstarted(key, dataclasses.replace(UNREGISTERED, job_id="job-v")) is True
    assert [d.job_id for d in store.list_dead_letters(include_retried=True)] == ["job-u", "job-v"]


def test_c39_a_retried_dead_letter_of_a_started_run_is_dead_lettered_again_until_an_attempt_starts(
    store: StepStore,
) -> None:
    """C39, C30: a run an attempt started (attempt 1, three steps) that was dead-lettered and retried counts as
    unstarted until an attempt starts after the retry: a dropped message of it makes it ``dead`` again (attempt
    kept, steps kept, outcome written, one more dead letter); a second retry of that dead letter, dropped too,
    is dead-lettered once more, and a late copy then replays the dead outcome."""
    key, dead_id = dead_letter(store, steps=3)
    store.prepare_retry(dead_id)
    retried = store.get_run(key)
    assert (retried.status, retried.attempt, retried.owner) == ("pending", 1, None)
    assert store.get_dead_letter(dead_id).retried_at == retried.updated_at  # one clock reading for both

    assert store.dead_letter_unstarted(key, UNREGISTERED, outcome=b"E-dead") is True
    run = store.get_run(key)
    assert (run.status, run.attempt, run.owner, run.step_count, run.outcome) == ("dead", 1, None, 3, b"E-dead")
    assert [s.step_key for s in store.get_steps(key)] == ["step#0", "step#1", "step#2"]
    [first, again] = store.list_dead_letters(include_retried=True)
    assert (first.id, first.reason, again.reason, again.job_id) == (dead_id, "divergence", "unregistered_task", "job-u")
    assert store.dead_letter_unstarted(key, UNREGISTERED) is False  # dead now: nothing more

    store.prepare_retry(again.id)
    assert store.dead_letter_unstarted(key, dataclasses.replace(UNREGISTERED, job_id="job-v"), outcome=b"E2") is True
    assert [d.job_id for d in store.list_dead_letters()] == ["job-v"]
    assert store.begin(key, "job-w", ENVELOPE, "worker-2", 30.0) == Finished("dead", b"E2")


def test_c39_a_retried_dead_letter_an_attempt_started_after_the_retry_is_never_dead_lettered(
    store: StepStore,
) -> None:
    """C39, C25: once an attempt starts after the retry, the run is a started run again: a dropped copy of its
    message leaves it alone while it runs, after a shutdown put it back ``pending`` (``release_run``, or the
    attempt's own ``finish``), and after it commits a step; no dead letter is added. The store's clock moves
    between the retry and the start (SQLite's ticks in milliseconds): a real start follows a broker round trip."""
    released, finished = dead_letter(store, steps=1), dead_letter(store, steps=1)
    for key, dead_id in (released, finished):
        store.prepare_retry(dead_id)
        tick(store)
        claim = claim_run(store, key, job_id="job-2", owner="worker-2").claim
        assert claim.attempt == 2
        assert store.dead_letter_unstarted(key, UNREGISTERED) is False
        store.commit_step(claim, run_row(1, "after-retry#0"))
        assert store.dead_letter_unstarted(key, UNREGISTERED) is False
        if key == released[0]:
            assert store.release_run(key, "pending", while_status={"running"}) is True
        else:
            store.finish(claim, "pending")
        run = store.get_run(key)
        assert (run.status, run.attempt, run.owner) == ("pending", 2, None)
        assert store.dead_letter_unstarted(key, UNREGISTERED) is False
        assert store.get_run(key).status == "pending"
    assert {d.reason for d in store.list_dead_letters(include_retried=True)} == {"divergence"}


def test_c39_a_run_an_ordinary_attempt_put_back_pending_is_never_dead_lettered(store: StepStore) -> None:
    """C39, C38: a run never dead-lettered whose attempt was put back ``pending`` (a worker shutdown: the
    framework's ``release_run`` or the attempt's own ``finish``) has attempt 1 and no retried dead letter: a
    dropped copy of its message leaves it ``pending``, with no dead letter."""
    released, finished = new_key(), new_key()
    store.record_queued(released, "job-1", ENVELOPE)
    claim_run(store, released)
    assert store.release_run(released, "pending", while_status={"running"}) is True
    store.finish(claim_run(store, finished).claim, "pending")
    for key in (released, finished):
        run = store.get_run(key)
        assert (run.status, run.attempt, run.owner) == ("pending", 1, None)
        assert store.dead_letter_unstarted(key, UNREGISTERED) is False
        assert store.get_run(key).status == "pending"
    assert store.list_dead_letters(include_retried=True) == []


# ------------------------------------------------------------ C37 outcomes
@pytest.mark.parametrize("status", ["succeeded", "failed", "dead", "cancelled", "compensated"])
def test_c37_finish_keeps_the_outcome_with_the_terminal_status_and_begin_hands_it_over(
    store: StepStore, status: str
) -> None:
    """C37: ``finish`` writes the outcome with the terminal status; a later ``begin`` returns it in ``Finished``."""
    key = new_key()
    outcome = b"V" + bytes(range(256)) + status.encode()  # opaque bytes, every byte value
    store.finish(claim_run(store, key).claim, status, outcome=outcome)  # type: ignore[arg-type]
    assert store.get_run(key).outcome == outcome
    assert store.begin(key, "job-again", ENVELOPE, "worker-2", 30.0) == Finished(status, outcome)


def test_c37_a_four_mib_outcome_round_trips(store: StepStore) -> None:
    """C37: an outcome as large as a step bytes limit of 4 MiB is kept whole."""
    key = new_key()
    outcome = b"V" + os.urandom(4 * 1024 * 1024)
    store.finish(claim_run(store, key).claim, "succeeded", outcome=outcome)
    finished = store.begin(key, "job-again", ENVELOPE, "worker-2", 30.0)
    assert isinstance(finished, Finished)
    assert finished.outcome == outcome


def test_c37_a_run_that_moves_on_does_not_keep_an_old_outcome(store: StepStore) -> None:
    """C37: a retrying run's outcome is kept when it is settled failed, cleared when a later end writes none."""
    kept, cleared = new_key(), new_key()
    store.finish(claim_run(store, kept).claim, "retrying", outcome=b"E1")
    assert store.settle_failed(kept, 1) is True
    assert store.begin(kept, "job-2", ENVELOPE, "w", 30.0) == Finished("failed", b"E1")
    store.finish(claim_run(store, cleared).claim, "retrying", outcome=b"E1")
    claim_run(store, cleared, owner="worker-2")
    assert store.release_run(cleared, "failed", while_status=LIVE) is True
    assert store.begin(cleared, "job-3", ENVELOPE, "w", 30.0) == Finished("failed", None)


def test_c37_release_run_and_settle_cancelled_write_the_outcome_with_the_status(store: StepStore) -> None:
    """C37: the framework's own ends (``release_run``) and a cancellation (``settle_cancelled``) keep an outcome."""
    released, cancelled = new_key(), new_key()
    claim_run(store, released)
    assert store.release_run(released, "cancelled", while_status=LIVE, outcome=b"Ex") is True
    assert store.get_run(released).outcome == b"Ex"
    store.finish(claim_run(store, cancelled).claim, "sleeping", wake_at=store.now() + 60)
    assert store.settle_cancelled(cancelled, status="sleeping", attempt=1, outcome=b"Ec") is True
    assert store.begin(cancelled, "job-2", ENVELOPE, "w", 30.0) == Finished("cancelled", b"Ec")


def test_c37_a_run_that_finished_without_an_outcome_has_none(store: StepStore) -> None:
    """C37: a run ended without an outcome (as every run did before revision 0006) hands ``None`` over."""
    key = new_key()
    store.finish(claim_run(store, key).claim, "succeeded")
    assert store.begin(key, "job-2", ENVELOPE, "w", 30.0) == Finished("succeeded", None)


# -------------------------------------------------------------- operators
def test_get_run_of_an_unknown_key_raises_unknown_run(store: StepStore) -> None:
    """``get_run`` of an unknown run key raises ``UnknownRun`` (a ``StoreError`` and ``LookupError``)."""
    with pytest.raises(UnknownRun) as info:
        store.get_run("no-such-run")
    assert isinstance(info.value, StoreError)
    assert isinstance(info.value, LookupError)
    assert store.get_steps("no-such-run") == []


def test_list_runs_filters_and_orders_newest_first(store: StepStore) -> None:
    """``list_runs`` filters by status, task and ``updated_at >= since``, newest first, up to ``limit``."""
    a = terminal_run(store, "succeeded", task="task.a")
    tick(store)
    b = terminal_run(store, "dead", task="task.b")
    since = tick(store)
    tick(store)
    c = terminal_run(store, "succeeded", task="task.b")
    assert [r.run_key for r in store.list_runs()][:3] == [c, b, a]
    assert {r.run_key for r in store.list_runs(status="succeeded")} == {a, c}
    assert {r.run_key for r in store.list_runs(task_name="task.b")} == {b, c}
    assert [r.run_key for r in store.list_runs(status="succeeded", task_name="task.b")] == [c]
    assert [r.run_key for r in store.list_runs(since=since)] == [c]
    assert [r.run_key for r in store.list_runs(limit=1)] == [c]
    assert [r.run_key for r in store.iter_runs(status="dead")] == [b]


def test_c30_dead_letters_list_get_and_filter(store: StepStore) -> None:
    """Dead letters list oldest first, filter by task, and hide retried ones unless asked (C30)."""
    _, first = dead_letter(store, task="task.a")
    _, second = dead_letter(store, task="task.b")
    assert [d.id for d in store.list_dead_letters()] == [first, second]
    assert [d.id for d in store.list_dead_letters(task_name="task.b")] == [second]
    store.prepare_retry(first)
    assert [d.id for d in store.list_dead_letters()] == [second]
    assert [d.id for d in store.list_dead_letters(include_retried=True)] == [first, second]
    assert store.get_dead_letter(first).retried_at is not None


def test_c30_unknown_dead_letter_raises(store: StepStore) -> None:
    """Reading or retrying an unknown dead letter raises ``UnknownDeadLetter`` (C30)."""
    with pytest.raises(UnknownDeadLetter):
        store.get_dead_letter(424242)
    with pytest.raises(UnknownDeadLetter):
        store.prepare_retry(424242)


def test_c11_prepare_retry_keeps_the_run_key_and_its_steps(store: StepStore) -> None:
    """A retried dead letter makes its run pending with the same key; the next attempt replays its steps (C11, C30)."""
    key, dead_id = dead_letter(store, steps=3)
    rows = store.get_steps(key)
    before = store.now()
    dead = store.prepare_retry(dead_id)
    assert dead.id == dead_id
    assert dead.retried_at is not None
    assert dead.retried_at >= before
    run = store.get_run(key)
    assert (run.status, run.owner, run.lease_until, run.takeovers, run.step_count) == (
        "pending",
        None,
        None,
        0,
        3,
    )
    begun = claim_run(store, key, owner="worker-2", job_id="job-new")
    assert begun.snapshot == tuple(rows)
    assert (begun.claim.attempt, begun.takeovers) == (2, 0)


def test_c30_prepare_retry_reset_from_deletes_that_step_and_later_ones(store: StepStore) -> None:
    """``reset_from`` deletes the named step and every later position; totals follow (C30)."""
    key, dead_id = dead_letter(store, steps=3)
    first = store.get_steps(key)[0]
    store.prepare_retry(dead_id, reset_from="step#1")
    assert store.get_steps(key) == [first]
    run = store.get_run(key)
    assert (run.status, run.step_count, run.step_bytes) == ("pending", 1, first.size)


def test_c30_prepare_retry_reset_from_an_unknown_step_changes_nothing(store: StepStore) -> None:
    """An unknown ``reset_from`` raises ``UnknownRun`` naming the run's steps; nothing changes (C30)."""
    key, dead_id = dead_letter(store, steps=2)
    with pytest.raises(UnknownRun, match="step#0, step#1"):
        store.prepare_retry(dead_id, reset_from="nope#0")
    assert store.get_run(key).status == "dead"
    assert len(store.get_steps(key)) == 2
    assert store.get_dead_letter(dead_id).retried_at is None


def test_c48_get_steps_of_reads_the_steps_of_many_runs_at_once(store: StepStore) -> None:
    """``get_steps_of`` gives each run's step rows by position, as ``get_steps`` does, ``[]`` for a run without
    steps or an unknown key, across more runs than one query reads (C48)."""
    keys = [new_key() for _ in range(3)]
    for count, key in enumerate(keys):
        commit_rows(store, claim_run(store, key).claim, count)
    many = [*keys, "nobody", *(new_key() for _ in range(600))]
    found = store.get_steps_of(many)
    assert set(found) == set(many)
    for key in keys:
        assert found[key] == store.get_steps(key)
    assert [len(found[k]) for k in keys] == [0, 1, 2]
    assert found["nobody"] == []


# ----------------------------------------------------------------- forks
def _run_to_fork(store: StepStore) -> tuple[str, list[StepRow]]:
    """A sleeping run with ``step#0``, a wait and what it received, a patch marker, ``step#4`` and a sleep."""
    key = new_key()
    claim = claim_run(store, key).claim
    rows = [
        run_row(0, "step#0", b"first"),
        StepRow(1, "payment#0", "wait", wake_at=store.now() + 60),
        StepRow(2, "event:payment#0", "event", value=b"paid", event_id=7),
        StepRow(3, "patch:audit-v2", "patch"),
        run_row(4, "step#4", b"fifth"),
        StepRow(5, "sleep#0", "sleep", wake_at=store.now() + 3600),
    ]
    committed = [store.commit_step(claim, row) for row in rows]
    store.finish(claim, "sleeping", wake_at=committed[-1].wake_at)
    return key, committed


def test_c50_fork_run_copies_the_steps_before_the_step_into_a_new_queued_run(store: StepStore) -> None:
    """``fork_run`` makes a new run, ``queued`` and due now with the old envelope, holding exact copies of the steps
    before ``from_step`` (positions, keys, kinds, values, wake and commit times, event ids); the old run and its
    steps are unchanged (C50)."""
    key, committed = _run_to_fork(store)
    old_run = store.get_run(key)
    fresh = new_key()
    forked = store.fork_run(key, "step#4", fresh)
    assert (forked.run_key, forked.status, forked.attempt, forked.job_id, forked.owner) == (
        fresh,
        "queued",
        0,
        None,
        None,
    )
    assert forked.envelope.to_dict() == ENVELOPE.to_dict()
    assert (forked.task_name, forked.framework, forked.queue) == ("shop.checkout", "test", "default")
    assert forked.wake_at is not None
    assert abs(forked.wake_at - store.now()) < 5
    assert store.get_steps(fresh) == committed[:4]
    assert (forked.step_count, forked.step_bytes) == (4, sum(r.size for r in committed[:4]))
    assert store.get_run(fresh) == forked
    assert store.get_run(key) == old_run
    assert store.get_steps(key) == committed
    begun = claim_run(store, fresh, job_id="job-fork")
    assert begun.snapshot == tuple(committed[:4])


def test_c50_fork_run_from_the_first_step_copies_nothing(store: StepStore) -> None:
    """Forked from its first step, the new run has no step rows: it runs the whole body again (C50)."""
    key, _ = _run_to_fork(store)
    fresh = new_key()
    assert store.fork_run(key, "step#0", fresh).step_count == 0
    assert store.get_steps(fresh) == []


def test_c50_fork_run_refuses_bad_input_and_writes_nothing(store: StepStore) -> None:
    """An unknown run, an unknown step, a step of another kind (what a wait received, a patch marker) or a new key
    that names a run is refused, the valid steps listed; no run is created (C50)."""
    key, _ = _run_to_fork(store)
    fresh = new_key()
    with pytest.raises(UnknownRun):
        store.fork_run(new_key(), "step#0", fresh)
    with pytest.raises(UnknownStep, match="step#0, payment#0, step#4, sleep#0"):
        store.fork_run(key, "nope#0", fresh)
    for other_kind in ("event:payment#0", "patch:audit-v2"):
        with pytest.raises(InvalidForkStep, match="fork it from one of: step#0, payment#0, step#4, sleep#0"):
            store.fork_run(key, other_kind, fresh)
    with pytest.raises(InvalidRunKey, match="exists already"):
        store.fork_run(key, "step#4", key)
    with pytest.raises(UnknownRun):
        store.get_run(fresh)
    assert store.get_steps(fresh) == []


def test_c50_fork_run_refuses_the_undos_of_a_compensation(store: StepStore) -> None:
    """A step recorded after a compensation began (an undo) is not a place to fork from (C32, C50)."""
    key = new_key()
    claim = claim_run(store, key).claim
    store.commit_step(claim, run_row(0, "step#0"))
    store.commit_step(claim, StepRow(1, "compensation:start", "compensation", failure="{}"))
    store.commit_step(claim, run_row(2, "compensate:step#0"))
    with pytest.raises(InvalidForkStep, match=r"fork it from one of: step#0$"):
        store.fork_run(key, "compensate:step#0", new_key())


def test_c30_purge_dead_letters(store: StepStore) -> None:
    """``purge_dead_letters`` deletes the given ids (or all) and returns how many (C30)."""
    ids = [dead_letter(store, steps=0)[1] for _ in range(3)]
    assert store.purge_dead_letters([]) == 0
    assert store.purge_dead_letters([ids[0], 987654]) == 1
    assert [d.id for d in store.list_dead_letters()] == ids[1:]
    assert store.purge_dead_letters() == 2
    assert store.list_dead_letters(include_retried=True) == []
    with pytest.raises(UnknownDeadLetter):
        store.get_dead_letter(ids[0])


def test_c27_cleanup_drops_only_old_succeeded_failed_and_cancelled_runs(store: StepStore) -> None:
    """``cleanup`` deletes old succeeded, failed, cancelled, compensated runs and their steps; others stay (C27)."""
    doomed = [terminal_run(store, status, steps=1) for status in ("succeeded", "failed", "cancelled", "compensated")]
    dead, _ = dead_letter(store, steps=2)
    sleeping = terminal_run(store, "sleeping", steps=1)
    running = new_key()
    claim_run(store, running)
    cutoff = tick(store)
    tick(store)
    recent = terminal_run(store, "succeeded", steps=1)
    assert store.cleanup(older_than=cutoff) == 4
    for key in doomed:
        with pytest.raises(UnknownRun):
            store.get_run(key)
        assert store.get_steps(key) == []
    for key in (dead, sleeping, running, recent):
        store.get_run(key)
    assert len(store.get_steps(dead)) == 2
    assert store.cleanup(older_than=cutoff) == 0


def test_c27_c30_cleanup_drops_a_dead_run_once_its_dead_letters_are_purged(store: StepStore) -> None:
    """A purged dead letter's run, steps and step attempts go at the next cleanup; a lettered run stays (C27, C30)."""
    purged = new_key()
    claim = claim_run(store, purged, job_id="job-dead").claim
    commit_rows(store, claim, 2)
    assert store.begin_step_attempt(claim, "step#2", 3) == AttemptStarted(1, ())
    store.finish(claim, "dead", dead_letter=NewDeadLetter("job-dead", "divergence", "step changed", "Traceback ..."))
    (purged_id,) = [d.id for d in store.list_dead_letters() if d.run_key == purged]
    kept, kept_id = dead_letter(store, steps=2)
    retried, retried_id = dead_letter(store, steps=1)
    store.prepare_retry(retried_id)
    store.finish(claim_run(store, retried).claim, "dead")  # died again; its retried dead letter still names it
    cutoff = tick(store)
    assert store.cleanup(older_than=cutoff) == 0
    assert store.purge_dead_letters([purged_id]) == 1
    assert store.get_run(purged).status == "dead"  # a purge deletes the dead letter only
    assert store.cleanup(older_than=cutoff) == 1
    with pytest.raises(UnknownRun):
        store.get_run(purged)
    assert store.get_steps(purged) == []
    assert store.get_step_attempts(purged) == []
    assert len(store.get_steps(kept)) == 2
    assert store.get_dead_letter(kept_id).run_key == kept
    assert store.get_run(retried).status == "dead"
    assert store.cleanup(older_than=cutoff) == 0


# --------------------------------------------------------- step attempts
def failure(step_key: str, number: int | None, ended: str = "failed", delay: float | None = None) -> StepAttemptFailure:
    return StepAttemptFailure(step_key, number, ended, "ConnectionError", "down", "Traceback ...", delay)  # type: ignore[arg-type]


def test_c31_step_attempts_are_numbered_and_journaled_before_the_body(store: StepStore) -> None:
    """``begin_step_attempt`` inserts attempt n+1 with its run attempt and start time (store clock) (C31)."""
    key = new_key()
    claim = claim_run(store, key).claim
    before = store.now()
    first = store.begin_step_attempt(claim, "ship#0", 3)
    assert first == AttemptStarted(1, ())
    store.fail_step_attempt(claim, failure("ship#0", 1))
    second = store.begin_step_attempt(claim, "ship#0", 3)
    assert isinstance(second, AttemptStarted)
    assert second.number == 2
    assert [a.number for a in second.previous] == [1]
    (one, two) = store.get_step_attempts(key)
    assert (one.number, one.ended, two.number, two.ended, two.run_attempt) == (1, "failed", 2, None, 1)
    assert before <= two.started_at <= store.now()


def test_c31_open_step_attempts_of_dead_attempts_become_lost(store: StepStore) -> None:
    """An attempt still open when its step begins again belonged to a worker that died: it is ``lost`` and
    counts; once ``max_attempts`` exist the budget is spent and nothing is inserted (C31)."""
    key = new_key()
    first = claim_run(store, key, lease=SHORT_LEASE)
    assert store.begin_step_attempt(first.claim, "charge#0", 2) == AttemptStarted(1, ())
    wait_past(store, first.claim.lease_until)
    second = claim_run(store, key, owner="worker-2").claim
    started = store.begin_step_attempt(second, "charge#0", 2)
    assert isinstance(started, AttemptStarted)
    assert started.number == 2
    assert [a.ended for a in started.previous] == ["lost"]
    store.finish(second, "retrying")
    third = claim_run(store, key, owner="worker-3").claim
    spent = store.begin_step_attempt(third, "charge#0", 2)
    assert isinstance(spent, AttemptsSpent)
    assert [(a.number, a.ended, a.run_attempt) for a in spent.previous] == [(1, "lost", 1), (2, "lost", 2)]
    assert len(store.get_step_attempts(key)) == 2


def test_c31_a_step_attempt_is_not_due_before_its_retry_time(store: StepStore) -> None:
    """After a failure with ``retry_delay``, a new attempt is refused until ``retry_at`` (store clock) (C31)."""
    key = new_key()
    claim = claim_run(store, key).claim
    store.begin_step_attempt(claim, "ship#0", 5)
    failed = store.fail_step_attempt(claim, failure("ship#0", 1, delay=30.0))
    assert failed.row is None
    assert failed.attempt.retry_at == pytest.approx(failed.attempt.failed_at + 30.0)
    assert store.begin_step_attempt(claim, "ship#0", 5) == AttemptNotDue(failed.attempt.retry_at)
    assert len(store.get_step_attempts(key)) == 1


def test_c31_step_attempt_writes_are_fenced(store: StepStore) -> None:
    """A taken-over attempt can neither journal nor fail a step attempt (C25, C31)."""
    key = new_key()
    old = claim_run(store, key, lease=SHORT_LEASE)
    wait_past(store, old.claim.lease_until)
    claim_run(store, key, owner="worker-2")
    with pytest.raises(ClaimLost):
        store.begin_step_attempt(old.claim, "ship#0", 3)
    with pytest.raises(ClaimLost):
        store.fail_step_attempt(old.claim, failure("ship#0", None))
    assert store.get_step_attempts(key) == []


def test_c31_a_step_failed_for_good_commits_its_row_with_the_failure(store: StepStore) -> None:
    """``fail_step_attempt(row=...)`` records the failure and commits the step row in one transaction; a
    failure without a number is numbered next; the row keeps its failure and undo name (C31, C32)."""
    key = new_key()
    claim = claim_run(store, key).claim
    store.fail_step_attempt(claim, failure("ship#0", None))
    row = StepRow(0, "ship#0", "run", failure='{"step": {}}', compensate="release")
    done = store.fail_step_attempt(claim, failure("ship#0", None, "non_retryable"), row=row)
    assert done.attempt.number == 2
    assert done.attempt.ended == "non_retryable"
    assert done.row is not None
    assert done.row.committed_at is not None
    (stored,) = store.get_steps(key)
    assert (stored.failure, stored.compensate, stored.value) == ('{"step": {}}', "release", None)
    assert store.get_run(key).step_count == 1
    with pytest.raises(ClaimLost):
        store.fail_step_attempt(claim, failure("ship#0", None), row=row)  # already committed
    assert len(store.get_step_attempts(key)) == 2


def test_c27_finish_with_drop_steps_deletes_the_step_attempts(store: StepStore) -> None:
    """A succeeded run's step attempts go with its step rows (C27)."""
    key = new_key()
    claim = claim_run(store, key).claim
    store.fail_step_attempt(claim, failure("a#0", None))
    store.finish(claim, "succeeded", drop_steps=True)
    assert store.get_step_attempts(key) == []


def test_c32_start_compensation_is_a_compare_and_set(store: StepStore) -> None:
    """``start_compensation`` applies only to a run with that status and attempt and no claim: it appends the
    ``compensation`` row after the last step and makes the run ``pending`` (C32)."""
    key = new_key()
    claim = claim_run(store, key).claim
    commit_rows(store, claim, 2)
    marker = StepRow(0, "compensation:start", "compensation", failure='{"run": {}}')
    assert not store.start_compensation(key, marker, status="retrying", attempt=1)  # still running
    store.finish(claim, "retrying")
    assert not store.start_compensation(key, marker, status="retrying", attempt=2)  # another attempt
    assert store.start_compensation(key, marker, status="retrying", attempt=1)
    assert not store.start_compensation(key, marker, status="retrying", attempt=1)  # it moved on
    last = store.get_steps(key)[-1]
    assert (last.position, last.step_key, last.kind, last.failure) == (
        2,
        "compensation:start",
        "compensation",
        '{"run": {}}',
    )
    run = store.get_run(key)
    assert (run.status, run.step_count) == ("pending", 3)
    assert claim_run(store, key, owner="worker-2").snapshot[-1].step_key == "compensation:start"


def test_c31_prepare_retry_drops_the_step_that_failed_for_good_and_its_attempts(store: StepStore) -> None:
    """Without ``reset_from``, a retry drops the last step that failed for good, every later step and their
    attempts, so the failed step runs again with its whole budget; earlier steps stay (C30, C31)."""
    key = new_key()
    claim = claim_run(store, key).claim
    store.commit_step(claim, run_row(0, "charge#0"))
    store.fail_step_attempt(claim, failure("charge#0", None))
    row = StepRow(1, "ship#0", "run", failure='{"step": {}}')
    store.fail_step_attempt(claim, failure("ship#0", None, "exhausted"), row=row)
    store.finish(claim, "dead", dead_letter=NewDeadLetter("job-1", "step_retry_exhausted", "spent"))
    (dead,) = [d for d in store.list_dead_letters() if d.run_key == key]
    store.prepare_retry(dead.id)
    assert [s.step_key for s in store.get_steps(key)] == ["charge#0"]
    assert [a.step_key for a in store.get_step_attempts(key)] == ["charge#0"]
    assert store.get_run(key).step_count == 1


# -------------------------------------------------------------- recovery
def test_c35_mark_recovered_is_a_compare_and_set(store: StepStore) -> None:
    """``mark_recovered`` wins once for the state read; a stale read or another status loses (C35).

    Two recoverers that read the same sleeping run race: the first moves
    ``updated_at`` to the store's clock and gets ``True``, the second, still
    holding the old ``updated_at``, gets ``False``. Nothing but ``updated_at``
    changes.
    """
    key = terminal_run(store, "sleeping", steps=1)
    seen = store.get_run(key)
    tick(store)
    assert seen.recovered_at is None
    assert store.mark_recovered(key, status="sleeping", updated_at=seen.updated_at) is True
    assert store.mark_recovered(key, status="sleeping", updated_at=seen.updated_at) is False
    after = store.get_run(key)
    assert after.updated_at > seen.updated_at
    assert after.recovered_at == after.updated_at  # the recovery is recorded as such
    assert (after.status, after.attempt, after.owner, after.step_count) == ("sleeping", 1, None, 1)
    assert store.mark_recovered(key, status="pending", updated_at=after.updated_at) is False
    assert store.mark_recovered(new_key(), status="sleeping", updated_at=after.updated_at) is False


def test_c35_unmark_recovered_makes_a_run_whose_copy_never_left_a_candidate_again(store: StepStore) -> None:
    """``unmark_recovered`` puts back the ``recovered_at`` read before ``mark_recovered``, and only that (C35).

    A sweep whose publish failed (the broker down) must not leave the run
    marked recovered for ``stale_after``: nothing was re-published.
    """
    key = terminal_run(store, "sleeping", steps=1)
    seen = store.get_run(key)
    tick(store)
    assert store.mark_recovered(key, status="sleeping", updated_at=seen.updated_at) is True
    store.unmark_recovered(key, recovered_at=seen.recovered_at)
    after = store.get_run(key)
    assert after.recovered_at is None
    assert (after.status, after.attempt, after.step_count) == ("sleeping", 1, 1)
    store.unmark_recovered(new_key(), recovered_at=None)  # an unknown run: nothing to do


def test_c47_settle_reported_ends_only_a_queued_run(store: StepStore) -> None:
    """``settle_reported`` ends a ``queued`` run with the status the framework reported; a run an attempt
    started is left alone; a status a framework cannot report is refused (C47)."""
    queued = new_key()
    store.record_queued(queued, "job-q", ENVELOPE)
    assert store.settle_reported(queued, "failed") is True
    run = store.get_run(queued)
    assert (run.status, run.owner, run.wake_at, run.outcome) == ("failed", None, None, None)
    assert store.settle_reported(queued, "succeeded") is False
    assert store.get_run(queued).status == "failed"
    started = new_key()
    store.record_queued(started, "job-s", ENVELOPE)
    claim_run(store, started)
    assert store.settle_reported(started, "succeeded") is False
    assert store.get_run(started).status == "running"
    assert store.settle_reported(new_key(), "cancelled") is False
    with pytest.raises(ValueError, match="succeeded, failed or cancelled"):
        store.settle_reported(queued, "dead")


def test_c35_finish_records_a_sleeping_runs_wake_time(store: StepStore) -> None:
    """``finish(..., wake_at=)`` records the wake time on the run; a later finish without one clears it (C35)."""
    key = new_key()
    claim = claim_run(store, key).claim
    store.finish(claim, "sleeping", wake_at=1_900_000_000.5)
    assert store.get_run(key).wake_at == 1_900_000_000.5
    claim = claim_run(store, key).claim
    store.finish(claim, "succeeded")
    assert store.get_run(key).wake_at is None


def test_c35_mark_recovered_skips_a_running_run_with_a_live_lease(store: StepStore) -> None:
    """A ``running`` run is won only once its lease has expired: a live worker is never recovered (C35)."""
    live = new_key()
    claim_run(store, live, lease=30.0)
    assert store.mark_recovered(live, status="running", updated_at=store.get_run(live).updated_at) is False
    lost = new_key()
    claim = claim_run(store, lost, lease=SHORT_LEASE).claim
    seen = store.get_run(lost)
    wait_past(store, claim.lease_until)
    assert store.mark_recovered(lost, status="running", updated_at=seen.updated_at) is True
    assert store.get_run(lost).owner == "worker-1"  # the claim is left for the next begin to take over


# ----------------------------------------------------------- events (C33)
def event_row(position: int, wait_key: str, event_id: int) -> StepRow:
    return StepRow(position=position, step_key=f"event:{wait_key}", kind="event", value=b"v", event_id=event_id)


def test_c33_a_run_receives_events_sent_after_it_was_created_oldest_first(store: StepStore) -> None:
    """``next_event``: an event sent to every run is receivable by runs created at or before it, the oldest first;
    one sent before the run existed is not (C33)."""
    early = store.add_event("payment", "o-1", b"early").event
    key = new_key()
    claim_run(store, key)
    tick(store)
    first = store.add_event("payment", "o-1", b"one").event
    second = store.add_event("payment", "o-1", b"two").event
    store.add_event("payment", "o-2", b"other key")
    store.add_event("refund", "o-1", b"other topic")
    assert second.id > first.id > early.id
    found = store.next_event(key, "payment", "o-1")
    assert found is not None
    assert (found.id, found.payload, found.run_key) == (first.id, b"one", None)
    assert store.next_event(new_key(), "payment", "o-1") is None  # an unknown run receives nothing


def test_c33_an_event_sent_to_a_run_by_its_key_is_received_even_before_the_run_exists(store: StepStore) -> None:
    """An event with a ``run_key`` is receivable by that run only, whenever the run was created (C33)."""
    key = new_key()
    sent = store.add_event("approval", "doc-9", b"yes", run_key=key).event
    claim_run(store, key)
    other = new_key()
    claim_run(store, other)
    found = store.next_event(key, "approval", "doc-9")
    assert found is not None
    assert (found.id, found.run_key) == (sent.id, key)
    assert store.next_event(other, "approval", "doc-9") is None


def test_c33_an_event_is_received_at_most_once_per_run(store: StepStore) -> None:
    """An ``event`` row committed with an event's id consumes it for that run, not for another run (C33)."""
    key, other = new_key(), new_key()
    claim = claim_run(store, key).claim
    claim_run(store, other)
    tick(store)
    first = store.add_event("payment", "o-1", b"one").event
    second = store.add_event("payment", "o-1", b"two").event
    store.commit_step(claim, event_row(0, "payment#0", first.id))
    assert store.get_steps(key)[0].event_id == first.id
    assert store.next_event(key, "payment", "o-1") == second
    assert store.next_event(other, "payment", "o-1") == first


def test_c33_poll_event_records_the_wait_and_clears_it_once_an_event_or_the_deadline_is_there(
    store: StepStore,
) -> None:
    """``poll_event`` (fenced) leaves the run's wait fields set while nothing came, clears them on an event or a
    timeout, and ``add_event`` lists the run among its waiters while they are set (C33)."""
    key = new_key()
    claim = claim_run(store, key).claim
    nothing = store.poll_event(claim, "payment", "o-1", None)
    assert (nothing.event, nothing.timed_out) == (None, False)
    run = store.get_run(key)
    assert (run.wait_topic, run.wait_key) == ("payment", "o-1")
    store.finish(claim, "waiting", wake_at=None)
    sent = store.add_event("payment", "o-1", b"paid")
    assert [r.run_key for r in sent.waiters] == [key]
    assert sent.waiters[0].status == "waiting"
    assert store.add_event("payment", "o-2", b"other").waiters == ()
    claim = claim_run(store, key).claim
    got = store.poll_event(claim, "payment", "o-1", None)
    assert got.event == sent.event
    assert (store.get_run(key).wait_topic, store.get_run(key).wait_key) == (None, None)
    assert store.add_event("payment", "o-1", b"again").waiters == ()


def test_c33_poll_event_times_out_at_the_deadline_and_is_fenced(store: StepStore) -> None:
    """With no event and the deadline passed the poll says ``timed_out``; a lost claim cannot poll (C25, C33)."""
    key = new_key()
    claim = claim_run(store, key).claim
    now = store.now()
    assert store.poll_event(claim, "payment", "o-1", now + 60).timed_out is False
    timed_out = store.poll_event(claim, "payment", "o-1", now - 1)
    assert (timed_out.event, timed_out.timed_out) == (None, True)
    assert store.get_run(key).wait_topic is None
    stale = Claim(key, "someone-else", claim.attempt, claim.lease_until)
    with pytest.raises(ClaimLost):
        store.poll_event(stale, "payment", "o-1", None)


def test_c33_add_event_wakes_only_runs_that_can_receive_the_event(store: StepStore) -> None:
    """Waiters: runs waiting (or running) on the topic and key, created before the event, or the addressed run (C33)."""
    waiting, running, addressed = new_key(), new_key(), new_key()
    for key in (waiting, running, addressed):
        claim = claim_run(store, key).claim
        store.poll_event(claim, "payment", "o-1", None)
        if key != running:
            store.finish(claim, "waiting")
    tick(store)
    everyone = store.add_event("payment", "o-1", b"x")
    assert sorted(r.run_key for r in everyone.waiters) == sorted([waiting, running, addressed])
    assert {r.status for r in everyone.waiters} == {"waiting", "running"}
    only = store.add_event("payment", "o-1", b"y", run_key=addressed)
    assert [r.run_key for r in only.waiters] == [addressed]
    late = new_key()
    claim_run(store, late)  # created after the events: waits on nothing yet
    assert late not in {r.run_key for r in store.add_event("payment", "o-2", b"z").waiters}


def test_c33_cleanup_events_drops_events_sent_before_the_cutoff(store: StepStore) -> None:
    """``cleanup_events`` deletes events older than the cutoff; later ones stay and stay receivable (C33)."""
    key = new_key()
    claim_run(store, key)
    tick(store)
    old = store.add_event("payment", "o-1", b"old").event
    cutoff = tick(store)
    new = store.add_event("payment", "o-1", b"new").event
    assert store.cleanup_events(older_than=cutoff) == 1
    assert store.next_event(key, "payment", "o-1") == new
    assert old.id < new.id
    assert store.cleanup_events(older_than=cutoff) == 0


# ----------------------------------------------------- cancellation (C34)
def test_c34_a_commit_reports_a_requested_cancellation_with_the_committed_row(store: StepStore) -> None:
    """After ``request_cancel``, ``commit_step`` still commits the row and raises ``CancelRequested`` carrying it,
    and the next ``begin`` hands the request to the attempt (C34)."""
    key = new_key()
    claim = claim_run(store, key).claim
    store.commit_step(claim, run_row(0, "charge#0"))
    requested = store.request_cancel(key, "customer asked")
    assert (requested.status, requested.cancel_reason) == ("running", "customer asked")
    with pytest.raises(CancelRequested) as raised:
        store.commit_step(claim, run_row(1, "ship#0"))
    assert raised.value.reason == "customer asked"
    assert isinstance(raised.value.row, StepRow)
    assert raised.value.row.step_key == "ship#0"
    assert [r.step_key for r in store.get_steps(key)] == ["charge#0", "ship#0"]
    with pytest.raises(CancelRequested):
        store.poll_event(claim, "payment", "o-1", None)
    assert store.get_run(key).wait_topic is None  # a cancelled poll records nothing
    store.finish(claim, "sleeping", wake_at=store.now() + 60)
    begun = claim_run(store, key)
    assert begun.cancel_reason == "customer asked"
    assert begun.created_at == store.get_run(key).created_at


def test_c34_request_cancel_keeps_the_first_reason_and_leaves_finished_runs_alone(store: StepStore) -> None:
    """``request_cancel`` keeps the first reason; a terminal run is returned unchanged; an unknown one raises (C34)."""
    key = terminal_run(store, "sleeping")
    assert store.request_cancel(key, "first").cancel_reason == "first"
    assert store.request_cancel(key, "second").cancel_reason == "first"
    done = terminal_run(store, "succeeded")
    assert store.request_cancel(done, "too late").cancel_reason is None
    assert store.get_run(done).status == "succeeded"
    with pytest.raises(UnknownRun):
        store.request_cancel(new_key(), "nobody")


def test_c34_settle_cancelled_is_a_compare_and_set_on_an_unheld_run(store: StepStore) -> None:
    """``settle_cancelled`` ends an unheld run ``cancelled`` (claim and wake time cleared) only at the status and
    attempt read; a live claim or a newer attempt wins; a later ``begin`` finds a finished run (C26, C34)."""
    key = new_key()
    claim = claim_run(store, key).claim
    store.finish(claim, "sleeping", wake_at=store.now() + 60)
    assert store.settle_cancelled(key, status="waiting", attempt=1) is False
    assert store.settle_cancelled(key, status="sleeping", attempt=2) is False
    assert store.settle_cancelled(key, status="sleeping", attempt=1) is True
    run = store.get_run(key)
    assert (run.status, run.owner, run.wake_at) == ("cancelled", None, None)
    assert isinstance(store.begin(key, "job-2", ENVELOPE, "worker-2", 30.0), Finished)
    live = new_key()
    claim_run(store, live)
    assert store.settle_cancelled(live, status="running", attempt=1) is False
    lost = new_key()
    dead = claim_run(store, lost, lease=SHORT_LEASE).claim
    wait_past(store, dead.lease_until)
    assert store.settle_cancelled(lost, status="running", attempt=1) is True
    with pytest.raises(ClaimLost):
        store.commit_step(dead, run_row(0, "late#0"))  # the dead worker's writes are fenced out


# ------------------------------------------------------------ tracing (C53)
TRACE_A = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
TRACE_B = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_c53_the_first_traced_claim_keeps_its_trace_context(store: StepStore) -> None:
    """A new run keeps its first attempt's trace context; later claims read it and never replace it (C53)."""
    key = new_key()
    first = store.begin(key, "job-1", ENVELOPE, "worker-1", 30.0, trace_context=TRACE_A)
    assert isinstance(first, Begun)
    assert first.trace_context is None  # nothing was stored before this claim
    assert store.get_run(key).trace_context == TRACE_A
    store.finish(first.claim, "sleeping", wake_at=store.now())
    second = store.begin(key, "job-1", ENVELOPE, "worker-2", 30.0, trace_context=TRACE_B)
    assert isinstance(second, Begun)
    assert (second.claim.attempt, second.trace_context) == (2, TRACE_A)
    assert store.get_run(key).trace_context == TRACE_A


def test_c53_a_queued_or_untraced_run_takes_the_trace_of_its_first_traced_claim(store: StepStore) -> None:
    """A run recorded at publish, or claimed untraced first, stores the trace of its first traced claim (C53)."""
    queued = new_key()
    store.record_queued(queued, "job-1", ENVELOPE)
    assert store.get_run(queued).trace_context is None
    begun = store.begin(queued, "job-1", ENVELOPE, "worker-1", 30.0, trace_context=TRACE_A)
    assert isinstance(begun, Begun)
    assert begun.trace_context is None
    assert store.get_run(queued).trace_context == TRACE_A
    untraced = new_key()
    store.finish(claim_run(store, untraced).claim, "sleeping", wake_at=store.now())
    assert store.get_run(untraced).trace_context is None
    traced = store.begin(untraced, "job-1", ENVELOPE, "worker-1", 30.0, trace_context=TRACE_B)
    assert isinstance(traced, Begun)
    assert traced.trace_context is None
    store.finish(traced.claim, "sleeping", wake_at=store.now())
    assert claim_run(store, untraced).trace_context == TRACE_B


def test_c53_count_statuses_counts_each_status_asked_for(store: StepStore) -> None:
    """``count_statuses`` gives every status asked for, 0 for none, counting only those runs (C53's gauge)."""
    before = store.count_statuses(["sleeping", "waiting", "running"])
    sleeping = [new_key() for _ in range(2)]
    for key in sleeping:
        store.finish(claim_run(store, key).claim, "sleeping", wake_at=store.now() + 60)
    claim_run(store, new_key())
    after = store.count_statuses(["sleeping", "waiting", "running"])
    assert after == {
        "sleeping": before["sleeping"] + 2,
        "waiting": before["waiting"],
        "running": before["running"] + 1,
    }
