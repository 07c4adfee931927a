"""The store's part of C39 on every store: a run recorded at publish, and the one recovery lease.

``record_queued`` inserts a ``queued`` run only when its key is new, and the
claim takes a ``queued`` run like any unclaimed one. ``acquire_sweep_lease``
lets one process at a time sweep, on the store's clock.
"""

from __future__ import annotations

import threading
import time
from uuid import uuid4

from flexiq_plugins._model.records import Begun, Finished, JobEnvelope
from flexiq_plugins._store.base import StepStore

ENVELOPE = JobEnvelope("shop.checkout", "test", "default", [1], {"order": "A-1"}, {})
OTHER = JobEnvelope("shop.other", "test", "other", [2], {}, {})


def test_c39_record_queued_stores_the_envelope_and_the_job_id(store: StepStore) -> None:
    """C39: a run recorded at publish is ``queued``, unclaimed, with its envelope and job id."""
    key = uuid4().hex
    store.record_queued(key, "job-1", ENVELOPE)
    run = store.get_run(key)
    assert (run.status, run.attempt, run.owner, run.job_id) == ("queued", 0, None, "job-1")
    assert (run.envelope.task_name, run.envelope.args, run.envelope.kwargs) == ("shop.checkout", [1], {"order": "A-1"})


def test_c39_record_queued_never_resets_an_existing_run(store: StepStore) -> None:
    """C39: a new job published with the key of a run that exists (running, or finished) leaves it as it is."""
    key = uuid4().hex
    begun = store.begin(key, "job-1", ENVELOPE, "w1", 30.0)
    assert isinstance(begun, Begun)
    store.record_queued(key, "job-2", OTHER)
    run = store.get_run(key)
    assert (run.status, run.attempt, run.owner, run.job_id, run.task_name) == (
        "running", 1, "w1", "job-1", "shop.checkout"
    )  # fmt: skip
    store.finish(begun.claim, "succeeded")
    store.record_queued(key, "job-3", OTHER)
    assert store.get_run(key).status == "succeeded"
    assert isinstance(store.begin(key, "job-3", OTHER, "w2", 30.0), Finished)


def test_c39_the_claim_takes_a_queued_run(store: StepStore) -> None:
    """C39: the first delivery claims a ``queued`` run (queued → running), keeping the envelope recorded at publish."""
    key = uuid4().hex
    store.record_queued(key, "job-1", ENVELOPE)
    begun = store.begin(key, "job-1", OTHER, "w1", 30.0)
    assert isinstance(begun, Begun)
    assert begun.claim.attempt == 1
    assert begun.envelope.task_name == "shop.checkout"
    assert store.get_run(key).status == "running"


def test_c39_one_sweep_lease_holder_at_a_time(store: StepStore) -> None:
    """C39: the lease goes to one owner; it renews its own; others get it once released."""
    assert store.acquire_sweep_lease("a", 30.0)
    assert not store.acquire_sweep_lease("b", 30.0)
    assert store.acquire_sweep_lease("a", 30.0)
    store.release_sweep_lease("b")  # not the holder: nothing happens
    assert not store.acquire_sweep_lease("b", 30.0)
    store.release_sweep_lease("a")
    assert store.acquire_sweep_lease("b", 30.0)
    assert not store.acquire_sweep_lease("a", 30.0)


def test_c39_an_expired_sweep_lease_is_taken_over(store: StepStore) -> None:
    """C39: a holder that died (its lease expired on the store's clock) loses the lease to the next asker."""
    assert store.acquire_sweep_lease("dead", 0.2)
    until = store.now() + 0.2
    deadline = time.monotonic() + 10
    while store.now() <= until:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert store.acquire_sweep_lease("alive", 30.0)
    assert not store.acquire_sweep_lease("dead", 0.2)


def test_c39_racing_askers_get_one_lease(store: StepStore) -> None:
    """C39: eight threads ask for the free lease at once; exactly one gets it (row lock / store lock)."""
    barrier = threading.Barrier(8)
    won: list[str] = []

    def ask(owner: str) -> None:
        barrier.wait()
        if store.acquire_sweep_lease(owner, 30.0):
            won.append(owner)

    threads = [threading.Thread(target=ask, args=(f"w{i}",)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(won) == 1


def test_c39_leases_of_different_names_are_independent(store: StepStore) -> None:
    """C39: the lease ``recovery:celery`` and the lease ``recovery:dramatiq`` have holders of their own."""
    assert store.acquire_sweep_lease("a", 30.0, name="recovery:celery")
    assert store.acquire_sweep_lease("b", 30.0, name="recovery:dramatiq")
    assert not store.acquire_sweep_lease("b", 30.0, name="recovery:celery")
    store.release_sweep_lease("a", name="recovery:dramatiq")  # not a's lease: nothing happens
    assert not store.acquire_sweep_lease("a", 30.0, name="recovery:dramatiq")
