"""How the Celery adapter hands step retries and compensations to Celery (C31, C32), with an in-process worker.

The real-process proofs (crashes, SIGKILL between undos) are in
``test_celery_step_retries.py``; these check the adapter's own wiring: a
task's ``step_retry`` attribute, and a run that Celery stops retrying being
compensated by one more delivery of the same task id while Celery reports the
failure as usual.
"""

from __future__ import annotations

from typing import Any

import pytest
from celery_support import in_process_worker, wait_for
from flexiq_celery_testapp import call_order, count_calls

from celery_ext import RUN_KEY_HEADER
from flexiq_plugins import new_run_key
from flexiq_plugins.errors import DeadLettered

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]


def test_c31_a_task_step_retry_attribute_budgets_its_steps(
    redis_broker: str, sqlite_store: Any, make_celery_app: Any, calls: str
) -> None:
    """``@app.task(step_retry=RetryPolicy(max_attempts=2))`` gives every ``step.run`` of the task that budget."""
    app = make_celery_app(redis_broker, sqlite_store)
    with in_process_worker(app):
        result = app.tasks[f"{app.main}.default_budget"].delay("t")
        with pytest.raises(DeadLettered, match="step_retry_exhausted"):
            result.get(timeout=30)
    assert count_calls(calls, "t:ship") == 2


def test_c32_when_celery_gives_up_the_same_task_id_comes_back_to_compensate(
    redis_broker: str, sqlite_store: Any, make_celery_app: Any, calls: str
) -> None:
    """``autoretry_for`` with ``max_retries=1`` gives up on the third step: ``AsyncResult.get`` raises the
    task's own error as usual, and one more delivery replays the body (the failing step is not called
    again) and undoes the two committed steps in reverse order; the run is ``compensated``, no dead letter."""
    app = make_celery_app(redis_broker, sqlite_store)
    run_key = new_run_key()
    with in_process_worker(app):
        result = app.tasks[f"{app.main}.gives_up"].apply_async(("g",), headers={RUN_KEY_HEADER: run_key})
        with pytest.raises(ValueError, match="no carrier"):
            result.get(timeout=30)
        wait_for(lambda: sqlite_store.get_run(run_key).status == "compensated", 30, "the compensation")
    assert app.AsyncResult(result.id).state == "FAILURE"  # the compensation delivery stored nothing over it
    assert call_order(calls, "g:undo_") == ["g:undo_charge", "g:undo_reserve"]
    assert count_calls(calls, "g:ship") == 2  # the first try and Celery's one retry; not the compensation
    assert sqlite_store.list_dead_letters() == []
