"""Dead letters on Celery (C13, C29, C30): recorded once, never retried, on the broker's dead-letter path."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery, signals
from celery_support import in_process_worker, wait_for
from flexiq_celery_testapp import VERSION, count_calls
from kombu import Exchange, Queue

import celery_ext
import flexiq_plugins
from flexiq_plugins.errors import ConfigurationError, DeadLettered

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def retries_seen() -> Iterator[list[str]]:
    """Task ids of every Celery retry (``task_retry`` signal) during the test."""
    seen: list[str] = []

    def on_retry(request: Any = None, **_: Any) -> None:
        seen.append(request.id)

    signals.task_retry.connect(on_retry, weak=False)
    yield seen
    signals.task_retry.disconnect(on_retry)


@pytest.fixture
def deployed() -> Iterator[dict[str, int]]:
    """The "deployed" version of the diverging task, back to 1 afterwards."""
    VERSION["value"] = 1
    yield VERSION
    VERSION["value"] = 1


def declare_rabbitmq_dead_letter_exchange(app: Celery) -> str:
    """Make ``app``'s queue dead-letter into a DLX bound to a queue; return that queue's name."""
    name = app.main
    dlx = Exchange(f"{name}.dlx", "fanout", auto_delete=True)
    dead = Queue(f"{name}.dlx-queue", dlx)
    app.conf.task_queues = [
        Queue(name, Exchange(name, "direct"), routing_key=name, queue_arguments={"x-dead-letter-exchange": dlx.name})
    ]
    with app.connection_for_write() as conn:
        dead.bind(conn.default_channel).declare()
    return dead.name


def dead_messages(app: Celery, broker: str) -> list[Any]:
    """The messages on the broker's dead-letter path: the DLQ list (Redis) or the DLX-bound queue."""
    if broker.startswith("redis"):
        client = redis.Redis.from_url(broker)
        return list(client.lrange(f"{app.main}.dlq", 0, -1))
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        found = []
        while (message := channel.basic_get(f"{app.main}.dlx-queue", no_ack=True)) is not None:
            found.append(message)
        return found


def test_c13_divergence_after_a_deploy_is_dead_lettered_once(  # noqa: PLR0917 - fixtures
    broker: str, sqlite_store: Any, make_celery_app: Any, calls: str, retries_seen: list[str], deployed: dict[str, int]
) -> None:
    """A job sleeping under version 1 of a task wakes under version 2, whose first step changed
    (C12): it is dead-lettered once (C13) though the task has ``autoretry_for=(Exception,)`` and
    ``max_retries=20``: no Celery retry, the store records the dead letter with reason
    ``divergence``, ``AsyncResult.get`` raises :class:`DeadLettered`, and the message is on the
    broker's dead-letter path (Redis: the DLQ list; RabbitMQ: the queue bound to the DLX)."""
    app = make_celery_app(broker, sqlite_store)
    if broker.startswith("amqp"):
        declare_rabbitmq_dead_letter_exchange(app)
    with in_process_worker(app):
        result = app.tasks[f"{app.main}.diverging"].delay(1.0)
        wait_for(lambda: [r for r in sqlite_store.list_runs() if r.status == "sleeping"], 15, "the sleep")
        deployed["value"] = 2
        with pytest.raises(DeadLettered, match="divergence") as info:
            result.get(timeout=20)
        assert "reserve#0" in str(info.value)
        assert "allocate#0" in str(info.value)
        found = wait_for(lambda: dead_messages(app, broker), 10, "the dead-lettered message")
    assert len(found) == 1
    assert retries_seen == []
    (dead,) = sqlite_store.list_dead_letters()
    assert dead.reason == "divergence"
    assert dead.job_id == result.id
    assert sqlite_store.get_run(dead.run_key).status == "dead"
    assert count_calls(calls, "reserve") == 1
    assert count_calls(calls, "allocate") == 0
    assert result.state == "FAILURE"


def test_c13_divergence_is_not_retried_by_a_manual_self_retry(
    redis_broker: str, sqlite_store: Any, make_celery_app: Any, retries_seen: list[str], deployed: dict[str, int]
) -> None:
    """A ``self.retry()`` in an ``except Exception`` block does not catch the divergence signal
    (C20) and nothing in the adapter turns it into a retry (C13): one dead letter, no retry."""
    app = make_celery_app(redis_broker, sqlite_store)
    with in_process_worker(app):
        result = app.tasks[f"{app.main}.diverging_manual"].delay(0.5)
        wait_for(lambda: [r for r in sqlite_store.list_runs() if r.status == "sleeping"], 15, "the sleep")
        deployed["value"] = 2
        with pytest.raises(DeadLettered, match="divergence"):
            result.get(timeout=20)
    assert retries_seen == []
    assert len(sqlite_store.list_dead_letters()) == 1


def test_c29_duplicate_step_key_is_dead_lettered_not_autoretried(
    redis_broker: str, sqlite_store: Any, make_celery_app: Any, calls: str, retries_seen: list[str]
) -> None:
    """``DuplicateStepKey`` is an ``Exception``, so ``autoretry_for=(Exception,)`` catches it; the
    adapter's ``retry`` refuses to retry what is never retried (C29): the body ran once, no retry
    was published, one dead letter with reason ``duplicate_step_key``."""
    app = make_celery_app(redis_broker, sqlite_store)
    with in_process_worker(app):
        result = app.tasks[f"{app.main}.duplicate_key"].delay()
        with pytest.raises(DeadLettered, match="duplicate_step_key"):
            result.get(timeout=20)
    assert retries_seen == []
    assert count_calls(calls, "duplicate_key") == 1
    assert [d.reason for d in sqlite_store.list_dead_letters()] == ["duplicate_step_key"]


def test_c30_dead_letter_retry_republishes_with_the_same_run_key(
    redis_broker: str, sqlite_store: Any, make_celery_app: Any, calls: str, deployed: dict[str, int]
) -> None:
    """After a divergence, an operator resets the changed step and re-publishes the stored
    envelope with ``celery_ext.republish`` (C30, C35): a new task id, the same run key (C11); the
    run replays and succeeds under the new version."""
    app = make_celery_app(redis_broker, sqlite_store)
    with in_process_worker(app):
        first = app.tasks[f"{app.main}.diverging"].delay(0.3)
        wait_for(lambda: [r for r in sqlite_store.list_runs() if r.status == "sleeping"], 15, "the sleep")
        deployed["value"] = 2
        with pytest.raises(DeadLettered):
            first.get(timeout=20)
        (dead,) = sqlite_store.list_dead_letters()
        sqlite_store.prepare_retry(dead.id, reset_from="reserve#0")
        again = celery_ext.republish(app, dead.envelope, dead.run_key)
        assert again.get(timeout=20) == "shipped"
    assert again.id != first.id
    assert sqlite_store.get_run(dead.run_key).status == "succeeded"
    assert count_calls(calls, "allocate") == 1


def test_c30_the_redis_dead_letter_queue_keeps_only_its_newest_messages(
    redis_broker: str, sqlite_store: Any, make_celery_app: Any
) -> None:
    """On Redis the dead-letter list, which nothing consumes, is trimmed after each publish to its newest
    ``dead_letter_queue_max_length`` messages; the store keeps every dead letter (C30)."""
    app = make_celery_app(redis_broker, sqlite_store, dead_letter_queue_max_length=2)
    task = app.tasks[f"{app.main}.duplicate_key"]
    ids = []
    with in_process_worker(app):
        for _ in range(3):
            result = task.delay()
            with pytest.raises(DeadLettered, match="duplicate_step_key"):
                result.get(timeout=20)
            ids.append(result.id)  # the worker published and trimmed before it stored the failure
    kept = dead_messages(app, redis_broker)
    assert sorted(json.loads(message)["headers"]["id"] for message in kept) == sorted(ids[1:])  # the oldest went
    assert len(sqlite_store.list_dead_letters()) == 3


def test_c30_the_dead_letter_queue_bound_is_checked_at_install(sqlite_store: Any) -> None:
    """``dead_letter_queue_max_length`` is ``None`` (no bound) or a positive int; anything else fails at install."""
    bound = Celery("fqt-bound", set_as_current=False)
    with pytest.raises(ConfigurationError, match="dead_letter_queue_max_length=0 must be None or an int"):
        celery_ext.install(bound, store=sqlite_store, dead_letter_queue_max_length=0)
    app = Celery("fqt-unbounded", set_as_current=False)
    celery_ext.install(app, store=sqlite_store, dead_letter_queue_max_length=None)
    assert celery_ext.runtime_of(app).config.dead_letter_queue_max_length is None  # type: ignore[union-attr]


@pytest.mark.parametrize("how", ["worker", "apply"])
def test_c30_except_dead_lettered_catches_what_celery_raises_for_a_dead_letter(
    how: str, redis_broker: str, sqlite_store: Any, make_celery_app: Any
) -> None:
    """The dead letter of a Celery job, read back through the result backend or raised by an eager
    ``apply``, is caught by ``except flexiq_plugins.DeadLettered``: one error for a dead letter on
    every adapter (C30); its message starts with the reason kind."""
    app = make_celery_app(redis_broker, sqlite_store)
    task = app.tasks[f"{app.main}.duplicate_key"]
    caught: flexiq_plugins.DeadLettered | None = None
    try:
        if how == "apply":
            task.apply(throw=True)
        else:
            with in_process_worker(app):
                task.delay().get(timeout=20)
    except flexiq_plugins.DeadLettered as exc:
        caught = exc
    assert caught is not None
    assert str(caught).startswith("duplicate_step_key: ")
    assert [d.reason for d in sqlite_store.list_dead_letters()] == ["duplicate_step_key"]
