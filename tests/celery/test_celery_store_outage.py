"""A store outage puts a Celery job back without using its retries; nothing else is taken for one (C28).

With an in-process worker on Redis: a ``begin`` that meets an outage puts the
job back after ``store_retry_seconds``, whatever the task's retry settings,
and a run key the store refuses fails the task once instead of being put back
forever. The in-process worker is the ``in_process_worker`` fixture of this
directory's conftest.
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

    @app.task(bind=True, name=f"{app.main}.fragile", max_retries=0, durable=True)  # recorded at publish (C43)
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
