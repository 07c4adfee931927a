"""Fixtures of the adapter conformance suite: one harness per adapter and broker.

``harness`` runs each test against Celery and Dramatiq on Redis and RabbitMQ
(``celery-redis``, ``celery-rabbitmq``, ``dramatiq-redis``,
``dramatiq-rabbitmq``). A broker that is not reachable skips the test locally
and fails it in CI (the root conftest's ``require_service``).

A harness lives for one test module: its queue, store, ledger and in-thread
worker are shared by the module's tests, which therefore look at their own
run keys only. A module that needs real worker processes instead overrides
``harness`` with ``make_harness`` (see ``test_conformance_crash.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any
from uuid import uuid4

import pytest

from tests.conformance.harness import Harness, HarnessConfig

SERVICES = {"redis": ("Redis", "127.0.0.1", 6379), "rabbitmq": ("RabbitMQ", "127.0.0.1", 5672)}

KINDS = [
    pytest.param("celery-redis", marks=pytest.mark.redis),
    pytest.param("celery-rabbitmq", marks=pytest.mark.rabbitmq),
    pytest.param("dramatiq-redis", marks=pytest.mark.redis),
    pytest.param("dramatiq-rabbitmq", marks=pytest.mark.rabbitmq),
]


@pytest.fixture(scope="module", params=KINDS)
def harness_kind(request: pytest.FixtureRequest, require_service: Callable[[str, str, int], None]) -> str:
    """``<framework>-<broker>``, each in turn; its broker must be reachable."""
    kind: str = request.param
    require_service(*SERVICES[kind.split("-")[1]])
    return kind


@pytest.fixture(scope="module")
def make_harness(harness_kind: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Harness]]:
    """Build the module's harness of ``harness_kind`` (``make_harness(lease_seconds=2)``); closed afterwards."""
    made: list[Harness] = []

    def make(**options: Any) -> Harness:
        framework, broker = harness_kind.split("-")
        directory = tmp_path_factory.mktemp(harness_kind)
        unique = uuid4().hex[:10]
        config = HarnessConfig(
            name=harness_kind,
            broker=broker,
            queue=f"fqconf{unique}",
            namespace=f"fqconf-{unique}",
            store_url=f"sqlite:///{directory / 'steps.db'}",
            directory=str(directory),
            **options,
        )
        harness: Harness
        if framework == "celery":
            from tests.conformance.celery_harness import CeleryHarness

            harness = CeleryHarness(config)
        else:
            from tests.conformance.dramatiq_harness import DramatiqHarness

            harness = DramatiqHarness(config)
        made.append(harness)
        return harness

    yield make
    for harness in made:
        harness.close()


@pytest.fixture(scope="module")
def harness(make_harness: Callable[..., Harness]) -> Iterator[Harness]:
    """The module's harness with its in-thread worker running."""
    built = make_harness()
    with built.thread_worker():
        yield built
