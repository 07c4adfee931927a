"""Real ``celery worker`` subprocesses (prefork): many jobs at once.

Crashes inside step bodies are in the adapter conformance suite (``tests/conformance``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
from celery.result import ResultSet
from celery_support import POSTGRES_URL, delete_queues, drop_tables, require, wait_for, worker_process
from flexiq_celery_testapp import make_app

from flexiq_plugins import SqlStepStore

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


def test_c16_a_worker_logs_one_start_line_and_no_alembic_or_sleep_hop_lines(
    redis_broker: str, tmp_path: Path, calls: str
) -> None:
    """A prefork worker at INFO: one start line naming the store (password hidden) and its schema
    revision; none of Alembic's INFO lines, though every child checks the schema; and no "Task …
    ignored" line for the sleep hops (C16: a sleep is not news), while the job completes."""
    require("postgres")
    queue = f"fql{uuid4().hex[:8]}"
    prefix = f"l{uuid4().hex[:8]}_"
    secret_url = POSTGRES_URL.replace("postgres@", "postgres:s3cret-pw@")
    env = worker_env(redis_broker, secret_url, calls, queue, FLEXIQ_TEST_TABLE_PREFIX=prefix)
    store = SqlStepStore(POSTGRES_URL, table_prefix=prefix)
    client = make_app(queue, redis_broker, store, calls)
    log = tmp_path / "worker.log"
    try:
        with worker_process(env, log, concurrency=2):
            wait_for(lambda: "durable steps in" in log.read_text(), 30, "the worker's start line")
            result = client.tasks[f"{queue}.sleeper"].delay(0.5).get(timeout=60)
        schema = store.describe().split(" (", 1)[1]  # "tables <prefix>*, schema revision <the newest>)"
    finally:
        delete_queues(client, [queue])
        drop_tables(store)
    assert result["attempt"] == 2  # the sleep hopped once
    text = log.read_text()
    (start,) = [line for line in text.splitlines() if "durable steps in" in line]
    assert "postgres:***@127.0.0.1" in start
    assert start.endswith(f"({schema}")  # the worker's revision: the newest, as the store reads it
    assert schema.startswith(f"tables {prefix}*, schema revision 0")
    assert "s3cret-pw" not in text
    for noise in ("alembic", "Context impl", "Will assume", "setup plugin", "ignored"):
        assert noise not in text, text[-3000:]
