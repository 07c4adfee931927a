"""Fixtures for the Dramatiq adapter: real brokers, real workers, real stores.

``broker`` runs a test against the stub broker, Redis and RabbitMQ in turn.
Every test gets its own queue name (and Redis namespace), so queues never leak
between tests, and the global broker is restored afterwards. A broker whose
server is not reachable skips the test locally and fails it in CI, through the
root ``require_service``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.brokers.redis import RedisBroker
from dramatiq.brokers.stub import StubBroker
from dramatiq.common import dq_name, xq_name

from flexiq_plugins._store.base import StepStore

REDIS = ("Redis", "127.0.0.1", 6379)
RABBITMQ = ("RabbitMQ", "127.0.0.1", 5672)


@pytest.fixture(scope="session")
def require_service(pytestconfig: pytest.Config) -> Callable[[str, str, int], None]:
    """The root conftest's ``require_service`` (skip locally, fail in CI)."""
    root = pytestconfig.pluginmanager.get_plugin(str(Path(__file__).parents[1] / "conftest.py"))
    return root.require_service  # type: ignore[no-any-return,union-attr]


@pytest.fixture
def queue() -> str:
    """A queue name used by this test only."""
    return f"flexiq_{uuid.uuid4().hex[:10]}"


@pytest.fixture
def namespace() -> str:
    """A Redis key namespace used by this test only."""
    return f"flexiq-test-{uuid.uuid4().hex[:10]}"


def make_broker(kind: str, namespace: str) -> dramatiq.Broker:
    """Build a broker of ``kind`` (``stub``, ``redis``, ``rabbitmq``) with the default middleware."""
    if kind == "redis":
        return RedisBroker(host=REDIS[1], port=REDIS[2], namespace=namespace)
    if kind == "rabbitmq":
        return RabbitmqBroker(host=RABBITMQ[1], port=RABBITMQ[2], heartbeat=0)
    return StubBroker()


@pytest.fixture(
    params=[
        "stub",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("rabbitmq", marks=pytest.mark.rabbitmq),
    ]
)
def broker_kind(request: pytest.FixtureRequest, require_service: Callable[[str, str, int], None]) -> str:
    """``stub``, ``redis`` and ``rabbitmq`` in turn (a missing server skips, or fails in CI)."""
    kind: str = request.param
    if kind == "redis":
        require_service(*REDIS)
    elif kind == "rabbitmq":
        require_service(*RABBITMQ)
    return kind


@pytest.fixture
def broker(broker_kind: str, namespace: str, queue: str) -> Iterator[dramatiq.Broker]:
    """A broker of each kind, set as the global broker for the test and cleaned up afterwards."""
    yield from _installed(make_broker(broker_kind, namespace), namespace, queue)


@pytest.fixture
def stub_broker(namespace: str, queue: str) -> Iterator[dramatiq.Broker]:
    """A stub broker, set as the global broker for the test."""
    yield from _installed(StubBroker(), namespace, queue)


def _installed(broker: dramatiq.Broker, namespace: str, queue: str) -> Iterator[dramatiq.Broker]:
    previous = dramatiq.get_broker() if _has_global_broker() else None
    broker.emit_after("process_boot")
    dramatiq.set_broker(broker)
    try:
        yield broker
    finally:
        _cleanup(broker, namespace, queue)
        broker.close()
        if previous is not None:
            dramatiq.set_broker(previous)


def _has_global_broker() -> bool:
    from dramatiq import broker as broker_module

    return broker_module.global_broker is not None


def _cleanup(broker: dramatiq.Broker, namespace: str, queue: str) -> None:
    if isinstance(broker, RedisBroker):
        keys = list(broker.client.scan_iter(f"{namespace}:*"))
        if keys:
            broker.client.delete(*keys)
    elif isinstance(broker, RabbitmqBroker):
        for name in (queue, dq_name(queue), xq_name(queue)):
            broker.channel.queue_delete(name)


@pytest.fixture
def start_worker() -> Iterator[Callable[..., dramatiq.Worker]]:
    """Start in-process workers (``start_worker(broker, worker_threads=2)``); stopped afterwards."""
    workers: list[dramatiq.Worker] = []

    def start(broker: dramatiq.Broker, **kwargs: Any) -> dramatiq.Worker:
        kwargs.setdefault("worker_timeout", 100)
        kwargs.setdefault("worker_threads", 2)
        worker = dramatiq.Worker(broker, **kwargs)
        worker.start()
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        worker.stop()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def step_store(request: pytest.FixtureRequest, make_sql_store: Callable[..., StepStore]) -> StepStore:
    """A fresh SQL step store: a SQLite file, then PostgreSQL (unique table prefix)."""
    url = request.getfixturevalue(f"{request.param}_url")
    return make_sql_store(url)


@pytest.fixture
def sqlite_store(sqlite_url: str, make_sql_store: Callable[..., StepStore]) -> StepStore:
    """A fresh SQLite step store."""
    return make_sql_store(sqlite_url)
