"""A real ``dramatiq`` worker process's log: what an operator needs and nothing more."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from uuid import uuid4

import dramatiq
import pytest
from dq_support import status_of, wait_until
from dramatiq.brokers.redis import RedisBroker

from dramatiq_ext import RUN_KEY_OPTION
from flexiq_plugins import SqlStepStore
from flexiq_plugins._model.identity import new_run_key
from tests.conftest import drop_store_tables

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
REDIS = ("Redis", "127.0.0.1", 6379)

pytestmark = [pytest.mark.slow, pytest.mark.redis, pytest.mark.postgres]


@pytest.fixture
def redis_producer(require_service: Callable[[str, str, int], None], namespace: str) -> Iterator[RedisBroker]:
    """A Redis broker on this test's namespace, to enqueue with; its keys are deleted afterwards."""
    require_service(*REDIS)
    broker = RedisBroker(host=REDIS[1], port=REDIS[2], namespace=namespace)
    yield broker
    keys = list(broker.client.scan_iter(f"{namespace}:*"))
    if keys:
        broker.client.delete(*keys)
    broker.close()


def test_c16_a_worker_logs_one_start_line_and_no_alembic_or_sleep_lines(
    redis_producer: RedisBroker, queue: str, namespace: str, tmp_path: Path, postgres_url: str
) -> None:
    """One INFO line at start names the store (password hidden) and schema revision; Alembic's INFO
    lines are gone; a sleep hop logs nothing at INFO or above (C16); the run completes."""
    prefix = f"d{uuid4().hex[:8]}_"
    store = SqlStepStore(POSTGRES_URL, table_prefix=prefix)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE)]),
        "FLEXIQ_TEST_NAMESPACE": namespace,
        "FLEXIQ_TEST_QUEUE": queue,
        "FLEXIQ_TEST_STORE": POSTGRES_URL.replace("postgres@", "postgres:s3cret-pw@"),
        "FLEXIQ_TEST_TABLE_PREFIX": prefix,
    }
    log = tmp_path / "worker.log"
    command = [sys.executable, "-m", "dramatiq", "dq_log_app", "--processes", "1", "--threads", "1"]
    with log.open("ab") as out:
        proc = subprocess.Popen(
            command, env=env, cwd=HERE, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    run_key = new_run_key()
    try:
        wait_until(lambda: "durable steps in" in log.read_text(), timeout=30, what="the worker's start line")
        redis_producer.enqueue(
            dramatiq.Message(queue_name=queue, actor_name="nap", args=(), kwargs={}, options={RUN_KEY_OPTION: run_key})
        )
        wait_until(lambda: status_of(store, run_key) == "succeeded", timeout=30, what="the nap to finish")
        schema = store.describe().split(" (", 1)[1]  # "tables <prefix>*, schema revision <the newest>)"
        text = log.read_text()  # the log of a running worker, before the shutdown's own lines
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(20)
    (start,) = [line for line in text.splitlines() if "durable steps in" in line]
    assert "postgres:***@127.0.0.1" in start
    assert start.endswith(f"({schema}")  # the worker's revision: the newest, as the store reads it
    assert schema.startswith(f"tables {prefix}*, schema revision 0")
    assert "s3cret-pw" not in text
    for noise in ("alembic", "Context impl", "Will assume", "setup plugin", "skipped", "WARNING", "ERROR"):
        assert noise not in text, text[-3000:]
    drop_store_tables(store)
    store.close()
