"""Fixtures of the Celery adapter tests: real brokers, real stores, in-process and subprocess workers.

Redis and RabbitMQ must be running locally; a test whose service is down is
skipped on a developer machine and fails in CI (``CI=true``). Every test gets
its own queue names (and Redis keys / RabbitMQ queues are deleted afterwards),
so tests do not see each other's messages.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
from celery import Celery
from celery_support import (
    POSTGRES_URL,
    broker_url,
    delete_queues,
    drop_tables,
    in_process_worker,
    require,
)
from flexiq_celery_testapp import make_app

from flexiq_plugins import SqlStepStore
from tests.polling import wait_for  # noqa: F401 - the tests import it from here

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


@pytest.fixture(name="in_process_worker")
def in_process_worker_fixture() -> Callable[..., Any]:
    """:func:`in_process_worker` as a fixture, for tests that take it as an argument."""
    return in_process_worker
