"""What the Celery tests share besides fixtures: brokers, services, worker processes, in-process workers.

Imported by name (``from celery_support import ...``): a conftest is not a module to import, and two
folders' conftests would shadow each other in one test process.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest
from celery import Celery, signals

from flexiq_plugins import SqlStepStore
from tests.polling import wait_for  # noqa: F401 - the tests import it from here
from tests.workers import celery_thread_worker, celery_worker_process

HERE = Path(__file__).resolve().parent


ROOT = HERE.parents[1]


REDIS_BROKER = "redis://127.0.0.1:6379/12"


RABBITMQ_BROKER = "amqp://guest:guest@127.0.0.1:5672//"


POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


SERVICES = {
    "redis": ("Redis", "127.0.0.1", 6379),
    "rabbitmq": ("RabbitMQ", "127.0.0.1", 5672),
    "postgres": ("PostgreSQL", "127.0.0.1", 5432),
}


def require(service: str) -> None:
    """Skip (locally) or fail (``CI=true``) unless ``service`` accepts TCP connections."""
    name, host, port = SERVICES[service]
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return
    except OSError:
        message = f"{name} not reachable at {host}:{port}"
        if os.environ.get("CI", "").strip().lower() in ("true", "1"):
            pytest.fail(message)
        pytest.skip(message)


def broker_url(kind: str) -> str:
    """The broker URL of ``kind`` (``"redis"`` or ``"rabbitmq"``), after checking it is up."""
    require(kind)
    require("redis")  # the result backend
    return REDIS_BROKER if kind == "redis" else RABBITMQ_BROKER


def drop_tables(store: SqlStepStore) -> None:
    """Drop the tables of ``store``'s prefix."""
    from benchmarks.schema import drop_prefixed_tables

    drop_prefixed_tables(store.engine, store.table_prefix)
    store.close()


def delete_queues(app: Celery, names: list[str]) -> None:
    """Delete the broker queues ``names`` of ``app`` (Redis keys or RabbitMQ queues)."""
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        for name in names:
            with suppress(Exception):  # the queue may never have been declared
                channel.queue_delete(name)


@contextmanager
def in_process_worker(app: Celery, pool: str = "solo", concurrency: int = 1) -> Iterator[Any]:
    """A real Celery worker consuming ``app``'s queue in a thread of this process."""
    with celery_thread_worker(app, pool=pool, concurrency=concurrency) as worker:
        yield worker


@contextmanager
def worker_process(env: dict[str, str], log: Path, concurrency: int = 2) -> Iterator[subprocess.Popen[bytes]]:
    """A real ``celery -A flexiq_celery_testapp worker`` subprocess (prefork pool)."""
    with celery_worker_process(
        "flexiq_celery_testapp", env["FLEXIQ_TEST_QUEUE"], env, log, concurrency=concurrency, pythonpath=HERE
    ) as proc:
        yield proc


def published_headers(send: Callable[[], Any]) -> dict[str, Any]:
    """Publish with ``send``; return the headers of the message that left (``after_task_publish``)."""
    seen: dict[str, Any] = {}

    def note(headers: dict[str, Any] | None = None, **_: Any) -> None:
        seen.update(headers or {})

    signals.after_task_publish.connect(note, weak=False)
    try:
        send()
    finally:
        signals.after_task_publish.disconnect(note)
    return seen
