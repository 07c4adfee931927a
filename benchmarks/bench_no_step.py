"""The cost of the integration for a task that takes no step, against the same task without it.

    .venv/bin/python benchmarks/bench_no_step.py [--rounds 7] [--messages 300] [--redis redis://127.0.0.1:6379/14]
        [--recorded]

A task that never touches ``current_job.step`` claims no run (C23): it should
cost about what it costs without the integration. In one process run, with
interleaved rounds (plain, durable, plain, durable …) so drift hits both
alike, it times per message:

- Dramatiq, StubBroker (and Redis, when reachable) and an in-process
  worker: a no-op actor and an always-failing actor (``max_retries=0``),
  with ``DurableSteps`` on a SQLite store and without it;
- Celery, eager (``Task.apply``): a no-op task, durable and ``durable=False``;
- Celery, a real in-process worker (threads pool) on Redis, when reachable:
  a no-op task, durable and ``durable=False``.

It prints the median per-message time of each and the RATIO durable / plain
(the target is ≤ 1.2). Ratios, not absolute times, compare between machines.

By default the durable side runs with ``record_at_publish=False``: that is
the cost of the integration itself for a step-less task (lazy claims, C23).
With ``--recorded`` it keeps the default, recording each run at publish
(C39): one insert when the job is published and one update when the
step-less body ends, so a broker that loses the message cannot lose the job.
"""

from __future__ import annotations

import argparse
import logging
import socket
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

Timer = Callable[[int], float]
"""Runs ``n`` messages; returns the seconds they took."""


# ------------------------------------------------------------------ Dramatiq
@contextmanager
def dramatiq_pair(store_url: str, redis_url: str | None = None, record: bool = False) -> Iterator[dict[str, Timer]]:
    """Timers for a no-op and a failing actor, on a plain broker and one with ``DurableSteps``.

    The brokers are StubBrokers, or RedisBrokers on ``redis_url``.
    """
    import dramatiq
    from dramatiq.brokers.redis import RedisBroker
    from dramatiq.brokers.stub import StubBroker
    from dramatiq.middleware import Retries

    from dramatiq_ext import DurableSteps

    logging.getLogger("dramatiq").setLevel(logging.CRITICAL)  # the failing actor's tracebacks
    timers: dict[str, Timer] = {}
    workers = []
    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    for kind in ("plain", "durable"):
        broker: Any = StubBroker() if redis_url is None else RedisBroker(url=redis_url, namespace=f"{namespace}-{kind}")
        if kind == "durable":
            broker.add_middleware(DurableSteps(store=store_url, record_at_publish=record), before=Retries)
        broker.emit_after("process_boot")
        queue = f"bench_{kind}"

        @dramatiq.actor(broker=broker, queue_name=queue, actor_name=f"noop_{kind}", max_retries=0)
        def noop() -> None:
            """Does nothing."""

        @dramatiq.actor(broker=broker, queue_name=queue, actor_name=f"fails_{kind}", max_retries=0)
        def fails() -> None:
            raise ValueError("always")

        worker = dramatiq.Worker(broker, worker_threads=1, worker_timeout=5 if redis_url is None else 1)
        worker.start()
        workers.append(worker)
        timers[f"dramatiq no-op ({kind})"] = _dramatiq_timer(broker, worker, queue, noop)
        timers[f"dramatiq failing ({kind})"] = _dramatiq_timer(broker, worker, queue, fails)
    try:
        yield timers
    finally:
        for worker in workers:
            worker.stop()
            if redis_url is not None:
                client = worker.broker.client
                keys = list(client.scan_iter(f"{namespace}*"))
                if keys:
                    client.delete(*keys)


def _dramatiq_timer(broker: Any, worker: Any, queue: str, actor: Any) -> Timer:
    from dramatiq.brokers.stub import StubBroker

    def run(n: int) -> float:
        started = time.perf_counter()
        for _ in range(n):
            actor.send()
        if isinstance(broker, StubBroker):
            broker.join(queue, fail_fast=False)
        else:
            broker.join(queue, interval=1)
        worker.join()
        return time.perf_counter() - started

    return run


# -------------------------------------------------------------------- Celery
def celery_eager(store_url: str, record: bool = False) -> dict[str, Timer]:
    """Timers for ``Task.apply`` of a no-op task, durable and not."""
    from celery import Celery

    import celery_ext

    app = Celery(f"bench{uuid.uuid4().hex[:6]}", broker="memory://", backend="cache+memory://", set_as_current=False)
    celery_ext.install(app, store=store_url, record_at_publish=record)

    @app.task(name="noop_durable")
    def noop_durable() -> None:
        """Does nothing."""

    @app.task(name="noop_plain", durable=False)
    def noop_plain() -> None:
        """Does nothing."""

    def timer(task: Any) -> Timer:
        def run(n: int) -> float:
            started = time.perf_counter()
            for _ in range(n):
                task.apply()
            return time.perf_counter() - started

        return run

    return {"celery eager no-op (plain)": timer(noop_plain), "celery eager no-op (durable)": timer(noop_durable)}


@contextmanager
def celery_worker(store_url: str, redis_url: str, record: bool = False) -> Iterator[dict[str, Timer]]:
    """Timers for a no-op task through a real in-process worker on Redis, durable and not."""
    from celery import Celery
    from celery.contrib.testing.worker import start_worker

    import celery_ext

    name = f"bench{uuid.uuid4().hex[:6]}"
    app = Celery(name, broker=redis_url, set_as_current=False)
    app.conf.update(task_default_queue=name, task_ignore_result=True, worker_hijack_root_logger=False)
    app.conf.worker_prefetch_multiplier = 16
    celery_ext.install(app, store=store_url, record_at_publish=record)
    done = {"n": 0}
    lock = threading.Lock()

    def count() -> None:
        with lock:
            done["n"] += 1

    @app.task(name=f"{name}.noop_durable")
    def noop_durable() -> None:
        count()

    @app.task(name=f"{name}.noop_plain", durable=False)
    def noop_plain() -> None:
        count()

    def timer(task: Any) -> Timer:
        def run(n: int) -> float:
            with lock:
                done["n"] = 0
            started = time.perf_counter()
            for _ in range(n):
                task.delay()
            while done["n"] < n:
                time.sleep(0.001)
            return time.perf_counter() - started

        return run

    with start_worker(app, pool="threads", concurrency=1, perform_ping_check=False, loglevel="WARNING"):
        yield {"celery worker no-op (plain)": timer(noop_plain), "celery worker no-op (durable)": timer(noop_durable)}
    with app.connection_for_write() as conn:
        conn.default_channel.queue_delete(name)


# --------------------------------------------------------------------- running
def measure(timers: dict[str, Timer], rounds: int, messages: int) -> dict[str, float]:
    """Median seconds per message of each timer, rounds interleaved (one warm-up round first)."""
    for run in timers.values():
        run(max(messages // 10, 1))
    samples: dict[str, list[float]] = {name: [] for name in timers}
    for _ in range(rounds):
        for name, run in timers.items():
            samples[name].append(run(messages) / messages)
    return {name: statistics.median(values) for name, values in samples.items()}


def report(title: str, medians: dict[str, float]) -> None:
    """Print each median (ms per message) and the durable / plain ratio of each pair."""
    print(f"\n{title}")
    for name, seconds in medians.items():
        print(f"  {name:<34} {seconds * 1000:8.3f} ms/message")
    for name, seconds in medians.items():
        if name.endswith("(durable)"):
            plain = medians[name.replace("(durable)", "(plain)")]
            print(f"  RATIO {name.removesuffix(' (durable)'):<28} {seconds / plain:6.2f}x  (target <= 1.2x)")


def _reachable(url: str) -> bool:
    parsed = urlparse(url)
    try:
        with socket.create_connection((parsed.hostname or "127.0.0.1", parsed.port or 6379), timeout=1):
            return True
    except OSError:
        return False


def main() -> None:
    """Run every measurement and print the ratios."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--messages", type=int, default=300)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/14")
    parser.add_argument("--recorded", action="store_true", help="keep recording at publish on (C39)")
    args = parser.parse_args()
    record = bool(args.recorded)
    print(f"record_at_publish={record}")
    with tempfile.TemporaryDirectory() as tmp:
        store_url = f"sqlite:///{Path(tmp) / 'steps.db'}"
        with dramatiq_pair(store_url, record=record) as timers:
            report("Dramatiq, StubBroker, SQLite store", measure(timers, args.rounds, args.messages))
        eager = measure(celery_eager(store_url, record), args.rounds, args.messages)
        report("Celery, eager Task.apply, SQLite store", eager)
        if _reachable(args.redis):
            with dramatiq_pair(store_url, args.redis, record) as timers:
                report("Dramatiq, Redis broker, SQLite store", measure(timers, args.rounds, args.messages))
            with celery_worker(store_url, args.redis, record) as timers:
                report("Celery, threads worker on Redis, SQLite store", measure(timers, args.rounds, args.messages))
        else:
            print(f"\nCelery worker: Redis not reachable at {args.redis}; skipped")


if __name__ == "__main__":
    main()
