"""A duplicate of a finished run replays its outcome through Celery's own path (C37); the jobs Celery then
publishes on the run's behalf are runs of their own, the same ones each time (C44).

The worker process dies (``os._exit``, as a SIGKILL: nothing more runs in
it) after the store recorded the run's end and before Celery stored the
result, published the chain's next task or called the ``link`` callbacks
(see ``DiesAfterTheRunEnds`` in ``flexiq_celery_testapp``). With
``acks_late`` and ``reject_on_worker_lost`` Celery delivers the message
again; the run is finished, so the body does not run: the stored value (or
error) is handed to Celery's tracer, which stores it, continues the chain
and calls the callbacks. A new job published with a finished run's key
gets the same replay.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
from celery import chord, signals, states
from celery_support import delete_queues, in_process_worker, wait_for, worker_process
from flexiq_celery_testapp import count_calls, make_app

from celery_ext import RUN_KEY_HEADER
from flexiq_plugins import SqlStepStore

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def _env(broker: str, store_url: str, calls: str, queue: str) -> dict[str, str]:
    return {
        "FLEXIQ_TEST_BROKER": broker,
        "FLEXIQ_TEST_STORE": store_url,
        "FLEXIQ_TEST_CALLS": calls,
        "FLEXIQ_TEST_QUEUE": queue,
    }


def _killed_once(marker: Path, log: Path) -> bool:
    """Whether the worker process died after the run ended (the marker was written, Celery saw the loss)."""
    return marker.exists() and b"WorkerLostError" in log.read_bytes()


def test_c37_celery_a_worker_killed_after_the_run_succeeded_the_redelivery_continues_the_chain(
    redis_broker: str, tmp_path: Path
) -> None:
    """C37: killed after ``succeeded`` was recorded; the redelivery replays 21: the chain and ``link`` go on.

    ``AsyncResult`` of the first task gets 21 (it stayed PENDING forever
    before), the chain's next task doubles it to 42, the ``link`` callback
    runs once with 21, and the body ran exactly once.
    """
    queue, label = f"fqr{uuid4().hex[:8]}", "ok"
    calls, marker, log = str(tmp_path / "calls.db"), tmp_path / "died", tmp_path / "worker.log"
    store_url = f"sqlite:///{tmp_path / 'steps.db'}"
    client = make_app(queue, redis_broker, store_url, calls)
    total, double, linked = (client.tasks[f"{queue}.{n}"] for n in ("c37_total", "plain", "c37_linked"))
    try:
        with worker_process(_env(redis_broker, store_url, calls, queue), log, concurrency=1):
            first = total.s(label, 20, die_once=str(marker))
            first.link(linked.s(label))
            result = (first | double.s()).apply_async()
            assert result.get(timeout=90) == 42
            assert result.parent.get(timeout=10) == 21
            wait_for(lambda: count_calls(calls, f"{label}:linked:21") == 1, 30, "the link callback")
            assert _killed_once(marker, log), log.read_text()[-3000:]
    finally:
        delete_queues(client, [queue])
    assert count_calls(calls, f"{label}:body") == 1
    store = SqlStepStore(store_url)
    (run,) = store.list_runs(task_name=f"{queue}.c37_total")
    assert (run.status, run.attempt) == ("succeeded", 1)  # the replay claimed nothing
    store.close()


def test_c37_celery_a_worker_killed_after_the_run_failed_the_redelivery_replays_the_error(
    redis_broker: str, tmp_path: Path
) -> None:
    """C37: killed after ``failed`` was recorded; the redelivery raises the stored ``ValueError`` again.

    Celery stores FAILURE with the same error type and message, the
    ``link_error`` callback runs, no retry is published, and the body ran once.
    """
    queue, label = f"fqr{uuid4().hex[:8]}", "ko"
    calls, marker, log = str(tmp_path / "calls.db"), tmp_path / "died", tmp_path / "worker.log"
    store_url = f"sqlite:///{tmp_path / 'steps.db'}"
    client = make_app(queue, redis_broker, store_url, calls)
    declines, errback = client.tasks[f"{queue}.c37_declines"], client.tasks[f"{queue}.c37_errback"]
    try:
        with worker_process(_env(redis_broker, store_url, calls, queue), log, concurrency=1):
            result = declines.apply_async((label,), {"die_once": str(marker)}, link_error=errback.s(label))
            with pytest.raises(ValueError, match=f"card declined for {label}"):
                result.get(timeout=90)
            assert result.state == states.FAILURE
            errback_call = f"{label}:errback:ValueError:card declined for {label}"
            wait_for(lambda: count_calls(calls, errback_call) == 1, 30, "the link_error callback")
            assert _killed_once(marker, log), log.read_text()[-3000:]
    finally:
        delete_queues(client, [queue])
    assert count_calls(calls, f"{label}:body") == 1
    store = SqlStepStore(store_url)
    (run,) = store.list_runs(task_name=f"{queue}.c37_declines")
    assert (run.status, run.attempt) == ("failed", 1)
    store.close()


def test_c37_celery_a_new_job_with_a_finished_runs_key_gets_its_value_without_running(
    redis_broker: str, sqlite_store: Any, make_celery_app: Any, calls: str
) -> None:
    """C37: a second task (new task id) published with a succeeded run's key: ``.get()`` returns the stored value.

    It used to be acknowledged without a result, so ``.get()`` blocked
    forever. The body ran once; the second task's own result is SUCCESS.
    """
    app = make_celery_app(redis_broker, sqlite_store)
    total = app.tasks[f"{app.main}.c37_total"]
    run_key = f"order-{uuid4().hex[:8]}"
    with in_process_worker(app):
        first = total.apply_async(("new", 6), headers={RUN_KEY_HEADER: run_key})
        assert first.get(timeout=30) == 7
        second = total.apply_async(("new", 100), headers={RUN_KEY_HEADER: run_key})
        assert second.id != first.id
        assert second.get(timeout=30) == 7  # the run's value, not a new body's
        assert second.state == states.SUCCESS
    assert count_calls(calls, "new:body") == 1
    assert sqlite_store.get_run(run_key).attempt == 1


def test_c37_celery_a_new_job_with_a_failed_runs_key_raises_its_error_without_retrying(
    redis_broker: str, sqlite_store: Any, make_celery_app: Any, calls: str
) -> None:
    """C37: a new job with a failed run's key: ``.get()`` raises the stored error; the body ran once."""
    app = make_celery_app(redis_broker, sqlite_store)
    declines = app.tasks[f"{app.main}.c37_declines"]
    run_key = f"order-{uuid4().hex[:8]}"
    with in_process_worker(app):
        first = declines.apply_async(("again",), headers={RUN_KEY_HEADER: run_key})
        with pytest.raises(ValueError, match="card declined for again"):
            first.get(timeout=30)
        second = declines.apply_async(("again",), headers={RUN_KEY_HEADER: run_key})
        with pytest.raises(ValueError, match="card declined for again"):
            second.get(timeout=30)
    assert count_calls(calls, "again:body") == 1
    assert sqlite_store.get_run(run_key).status == "failed"


# ------------------------------------------------ C44: jobs dispatched on a run's behalf
def _runs_of(store: SqlStepStore, task: str) -> list[tuple[str, str, int]]:
    """``(run key, status, attempt)`` of every run of ``task`` in the store."""
    return sorted((r.run_key, r.status, r.attempt) for r in store.list_runs(task_name=task))


@contextmanager
def _handled(app: Any) -> Iterator[Counter[str]]:
    """Count, by task name, the jobs the in-process worker of ``app`` finished handling (``task_postrun``)."""
    done: Counter[str] = Counter()

    def note(sender: Any = None, **_: Any) -> None:
        if sender is not None and sender.app is app:
            done[sender.name] += 1

    signals.task_postrun.connect(note, weak=False)
    try:
        yield done
    finally:
        signals.task_postrun.disconnect(note)


@pytest.mark.parametrize("where", ["link", "chain"])
def test_c44_celery_a_worker_killed_while_publishing_the_next_job_leaves_it_one_run(
    where: str, redis_broker: str, tmp_path: Path
) -> None:
    """C44, C37, C39: the run commits 21, then the worker process dies while publishing its ``link`` callback
    (or its chain's next task), after that job's run was recorded ``queued``. The redelivered parent replays
    21 and publishes the job again under the same derived key (``<run key>/link/0``, ``<run key>/chain``): its
    step body runs once, and the store holds one run of it, no orphan for recovery to publish again.
    """
    queue, label = f"fqd{uuid4().hex[:8]}", where
    calls, marker, log = str(tmp_path / "calls.db"), tmp_path / "died", tmp_path / "worker.log"
    store_url = f"sqlite:///{tmp_path / 'steps.db'}"
    client = make_app(queue, redis_broker, store_url, calls)
    total, noted = client.tasks[f"{queue}.c37_total"], client.tasks[f"{queue}.c44_noted"]
    parent_key = f"order-{uuid4().hex[:8]}"
    first = total.s(label, 20).set(headers={RUN_KEY_HEADER: parent_key})
    then = noted.s(label, die_publishing=str(marker))
    try:
        with worker_process(_env(redis_broker, store_url, calls, queue), log, concurrency=1):
            if where == "link":
                first.link(then)
                result = first.apply_async()
                assert result.get(timeout=90) == 21
            else:
                assert (first | then).apply_async().get(timeout=90) == 21
            wait_for(lambda: count_calls(calls, f"{label}:noted:21") >= 1, 60, "the dispatched job's step")
            assert _killed_once(marker, log), log.read_text()[-3000:]
            store = SqlStepStore(store_url)
            child = f"{parent_key}/{'link/0' if where == 'link' else 'chain'}"
            wait_for(lambda: _runs_of(store, f"{queue}.c44_noted") == [(child, "succeeded", 1)], 30, "one run")
    finally:
        delete_queues(client, [queue])
    assert count_calls(calls, f"{label}:noted:21") == 1
    assert count_calls(calls, f"{label}:body") == 1
    assert _runs_of(store, f"{queue}.c37_total") == [(parent_key, "succeeded", 1)]
    store.close()


def test_c44_celery_a_replayed_run_dispatches_its_callbacks_and_chain_as_the_same_runs(
    redis_broker: str, sqlite_store: Any, make_celery_app: Any, calls: str
) -> None:
    """C44, C37: a second job with a finished run's key replays 7, and Celery publishes its ``link`` callback
    and its chain's next task again, and a failed run's ``link_error`` callback: each under the key it had the
    first time, so each replays its own run instead of running its step again."""
    app = make_celery_app(redis_broker, sqlite_store)
    total, noted = app.tasks[f"{app.main}.c37_total"], app.tasks[f"{app.main}.c44_noted"]
    declines, errback = app.tasks[f"{app.main}.c37_declines"], app.tasks[f"{app.main}.c44_errback"]
    ok, ko = f"order-{uuid4().hex[:8]}", f"order-{uuid4().hex[:8]}"

    def checkout() -> Any:
        first = total.s("r", 6).set(headers={RUN_KEY_HEADER: ok})
        first.link(noted.s("r-link"))
        return (first | noted.s("r-chain")).apply_async()

    def failing() -> Any:
        job = declines.s("r-ko").set(headers={RUN_KEY_HEADER: ko})
        job.link_error(errback.s("r-ko"))
        return job.apply_async()

    with in_process_worker(app), _handled(app) as handled:
        for round_ in (1, 2):
            assert checkout().get(timeout=30) == 7
            with pytest.raises(ValueError, match="card declined"):
                failing().get(timeout=30)
            wait_for(lambda n=round_: handled[noted.name] == 2 * n, 30, "the callback and the chain's next task")
            wait_for(lambda n=round_: handled[errback.name] == n, 30, "the link_error callback")
    assert count_calls(calls, "r:body") == 1
    assert count_calls(calls, "r-ko:body") == 1
    assert count_calls(calls, "r-link:noted:7") == 1
    assert count_calls(calls, "r-ko:errback") == 1
    assert count_calls(calls, "r-chain:noted:7") == 1
    assert _runs_of(sqlite_store, f"{app.main}.c44_noted") == [
        (f"{ok}/chain", "succeeded", 1),
        (f"{ok}/link/0", "succeeded", 1),
    ]
    assert _runs_of(sqlite_store, f"{app.main}.c44_errback") == [(f"{ko}/link_error/0", "succeeded", 1)]


def test_c44_celery_a_chord_body_is_keyed_by_its_group_and_a_callbacks_own_key_wins(
    redis_broker: str, sqlite_store: Any, make_celery_app: Any, calls: str
) -> None:
    """C44: a chord's body, published by whichever header part completes it, has the key ``<group id>/chord``;
    a ``link`` callback given its own ``flexiq_run_key`` keeps it."""
    app = make_celery_app(redis_broker, sqlite_store)
    total, noted = app.tasks[f"{app.main}.c37_total"], app.tasks[f"{app.main}.c44_noted"]
    with in_process_worker(app):
        result = chord([total.s("h1", 1), total.s("h2", 2)], noted.s("c-body")).apply_async()
        assert result.get(timeout=30) == [2, 3]
        group_id = result.parent.id
        mine = f"mine-{uuid4().hex[:8]}"
        linked = total.s("c", 4)
        linked.link(noted.s("c-own").set(headers={RUN_KEY_HEADER: mine}))
        assert linked.apply_async().get(timeout=30) == 5
        wait_for(lambda: count_calls(calls, "c-own:noted:5") == 1, 30, "the callback with its own key")
    runs = {key: status for key, status, _ in _runs_of(sqlite_store, f"{app.main}.c44_noted")}
    assert runs == {f"{group_id}/chord": "succeeded", mine: "succeeded"}


def test_c44_celery_a_job_the_body_publishes_itself_stays_a_new_run(
    redis_broker: str, sqlite_store: Any, make_celery_app: Any, calls: str
) -> None:
    """C44, C11: ``.delay()`` inside a durable body is the user's own new job: a new run key, nothing derived."""
    app = make_celery_app(redis_broker, sqlite_store)
    sends = app.tasks[f"{app.main}.c44_sends"]
    with in_process_worker(app):
        sent = app.AsyncResult(sends.delay("u").get(timeout=30))
        assert sent.get(timeout=30) == "sent"
    (run,) = sqlite_store.list_runs(task_name=f"{app.main}.c44_noted")
    (parent,) = sqlite_store.list_runs(task_name=f"{app.main}.c44_sends")
    assert not run.run_key.startswith(parent.run_key)
    assert "/" not in run.run_key
