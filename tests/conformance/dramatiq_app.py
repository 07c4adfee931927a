"""The Dramatiq broker of the conformance suite: every scenario as a durable actor.

The harness builds it in the test process with :func:`make_broker`; a worker
process (``dramatiq tests.conformance.dramatiq_app``) builds the same broker
from the configuration in its environment and sets it as the global broker.
"""

from __future__ import annotations

from typing import Any

import dramatiq
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.brokers.redis import MAINTENANCE_SCALE, RedisBroker
from dramatiq.middleware import CurrentMessage

from dramatiq_ext import DurableSteps
from tests.conformance.harness import HarnessConfig, adapter_options
from tests.conformance.scenarios import SCENARIOS, Ledger, Scenario


def make_plain_broker(config: HarnessConfig, **options: Any) -> dramatiq.Broker:
    """A broker of ``config``'s kind and namespace with no middleware at all (``options`` go to it)."""
    if config.broker == "redis":
        return RedisBroker(host="127.0.0.1", port=6379, namespace=config.namespace, middleware=[], **options)
    return RabbitmqBroker(host="127.0.0.1", port=5672, heartbeat=0, middleware=[], **options)


def make_broker(config: HarnessConfig, *, worker_process: bool = False) -> dramatiq.Broker:
    """A broker of ``config``'s kind with ``DurableSteps`` and every scenario declared on its queue.

    A worker process on Redis considers another worker dead one second after
    its last heartbeat and runs the maintenance that requeues a dead worker's
    unacknowledged messages on every command, so a killed worker's job comes
    back at once (RabbitMQ gives it back when the connection drops).
    """
    broker: dramatiq.Broker
    if config.broker == "redis":
        fast_redelivery: dict[str, Any] = (
            {"heartbeat_timeout": 1_000, "maintenance_chance": MAINTENANCE_SCALE} if worker_process else {}
        )
        broker = RedisBroker(host="127.0.0.1", port=6379, namespace=config.namespace, **fast_redelivery)
    else:
        broker = RabbitmqBroker(host="127.0.0.1", port=5672, heartbeat=0)
    broker.add_middleware(CurrentMessage())
    broker.add_middleware(DurableSteps(**adapter_options(config)))
    ledger = Ledger(config.directory)
    for scenario in SCENARIOS.values():
        declare(broker, config.queue, scenario, ledger)
    return broker


def declare(broker: dramatiq.Broker, queue: str, scenario: Scenario, ledger: Ledger) -> None:
    """Declare ``scenario`` as an actor on ``queue``; the body first notes the message's ``retries``.

    The scenario's return value is dropped: with no Results middleware Dramatiq
    would log a warning for it.
    """

    def actor(*args: Any) -> None:
        message = CurrentMessage.get_current_message()
        ledger.enter(retries=int(message.options.get("retries", 0)) if message is not None else 0)
        scenario.fn(ledger, *args)

    actor.__name__ = scenario.name
    limit = scenario.time_limit_seconds
    dramatiq.actor(
        actor_name=scenario.name,
        queue_name=queue,
        broker=broker,
        max_retries=scenario.max_retries,
        min_backoff=10,
        max_backoff=50,
        notify_shutdown=scenario.interruptible,
        **({"time_limit": int(limit * 1000)} if limit is not None else {}),
        **{"durable": True, **scenario.options},  # every scenario takes steps: declared durable up front (C43)
    )(actor)


_config = HarnessConfig.from_env()
if _config is not None:  # a ``dramatiq tests.conformance.dramatiq_app`` worker process
    broker = make_broker(_config, worker_process=True)
    dramatiq.set_broker(broker)
