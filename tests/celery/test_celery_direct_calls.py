"""A durable task called as a plain function, not sent, is a plain call with no current job (C10).

Outside a job the error says the task was called directly and how to send it.
Inside another durable task's body, or inside its own, the call runs in-process
as in plain Celery: ``current_job`` is falsy in it, it records no step in the
outer run, and the outer attempt's claim and outcome are untouched.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from celery import Celery
from celery_support import in_process_worker

import celery_ext
from flexiq_plugins import MemoryStepStore, NoCurrentJob, current_job


def test_c10_a_durable_task_called_directly_says_it_was_called_directly() -> None:
    """``checkout(1)`` (not ``.delay``) has no current job: the error says so and how to send it, not "install"."""
    app = Celery("direct", broker="memory://", set_as_current=False)
    celery_ext.install(app, store=MemoryStepStore())

    @app.task(name="shop.checkout")
    def checkout(order: int) -> int:
        return int(current_job.step.run("charge", lambda: order))

    with pytest.raises(NoCurrentJob) as info:
        checkout(1)
    message = str(info.value)
    assert "the task 'shop.checkout' was called directly, as a plain function" in message
    assert "task.delay(...)" in message
    assert "celery_ext.install" not in message


def test_c10_a_durable_task_called_as_a_function_inside_a_job_has_no_current_job(
    redis_broker: str, sqlite_store: Any, make_celery_app: Any, in_process_worker: Callable[..., Any]
) -> None:
    """C10: calling a durable task directly (``inner(1)``, not ``.delay``) inside another durable
    task's body is a plain function call: ``current_job`` is falsy in it, and it records no step in
    the outer run, whose step rows (kept with ``keep_succeeded_steps=True``) are only its own."""
    app = make_celery_app(redis_broker, sqlite_store, keep_succeeded_steps=True)
    inside: list[bool] = []

    @app.task(name=f"{app.main}.inner")
    def inner(x: int) -> int:
        inside.append(bool(current_job))
        if current_job:  # the old behaviour: the outer job leaked into the direct call
            return current_job.step.run("inner", lambda: x + 100)
        return x + 100

    @app.task(name=f"{app.main}.outer")
    def outer(x: int) -> dict[str, Any]:
        step = current_job.step
        before = step.run("before", lambda: x)
        middle = inner(before)
        after = step.run("after", lambda: middle + 1)
        return {"after": after, "run_key": current_job.run_key}

    with in_process_worker(app):
        result = app.tasks[f"{app.main}.outer"].delay(1).get(timeout=30)
    assert result["after"] == 102
    assert inside == [False]
    assert sqlite_store.get_run(result["run_key"]).status == "succeeded"
    keys = [row.step_key for row in sqlite_store.get_steps(result["run_key"])]
    assert keys == ["before#0", "after#0"]


@pytest.mark.parametrize("steps", [False, True], ids=["no_step", "step"])
def test_c10_a_durable_task_calling_itself_directly_is_a_plain_call(
    redis_broker: str, sqlite_store: Any, make_celery_app: Any, steps: bool
) -> None:
    """C10: calling a durable task object as a function inside its own body runs the body in-process, as in
    plain Celery: no second attempt, the outer attempt's claim and decision untouched; the inner call has no
    ``current_job`` of its own. ``countdown.delay(3).get()`` is 3, and the run is ``succeeded``."""
    app: Celery = make_celery_app(redis_broker, sqlite_store)
    inner_jobs: list[bool] = []

    @app.task(name=f"{app.main}.countdown")
    def countdown(n: int) -> int:
        if n == 0:
            inner_jobs.append(bool(current_job))
            return 0
        if steps and not inner_jobs and bool(current_job):
            current_job.step.run("outer", lambda: n)
        return 1 + countdown(n - 1)

    with in_process_worker(app):
        result = countdown.delay(3)
        assert result.get(timeout=20) == 3
    assert result.state == "SUCCESS"
    assert inner_jobs == [False]
    if steps:
        assert [r.status for r in sqlite_store.list_runs()] == ["succeeded"]
