"""C43: a Celery task that never takes a step is not touched by the integration; one that does is learned.

A task that takes no step sends no store statement at publish or at the worker, leaves no run row and
keeps Celery's acknowledgement. A task is known to take steps once one of its attempts took one (the
store's known tasks), or when declared ``durable=True``: only then are its jobs recorded at publish (C39)
and, from a worker's next start, acknowledged late (C26). The first jobs of a task not known yet are
claimed at their first step, so a worker killed after a step committed loses nothing: the run is
recovered from its claim. Real brokers and workers; statements are counted with SQLAlchemy's event
listeners on the store's engine.
"""

from __future__ import annotations

import os
import signal
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
from celery import Celery
from celery_support import HERE, delete_queues, in_process_worker, published_headers, wait_for

from celery_ext import RUN_KEY_HEADER
from flexiq_plugins import SqlStepStore, UnknownRun, current_job, operations
from tests.statements import Statements
from tests.workers import celery_worker_process

pytestmark = pytest.mark.timeout(180)


def _status(store: SqlStepStore, run_key: str) -> str | None:
    try:
        return store.get_run(run_key).status
    except UnknownRun:
        return None


def _lose_queue(app: Celery) -> None:
    """Delete the app's queue from Redis, as a broker restarted without persistence would have lost it."""
    with app.connection_for_write() as conn:
        conn.default_channel.client.delete(app.main)
        assert int(conn.default_channel.client.llen(app.main)) == 0


def test_c43_a_task_that_takes_no_step_sends_no_statement_leaves_no_run_and_keeps_celerys_ack(
    redis_broker: str, sqlite_store: SqlStepStore, make_celery_app: Callable[..., Celery]
) -> None:
    """C43: after the process has read the known tasks once (it reads them again at most every
    ``known_tasks_refresh_seconds``, an hour here so the window is exact), step-less jobs, succeeding or failing
    through Celery's own retries, send no statement at publish or at the worker; no run row, no known task, and
    the task keeps ``acks_late`` and ``reject_on_worker_lost`` off."""
    statements = Statements(sqlite_store.engine)
    app = make_celery_app(redis_broker, sqlite_store, recovery=False, known_tasks_refresh_seconds=3600)
    tries: list[int] = []

    @app.task(name=f"{app.main}.idle")
    def plain(x: int) -> int:
        return x + 1

    @app.task(bind=True, name=f"{app.main}.failing", autoretry_for=(ValueError,), max_retries=2, default_retry_delay=0)
    def failing(self: Any) -> None:
        tries.append(self.request.retries)
        raise ValueError("always")

    with in_process_worker(app):
        assert plain.delay(0).get(timeout=20) == 1  # the first publish read the known tasks
        statements.on = True
        headers = published_headers(lambda: plain.delay(1))
        assert [plain.delay(n).get(timeout=20) for n in (2, 3)] == [3, 4]
        with pytest.raises(ValueError, match="always"):
            failing.delay().get(timeout=20)
        statements.on = False
    assert statements.seen == []
    assert "flexiq_recorded" not in headers
    assert tries == [0, 1, 2]
    assert sqlite_store.list_runs() == []
    assert sqlite_store.durable_tasks() == []
    assert (bool(plain.acks_late), bool(plain.reject_on_worker_lost)) == (False, False)


def test_c43_a_task_that_opts_out_is_published_as_without_the_integration(
    redis_broker: str, sqlite_store: SqlStepStore, make_celery_app: Callable[..., Celery]
) -> None:
    """C43: a ``durable=False`` task's message gets no run key, no resume mark and no record, even when the
    task is known to take steps."""
    app = make_celery_app(redis_broker, sqlite_store, recovery=False)
    sqlite_store.note_durable_task(f"{app.main}.opted", "celery")

    @app.task(name=f"{app.main}.opted", durable=False)
    def opted(x: int) -> int:
        return x + 1

    with in_process_worker(app):
        headers = published_headers(lambda: opted.delay(1))
        assert opted.delay(2).get(timeout=20) == 3
    assert not any(name.startswith("flexiq_") for name in headers), headers
    assert sqlite_store.list_runs() == []


def test_c43_a_redelivered_job_of_a_task_that_takes_no_step_writes_no_run(
    redis_broker: str, sqlite_store: SqlStepStore, make_celery_app: Callable[..., Celery]
) -> None:
    """C43: a step-less task's message that the broker delivers again (``Reject(requeue=True)`` with
    ``acks_late``: ``redelivered``) runs again as in plain Celery and leaves no run row: only a task declared
    durable or known to take steps has a run a redelivery may continue."""
    from celery.exceptions import Reject

    app = make_celery_app(redis_broker, sqlite_store, recovery=False)
    seen: list[bool] = []

    @app.task(bind=True, name=f"{app.main}.requeued", acks_late=True)
    def requeued(self: Any) -> str:
        redelivered = bool((self.request.delivery_info or {}).get("redelivered"))
        seen.append(redelivered)
        if not redelivered:
            raise Reject("again", requeue=True)
        return "done"

    with in_process_worker(app):
        assert requeued.delay().get(timeout=20) == "done"
    assert seen == [False, True]
    assert sqlite_store.list_runs() == []


def test_c43_once_a_task_took_a_step_its_jobs_are_recorded_and_a_lost_message_is_recovered(
    redis_broker: str, sqlite_store: SqlStepStore, make_celery_app: Callable[..., Celery]
) -> None:
    """C43, C39: the first job of a task not known yet is not recorded; its first step notes the task; the next
    job is recorded at publish, so when the broker loses its message recovery re-publishes it and its waiter
    gets the value."""
    app = make_celery_app(redis_broker, sqlite_store, recovery=False)

    @app.task(name=f"{app.main}.ship")
    def ship(order: str) -> str:
        return str(current_job.step.run("label", lambda: f"label {order}"))

    first = published_headers(lambda: ship.delay("A-0"))
    assert "flexiq_recorded" not in first
    assert _status(sqlite_store, first[RUN_KEY_HEADER]) is None
    with in_process_worker(app):
        assert app.AsyncResult(first["id"]).get(timeout=20) == "label A-0"
    assert [(t.framework, t.name) for t in sqlite_store.durable_tasks()] == [("celery", ship.name)]

    sent = ship.delay("A-1")
    run_key = sqlite_store.list_runs(status="queued")[0].run_key
    _lose_queue(app)
    report = operations.recover(sqlite_store, operations.publishers_for(app), grace=0, queued_after=0)
    assert [job_id for _, job_id in report.recovered] == [sent.id]
    with in_process_worker(app):
        assert sent.get(timeout=30) == "label A-1"
    assert _status(sqlite_store, run_key) == "succeeded"


def test_c43_a_task_declared_durable_is_recorded_from_its_first_job_and_acknowledged_late(
    redis_broker: str, sqlite_store: SqlStepStore, make_celery_app: Callable[..., Celery]
) -> None:
    """C43, C39, C26: ``durable=True`` needs no store read: its very first job is recorded ``queued``, and the
    task is acknowledged late from its declaration; a task not declared is not."""
    app = make_celery_app(redis_broker, sqlite_store, recovery=False)

    @app.task(name=f"{app.main}.declared", durable=True)
    def declared() -> None: ...

    @app.task(name=f"{app.main}.learned")
    def learned() -> None: ...

    headers = published_headers(declared.delay)
    assert headers["flexiq_recorded"] is True
    assert _status(sqlite_store, headers[RUN_KEY_HEADER]) == "queued"
    assert (declared.acks_late, declared.reject_on_worker_lost) == (True, True)
    assert (bool(learned.acks_late), bool(learned.reject_on_worker_lost)) == (False, False)


def test_c43_a_task_learned_durable_is_acknowledged_late_from_the_next_worker_start(
    redis_broker: str, sqlite_store: SqlStepStore, make_celery_app: Callable[..., Celery]
) -> None:
    """C43, C26: Celery's worker keeps each task's ``acks_late`` from its consumer's start, so a task learned
    while a worker runs keeps Celery's acknowledgement in that worker; the next worker to start reads the known
    tasks and acknowledges it late (``reject_on_worker_lost`` too), unless the task set them itself."""
    app = make_celery_app(redis_broker, sqlite_store, recovery=False)

    @app.task(name=f"{app.main}.stepping")
    def stepping() -> int:
        return int(current_job.step.run("one", lambda: 1))

    @app.task(name=f"{app.main}.own_choice", acks_late=False)
    def own_choice() -> int:
        return int(current_job.step.run("one", lambda: 1))

    with in_process_worker(app):
        assert stepping.delay().get(timeout=20) == 1
        assert own_choice.delay().get(timeout=20) == 1
        assert not stepping.acks_late
    assert {t.name for t in sqlite_store.durable_tasks()} == {stepping.name, own_choice.name}
    with in_process_worker(app):
        assert (stepping.acks_late, stepping.reject_on_worker_lost) == (True, True)
        assert (own_choice.acks_late, own_choice.reject_on_worker_lost) == (False, True)
        assert stepping.delay().get(timeout=20) == 1


@contextmanager
def _learned_worker(env: dict[str, str], log: Path) -> Iterator[Any]:
    with celery_worker_process(
        "fq_learned_app", env["FQ_LEARNED_QUEUE"], env, log, concurrency=1, pythonpath=HERE
    ) as proc:
        yield proc


def _calls(calls: str, what: str) -> list[tuple[str, int]]:
    if not Path(calls).exists():
        return []
    with sqlite3.connect(calls, timeout=30) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS calls (what TEXT, key TEXT, pid INTEGER, at REAL)")
        return [(r[0], int(r[1])) for r in conn.execute("SELECT key, pid FROM calls WHERE what = ?", (what,))]


@pytest.mark.slow
def test_c43_a_job_of_a_task_not_known_yet_whose_worker_dies_after_a_step_is_recovered_from_its_claim(
    redis_broker: str, sqlite_store: SqlStepStore, tmp_path: Path
) -> None:
    """C43, C23, C35: the task is not known: its job is not recorded and Celery acknowledges it early, as
    without the integration. Its first step claims the run and commits; the whole worker is then SIGKILLed
    inside the second step. No message is left in the broker, yet the next worker's recovery finds the run's
    expired claim and re-publishes it: the run succeeds, ``charge`` ran once, its value replayed."""
    from fq_learned_app import make_app

    queue = f"fql{uuid4().hex[:10]}"
    calls, hang = str(tmp_path / "calls.db"), tmp_path / "hang"
    hang.write_text("hang")
    env = {
        "FQ_LEARNED_QUEUE": queue,
        "FQ_LEARNED_BROKER": redis_broker,
        "FQ_LEARNED_STORE": sqlite_store.url,
        "FQ_LEARNED_CALLS": calls,
        "FQ_LEARNED_HANG": str(hang),
    }
    producer = make_app(queue, redis_broker, sqlite_store, calls, str(hang), recovery=False)
    try:
        with _learned_worker(env, tmp_path / "first.log") as first:
            headers = published_headers(lambda: producer.send_task(f"{queue}.order", (7,)))
            assert "flexiq_recorded" not in headers  # not known yet: not recorded at publish
            run_key = headers[RUN_KEY_HEADER]
            [(_, child)] = wait_for(lambda: _calls(calls, "ship"), 60, "the ship step to hang")
            assert [s.step_key for s in sqlite_store.get_steps(run_key)] == ["charge#0"]
            os.kill(first.pid, signal.SIGKILL)  # the whole worker: its main process, then the child in the body
            os.kill(child, signal.SIGKILL)
            first.wait(timeout=20)
        with producer.connection_for_write() as conn:
            assert int(conn.default_channel.client.llen(queue)) == 0  # acknowledged early: nothing to redeliver
        assert sqlite_store.get_run(run_key).status == "running"
        hang.unlink()
        with _learned_worker(env, tmp_path / "second.log"):
            wait_for(lambda: _status(sqlite_store, run_key) == "succeeded", 60, "recovery to finish the run")
        assert [key for key, _ in _calls(calls, "charge")] == [run_key]  # committed once, replayed after
        assert len(_calls(calls, "ship")) == 2  # the killed attempt's, and the recovered one's
        assert producer.AsyncResult(headers["id"]).get(timeout=20) == "shipped 7 after charge 1"
    finally:
        delete_queues(producer, [queue])
