"""The publish-side cost of recording a new job's run at publish (C39).

    .venv/bin/python benchmarks/bench_publish.py [--jobs 500] [--store URL ...]

For each framework (Celery ``delay``, Dramatiq ``send``, both on the local
Redis) and each store, it times ``--jobs`` publishes of a durable task with
``record_at_publish`` on (one insert into the store before the message
leaves) and off (a task with ``record_at_publish=False``), both declared
``durable=True`` (a task not known to take steps is never recorded, C43),
and prints the
time per publish and the ratio on/off. Ratios, not absolute times, are what
to compare between machines. No worker runs; the queues are deleted after.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from uuid import uuid4

REDIS = "redis://127.0.0.1:6379/14"


def _time(send: Callable[[], Any], jobs: int) -> float:
    send()  # warm-up: connections, schema
    started = time.perf_counter()
    for _ in range(jobs):
        send()
    return (time.perf_counter() - started) / jobs


def celery_pair(store: str) -> tuple[Callable[[], Any], Callable[[], Any], Callable[[], None]]:
    """``delay`` of a recorded task and of one with ``record_at_publish=False``, and a cleanup."""
    from celery import Celery

    import celery_ext
    from celery_ext import runtime_of

    app = Celery(f"bench{uuid4().hex[:8]}", broker=REDIS, set_as_current=False)
    app.conf.task_default_queue = app.main
    celery_ext.install(app, store=store, recovery=False)

    @app.task(name=f"{app.main}.on", durable=True)
    def on() -> None: ...

    @app.task(name=f"{app.main}.off", durable=True, record_at_publish=False)
    def off() -> None: ...

    def cleanup() -> None:
        with app.connection_for_write() as conn:
            conn.default_channel.queue_delete(app.main)
        _settle(runtime_of(app).store, f"{app.main}.on")  # type: ignore[union-attr]
        app.close()

    return on.delay, off.delay, cleanup


def dramatiq_pair(store: str) -> tuple[Callable[[], Any], Callable[[], Any], Callable[[], None]]:
    """``send`` of a recorded actor and of one with ``record_at_publish=False``, and a cleanup."""
    import dramatiq
    from dramatiq.brokers.redis import RedisBroker

    from dramatiq_ext import DurableSteps

    namespace = f"bench-{uuid4().hex[:8]}"
    broker = RedisBroker(url=REDIS, namespace=namespace)
    broker.add_middleware(DurableSteps(store=store, recovery=False))

    @dramatiq.actor(broker=broker, queue_name="bench", durable=True)
    def on() -> None: ...

    @dramatiq.actor(broker=broker, queue_name="bench", durable=True, record_at_publish=False)
    def off() -> None: ...

    middleware = next(m for m in broker.middleware if isinstance(m, DurableSteps))

    def cleanup() -> None:
        _settle(middleware.store, on.actor_name)
        keys = list(broker.client.scan_iter(f"{namespace}:*"))
        if keys:
            broker.client.delete(*keys)
        broker.close()

    return on.send, off.send, cleanup


def _settle(store: Any, task_name: str) -> None:
    """End the runs this benchmark recorded (no worker will): recovery must not re-publish them."""
    from flexiq_plugins.integration import settle_unclaimed_run

    for run in store.list_runs(status="queued", task_name=task_name, limit=100_000):
        settle_unclaimed_run(store, run.run_key, "cancelled")


def main() -> None:
    """Print one line per framework and store."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--store", action="append", default=None, help="SQLAlchemy URL (repeatable)")
    args = parser.parse_args()
    stores = args.store or [f"sqlite:///{Path(tempfile.mkdtemp()) / 'steps.db'}"]
    print(f"{'framework':<10} {'store':<12} {'recorded µs':>12} {'not recorded µs':>16} {'ratio':>6}")
    for name, pair in (("celery", celery_pair), ("dramatiq", dramatiq_pair)):
        for store in stores:
            on, off, cleanup = pair(store)
            try:
                recorded, plain = _time(on, args.jobs), _time(off, args.jobs)
            finally:
                cleanup()
            kind = store.split(":")[0].split("+")[0]
            print(f"{name:<10} {kind:<12} {recorded * 1e6:>12.0f} {plain * 1e6:>16.0f} {recorded / plain:>6.2f}")


if __name__ == "__main__":
    main()
