"""Fixtures of the Celery adapter tests: real brokers, real stores, in-process and subprocess workers.

Redis and RabbitMQ must be running locally; a test whose service is down is
skipped on a developer machine and fails in CI (``CI=true``). Every test gets
its own queue names (and Redis keys / RabbitMQ queues are deleted afterwards),
so tests do not see each other's messages.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
from celery import Celery
from flexiq_celery_testapp import make_app

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


BROKERS = [pytest.param("redis", marks=pytest.mark.redis), pytest.param("rabbitmq", marks=pytest.mark.rabbitmq)]


@pytest.fixture(params=BROKERS)
def broker(request: pytest.FixtureRequest) -> str:
    """A real broker URL: Redis, then RabbitMQ."""
    return broker_url(request.param)


@pytest.fixture
def redis_broker() -> str:
    """The Redis broker URL."""
    return broker_url("redis")


@pytest.fixture
def rabbitmq_broker() -> str:
    """The RabbitMQ broker URL."""
    return broker_url("rabbitmq")


@pytest.fixture
def pg_store() -> Iterator[SqlStepStore]:
    """A PostgreSQL store with its own table prefix, dropped afterwards."""
    require("postgres")
    store = SqlStepStore(POSTGRES_URL, table_prefix=f"c{uuid4().hex[:8]}_")
    yield store
    drop_tables(store)


def drop_tables(store: SqlStepStore) -> None:
    """Drop the tables of ``store``'s prefix."""
    import sqlalchemy as sa

    with store.engine.begin() as conn:
        for table in ("steps", "step_attempts", "dead_letters", "events", "sweep_lease", "runs", "alembic_version"):
            conn.execute(sa.text(f"DROP TABLE IF EXISTS {store.table_prefix}{table}"))
    store.close()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SqlStepStore]:
    """A fresh SQL store: a SQLite file, then PostgreSQL."""
    if request.param == "sqlite":
        sqlite = SqlStepStore(f"sqlite:///{tmp_path / 'steps.db'}")
        yield sqlite
        sqlite.close()
        return
    yield request.getfixturevalue("pg_store")


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[SqlStepStore]:
    """A SQLite store in the test's temporary directory."""
    sqlite = SqlStepStore(f"sqlite:///{tmp_path / 'steps.db'}")
    yield sqlite
    sqlite.close()


@pytest.fixture
def calls(tmp_path: Path) -> str:
    """The SQLite side table counting real calls of step bodies."""
    return str(tmp_path / "calls.db")


@pytest.fixture
def make_celery_app(calls: str) -> Iterator[Callable[..., Celery]]:
    """A factory of fresh apps (own queue names), whose queues are deleted afterwards."""
    made: list[Celery] = []

    def make(broker: str, store: Any, **options: Any) -> Celery:
        app = make_app(f"fqt{uuid4().hex[:10]}", broker, store, calls, **options)
        made.append(app)
        return app

    yield make
    for app in made:
        delete_queues(app, [app.main, f"{app.main}.dlq", f"{app.main}.dlx-queue"])


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


@pytest.fixture(name="in_process_worker")
def in_process_worker_fixture() -> Callable[..., Any]:
    """:func:`in_process_worker` as a fixture, for tests that take it as an argument."""
    return in_process_worker


@contextmanager
def worker_process(env: dict[str, str], log: Path, concurrency: int = 2) -> Iterator[subprocess.Popen[bytes]]:
    """A real ``celery -A flexiq_celery_testapp worker`` subprocess (prefork pool)."""
    with celery_worker_process(
        "flexiq_celery_testapp", env["FLEXIQ_TEST_QUEUE"], env, log, concurrency=concurrency, pythonpath=HERE
    ) as proc:
        yield proc
