"""Celery: a durable job sent for a task the worker does not have is dead-lettered, not left ``queued`` (C30, C39).

A real worker (in a thread of this process) receives a job whose task name it
does not know; Celery logs ``Received unregistered task``, rejects the message
and marks the result ``NotRegistered``, as it does without the integration.
The run recorded at publish is dead-lettered once with the reason
``unregistered_task``, recovery leaves it alone, and a dead-letter retry runs
it once the worker has the task.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from uuid import uuid4

import pytest
from celery import Celery
from celery_support import delete_queues, in_process_worker, wait_for, worker_process
from flexiq_celery_testapp import make_app

from celery_ext import RUN_KEY_HEADER
from flexiq_plugins import SqlStepStore, current_job, operations


def test_c39_a_job_of_an_unregistered_task_is_dead_lettered_once_and_retried_once_deployed(
    broker: str, sqlite_store: SqlStepStore, make_celery_app: Callable[..., Celery]
) -> None:
    """C39, C30: ``send_task`` with a misspelt name records the run ``queued``; recovery (whose app does not
    have the task either) publishes a copy before any worker runs. The worker discards both; the run
    becomes ``dead`` with one dead letter (reason ``unregistered_task``, naming the task and the worker's
    closest task). Celery's own results are still ``NotRegistered``. Recovery no longer re-publishes the
    run; once the task is deployed, ``retry_dead_letter`` runs it under the same run key."""
    app = make_celery_app(broker, sqlite_store, recovery=False)
    typo = f"{app.main}.chekcout"
    sqlite_store.note_durable_task(typo, "celery")  # C43: a name known to take steps (one an earlier deploy had)
    sent = app.send_task(typo, args=["A-1"])
    [run] = sqlite_store.list_runs(task_name=typo)
    assert run.status == "queued"
    publishers = operations.publishers_for(app)
    copied = operations.recover(sqlite_store, publishers, grace=0, queued_after=0)  # before any worker runs
    [(_, copy_id)] = [(s, job_id) for s, job_id in copied.recovered if s.run.run_key == run.run_key]

    with in_process_worker(app):
        wait_for(lambda: sqlite_store.get_run(run.run_key).status == "dead", 30, "the run to be dead-lettered")
        for job_id in (sent.id, copy_id):
            wait_for(lambda j=job_id: app.AsyncResult(j).state == "FAILURE", 30, "Celery's NotRegistered result")
    assert type(app.AsyncResult(sent.id).result).__name__ == "NotRegistered"

    [dead] = sqlite_store.list_dead_letters(task_name=typo)
    assert (dead.run_key, dead.job_id, dead.reason) == (run.run_key, sent.id, "unregistered_task")
    assert repr(typo) in dead.message
    assert f"did you mean {f'{app.main}.checkout'!r}" in dead.message
    assert dead.envelope.args == ["A-1"]

    report = operations.recover(sqlite_store, operations.publishers_for(app), grace=0, queued_after=0, stale_after=0)
    assert [s.run.run_key for s, _ in report.recovered] == []
    assert sqlite_store.get_run(run.run_key).status == "dead"

    @app.task(name=typo)
    def deployed(order: str) -> str:
        return f"shipped {order}"

    retried = operations.retry_dead_letter(sqlite_store, dead.id, publishers)
    with in_process_worker(app):
        wait_for(lambda: sqlite_store.get_run(run.run_key).status == "succeeded", 30, "the retried run to succeed")
    assert app.AsyncResult(retried.job_id).get(timeout=10) == "shipped A-1"
    assert len(sqlite_store.list_dead_letters(task_name=typo, include_retried=True)) == 1


def test_c39_a_late_copy_at_a_worker_without_the_task_leaves_a_started_run_alone(
    redis_broker: str, sqlite_store: SqlStepStore, make_celery_app: Callable[..., Celery]
) -> None:
    """C39, C25: a worker that has the task runs the job; a copy of its message (same run key) then reaches a
    worker that does not (a rolling deploy). Celery discards the copy; the run stays ``succeeded``, no dead
    letter. A copy for a run still ``queued`` in the same worker is dead-lettered: the fence is the run's state."""
    app = make_celery_app(redis_broker, sqlite_store, recovery=False)

    @app.task(name=f"{app.main}.ship", durable=True)  # recorded from its first job (C43)
    def ship(order: str) -> str:
        return order

    sqlite_store.note_durable_task(f"{app.main}.gone", "celery")  # C43: known to take steps, gone from the worker
    result = ship.delay("B-2")
    [run] = sqlite_store.list_runs(task_name=f"{app.main}.ship")
    with in_process_worker(app):
        assert result.get(timeout=30) == "B-2"
        wait_for(lambda: sqlite_store.get_run(run.run_key).status == "succeeded", 30, "the run to succeed")
        late = app.send_task(f"{app.main}.gone", headers={RUN_KEY_HEADER: run.run_key})
        fresh = app.send_task(f"{app.main}.gone")
        wait_for(lambda: app.AsyncResult(late.id).state == "FAILURE", 30, "Celery to discard the late copy")
        wait_for(sqlite_store.list_dead_letters, 30, "the fresh job's dead letter")
    assert sqlite_store.get_run(run.run_key).status == "succeeded"
    [dead] = sqlite_store.list_dead_letters()
    assert (dead.job_id, dead.reason) == (fresh.id, "unregistered_task")


def test_c39_a_retried_dead_letter_of_a_started_run_is_dead_lettered_again_by_a_worker_without_the_task(
    redis_broker: str, sqlite_store: SqlStepStore, make_celery_app: Callable[..., Celery]
) -> None:
    """C39, C30: a run that ran (one step committed) and was dead-lettered is retried once the workers no
    longer have its task (a deploy removed it): Celery discards the retried job (``NotRegistered``) and the
    run, which no attempt started since the retry, is dead-lettered again instead of staying ``pending``."""
    app = make_celery_app(redis_broker, sqlite_store, recovery=False)
    name = f"{app.main}.order"
    charged: list[str] = []

    @app.task(name=name, durable=True)  # recorded from its first job (C43)
    def order(order_id: str) -> None:
        current_job.step.run("charge", lambda: charged.append(order_id))
        current_job.step.run("x" * 300, lambda: None)  # an invalid name: dead-lettered (C2, C29)

    order.delay("o-1")
    [run] = sqlite_store.list_runs(task_name=name)
    with in_process_worker(app):
        wait_for(lambda: sqlite_store.get_run(run.run_key).status == "dead", 30, "the run to be dead-lettered")
    [first] = sqlite_store.list_dead_letters()
    assert (sqlite_store.get_run(run.run_key).attempt, charged) == (1, ["o-1"])

    app.tasks.unregister(name)  # the next worker does not have the task
    retried = operations.retry_dead_letter(sqlite_store, first.id, operations.publishers_for(app))
    with in_process_worker(app):
        wait_for(lambda: app.AsyncResult(retried.job_id).state == "FAILURE", 30, "Celery's NotRegistered result")
        wait_for(lambda: sqlite_store.get_run(run.run_key).status == "dead", 30, "the run dead-lettered again")
    [again] = sqlite_store.list_dead_letters()
    assert (again.run_key, again.job_id, again.reason) == (run.run_key, retried.job_id, "unregistered_task")
    assert (sqlite_store.get_run(run.run_key).attempt, charged) == (1, ["o-1"])


@pytest.mark.slow
def test_c39_a_prefork_worker_process_dead_letters_a_job_of_an_unregistered_task(
    redis_broker: str, tmp_path: Path
) -> None:
    """C39: ``celery -A … worker -P prefork`` (a real subprocess): Celery's consumer in the main process drops
    the job of a task it does not have and its ``task_unknown`` receiver dead-letters the run; the log keeps
    Celery's own ``Received unregistered task`` line and the library's one WARNING line."""
    queue = f"fqu{uuid4().hex[:8]}"
    calls, log = str(tmp_path / "calls.db"), tmp_path / "worker.log"
    store_url = f"sqlite:///{tmp_path / 'steps.db'}"
    client = make_app(queue, redis_broker, store_url, calls, recovery=False)
    env = {
        "FLEXIQ_TEST_BROKER": redis_broker,
        "FLEXIQ_TEST_STORE": store_url,
        "FLEXIQ_TEST_CALLS": calls,
        "FLEXIQ_TEST_QUEUE": queue,
    }
    store = SqlStepStore(store_url)
    store.note_durable_task(f"{queue}.not_deployed", "celery")  # C43: known to take steps, not deployed here
    try:
        with worker_process(env, log, concurrency=1):
            sent = client.send_task(f"{queue}.not_deployed", args=[7])
            run_key = store.list_runs(task_name=f"{queue}.not_deployed")[0].run_key
            wait_for(lambda: store.get_run(run_key).status == "dead", 60, "the run to be dead-lettered")
    finally:
        delete_queues(client, [queue])
    [dead] = store.list_dead_letters()
    assert (dead.run_key, dead.job_id, dead.reason) == (run_key, sent.id, "unregistered_task")
    text = log.read_text()
    assert f"Received unregistered task of type '{queue}.not_deployed'" in text
    assert f"dead-lettered (unregistered_task): celery worker {queue}@" in text
    store.close()
