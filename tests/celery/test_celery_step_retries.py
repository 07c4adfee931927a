"""Step retry budgets and compensations on a real Celery worker process and a real Redis broker (C31, C32).

One ``celery worker`` subprocess (prefork, two children) serves every test of
this module; each test publishes its own job and waits for its run to end in
the store. What does not need real processes is proven in
``tests/core/test_step_retries.py`` and ``tests/core/test_compensation.py``.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
import redis
from celery import Celery
from celery_support import REDIS_BROKER, delete_queues, require, wait_for, worker_process
from flexiq_celery_testapp import call_order, count_calls, make_app

from celery_ext import RUN_KEY_HEADER
from flexiq_plugins import SqlStepStore, new_run_key
from flexiq_plugins.errors import DeadLettered

pytestmark = [pytest.mark.slow, pytest.mark.redis, pytest.mark.timeout(180)]

TERMINAL = {"succeeded", "failed", "dead", "compensated"}


@dataclass
class Worker:
    """The module's worker subprocess, its client app, store and side table."""

    client: Celery
    store: SqlStepStore
    calls: str
    dir: Path

    def publish(self, task: str, *args: Any, **options: Any) -> tuple[Any, str]:
        """Publish ``task`` of the worker's app with a run key of our own; return its ``AsyncResult`` and run key."""
        run_key = new_run_key()
        headers = {RUN_KEY_HEADER: run_key}
        return self.client.tasks[f"{self.client.main}.{task}"].apply_async(args, headers=headers, **options), run_key

    def finished(self, run_key: str, timeout: float = 60) -> str:
        """Wait until the run is terminal in the store; return its status."""

        def status() -> str | None:
            runs = [r for r in self.store.list_runs(limit=1000) if r.run_key == run_key]
            return runs[0].status if runs and runs[0].status in TERMINAL else None

        return str(wait_for(status, timeout, f"run {run_key} to finish"))

    def dead_letters_in_queue(self, run_key: str) -> int:
        """How many messages of ``run_key`` the Redis dead-letter queue of the worker's app holds.

        Counted per run, so another test's dead letter landing meanwhile does not count.
        """
        entries = redis.Redis.from_url(REDIS_BROKER).lrange(f"{self.client.main}.dlq", 0, -1)
        return sum(run_key in entry.decode() for entry in entries)


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    """One prefork worker (2 children, lease 2 s) on its own queue and SQLite store, for the whole module."""
    require("redis")
    here = tmp_path_factory.mktemp("celery-retries")
    queue = f"fqr{uuid4().hex[:8]}"
    store_url = f"sqlite:///{here / 'steps.db'}"
    calls = str(here / "calls.db")
    env = {
        "FLEXIQ_TEST_BROKER": REDIS_BROKER,
        "FLEXIQ_TEST_STORE": store_url,
        "FLEXIQ_TEST_CALLS": calls,
        "FLEXIQ_TEST_QUEUE": queue,
        "FLEXIQ_TEST_LEASE": "2",
    }
    client = make_app(queue, REDIS_BROKER, store_url, calls)
    store = SqlStepStore(store_url)
    try:
        with worker_process(env, here / "worker.log", concurrency=2):
            yield Worker(client, store, calls, here)
    finally:
        delete_queues(client, [queue, f"{queue}.dlq"])
        store.close()


def label() -> str:
    """A label of its own for the calls one test records."""
    return uuid4().hex[:8]


def test_c31_a_failing_step_runs_exactly_five_times_whatever_the_headers_say(worker: Worker) -> None:
    """A step with ``max_attempts=5`` that always raises runs exactly five times, though the task has
    ``autoretry_for=(Exception,)`` with ``max_retries=1`` and the message claims 7 retries already: the
    budget lives in the store. Attempts 1..5 are recorded, the last exhausted; one dead letter."""
    name = label()
    result, run_key = worker.publish("always_fails", name, retries=7)
    assert worker.finished(run_key) == "dead"

    assert count_calls(worker.calls, f"{name}:ship") == 5
    attempts = worker.store.get_step_attempts(run_key)
    assert [(a.number, a.ended) for a in attempts] == [(n, "failed") for n in range(1, 5)] + [(5, "exhausted")]
    assert [d.reason for d in worker.store.list_dead_letters() if d.run_key == run_key] == ["step_retry_exhausted"]
    with pytest.raises(DeadLettered, match="step_retry_exhausted"):
        result.get(timeout=30)


def test_c31_a_worker_killed_inside_the_step_uses_its_attempts(worker: Worker) -> None:
    """``os._exit(137)`` inside a step with ``max_attempts=3``: the body runs three times (each death a
    redelivery and a takeover), then the run is dead-lettered ``step_retry_exhausted``."""
    name = label()
    _, run_key = worker.publish("exits_in_step", name)
    assert worker.finished(run_key, timeout=90) == "dead"

    assert count_calls(worker.calls, f"{name}:charge") == 3
    attempts = worker.store.get_step_attempts(run_key)
    assert [(a.number, a.ended) for a in attempts] == [(1, "lost"), (2, "lost"), (3, "exhausted")]
    (dead,) = [d for d in worker.store.list_dead_letters() if d.run_key == run_key]
    assert dead.reason == "step_retry_exhausted"


def test_c31_a_non_retryable_error_runs_the_body_once(worker: Worker) -> None:
    """``NonRetryableError`` in a step with a budget and a task with ``autoretry_for=(Exception,)``: one call,
    no retry of any kind, dead letter ``non_retryable``."""
    name = label()
    _, run_key = worker.publish("non_retryable", name)
    assert worker.finished(run_key) == "dead"
    assert count_calls(worker.calls, f"{name}:charge") == 1
    assert [d.reason for d in worker.store.list_dead_letters() if d.run_key == run_key] == ["non_retryable"]


def test_c32_two_undos_run_once_each_in_reverse_even_when_killed_between_them(worker: Worker) -> None:
    """The third step fails for good: the charge is undone, the worker process is SIGKILLed before the
    reservation's undo does anything, and the redelivered job replays the body, does not undo the charge
    again, undoes the reservation, and ends the run ``compensated`` with one dead letter."""
    name = label()
    _, run_key = worker.publish("saga", name, str(worker.dir))
    pid_file = worker.dir / f"{name}.pid"
    wait_for(pid_file.exists, 60, "the second undo to start")
    os.kill(int(pid_file.read_text()), signal.SIGKILL)
    assert worker.finished(run_key, timeout=90) == "compensated"

    assert call_order(worker.calls, f"{name}:undo_") == [f"{name}:undo_charge", f"{name}:undo_reserve"]
    assert count_calls(worker.calls, f"{name}:ship") == 1
    assert [d.reason for d in worker.store.list_dead_letters() if d.run_key == run_key] == ["non_retryable"]
    assert wait_for(lambda: worker.dead_letters_in_queue(run_key) == 1, 30, "the job in the dead-letter queue")
    assert worker.store.get_run(run_key).takeovers == 1
