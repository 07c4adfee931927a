"""The store's listings for an operator's window, on every store (C52): keyset pages and capped counts.

The ``store`` fixture runs each test on memory, SQLite, PostgreSQL and
MariaDB, so the SQL queries (keyset conditions, loose index scans, capped
subqueries, the event receivers' join) are held to the memory store's
plain-Python answer.
"""

from __future__ import annotations

from uuid import uuid4

from flexiq_plugins._model.listings import RunCursor, RunFilter
from flexiq_plugins._model.records import Claim, JobEnvelope, NewDeadLetter, RunRecord, StepRow
from flexiq_plugins._store.base import StepStore
from tests.store.test_store_contract import claim_run, tick


def _run(store: StepStore, *, task: str = "shop.checkout", framework: str = "test", queue: str = "q1") -> Claim:
    """A new run, claimed (``running``), with an ``updated_at`` of its own."""
    claim = claim_run(store, f"rk-{uuid4().hex}", envelope=JobEnvelope(task, framework, queue)).claim
    tick(store)
    return claim


def _finish(store: StepStore, claim: Claim, status: str, **extra: object) -> str:
    """End the run of ``claim`` in ``status``; return its key."""
    store.finish(claim, status, **extra)  # type: ignore[arg-type]
    tick(store)
    return claim.run_key


def _keys(runs: list[RunRecord]) -> list[str]:
    return [r.run_key for r in runs]


def test_c52_find_runs_pages_by_last_update_newest_first_without_gaps_or_repeats(store: StepStore) -> None:
    """C52: pages of two, each continued after the previous page's last run, list every run once, newest first."""
    made = [_run(store).run_key for _ in range(5)]

    seen: list[str] = []
    after = None
    while True:
        page = store.find_runs(RunFilter(), after=after, limit=2)
        if not page:
            break
        seen += _keys(page)
        after = RunCursor(page[-1].updated_at, page[-1].run_key)

    assert seen == list(reversed(made))
    oldest_first = store.find_runs(RunFilter(), order="updated_asc", limit=3)
    assert _keys(oldest_first) == made[:3]
    rest = store.find_runs(RunFilter(), order="updated_asc", after=RunCursor(oldest_first[-1].updated_at, made[2]))
    assert _keys(rest) == made[3:]


def test_c52_find_runs_breaks_ties_on_the_run_key(store: StepStore) -> None:
    """C52: runs with one ``updated_at`` are ordered by run key, and a cursor inside the tie continues it."""
    made = [_run(store).run_key for _ in range(3)]
    runs = [store.get_run(k) for k in made]
    first = runs[0]
    tied = RunCursor(first.updated_at, first.run_key)

    page = store.find_runs(RunFilter(), after=tied, limit=10)

    assert first.run_key not in _keys(page)
    assert all((r.updated_at, r.run_key) < (first.updated_at, first.run_key) for r in page)


def test_c52_find_runs_filters_by_status_task_framework_queue_and_update_window(store: StepStore) -> None:
    """C52: each filter field narrows the listing; fields combine."""
    a = _run(store, task="shop.a", framework="celery", queue="fast").run_key
    b = _finish(store, _run(store, task="shop.b", framework="dramatiq", queue="slow"), "succeeded")
    c = _run(store, task="shop.a", framework="dramatiq", queue="fast").run_key
    run_b = store.get_run(b)

    def found(**fields: object) -> set[str]:
        return set(_keys(store.find_runs(RunFilter(**fields), limit=100))) & {a, b, c}  # type: ignore[arg-type]

    assert found(task_name="shop.a") == {a, c}
    assert found(framework="dramatiq") == {b, c}
    assert found(queue="fast", framework="dramatiq") == {c}
    assert found(status="succeeded") == {b}
    assert found(updated_since=run_b.updated_at) == {b, c}
    assert found(updated_until=run_b.updated_at) == {a}


def test_c52_find_runs_by_wake_time_lists_the_overdue_sleepers_soonest_first(store: StepStore) -> None:
    """C52: ``wake_asc`` with ``wake_before`` lists the sleeping runs past their wake time, soonest first."""
    now = store.now()
    later = _finish(store, _run(store), "sleeping", wake_at=now - 10)
    late = _finish(store, _run(store), "sleeping", wake_at=now - 100)
    future = _finish(store, _run(store), "sleeping", wake_at=now + 3600)

    overdue = store.find_runs(RunFilter(status="sleeping", wake_before=store.now()), order="wake_asc", limit=10)

    assert [k for k in _keys(overdue) if k in (late, later, future)] == [late, later]


def test_c52_count_runs_per_status_and_task_is_capped(store: StepStore) -> None:
    """C52: a group with more runs than the cap counts ``cap + 1``; smaller groups count exactly."""
    for _ in range(4):
        _run(store, task="shop.many")
    _finish(store, _run(store, task="shop.one"), "succeeded")

    by_task = store.count_runs(by="task_name", cap=2)
    by_status = store.count_runs(by="status", cap=2)

    assert by_task == {"shop.many": 3, "shop.one": 1}
    assert by_status == {"running": 3, "succeeded": 1}
    assert store.count_runs(by="task_name", cap=10, max_groups=1) == {"shop.many": 4}


def test_c52_dead_letters_page_newest_first_and_count_by_reason(store: StepStore) -> None:
    """C30, C52: dead letters are paged by id, newest first, filtered; the recent ones are counted per reason."""
    ids = []
    for reason in ("divergence", "worker_lost", "divergence"):
        key = _finish(store, _run(store, task="shop.dl"), "dead", dead_letter=NewDeadLetter("job", reason, "why", ""))
        ids.append(store.find_dead_letters(run_key=key)[0].id)
    since = store.get_dead_letter(ids[0]).created_at

    first = store.find_dead_letters(limit=2, task_name="shop.dl")
    rest = store.find_dead_letters(before_id=first[-1].id, task_name="shop.dl")

    assert [d.id for d in first + rest] == list(reversed(ids))
    assert [d.id for d in store.find_dead_letters(reason="worker_lost")] == [ids[1]]
    assert store.find_dead_letters(retried=True) == []
    assert store.count_dead_letters(since=since, cap=100) == {"divergence": 2, "worker_lost": 1}
    assert sum(store.count_dead_letters(since=since, cap=1).values()) == 2


def test_c33_c52_find_events_tells_pending_from_received_with_the_receivers(store: StepStore) -> None:
    """C33, C52: an event a run's ``event`` step holds is received, by that run; the others are pending."""
    claim = _run(store)
    key = claim.run_key
    taken = store.add_event("payment", "o-1", b"paid").event
    pending = store.add_event("payment", "o-2", b"later").event
    store.commit_step(claim, StepRow(0, "event:payment#0", "event", b"paid", event_id=taken.id))

    listed = {e.event.id: e.received_by for e in store.find_events(ids=[taken.id, pending.id])}
    received = [e.event.id for e in store.find_events(received=True)]
    waiting = [e.event.id for e in store.find_events(received=False)]
    newest = store.find_events(limit=1)

    assert listed == {taken.id: (key,), pending.id: ()}
    assert taken.id in received
    assert pending.id not in received
    assert pending.id in waiting
    assert taken.id not in waiting
    assert [e.event.id for e in newest] == [pending.id]
    assert [e.event.id for e in store.find_events(before_id=pending.id, limit=1)] == [taken.id]


def test_c39_c52_sweep_leases_say_when_recovery_last_swept(store: StepStore) -> None:
    """C39, C52: taking or renewing a recovery lease records when, on the store's clock."""
    before = store.now()
    assert store.acquire_sweep_lease("sweeper-1", 30.0, name="recovery:test")

    (lease,) = [s for s in store.sweep_leases() if s.name == "recovery:test"]

    assert lease.owner == "sweeper-1"
    assert lease.swept_at is not None
    assert lease.swept_at >= before
    assert lease.lease_until is not None
    assert lease.lease_until >= lease.swept_at + 29
