"""When Celery itself ends a job, or runs it eagerly, the store agrees (C38, C39).

Time limits and shutdowns, which need worker processes, are in the adapter
conformance suite (``tests/conformance/test_conformance_framework_ends.py``);
here are the paths only Celery has: ``revoke()``, eager mode, and what a
result waiter sees while a job sleeps.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from celery import states
from conftest import in_process_worker, wait_for
from flexiq_celery_testapp import count_calls

from flexiq_plugins import StepStore
from flexiq_plugins.errors import UnsupportedInEagerMode
from flexiq_plugins.operations import find_stranded

pytestmark = pytest.mark.timeout(120)


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
