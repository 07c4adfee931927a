"""The Celery app of the conformance suite: every scenario as a durable task.

The harness builds it in the test process with :func:`make_app`; a worker
process (``celery -A tests.conformance.celery_app worker``) builds the same app
from the configuration in its environment (:data:`app`).
"""

from __future__ import annotations

from typing import Any

from celery import Celery
from kombu import Exchange, Queue

import celery_ext
from tests.conformance.harness import HarnessConfig, adapter_options
from tests.conformance.scenarios import SCENARIOS, Ledger, Scenario

BROKER_URLS = {"redis": "redis://127.0.0.1:6379/12", "rabbitmq": "amqp://guest:guest@127.0.0.1:5672//"}


def dead_letter_names(config: HarnessConfig) -> tuple[str, str]:
    """``(exchange, queue)`` of the RabbitMQ dead-letter exchange of ``config``'s queue, or the Redis DLQ twice."""
    if config.broker == "rabbitmq":
        return f"{config.queue}.dlx", f"{config.queue}.dlx-queue"
    return f"{config.queue}.dlq", f"{config.queue}.dlq"


def make_app(config: HarnessConfig) -> Celery:
    """An app on ``config``'s queue with the adapter installed and every scenario registered.

    On RabbitMQ the queue is declared with ``x-dead-letter-exchange`` (the
    adapter's ``Reject(requeue=False)`` then moves dead letters there); on Redis
    the adapter publishes them to the queue ``<queue>.dlq``.
    """
    app = Celery(config.queue, broker=BROKER_URLS[config.broker], set_as_current=False)
    app.conf.update(
        task_default_queue=config.queue,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        worker_prefetch_multiplier=4,
    )
    if config.broker == "rabbitmq":
        exchange, _ = dead_letter_names(config)
        app.conf.task_queues = [
            Queue(
                config.queue,
                Exchange(config.queue, "direct"),
                routing_key=config.queue,
                queue_arguments={"x-dead-letter-exchange": exchange},
            )
        ]
    celery_ext.install(app, dead_letter_queue=dead_letter_names(config)[1], **adapter_options(config))
    ledger = Ledger(config.directory)
    for scenario in SCENARIOS.values():
        register(app, scenario, ledger)
    return app


def register(app: Celery, scenario: Scenario, ledger: Ledger) -> None:
    """Declare ``scenario`` as the task ``<app>.<scenario>``; the body first notes its ``request.retries``."""

    def task(self: Any, *args: Any) -> Any:
        ledger.enter(retries=self.request.retries)
        return scenario.fn(ledger, *args)

    app.task(
        bind=True,
        name=f"{app.main}.{scenario.name}",
        autoretry_for=(Exception,),
        max_retries=scenario.max_retries,
        default_retry_delay=0,
        time_limit=scenario.time_limit_seconds,
        **{"durable": True, **scenario.options},  # every scenario takes steps: declared durable up front (C43)
    )(task)


_config = HarnessConfig.from_env()
app = make_app(_config) if _config is not None else None
"""The worker process's app (``None`` when imported by the tests)."""
