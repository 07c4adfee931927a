"""Real ``celery worker`` subprocesses (prefork): many jobs at once.

Crashes inside step bodies are in the adapter conformance suite (``tests/conformance``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
from celery.result import ResultSet
from conftest import POSTGRES_URL, delete_queues, worker_process
from flexiq_celery_testapp import make_app

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def worker_env(broker: str, store_url: str, calls: str, queue: str, **extra: str) -> dict[str, str]:
    """The environment of a worker subprocess building its app with ``app_from_env``."""
    return {
        "FLEXIQ_TEST_BROKER": broker,
        "FLEXIQ_TEST_STORE": store_url,
        "FLEXIQ_TEST_CALLS": calls,
        "FLEXIQ_TEST_QUEUE": queue,
        **extra,
    }


def test_c23_prefork_four_children_postgres_two_hundred_jobs(redis_broker: str, pg_store: Any, tmp_path: Path) -> None:
    """200 concurrent jobs on a prefork worker with 4 children and a PostgreSQL store (C9, C23,
    C26): each child opens its own connections after the fork, so no connection error appears in
    the worker's log, and every run succeeded exactly once (attempt 1)."""
    queue = f"fqp{uuid4().hex[:8]}"
    calls = str(tmp_path / "calls.db")
    env = worker_env(redis_broker, POSTGRES_URL, calls, queue, FLEXIQ_TEST_TABLE_PREFIX=pg_store.table_prefix)
    client = make_app(queue, redis_broker, pg_store, calls)
    log = tmp_path / "worker.log"
    try:
        with worker_process(env, log, concurrency=4):
            bulk = client.tasks[f"{queue}.bulk"]
            results = ResultSet([bulk.delay(i) for i in range(200)])
            values = results.get(timeout=120)
    finally:
        delete_queues(client, [queue])
    assert sorted(values) == list(range(1, 201))
    runs = pg_store.list_runs(limit=1000)
    assert len(runs) == 200
    assert {(r.status, r.attempt) for r in runs} == {("succeeded", 1)}
    text = log.read_text()
    for problem in ("OperationalError", "StoreUnavailable", "Traceback", "ERROR"):
        assert problem not in text, text[-3000:]
