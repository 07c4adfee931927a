"""Celery's ``revoke`` of a durable task is the core's cancellation (C34), with an in-process worker.

A revoked task id is discarded by the worker when its next message arrives: for
a sleeping durable job that is its wake-up. The adapter hands the revoke to
the core's one cancellation (``cancel_run``), so the run's undos run (in a new
job: the old task id stays revoked) and the run ends ``cancelled``.
"""

from __future__ import annotations

from typing import Any

import pytest
from celery_support import in_process_worker, wait_for
from flexiq_celery_testapp import count_calls

from celery_ext import RUN_KEY_HEADER
from flexiq_plugins import new_run_key

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]


def test_c34_a_revoked_sleeping_task_is_cancelled_and_its_undo_runs(
    redis_broker: str, sqlite_store: Any, make_celery_app: Any, calls: str
) -> None:
    """``app.control.revoke(task_id)`` of a sleeping durable job: when its wake-up arrives Celery discards it and
    the run is cancelled through the core: ``charge`` is undone once, ``ship`` never runs, the reason says so."""
    app = make_celery_app(redis_broker, sqlite_store)
    run_key = new_run_key()
    with in_process_worker(app):
        result = app.tasks[f"{app.main}.revocable"].apply_async(("v", 1.0), headers={RUN_KEY_HEADER: run_key})
        wait_for(lambda: _status(sqlite_store, run_key) == "sleeping", 30, "the job to sleep")
        app.control.revoke(result.id)
        wait_for(lambda: _status(sqlite_store, run_key) == "cancelled", 30, "the run to be cancelled")
    run = sqlite_store.get_run(run_key)
    assert run.cancel_reason == "revoked (Celery)"
    assert (count_calls(calls, "v:undo_charge"), count_calls(calls, "v:ship")) == (1, 0)
    assert app.AsyncResult(result.id).state == "REVOKED"


def _status(store: Any, run_key: str) -> str | None:
    try:
        return str(store.get_run(run_key).status)
    except LookupError:
        return None
