"""Dramatiq: a new message's run is recorded ``queued`` at enqueue, unless the actor or the message opts out
(C39), whether the middleware minted its run key or the producer chose it (C46). A ``StubBroker`` with no
worker: what the store holds is what the enqueue wrote.
Every actor here declares ``durable=True`` (C43): only an actor known to take steps is recorded; one not
known yet is not (the C43 tests).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker

from dramatiq_ext import RUN_KEY_OPTION, DurableSteps
from flexiq_plugins import SqlStepStore, UnknownRun, operations
from tests.polling import wait_for


def _status(store: SqlStepStore, run_key: str) -> str | None:
    try:
        return store.get_run(run_key).status
    except UnknownRun:
        return None


def test_c39_a_new_message_is_queued_and_opt_outs_are_honoured(tmp_path: Path) -> None:
    """C39: ``send`` records the run ``queued`` and flags the message; ``record_at_publish=False`` on the actor
    or ``flexiq_record=False`` on the message records nothing (C46: not even with a run key of its own)."""
    store = SqlStepStore(f"sqlite:///{tmp_path / 'steps.db'}")
    broker = StubBroker()
    broker.add_middleware(DurableSteps(store=store))

    @dramatiq.actor(durable=True, broker=broker, queue_name="orders")
    def ship(order: str) -> str:
        return order

    @dramatiq.actor(durable=True, broker=broker, queue_name="orders", record_at_publish=False)
    def hot() -> None: ...

    sent = ship.send("A-1")
    run = store.get_run(sent.options[RUN_KEY_OPTION])
    assert (run.status, run.job_id) == ("queued", sent.message_id)
    assert (run.envelope.args, run.envelope.queue) == (["A-1"], "orders")
    assert sent.options["flexiq_recorded"] is True

    for message in (
        hot.send(),
        ship.send_with_options(args=("B-2",), flexiq_record=False),
        ship.send_with_options(args=("C-3",), flexiq_record=False, **{RUN_KEY_OPTION: "order-C-3"}),
        hot.send_with_options(**{RUN_KEY_OPTION: "order-hot"}),
    ):
        assert _status(store, message.options[RUN_KEY_OPTION]) is None
        assert "flexiq_recorded" not in message.options
    broker.close()
    store.close()


def test_c46_a_message_with_its_own_run_key_is_queued_unless_its_run_exists(tmp_path: Path) -> None:
    """C46: ``send_with_options(flexiq_run_key=...)`` records the run ``queued`` and flags the message, as a
    minted key does; a second message with that key leaves the run as it is; a message the middleware
    publishes again for a run (a run key and the resume mark) is never recorded."""
    store = SqlStepStore(f"sqlite:///{tmp_path / 'steps.db'}")
    broker = StubBroker()
    broker.add_middleware(DurableSteps(store=store))

    @dramatiq.actor(durable=True, broker=broker, queue_name="orders")
    def ship(order: str) -> str:
        return order

    sent = ship.send_with_options(args=("A-1",), **{RUN_KEY_OPTION: "order-A-1"})
    run = store.get_run("order-A-1")
    assert (run.status, run.job_id, run.envelope.args) == ("queued", sent.message_id, ["A-1"])
    assert sent.options["flexiq_recorded"] is True
    again = ship.send_with_options(args=("B-2",), **{RUN_KEY_OPTION: "order-A-1"})
    assert again.options[RUN_KEY_OPTION] == "order-A-1"
    assert store.get_run("order-A-1") == run
    hop = ship.send_with_options(args=("C-3",), **{RUN_KEY_OPTION: "run-C-3", "flexiq_resume": True})
    assert _status(store, "run-C-3") is None
    assert "flexiq_recorded" not in hop.options
    broker.close()
    store.close()


def test_c39_a_delay_is_recorded_as_the_runs_due_time(tmp_path: Path) -> None:
    """C39: ``send_with_options(delay=...)`` records when the message is due, so recovery never runs it early."""
    store = SqlStepStore(f"sqlite:///{tmp_path / 'steps.db'}")
    broker = StubBroker()
    broker.add_middleware(DurableSteps(store=store))

    @dramatiq.actor(durable=True, broker=broker, queue_name="orders")
    def later() -> None: ...

    sent = later.send_with_options(delay=3_600_000)
    run = store.get_run(sent.options[RUN_KEY_OPTION])
    assert run.status == "queued"
    assert run.wake_at is not None
    assert run.wake_at - run.created_at > 3500
    broker.close()
    store.close()


def test_c39_a_recovery_copy_does_not_run_a_job_its_original_handed_to_retries(tmp_path: Path) -> None:
    """C39: a recorded message waits in a backlog past ``recovery_queued_seconds``, so recovery publishes a
    copy; the original then runs first and fails, and ``Retries`` schedules its retry. The copy, marked to
    run only while the run never started, is dropped: the body runs twice (the original and its one
    retry), not three or four times."""
    from dramatiq.middleware import Retries

    from flexiq_plugins import operations

    store = SqlStepStore(f"sqlite:///{tmp_path / 'steps.db'}")
    broker = StubBroker()
    broker.add_middleware(DurableSteps(store=store, recovery=False), before=Retries)
    ran: list[str] = []

    @dramatiq.actor(durable=True, broker=broker, queue_name="orders", max_retries=1, min_backoff=200, max_backoff=200)
    def charge(order: str) -> None:
        ran.append(order)
        raise ValueError("card declined")

    run_key = charge.send("o-1").options[RUN_KEY_OPTION]
    report = operations.recover(store, operations.publishers_for(broker), grace=0, queued_after=0)
    assert [why for stranded, _ in report.recovered for why in [stranded.why]] == ["never_started"]
    worker = dramatiq.Worker(broker, worker_threads=1, worker_timeout=100)
    worker.start()
    try:
        broker.join("orders", fail_fast=False)
        worker.join()
    finally:
        worker.stop()
    assert ran == ["o-1", "o-1"]
    assert store.get_run(run_key).status == "failed"
    broker.close()
    store.close()


def _redis_brokers(namespace: str, store: SqlStepStore) -> tuple[Any, Any, Any]:
    """A producer broker with the middleware and ``Results``, a bare one (``Results`` only) on the same Redis
    namespace, and their shared results backend."""
    from dramatiq.brokers.redis import RedisBroker
    from dramatiq.results import Results
    from dramatiq.results.backends import RedisBackend

    backend = RedisBackend(host="127.0.0.1", port=6379, namespace=f"{namespace}-results")
    producer = RedisBroker(host="127.0.0.1", port=6379, namespace=namespace)
    producer.add_middleware(Results(backend=backend))
    producer.add_middleware(DurableSteps(store=store, recovery=False))
    bare = RedisBroker(host="127.0.0.1", port=6379, namespace=namespace)
    bare.add_middleware(Results(backend=backend))
    return producer, bare, backend


def _drop_namespace(broker: Any, namespace: str) -> None:
    keys = list(broker.client.scan_iter(f"{namespace}*"))
    if keys:
        broker.client.delete(*keys)


@pytest.mark.redis
def test_c47_a_job_a_worker_without_the_middleware_failed_is_settled_not_re_published(
    namespace: str, queue: str, sqlite_store: SqlStepStore, require_service: Callable[[str, str, int], None]
) -> None:
    """C47, C39: the producer has ``DurableSteps`` and records the run; the worker that takes the message has
    no middleware (forgotten), runs the body, which fails, and ``Results`` stores the error. Recovery reads it
    and settles the run ``failed``: the body is not run again under a new message."""
    from dramatiq.results import ResultFailure, ResultMissing

    require_service("Redis", "127.0.0.1", 6379)
    producer, bare, backend = _redis_brokers(namespace, sqlite_store)
    ran: list[str] = []

    def charge(order: str) -> None:
        ran.append(order)
        raise ValueError("card declined")

    options = {"actor_name": "charge", "queue_name": queue, "store_results": True, "max_retries": 0}
    sent = dramatiq.actor(charge, broker=producer, durable=True, **options).send("o-1")
    dramatiq.actor(charge, broker=bare, **options)

    def failed() -> bool:
        try:
            backend.get_result(sent, block=False)
        except ResultFailure:
            return True
        except ResultMissing:
            return False
        return False

    worker = dramatiq.Worker(bare, worker_threads=1, worker_timeout=100)
    worker.start()
    try:
        wait_for(failed, 30, "the bare worker to fail the job")
        run_key = sent.options[RUN_KEY_OPTION]
        assert sqlite_store.get_run(run_key).status == "queued"  # nothing told the store
        report = operations.recover(sqlite_store, operations.publishers_for(producer), grace=0, queued_after=0)
        assert [(s.run.run_key, status) for s, status in report.settled] == [(run_key, "failed")]
        assert report.recovered == []
        assert sqlite_store.get_run(run_key).status == "failed"
        bare.join(queue)  # nothing was re-published for the worker to run
        worker.join()
    finally:
        worker.stop()
        _drop_namespace(producer, namespace)
        producer.close()
        bare.close()
    assert ran == ["o-1"]


@pytest.mark.redis
@pytest.mark.parametrize("lost", [True, False], ids=["message-lost", "message-late"])
def test_c39_a_re_published_message_keeps_its_id_so_its_waiter_gets_the_result_and_the_body_runs_once(
    lost: bool,
    namespace: str,
    queue: str,
    sqlite_store: SqlStepStore,
    require_service: Callable[[str, str, int], None],
) -> None:
    """C39, C24, C37: recovery re-publishes a ``queued`` run under its original message id. Lost: the queue was
    flushed before any worker took it; late: the original is still there, so two messages of one id reach the
    worker and the run's claim lets one run the body. Either way ``message.get_result()`` on the message the
    producer holds returns the value, and the body ran once."""
    require_service("Redis", "127.0.0.1", 6379)
    producer, bare, backend = _redis_brokers(namespace, sqlite_store)
    bare.close()
    ran: list[str] = []

    @dramatiq.actor(durable=True, broker=producer, actor_name="ship", queue_name=queue, store_results=True)
    def ship(order: str) -> str:
        ran.append(order)
        return f"shipped {order}"

    sent = ship.send("A-1")
    if lost:
        producer.flush(queue)
        assert list(producer.client.scan_iter(f"{namespace}:{queue}*")) == []  # the message is gone
    report = operations.recover(sqlite_store, operations.publishers_for(producer), grace=0, queued_after=0)
    assert [job_id for _, job_id in report.recovered] == [sent.message_id]
    worker = dramatiq.Worker(producer, worker_threads=2, worker_timeout=100)
    worker.start()
    try:
        assert backend.get_result(sent, block=True, timeout=30_000) == "shipped A-1"
        producer.join(queue)
        worker.join()
    finally:
        worker.stop()
        _drop_namespace(producer, namespace)
        producer.close()
    assert sqlite_store.get_run(sent.options[RUN_KEY_OPTION]).status == "succeeded"
    assert ran == ["A-1"]
