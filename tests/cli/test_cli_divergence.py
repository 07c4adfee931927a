"""From a divergence dead letter to a completed run with the CLI alone, on real brokers (C11, C13, C30).

The checkout (``reserve``, ``charge``, a one-second sleep, ``notify``) sleeps;
a deploy renames ``reserve`` while it sleeps, so the wake-up diverges and the
job is dead-lettered. The fix is deployed and ``flexiq dlq retry`` re-publishes
the job through its own framework: it completes, the steps recorded before
the divergence are memo hits (their bodies ran once), and the idempotency
keys are those of the original run.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any
from uuid import uuid4

import dramatiq
import fq_cli_apps
import pytest
from celery.contrib.testing.worker import start_worker
from click.testing import Result
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.common import dq_name, xq_name

from dramatiq_ext import DurableSteps
from flexiq_plugins._store.sql import SqlStepStore
from tests.polling import wait_for


@pytest.fixture(autouse=True)
def deployed_version() -> Iterator[None]:
    """Start every test on version 1 of the checkout, and leave it there."""
    fq_cli_apps.VERSION["value"] = 1
    yield
    fq_cli_apps.VERSION["value"] = 1


def diverge_while_sleeping(store: SqlStepStore) -> str:
    """Wait for the run to sleep, deploy the diverging version, wait for its dead letter; return the run key."""
    run = wait_for(lambda: store.list_runs(status="sleeping"), 30, "the run to sleep")[0]
    fq_cli_apps.VERSION["value"] = 2
    wait_for(lambda: store.get_run(run.run_key).status == "dead", 30, "the divergence dead letter")
    fq_cli_apps.VERSION["value"] = 3  # the fix: the recorded sequence again
    return run.run_key


def dead_letter_of(flexiq: Callable[..., Result], run_key: str) -> dict[str, Any]:
    """The one dead letter of ``run_key``, as ``flexiq dlq list --json`` shows it."""
    (dead,) = [d for d in json.loads(flexiq("dlq", "list", "--json").stdout) if d["run_key"] == run_key]
    assert dead["reason"] == "divergence"
    return dead  # type: ignore[no-any-return]


@pytest.mark.redis
def test_c30_celery_divergence_retried_with_the_cli_completes(
    require_service: Callable[..., None],
    tmp_path: Path,
    store_url: str,
    store: SqlStepStore,
    flexiq: Callable[..., Result],
) -> None:
    """Celery on Redis: ``flexiq dlq retry ID --app`` finishes the run with a new task id, memo hits, same keys."""
    require_service("Redis", "127.0.0.1", 6379)
    name = f"fqcli{uuid4().hex[:8]}"
    calls = str(tmp_path / "calls.db")
    fq_cli_apps.celery_app = app = fq_cli_apps.make_celery_app(name, store_url, calls)
    try:
        with start_worker(app, pool="solo", perform_ping_check=False, loglevel="WARNING", shutdown_timeout=15):
            first = app.tasks[f"{name}.checkout"].delay(7, 1.0)
            run_key = diverge_while_sleeping(store)
            dead = dead_letter_of(flexiq, run_key)
            assert dead["framework"] == "celery"
            result = flexiq("dlq", "retry", str(dead["id"]), "--app", "fq_cli_apps:celery_app", "--json")
            assert result.exit_code == 0, result.output
            (retried,) = json.loads(result.stdout)["retried"]
            wait_for(lambda: store.get_run(run_key).status == "succeeded", 30, "the retried run to succeed")
        assert retried["run_key"] == run_key
        assert retried["job_id"] != first.id
        assert app.AsyncResult(retried["job_id"]).get(timeout=10) == "notify-7"
        assert fq_cli_apps.keys_of(calls, "reserve") == [f"{run_key}:reserve#0"]  # memo hit on the retry
        assert fq_cli_apps.keys_of(calls, "charge") == [f"{run_key}:charge#0"]
        assert fq_cli_apps.keys_of(calls, "notify") == [f"{run_key}:notify#0"]
    finally:
        fq_cli_apps.celery_app = None
        with app.connection_for_write() as conn:
            for queue in (name, f"{name}.dlq"):
                with suppress(Exception):
                    conn.default_channel.queue_delete(queue)


@pytest.fixture
def rabbitmq(require_service: Callable[..., None]) -> Iterator[tuple[RabbitmqBroker, str]]:
    """A RabbitMQ broker and a queue name of this test; the queues are deleted afterwards."""
    require_service("RabbitMQ", "127.0.0.1", 5672)
    broker = RabbitmqBroker(host="127.0.0.1", port=5672, heartbeat=0)
    queue = f"fqcli_{uuid4().hex[:8]}"
    broker.emit_after("process_boot")
    yield broker, queue
    for name in (queue, dq_name(queue), xq_name(queue)):
        with suppress(Exception):
            broker.channel.queue_delete(name)
    broker.close()


@pytest.mark.rabbitmq
def test_c11_dramatiq_divergence_retried_with_reset_from_keeps_the_keys(
    rabbitmq: tuple[RabbitmqBroker, str],
    tmp_path: Path,
    store: SqlStepStore,
    flexiq: Callable[..., Result],
) -> None:
    """Dramatiq on RabbitMQ: ``dlq retry ID --broker --reset-from charge#0`` re-runs ``charge`` with its original key.

    ``reserve`` is a memo hit (one real call); ``charge`` runs again because
    its memo was reset, with the very idempotency key of its first call, so
    the payment service deduplicates it (C11, C30).
    """
    broker, queue = rabbitmq
    broker.add_middleware(DurableSteps(store=store))
    calls = str(tmp_path / "calls.db")

    @dramatiq.actor(broker=broker, queue_name=queue, actor_name=f"{queue}_checkout", max_retries=5, min_backoff=100)
    def checkout(order: int, pause: float) -> None:
        fq_cli_apps.checkout(calls, order, pause)

    worker = dramatiq.Worker(broker, worker_timeout=100, worker_threads=2)
    worker.start()
    fq_cli_apps.dramatiq_broker = broker
    try:
        first = checkout.send(9, 1.0)
        run_key = diverge_while_sleeping(store)
        dead = dead_letter_of(flexiq, run_key)
        assert dead["framework"] == "dramatiq"
        wait_for(lambda: broker.get_queue_message_counts(queue)[2] == 1, 10, "the message in the .XQ")
        result = flexiq(
            "dlq", "retry", str(dead["id"]), "--broker", "fq_cli_apps:dramatiq_broker", "--reset-from", "charge#0"
        )
        assert result.exit_code == 0, result.output
        assert f"run {run_key} -> dramatiq job " in result.stdout
        wait_for(lambda: store.get_run(run_key).status == "succeeded", 30, "the retried run to succeed")
    finally:
        fq_cli_apps.dramatiq_broker = None
        worker.stop()
    new_job = result.stdout.split("dramatiq job ")[1].split()[0]
    assert new_job != first.message_id
    assert fq_cli_apps.keys_of(calls, "reserve") == [f"{run_key}:reserve#0"]
    assert fq_cli_apps.keys_of(calls, "charge") == [f"{run_key}:charge#0"] * 2
    assert fq_cli_apps.keys_of(calls, "notify") == [f"{run_key}:notify#0"]
