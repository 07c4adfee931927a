"""The checkout as an ordinary Celery task; ``celery_ext.install`` adds durable steps.

Configured from the environment the demo sets: ``FLEXIQ_DEMO_DIR`` (where the
SQLite files live) and ``FLEXIQ_DEMO_BROKER`` (empty: kombu's SQLAlchemy
transport on a SQLite file, no server).
"""

from __future__ import annotations

import os

from celery import Celery

import celery_ext

from . import flow
from .services import ReceiptNotSent

DEMO_DIR = os.path.abspath(os.environ.get("FLEXIQ_DEMO_DIR", "."))
BROKER = os.environ.get("FLEXIQ_DEMO_BROKER") or f"sqla+sqlite:///{DEMO_DIR}/broker.db"
QUEUE = os.environ.get("FLEXIQ_DEMO_QUEUE", "flexiq-demo")

app = Celery("checkout_demo", broker=BROKER, backend=f"db+sqlite:///{DEMO_DIR}/results.db")
app.conf.update(
    task_default_queue=QUEUE,
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    result_extended=True,
)
DEMO_TIMINGS = f"a {flow.LEASE_SECONDS:g} s claim lease (default 30 s)"
"""What the demo shortens so that a crash is over in seconds; the driver prints it (with the Redis part below)."""
if BROKER.startswith("redis://"):
    # a dead worker's unacknowledged job comes back once unacknowledged for 10 s; kombu looks
    # for such jobs every unacked_restore_interval * unacked_restore_throttle seconds (default 100)
    app.conf.broker_transport_options = {
        "visibility_timeout": 10,
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
    }
    DEMO_TIMINGS += ", Redis redelivering an unacknowledged job after 10 s (visibility_timeout, default 1 h)"
celery_ext.install(
    app, store=f"sqlite:///{DEMO_DIR}/steps.db", lease_seconds=flow.LEASE_SECONDS, keep_succeeded_steps=True
)


# durable=True: durable from its very first job (recorded at publish, acknowledged late), as the demo kills a
# worker during the first job; without it the task becomes durable once it has taken a step (C43).
@app.task(  # type: ignore[untyped-decorator]
    autoretry_for=(ReceiptNotSent,), default_retry_delay=1, max_retries=3, durable=True
)
def checkout(order_id: str, amount_cents: int) -> str:
    """Charge once, wait, send the receipt (see :func:`examples.checkout.flow.checkout`)."""
    return flow.checkout(order_id, amount_cents)
