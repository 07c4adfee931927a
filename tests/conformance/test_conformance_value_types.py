"""C7: the same step values come back the same on Celery and on Dramatiq, with real workers.

One table of values, one job per framework on Redis with an in-process
worker. Every value is a step's return value; the job then sleeps, so the
next attempt replays every step from the store. Under each framework's
default JSON serializer, the core's ``JsonSerializer`` keeps ``datetime``
(aware or naive), ``date``, ``time``, ``timedelta``, ``Decimal``, ``UUID`` and
``bytes``; a tuple comes back as a list; NaN and the infinities come back as
floats, as Python's ``json`` and the frameworks' own JSON carry them. The value
is the same, and of the same type, on the first attempt, on the replay and on
both frameworks.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Iterator
from datetime import date, datetime, time, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from flexiq_plugins import DurableConfig, JobEnvelope, SqlStepStore, StepStore, UnknownRun, current_job, new_run_key
from flexiq_plugins._attempt import decisions
from flexiq_plugins.integration import AttemptDriver, JobInfo
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
    ("nan", math.nan, None),
    ("infinity", math.inf, None),
    ("minus_infinity", -math.inf, None),
]


def expected(value: Any, decoded: Any) -> Any:
    """What a step returning ``value`` gives back on every attempt."""
    return value if decoded is None else decoded


def same(got: Any, want: Any) -> bool:
    """``got == want``, with NaN equal to NaN (a float NaN never equals itself)."""
    if isinstance(want, float) and math.isnan(want):
        return isinstance(got, float) and math.isnan(got)
    return bool(got == want)


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
def values_store(tmp_path: Path) -> Iterator[SqlStepStore]:
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
def test_c7_supported_values_round_trip_the_same_on_both_frameworks(framework: str, values_store: SqlStepStore) -> None:
    """Each value of the table comes back equal and of the same type, first run and replay, on both."""
    store = values_store
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
        assert same(got, want), (framework, attempt, name, got)
        assert type(got) is type(want), (framework, attempt, name, type(got))
        if isinstance(want, datetime):
            assert got.utcoffset() == want.utcoffset(), (framework, attempt, name)


class LeaveTheRow(Exception):
    """Fails the first attempt after its step committed, so the next attempt replays the step."""


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
def test_c7_a_step_returning_nan_or_an_infinity_commits_and_replays_it_on_every_store(
    store: StepStore, value: float
) -> None:
    """A body returning ``float("nan")``, ``inf`` or ``-inf`` commits (no ``EncodeError`` dead letter); the
    replay returns the same float without calling the body, and so does a duplicate of the finished job (C7, C37).
    """
    driver = AttemptDriver(store, DurableConfig())
    calls: list[int] = []

    def body() -> float:
        got = float(current_job.step.run("x", lambda: calls.append(1) or value))
        if current_job.attempt == 1:
            raise LeaveTheRow
        return got

    def job(job_id: str) -> JobInfo:
        return JobInfo("run-nan", job_id, JobEnvelope("task", "test"))

    first = driver.run_job(job("job-1"), body)
    assert isinstance(first, decisions.Failure), first
    assert isinstance(first.error, LeaveTheRow)  # not an EncodeError: the step committed
    stored = store.get_steps("run-nan")[0].value
    assert stored == b"FQ1|json\n" + {"nan": b"NaN", "inf": b"Infinity", "-inf": b"-Infinity"}[repr(value)]
    replayed = driver.run_job(job("job-1"), body)
    assert isinstance(replayed, decisions.Completed), replayed
    assert same(replayed.value, value)
    assert calls == [1]
    duplicate = driver.run_job(job("job-2"), body)
    assert isinstance(duplicate, decisions.Replay), duplicate
    assert same(duplicate.value, value)
