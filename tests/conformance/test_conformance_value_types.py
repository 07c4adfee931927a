"""C7: the same step values come back the same on Celery and on Dramatiq, with real workers.

One table of values, one job per framework on Redis with an in-process
worker. Every value is a step's return value; the job then sleeps, so the
next attempt replays every step from the store. Under each framework's
default JSON serializer, the core's ``JsonSerializer`` keeps ``datetime``
(aware or naive), ``date``, ``time``, ``timedelta``, ``Decimal``, ``UUID`` and
``bytes``; a tuple comes back as a list. The value is the same, and of the
same type, on the first attempt, on the replay and on both frameworks.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from datetime import date, datetime, time, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from flexiq_plugins import SqlStepStore, UnknownRun, current_job, new_run_key
from tests.conftest import require_service
from tests.polling import wait_for

REDIS = ("Redis", "127.0.0.1", 6379)
CET = timezone(timedelta(hours=1))

VALUES: list[tuple[str, Any, Any]] = [
    # (step name, the value the body returns, the value every attempt gets back)
    ("aware_datetime", datetime(2025, 1, 2, 3, 4, 5, 123456, tzinfo=CET), None),
    ("naive_datetime", datetime(2025, 1, 2, 3, 4, 5), None),
    ("date", date(2025, 1, 2), None),
    ("time", time(3, 4, 5, 6), None),
    ("timedelta", timedelta(days=-1, seconds=5, microseconds=7), None),
    ("decimal", Decimal("19.990"), None),
    ("uuid", uuid.UUID("0193d1b2-7f1a-7c4e-9d3b-52c0f0a3e0b1"), None),
    ("bytes", b"\x00\xff raw", None),
    ("tuple", (1, "two"), [1, "two"]),
    ("nested", {"at": date(2025, 1, 2), "amounts": [Decimal("1.5"), Decimal("2")]}, None),
]


def expected(value: Any, decoded: Any) -> Any:
    """What a step returning ``value`` gives back on every attempt."""
    return value if decoded is None else decoded


def _body(seen: list[tuple[int, str, Any]]) -> None:
    step = current_job.step
    for name, value, _ in VALUES:
        seen.append((current_job.attempt, name, step.run(name, lambda value=value: value)))
    step.sleep("200ms")  # the next attempt replays every step from the store


def _succeeded(store: SqlStepStore, run_key: str) -> bool:
    try:
        return store.get_run(run_key).status == "succeeded"
    except UnknownRun:
        return False


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqlStepStore]:
    """A SQLite store of this test."""
    sql = SqlStepStore(f"sqlite:///{tmp_path / 'steps.db'}")
    yield sql
    sql.close()


def _on_celery(store: SqlStepStore, seen: list[tuple[int, str, Any]]) -> Callable[[], str]:
    from celery import Celery
    from celery.contrib.testing.worker import start_worker

    import celery_ext

    queue = f"fqv{uuid.uuid4().hex[:8]}"
    app = Celery(queue, broker="redis://127.0.0.1:6379/12", set_as_current=False)
    app.conf.update(task_default_queue=queue, worker_hijack_root_logger=False)
    celery_ext.install(app, store=store, keep_succeeded_steps=True)

    @app.task(name=f"{queue}.values")
    def values() -> None:
        _body(seen)

    def run() -> str:
        run_key = new_run_key()
        with start_worker(app, pool="solo", perform_ping_check=False, loglevel="WARNING"):
            values.apply_async(headers={"flexiq_run_key": run_key})
            wait_for(lambda: _succeeded(store, run_key), 30, "the run to succeed")
        with app.connection_for_write() as conn:
            conn.default_channel.queue_delete(queue)
        return run_key

    return run


def _on_dramatiq(store: SqlStepStore, seen: list[tuple[int, str, Any]]) -> Callable[[], str]:
    import dramatiq
    from dramatiq.brokers.redis import RedisBroker

    from dramatiq_ext import RUN_KEY_OPTION, DurableSteps

    namespace = f"flexiq-test-{uuid.uuid4().hex[:10]}"
    broker = RedisBroker(host="127.0.0.1", namespace=namespace)
    broker.add_middleware(DurableSteps(store=store, keep_succeeded_steps=True))

    @dramatiq.actor(broker=broker, queue_name="values", actor_name="values")
    def values() -> None:
        _body(seen)

    def run() -> str:
        worker = dramatiq.Worker(broker, worker_timeout=100, worker_threads=1)
        worker.start()
        try:
            run_key = new_run_key()
            values.send_with_options(**{RUN_KEY_OPTION: run_key})
            wait_for(lambda: _succeeded(store, run_key), 30, "the run to succeed")
        finally:
            worker.stop()
            keys = list(broker.client.scan_iter(f"{namespace}:*"))
            if keys:
                broker.client.delete(*keys)
            broker.close()
        return run_key

    return run


@pytest.mark.redis
@pytest.mark.parametrize("framework", ["celery", "dramatiq"])
def test_c7_supported_values_round_trip_the_same_on_both_frameworks(framework: str, store: SqlStepStore) -> None:
    """Each value of the table comes back equal and of the same type, first run and replay, on both."""
    require_service(*REDIS)
    seen: list[tuple[int, str, Any]] = []
    run = (_on_celery if framework == "celery" else _on_dramatiq)(store, seen)()

    attempts = {attempt for attempt, _, _ in seen}
    assert attempts == {1, 2}, seen  # the first run, then the replay after the sleep
    serializer = store.get_steps(run)[0].value.partition(b"\n")[0]  # type: ignore[union-attr]
    assert serializer == b"FQ1|json"  # the core's JsonSerializer, under each framework's JSON default
    for attempt, name, got in seen:
        (value, decoded) = next((v, d) for n, v, d in VALUES if n == name)
        want = expected(value, decoded)
        assert got == want, (framework, attempt, name, got)
        assert type(got) is type(want), (framework, attempt, name, type(got))
        if isinstance(want, datetime):
            assert got.utcoffset() == want.utcoffset(), (framework, attempt, name)
