"""``flexiq recover`` and the sweeper: stranded runs are re-published, each exactly once (C35)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any
from uuid import uuid4

import fq_cli_apps
import pytest
import redis
from celery.contrib.testing.worker import start_worker
from cli_support import Runs
from click.testing import Result
from dramatiq import Message
from dramatiq.brokers.stub import StubBroker

from flexiq_plugins import DurableConfig, operations
from flexiq_plugins._store.base import StepStore
from flexiq_plugins._store.sql import SqlStepStore
from flexiq_plugins.integration import Attempt, AttemptDriver
from tests.polling import wait_for

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def queued_run_keys(broker: StubBroker, queue: str = "orders") -> list[str]:
    """The run keys of the messages waiting in the stub broker's ``queue``."""
    q = broker.queues.get(queue)
    items = [] if q is None else list(q.queue)
    return [Message.decode(m).options["flexiq_run_key"] for m in items]


def test_c35_dry_run_lists_each_kind_of_stranded_run(
    runs: Runs, store: SqlStepStore, flexiq: Callable[..., Result]
) -> None:
    """Overdue sleepers, expired claims and stale pending runs are listed; live ones are not; nothing changes (C35).
    A sleeper is due ``--grace`` past its wake time; a run whose claim lease expired is due at once."""
    runs.sleeping("overdue", overdue=True)
    runs.sleeping("dozing")
    short = AttemptDriver(store, DurableConfig(lease_seconds=0.2))
    assert isinstance(short.start(runs.job("worker-died")), Attempt)  # claimed, never renewed: the worker died
    assert isinstance(runs.driver.start(runs.job("working")), Attempt)
    store.prepare_retry(runs.dead("publish-failed"))
    wait_for(  # the dead worker's 0.2 s lease runs out on the store's clock
        lambda: len(operations.find_stranded(store, grace=0, stale_after=0)) == 3, 30, "the lease to expire"
    )
    before = {r.run_key: r.updated_at for r in store.list_runs()}
    result = flexiq("recover", "--dry-run", "--grace", "0s", "--stale-after", "0s", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert set(data) == {"dry_run", "recovered", "skipped", "failed", "settled"}
    assert data["dry_run"] is True
    found = {r["run_key"]: r["why"] for r in data["recovered"]}
    assert found == {"overdue": "sleep_overdue", "worker-died": "lease_expired", "publish-failed": "stale"}
    assert set(data["recovered"][0]) == {"run_key", "task_name", "framework", "status", "why", "due_at", "job_id"}
    assert {r.run_key: r.updated_at for r in store.list_runs()} == before
    quiet = flexiq("recover", "--dry-run", "--grace", "60s", "--json")  # and the default stale-after, 1h
    # an expired lease is its own grace: the dead worker's run is due at once, the others are not yet
    assert [r["run_key"] for r in json.loads(quiet.stdout)["recovered"]] == ["worker-died"]


def test_c35_recover_needs_a_publisher(flexiq: Callable[..., Result], runs: Runs) -> None:
    """Without ``--app`` or ``--broker`` a real recovery is a usage error (exit 2)."""
    runs.succeeded("r")
    result = flexiq("recover")
    assert result.exit_code == 2
    assert "--app module:app" in result.stderr


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_c35_concurrent_recovers_publish_each_run_once(
    backend: str, request: pytest.FixtureRequest, make_sql_store: Callable[..., SqlStepStore]
) -> None:
    """Four recoverers at once, each with its own store connection: every stranded run is published exactly once.

    Each thread opens its own ``SqlStepStore`` (as separate processes would)
    and they start together behind a barrier; ``mark_recovered`` lets one of
    them win each run (C35).
    """
    url = request.getfixturevalue(f"{backend}_url")
    first = make_sql_store(url)
    runs = Runs(first)
    keys = [f"run-{i:02d}" for i in range(15)]
    for key in keys:
        runs.sleeping(key, overdue=True, framework="dramatiq")
    # Every run is past its wake time plus the grace on the store's clock, so
    # all four recoverers see the same fifteen candidates.
    assert len(operations.find_stranded(first, grace=0.5)) == len(keys)
    broker = StubBroker()
    broker.declare_queue("orders")  # StubBroker.declare_queue is not thread-safe: two threads could each make it
    stores: list[StepStore] = [first] + [SqlStepStore(url, table_prefix=first.table_prefix) for _ in range(3)]
    barrier = threading.Barrier(len(stores))
    reports: list[operations.RecoveryReport] = []
    errors: list[BaseException] = []

    def recoverer(store: StepStore) -> None:
        barrier.wait()
        try:
            reports.append(operations.recover(store, operations.publishers_for(broker), grace=0.5))
        except BaseException as exc:
            errors.append(exc)
            raise

    threads = [threading.Thread(target=recoverer, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for s in stores[1:]:
        s.close()
    assert errors == [], "every recoverer must run to its end"
    assert len(reports) == len(stores)
    assert sorted(queued_run_keys(broker)) == keys
    assert sum(len(r.recovered) for r in reports) == len(keys)
    assert all(not r.failed for r in reports)


def test_c35_sweeper_recovers_in_the_background(runs: Runs, store: SqlStepStore) -> None:
    """A started ``Sweeper`` re-publishes an overdue sleeper on its own, once, and stops when asked (C35)."""
    runs.sleeping("late", overdue=True, framework="dramatiq")
    broker = StubBroker()
    publishers = operations.publishers_for(broker)
    sweeper = operations.Sweeper(store, publishers, interval=0.1, grace=0.3).start()
    try:
        wait_for(lambda: queued_run_keys(broker) == ["late"], 10, "the sweeper to re-publish the run")
        time.sleep(0.3)
    finally:
        sweeper.stop(timeout=5)
    assert queued_run_keys(broker) == ["late"]


# ---------------------------------------------------------- Celery on Redis
@pytest.mark.redis
def test_c35_a_sleeper_whose_wake_up_was_purged_completes_after_recover(
    require_service: Callable[..., None], tmp_path: Path, store_url: str, store: SqlStepStore
) -> None:
    """A sleeping Celery run whose wake-up was purged from Redis: two ``flexiq recover`` at once publish it once.

    The run stays asleep past its wake time (nothing will wake it), two
    ``flexiq recover --app`` processes start together, exactly one of them
    re-publishes, and the run completes: ``reserve`` and ``charge`` ran once
    (memo hits on the recovered attempt), ``notify`` once (C35, C11).
    """
    require_service("Redis", "127.0.0.1", 6379)
    name = f"fqcli{uuid4().hex[:8]}"
    calls = str(tmp_path / "calls.db")
    app = fq_cli_apps.make_celery_app(name, store_url, calls)
    try:
        with start_worker(app, pool="solo", perform_ping_check=False, loglevel="WARNING", shutdown_timeout=15):
            app.tasks[f"{name}.checkout"].delay(7, 1.0)
            run = wait_for(lambda: store.list_runs(status="sleeping"), 30, "the run to sleep")[0]
        _purge_celery_queue(app, name)
        wake_at = operations.show_run(store, run.run_key).wake_at
        assert wake_at is not None
        with start_worker(app, pool="solo", perform_ping_check=False, loglevel="WARNING", shutdown_timeout=15):
            wait_for(lambda: store.now() > wake_at + 1.5, 30, "the wake time and grace to pass")
            assert store.get_run(run.run_key).status == "sleeping"  # the wake-up is gone: stranded
            outputs = _two_recovers(name, store_url, calls)
            recovered = [r for out in outputs for r in out["recovered"]]
            assert [(r["run_key"], r["why"]) for r in recovered] == [(run.run_key, "sleep_overdue")]
            wait_for(lambda: store.get_run(run.run_key).status == "succeeded", 30, "the run to complete")
        assert [len(fq_cli_apps.keys_of(calls, w)) for w in ("reserve", "charge", "notify")] == [1, 1, 1]
        assert fq_cli_apps.keys_of(calls, "notify") == [f"{run.run_key}:notify#0"]
    finally:
        _delete_celery_queues(app, [name, f"{name}.dlq"])


def _two_recovers(name: str, store_url: str, calls: str) -> list[dict[str, Any]]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE)]),
        "FQ_CLI_QUEUE": name,
        "FQ_CLI_STORE": store_url,
        "FQ_CLI_CALLS": calls,
    }
    command = [
        sys.executable, "-c", "from flexiq_plugins.cli import main; main()",
        "--store", store_url, "recover", "--grace", "1s", "--app", "fq_cli_apps:celery_app", "--json",
    ]  # fmt: skip
    procs = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    results = [p.communicate(timeout=60) for p in procs]
    for p, (_, err) in zip(procs, results, strict=True):
        assert p.returncode == 0, err.decode()
    return [json.loads(out) for out, _ in results]


def _purge_celery_queue(app: Any, name: str) -> None:
    """Delete the run's wake-up message: the queue and any message Redis still holds unacknowledged."""
    with app.connection_for_write() as conn:
        conn.default_channel.queue_purge(name)
    client = redis.Redis.from_url(fq_cli_apps.REDIS_URL)
    for key in ("unacked", "unacked_index"):
        client.delete(key)
    assert client.llen(name) == 0


def _delete_celery_queues(app: Any, names: list[str]) -> None:
    with app.connection_for_write() as conn:
        for queue in names:
            with suppress(Exception):  # never declared
                conn.default_channel.queue_delete(queue)


def test_c35_a_short_sleep_recorded_after_its_wake_time_is_recovered() -> None:
    """A sleeping run whose ``sleeping`` record landed after its own wake time is overdue all the same (C35).

    A 50 ms sleep on a slow database: the sleep step commits at T with wake
    time T + 0.05, the attempt's ``finish`` lands at T + 0.2. Recovery decides
    on the recorded status and wake time, not on whether ``updated_at`` comes
    before the wake time; after it is re-published once, it is not taken again
    until ``stale_after`` has passed.
    """
    from flexiq_plugins import JobEnvelope, MemoryStepStore
    from flexiq_plugins._model.records import Begun, StepRow
    from flexiq_plugins.testing import FakeClock

    clock = FakeClock()
    store = MemoryStepStore(clock=clock)
    begun = store.begin("short", "job-1", JobEnvelope("nap", "dramatiq", "orders"), "w1", 30.0)
    assert isinstance(begun, Begun)
    wake_at = clock() + 0.05
    store.commit_step(begun.claim, StepRow(0, "sleep#0", "sleep", None, wake_at))
    clock.advance(0.2)  # the database was slow: the run is recorded sleeping after its wake time
    store.finish(begun.claim, "sleeping", wake_at=wake_at)
    clock.advance(1)

    (stranded,) = operations.find_stranded(store, grace=0.5, stale_after=60)
    assert (stranded.run.run_key, stranded.why, stranded.due_at) == ("short", "sleep_overdue", wake_at)
    report = operations.recover(store, operations.publishers_for(StubBroker()), grace=0.5, stale_after=60)
    assert [s.run.run_key for s, _ in report.recovered] == ["short"]
    assert operations.find_stranded(store, grace=0.5, stale_after=60) == []  # recovered once, not again
    clock.advance(61)
    assert [s.run.run_key for s in operations.find_stranded(store, grace=0.5, stale_after=60)] == ["short"]
