"""A Celery app whose task is not declared durable: the library learns it at its first step (C43).

Worker subprocesses (``celery -A fq_learned_app worker``) build the module-level ``app`` from environment
variables; the tests build the producer's with :func:`make_app`. The body's calls are counted in a SQLite
side table (``fq_calls``), so a count survives a killed worker.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from celery import Celery
from flexiq_celery_testapp import REDIS_BACKEND, record_call

import celery_ext
from flexiq_plugins import current_job

__all__ = ["app", "make_app"]


def make_app(queue: str, broker: str, store: Any, calls: str, hang: str, **options: Any) -> Celery:
    """An app on ``queue`` with the task ``<queue>.order`` (no ``durable=`` option: learned)."""
    app = Celery(queue, broker=broker, backend=REDIS_BACKEND, set_as_current=False)
    app.conf.update(task_default_queue=queue, worker_hijack_root_logger=False, broker_connection_retry=True)
    celery_ext.install(app, store=store, **options)

    @app.task(name=f"{queue}.order")
    def order(number: int) -> str:
        charge = current_job.step.run("charge", lambda: record_call(calls, "charge", current_job.run_key))

        def ship() -> str:
            record_call(calls, "ship", str(os.getpid()))
            while Path(hang).exists():  # the test kills this worker here, after charge committed
                time.sleep(0.05)
            return f"shipped {number}"

        return f"{current_job.step.run('ship', ship)} after charge {charge}"

    return app


def _from_env() -> Celery | None:
    env = os.environ
    if "FQ_LEARNED_QUEUE" not in env:
        return None
    return make_app(
        env["FQ_LEARNED_QUEUE"],
        env["FQ_LEARNED_BROKER"],
        env["FQ_LEARNED_STORE"],
        env["FQ_LEARNED_CALLS"],
        env["FQ_LEARNED_HANG"],
        lease_seconds=2,
        recovery_interval_seconds=0.5,
        recovery_grace_seconds=0.5,
    )


app = _from_env()
"""The worker process's app (``None`` when imported by the tests)."""
