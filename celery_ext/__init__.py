"""Durable steps for the Celery tasks you already have.

Three lines:

    import celery_ext
    app = Celery("shop", broker="redis://localhost:6379/0", backend="redis://localhost:6379/0")
    celery_ext.install(app, store="postgresql://localhost/shop")

Then, inside any task:

    from flexiq_plugins import current_job

    @app.task
    def checkout(order_id):
        step = current_job.step
        charge = step.run("charge", lambda: pay(order_id, idempotency_key=step.idempotency_key))
        step.sleep("1h")
        step.run("receipt", lambda: send_receipt(charge))

See ``docs/celery.md`` for how sleeps, retries and dead letters map onto
Celery on Redis and RabbitMQ.
"""

from ._adapter import CeleryAdapter, adapter, publisher
from ._deadletter import DEAD_LETTER_HEADER, DeadLetterReject
from ._envelope import republish, run_key_of
from ._install import install
from ._options import DEFAULT_DEAD_LETTER_QUEUE, RUN_KEY_HEADER, CeleryConfig
from ._runtime import runtime_of
from ._task import DurableTask

__all__ = [
    "CeleryAdapter",
    "CeleryConfig",
    "DEAD_LETTER_HEADER",
    "DEFAULT_DEAD_LETTER_QUEUE",
    "DeadLetterReject",
    "DurableTask",
    "RUN_KEY_HEADER",
    "adapter",
    "install",
    "publisher",
    "republish",
    "run_key_of",
    "runtime_of",
]
