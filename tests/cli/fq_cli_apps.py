"""The jobs the CLI tests run on real brokers, and the objects ``--app`` / ``--broker`` import.

``flexiq dlq retry --app fq_cli_apps:celery_app`` imports this module: in the
test process the tests set :data:`celery_app` / :data:`dramatiq_broker`; in a
``flexiq`` subprocess :data:`celery_app` is built from ``FQ_CLI_*`` environment
variables, the way a project's ``proj.celery:app`` is.

The job is the checkout of the seed: ``reserve``, ``charge``, a sleep,
``notify``. Every real call of a step body is recorded with its idempotency
key in a SQLite side table, so counts survive threads and processes.
:data:`VERSION` is the "deployed" code: 1 is the original, 2 renames
``reserve`` (a diverging deploy), 3 is the fix.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

from celery import Celery

import celery_ext
from flexiq_plugins import current_job

REDIS_URL = "redis://127.0.0.1:6379/10"
VERSION = {"value": 1}

celery_app: Any = None
dramatiq_broker: Any = None
check_app: Any = None
"""The app ``flexiq check --app fq_cli_apps:check_app`` checks (set by ``test_cli_deploys.py``)."""


def record(calls: str, what: str, key: str) -> None:
    """Record one real call of the step body ``what`` with its idempotency key."""
    with sqlite3.connect(calls, timeout=30) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS calls (what TEXT, key TEXT)")
        conn.execute("INSERT INTO calls VALUES (?, ?)", (what, key))


def keys_of(calls: str, what: str) -> list[str]:
    """The idempotency keys of every real call of ``what``, in call order."""
    if not Path(calls).exists():
        return []
    with sqlite3.connect(calls, timeout=30) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS calls (what TEXT, key TEXT)")
        return [r[0] for r in conn.execute("SELECT key FROM calls WHERE what = ? ORDER BY rowid", (what,))]


def checkout(calls: str, order: int, pause: float) -> str:
    """The durable body both frameworks run (see the module docstring for the versions)."""
    step = current_job.step

    def body(what: str) -> Any:
        def call() -> str:
            record(calls, what, step.idempotency_key)
            return f"{what}-{order}"

        return call

    step.run("hold" if VERSION["value"] == 2 else "reserve", body("reserve"))
    step.run("charge", body("charge"))
    step.sleep(pause)
    return str(step.run("notify", body("notify")))


def make_celery_app(name: str, store: Any, calls: str) -> Celery:
    """A Celery app on Redis with queue ``name``, durable steps and the ``checkout`` task."""
    app = Celery(name, broker=REDIS_URL, backend=REDIS_URL, set_as_current=False)
    app.conf.update(
        task_default_queue=name,
        result_expires=600,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )
    celery_ext.install(app, store=store, dead_letter_queue=f"{name}.dlq", busy_retry_seconds=0.5)

    @app.task(name=f"{name}.checkout", autoretry_for=(Exception,), max_retries=5)
    def checkout_task(order: int, pause: float) -> str:
        return checkout(calls, order, pause)

    return app


def _app_from_env() -> Any:
    """The app of a ``flexiq --app fq_cli_apps:celery_app`` subprocess (publishing only)."""
    name = os.environ.get("FQ_CLI_QUEUE")
    if not name:
        return None
    return make_celery_app(name, os.environ["FQ_CLI_STORE"], os.environ["FQ_CLI_CALLS"])


celery_app = _app_from_env()
