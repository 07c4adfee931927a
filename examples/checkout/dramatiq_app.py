"""The checkout as an ordinary Dramatiq actor; the ``DurableSteps`` middleware adds durable steps.

``FLEXIQ_DEMO_BROKER`` picks the broker: ``redis://…`` or ``amqp://…``; empty
means Dramatiq's in-process ``StubBroker`` (Dramatiq has no embedded transport
that a separate worker process could share).
"""

from __future__ import annotations

import os

import dramatiq
from dramatiq.brokers.stub import StubBroker

from dramatiq_ext import DurableSteps

from . import flow
from .services import ReceiptNotSent

DEMO_DIR = os.path.abspath(os.environ.get("FLEXIQ_DEMO_DIR", "."))
BROKER_URL = os.environ.get("FLEXIQ_DEMO_BROKER", "")
QUEUE = os.environ.get("FLEXIQ_DEMO_QUEUE", "flexiq-demo")


DEMO_TIMINGS = f"a {flow.LEASE_SECONDS:g} s claim lease (default 30 s)"
"""What the demo shortens so that a crash is over in seconds; the driver prints it (with the Redis part below)."""


def pika_url(url: str) -> str:
    """``url`` as pika reads it: kombu (Celery) spells the default vhost ``//``, pika ``/%2F``."""
    return url[:-2] + "/%2F" if url.startswith("amqp://") and url.endswith("//") else url


def _broker() -> dramatiq.Broker:
    global DEMO_TIMINGS
    if BROKER_URL.startswith("redis://"):
        from dramatiq.brokers.redis import MAINTENANCE_SCALE, RedisBroker

        DEMO_TIMINGS += ", Redis redelivering a dead worker's job after 3 s (heartbeat_timeout, default 60 s)"
        return RedisBroker(  # type: ignore[no-untyped-call]
            url=BROKER_URL,
            namespace=QUEUE,
            heartbeat_timeout=3_000,  # ms: a dead worker's unacknowledged job comes back after 3 s
            maintenance_chance=MAINTENANCE_SCALE,  # look for such jobs on every command, not by chance
        )
    if BROKER_URL.startswith("amqp://"):
        from dramatiq.brokers.rabbitmq import RabbitmqBroker

        return RabbitmqBroker(url=pika_url(BROKER_URL))  # the driver says so when it rewrites the URL
    return StubBroker()


broker = _broker()
broker.add_middleware(
    DurableSteps(store=f"sqlite:///{DEMO_DIR}/steps.db", lease_seconds=flow.LEASE_SECONDS, keep_succeeded_steps=True)
)
dramatiq.set_broker(broker)


@dramatiq.actor(
    queue_name=QUEUE,
    max_retries=3,
    min_backoff=1000,
    max_backoff=1000,
    retry_when=lambda retries, exc: isinstance(exc, ReceiptNotSent) and retries < 3,
    durable=True,  # durable from its very first job, recorded at publish (otherwise learned at its first step, C43)
)
def checkout(order_id: str, amount_cents: int) -> None:
    """Charge once, wait, send the receipt (see :func:`examples.checkout.flow.checkout`).

    Dramatiq keeps no results without a result backend, so the charge id is
    only in the journal and the store.
    """
    flow.checkout(order_id, amount_cents)
