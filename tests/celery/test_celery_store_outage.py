"""Regressions of the Celery adapter found in review: store outages, expiring sleeps, direct calls.

The in-process worker is ``conftest.in_process_worker``, reached through the
plugin manager (the :func:`in_process_worker` fixture) rather than ``from
conftest import``: when the Celery and Dramatiq directories are collected in
one run, the module named ``conftest`` may be the Dramatiq one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from flexiq_plugins import SqlStepStore, StoreUnavailable, current_job

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def in_process_worker(pytestconfig: pytest.Config) -> Callable[..., Any]:
    """``in_process_worker`` of this directory's conftest: a real worker in a thread of this process."""
    celery_conftest = pytestconfig.pluginmanager.get_plugin(str(Path(__file__).with_name("conftest.py")))
    return celery_conftest.in_process_worker  # type: ignore[no-any-return,union-attr]


class FlakyBeginStore(SqlStepStore):
    """A real SQLite store whose first ``failures`` calls of ``begin`` raise :class:`StoreUnavailable`."""

    def __init__(self, url: str, failures: int) -> None:
        super().__init__(url)
        self.failures_left = failures
        self.begin_calls = 0
        self._lock = threading.Lock()

    def begin(self, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            self.begin_calls += 1
            if self.failures_left > 0:
                self.failures_left -= 1
                raise StoreUnavailable("injected outage: connection refused")
        return super().begin(*args, **kwargs)


def test_c28_store_outage_puts_the_job_back_without_using_its_retries(
    redis_broker: str, tmp_path: Path, make_celery_app: Any, in_process_worker: Callable[..., Any]
) -> None:
    """C28: a store outage is always retryable, even for a task with ``max_retries=0`` and no
    ``autoretry_for``. Two failing ``begin`` calls put the job back (countdown ``store_retry_seconds``)
    without consuming the task's retries: the third delivery runs the body through with
    ``request.retries == 0``, the value comes back through ``AsyncResult`` and the run succeeded."""
    store = FlakyBeginStore(f"sqlite:///{tmp_path / 'flaky.db'}", failures=2)
    app = make_celery_app(redis_broker, store, store_retry_seconds=0.2)
    bodies: list[int] = []

    @app.task(bind=True, name=f"{app.main}.fragile", max_retries=0)
    def fragile(self: Any, x: int) -> dict[str, Any]:
        bodies.append(self.request.retries)
        value = current_job.step.run("double", lambda: x * 2)
        return {"value": value, "retries": self.request.retries, "run_key": current_job.run_key}

    try:
        with in_process_worker(app):
            started = time.monotonic()
            result = fragile.delay(21).get(timeout=30)
            elapsed = time.monotonic() - started
        assert result["value"] == 42
        assert result["retries"] == 0
        # the job was recorded at publish (C39), so each delivery claims before its body (C23): the two that
        # met the outage went back without running it; the third ran it through, no retry counted
        assert bodies == [0]
        assert store.begin_calls == 3
        assert elapsed >= 0.4  # two put-backs of store_retry_seconds=0.2 each
        run = store.get_run(result["run_key"])
        assert (run.status, run.attempt) == ("succeeded", 1)
    finally:
        store.close()


def test_c15_a_sleep_outlives_the_messages_expires(
    redis_broker: str, sqlite_store: Any, make_celery_app: Any, in_process_worker: Callable[..., Any]
) -> None:
    """C15: a job published with ``expires=2`` s that started in time and sleeps 3 s in 1 s hops
    (C18) is not revoked as expired while it sleeps: the hops are re-published without ``expires``,
    so it wakes, completes, and its value comes back through ``AsyncResult``."""
    app = make_celery_app(redis_broker, sqlite_store, max_hop_seconds=1)
    with in_process_worker(app):
        sent = app.tasks[f"{app.main}.sleeper"].apply_async((3.0,), expires=2)
        result = sent.get(timeout=30)
    assert result["retries"] == 0
    assert result["attempt"] == 4  # the first attempt + three 1 s hops
    assert time.time() - result["started"] >= 2.9
    (run,) = sqlite_store.list_runs()
    assert run.status == "succeeded"


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


def test_c28_a_bad_run_key_fails_the_task_instead_of_looping_as_an_outage(
    redis_broker: str, tmp_path: Path, make_celery_app: Any, in_process_worker: Callable[..., Any]
) -> None:
    """C28: only a store outage is retried whatever the filters say. A run key header too long for
    the store (300 characters) is ``InvalidRunKey``: the task fails once, it is not put back forever."""
    from flexiq_plugins import InvalidRunKey

    store = SqlStepStore(f"sqlite:///{tmp_path / 'keys.db'}")
    app = make_celery_app(redis_broker, store, store_retry_seconds=0.2)
    bodies: list[int] = []

    @app.task(name=f"{app.main}.badkey", max_retries=0)
    def badkey(x: int) -> int:
        bodies.append(x)
        return x

    try:
        with in_process_worker(app):
            result = badkey.apply_async((1,), headers={"flexiq_run_key": "y" * 300})
            with pytest.raises(InvalidRunKey, match="1 to 255 characters"):
                result.get(timeout=30)
        assert bodies == []
        assert store.list_runs() == []
    finally:
        store.close()


def test_c7_the_serializer_option_takes_a_kombu_name(redis_broker: str, tmp_path: Path, make_celery_app: Any) -> None:
    """C7: ``serializer="pickle"`` (a kombu name, as in ``task_serializer``) is accepted for step values."""
    import celery_ext

    store = SqlStepStore(f"sqlite:///{tmp_path / 'ser.db'}")
    try:
        app = make_celery_app(redis_broker, store, serializer="pickle")
        runtime = celery_ext.runtime_of(app)
        assert runtime is not None
        assert runtime.config.serializer is not None
        assert "pickle" in runtime.config.serializer.name
    finally:
        store.close()


def test_c11_a_run_key_header_that_is_not_a_str_is_refused() -> None:
    """C11: the run key header must be a str; anything else is refused, never coerced with ``str()``."""
    from celery.app.task import Context

    from celery_ext._envelope import run_key_of
    from flexiq_plugins import InvalidRunKey

    assert run_key_of(Context(id="task-1", headers={})) == "task-1"
    assert run_key_of(Context(id="task-1", headers={"flexiq_run_key": "rk-1"})) == "rk-1"
    with pytest.raises(InvalidRunKey, match="is not a str"):
        run_key_of(Context(id="task-1", headers={"flexiq_run_key": 42}))
