"""When Celery itself ends a job, or runs it eagerly, the store agrees; a result waiter gets an answer (C38, C39, C45).

Time limits and shutdowns, which need worker processes, are in the adapter
conformance suite (``tests/conformance/test_conformance_framework_ends.py``);
here are the paths only Celery has: ``revoke()``, eager mode, and what a
result waiter sees while a job sleeps and after its run is cancelled.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from celery import states
from celery_support import in_process_worker, wait_for
from flexiq_celery_testapp import count_calls

from celery_ext import RUN_KEY_HEADER
from flexiq_plugins import JobCancelled, StepStore, new_run_key
from flexiq_plugins.errors import UnsupportedInEagerMode
from flexiq_plugins.operations import cancel_run, find_stranded, publishers_for

pytestmark = pytest.mark.timeout(120)


def status_of(store: StepStore, run_key: str) -> str | None:
    """The run's status, ``None`` before it exists."""
    return next((r.status for r in store.list_runs() if r.run_key == run_key), None)


def only_run(store: StepStore) -> Any:
    """The one run of a fresh store."""
    (run,) = store.list_runs()
    return run


def test_c38_a_revoked_sleeping_task_is_cancelled_and_never_recovered(
    redis_broker: str, sqlite_store: Any, make_celery_app: Any, calls: str
) -> None:
    """C38: ``revoke()`` of a task sleeping between ``charge`` and ``receipt``: its run is ``cancelled``.

    The worker honours the revoke when the sleep's next hop arrives: Celery
    reports ``REVOKED``, the store says ``cancelled``, recovery does not count
    the run as stranded once its wake time is long past, and ``receipt``
    never runs.
    """
    app = make_celery_app(redis_broker, sqlite_store)
    with in_process_worker(app):
        sent = app.tasks[f"{app.main}.checkout"].delay(7, pause=3)
        wait_for(lambda: sqlite_store.list_runs(status="sleeping"), 30, "the job to sleep")
        app.control.revoke(sent.id)
        wait_for(lambda: only_run(sqlite_store).status != "sleeping", 30, "the run to leave 'sleeping'")
        assert app.AsyncResult(sent.id).state == states.REVOKED
    run = only_run(sqlite_store)
    assert run.status == "cancelled"
    assert run.run_key not in {s.run.run_key for s in find_stranded(sqlite_store, grace=0, stale_after=0)}
    assert count_calls(calls, "charge") == 1
    assert count_calls(calls, "receipt") == 0


@pytest.mark.parametrize("how", ["apply", "task_always_eager"])
def test_c38_an_eager_call_that_sleeps_fails_its_run_so_no_worker_resumes_it(
    how: str, redis_broker: str, sqlite_store: Any, make_celery_app: Any, calls: str
) -> None:
    """C38: a task that sleeps under ``Task.apply()`` or ``task_always_eager`` raises ``UnsupportedInEagerMode``.

    Its run is ``failed``, not ``sleeping``: once the wake time is past,
    recovery does not count it as stranded, so no worker later runs the rest
    of a body a unit test started against a shared store.
    """
    app = make_celery_app(redis_broker, sqlite_store)
    checkout = app.tasks[f"{app.main}.checkout"]
    app.conf.task_eager_propagates = True
    app.conf.task_always_eager = how == "task_always_eager"
    call = checkout.delay if how == "task_always_eager" else lambda *a, **k: checkout.apply(a, k, throw=True)
    with pytest.raises(UnsupportedInEagerMode, match="eager mode"):
        call(7, pause=0.2)
    run = only_run(sqlite_store)
    assert run.status == "failed"
    wait_for(lambda: sqlite_store.now() > run.updated_at + 0.5, 5, "the wake time to be past")
    assert run.run_key not in {s.run.run_key for s in find_stranded(sqlite_store, grace=0, stale_after=0)}
    assert count_calls(calls, "charge") == 1
    assert count_calls(calls, "receipt") == 0


def test_c39_a_sleeping_task_is_never_reported_finished(
    redis_broker: str, sqlite_store: Any, make_celery_app: Any
) -> None:
    """C39: while a task sleeps its result state is not a ready one; the waiter gets the final value.

    Polled while the store says ``sleeping``, ``AsyncResult`` is never
    ``SUCCESS``, ``FAILURE`` or ``REVOKED``; ``get()`` then returns what the
    body returned after its wake-up.
    """
    app = make_celery_app(redis_broker, sqlite_store)
    with in_process_worker(app):
        sent = app.tasks[f"{app.main}.sleeper"].delay(1.0)
        wait_for(lambda: sqlite_store.list_runs(status="sleeping"), 30, "the job to sleep")
        seen = set()
        while sqlite_store.list_runs(status="sleeping"):
            seen.add(sent.state)
            time.sleep(0.05)
        value = sent.get(timeout=30)
    assert seen
    assert not seen & states.READY_STATES, seen
    assert value["attempt"] == 2


def test_c45_a_result_waiter_of_a_running_task_that_is_cancelled_gets_job_cancelled(
    redis_broker: str, sqlite_store: Any, make_celery_app: Any, calls: str, tmp_path: Path
) -> None:
    """C45, C34: ``cancel_run`` while the task's ``work`` step runs; the attempt stops at its next step boundary.

    Its undo runs once, the run is ``cancelled``, and ``AsyncResult.get()``
    raises ``JobCancelled`` with the reason instead of staying PENDING for ever.
    """
    app = make_celery_app(redis_broker, sqlite_store)
    flag = tmp_path / "release"
    run_key = new_run_key()
    with in_process_worker(app):
        sent = app.tasks[f"{app.main}.cancellable"].apply_async(("c", str(flag)), headers={RUN_KEY_HEADER: run_key})
        wait_for(lambda: count_calls(calls, "c:work") == 1, 30, "the work step to run")
        done = cancel_run(run_key, reason="order abandoned", store=sqlite_store, publishers=publishers_for(app))
        assert done.effect == "requested"
        flag.touch()
        with pytest.raises(JobCancelled, match="the run was cancelled: order abandoned"):
            sent.get(timeout=30)
    assert sqlite_store.get_run(run_key).status == "cancelled"
    assert (count_calls(calls, "c:undo_charge"), count_calls(calls, "c:ship")) == (1, 0)
    assert sent.state == states.FAILURE


def test_c45_cancelling_a_sleeping_task_from_a_process_with_the_integration_answers_its_waiter_at_once(
    redis_broker: str, sqlite_store: Any, make_celery_app: Any, calls: str
) -> None:
    """C45, C34: a task sleeping for an hour is cancelled with the app's publisher: ``AsyncResult.get()``
    raises ``JobCancelled`` at once (its wake-up is an hour away), and its undo runs once in the job
    published to compensate it, which ends the run ``cancelled``."""
    app = make_celery_app(redis_broker, sqlite_store)
    run_key = new_run_key()
    with in_process_worker(app):
        sent = app.tasks[f"{app.main}.revocable"].apply_async(("s", 3600), headers={RUN_KEY_HEADER: run_key})
        wait_for(lambda: status_of(sqlite_store, run_key) == "sleeping", 30, "the task to sleep")
        done = cancel_run(run_key, reason="customer left", store=sqlite_store, publishers=publishers_for(app))
        assert done.effect == "compensating"
        with pytest.raises(JobCancelled, match="customer left"):
            sent.get(timeout=10)
        wait_for(lambda: sqlite_store.get_run(run_key).status == "cancelled", 30, "the undo to run")
    assert (count_calls(calls, "s:undo_charge"), count_calls(calls, "s:ship")) == (1, 0)
