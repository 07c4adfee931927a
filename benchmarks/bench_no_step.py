"""The cost of the integration for a task that takes no step, against the same task without it (C43).

    .venv/bin/python benchmarks/bench_no_step.py [--rounds 7] [--messages 300] [--redis redis://127.0.0.1:6379/14]
        [--postgres postgresql+psycopg://postgres@127.0.0.1:5432/test] [--declared]

A task that never touches ``current_job.step`` is not touched by the
integration (C43): it is not recorded at publish, claims no run (C23) and
keeps its framework's acknowledgement, so it should cost what it costs
without the integration. In one process run, with interleaved rounds (plain,
durable, plain, durable …) so drift hits both alike, it times per message,
producer and worker both included:

- Dramatiq, StubBroker (and Redis, when reachable) and an in-process
  worker: a no-op actor and an always-failing actor (``max_retries=0``),
  with ``DurableSteps`` and without it;
- Celery, eager (``Task.apply``): a no-op task, with the integration and
  ``durable=False``;
- Celery, a real in-process worker (threads pool) on Redis, when reachable:
  a no-op task, with the integration and ``durable=False``;

each on a SQLite store and, when reachable, a PostgreSQL one. It prints the
median per-message time of each, and the THROUGHPUT ratio with / without
(target >= 0.95x, i.e. at most about 5 % slower), met or NOT MET.
``run_no_step`` returns the same figures for ``python -m benchmarks``.
Ratios, not absolute times, compare between machines.

The durable side runs with the integration's defaults: a task not known to
take steps is not recorded at publish, whatever ``record_at_publish`` says.
With ``--declared`` the tasks are declared ``durable=True`` instead: each
job is then recorded at publish (C39) and claims its run before its body,
one insert when the job is published and one update when the step-less body
ends, so a broker that loses the message cannot lose the job; that is what
a step-less task cost before the integration learned which tasks take steps.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from benchmarks.schema import drop_prefixed_tables

Timer = Callable[[int], float]
"""Runs ``n`` messages; returns the seconds they took."""


# ------------------------------------------------------------------ Dramatiq
@contextmanager
def dramatiq_pair(store_url: Any, redis_url: str | None = None, declared: bool = False) -> Iterator[dict[str, Timer]]:
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
            broker.add_middleware(DurableSteps(store=store_url), before=Retries)
        broker.emit_after("process_boot")
        queue = f"bench_{kind}"
        options: dict[str, Any] = {"durable": True} if declared and kind == "durable" else {}

        @dramatiq.actor(broker=broker, queue_name=queue, actor_name=f"noop_{kind}", max_retries=0, **options)
        def noop() -> None:
            """Does nothing."""

        @dramatiq.actor(broker=broker, queue_name=queue, actor_name=f"fails_{kind}", max_retries=0, **options)
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
def celery_eager(store_url: Any, declared: bool = False) -> dict[str, Timer]:
    """Timers for ``Task.apply`` of a no-op task, durable and not."""
    from celery import Celery

    import celery_ext

    name = f"bench{uuid.uuid4().hex[:6]}"  # each call's tasks are its own: the store measured next has others
    app = Celery(name, broker="memory://", backend="cache+memory://", set_as_current=False)
    celery_ext.install(app, store=store_url)

    @app.task(name=f"{name}.noop_durable", durable=True if declared else None)
    def noop_durable() -> None:
        """Does nothing."""

    @app.task(name=f"{name}.noop_plain", durable=False)
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
def celery_worker(store_url: Any, redis_url: str, declared: bool = False) -> Iterator[dict[str, Timer]]:
    """Timers for a no-op task through a real in-process worker on Redis, durable and not."""
    from celery import Celery
    from celery.contrib.testing.worker import start_worker

    import celery_ext

    name = f"bench{uuid.uuid4().hex[:6]}"
    app = Celery(name, broker=redis_url, set_as_current=False)
    app.conf.update(task_default_queue=name, task_ignore_result=True, worker_hijack_root_logger=False)
    app.conf.worker_prefetch_multiplier = 16
    celery_ext.install(app, store=store_url)
    done = {"n": 0}
    lock = threading.Lock()

    def count() -> None:
        with lock:
            done["n"] += 1

    @app.task(name=f"{name}.noop_durable", durable=True if declared else None)
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


TARGET = 0.95
"""The least throughput with the integration, as a fraction of the throughput without it (C43)."""


@dataclass(frozen=True)
class NoStepResult:
    """One pair measured: a step-less task with the integration and without it (C43).

    Parameters:
      setting (str): what ran, e.g. ``"Dramatiq, StubBroker, SQLite store: no-op"``.
      plain_seconds (float): median seconds per message without the integration.
      durable_seconds (float): median seconds per message with it.
    """

    setting: str
    plain_seconds: float
    durable_seconds: float
    target: float = TARGET

    @property
    def throughput_ratio(self) -> float:
        """Throughput with the integration over throughput without it (1.0: the same)."""
        return self.plain_seconds / self.durable_seconds

    @property
    def met(self) -> bool:
        """Whether the throughput ratio reaches the target."""
        return self.throughput_ratio >= self.target


def pairs(title: str, medians: dict[str, float]) -> list[NoStepResult]:
    """The ``(plain)`` / ``(durable)`` pairs of ``medians`` as results named ``<title>: <what>``."""
    found = []
    for name, seconds in medians.items():
        if name.endswith("(durable)"):
            plain = medians[name.replace("(durable)", "(plain)")]
            found.append(NoStepResult(f"{title}: {name.removesuffix(' (durable)')}", plain, seconds))
    return found


def report(title: str, medians: dict[str, float]) -> list[NoStepResult]:
    """Print each median (ms per message) and the throughput ratio of each pair; return the pairs."""
    print(f"\n{title}")
    for name, seconds in medians.items():
        print(f"  {name:<34} {seconds * 1000:8.3f} ms/message")
    found = pairs(title, medians)
    for result in found:
        what = result.setting.removeprefix(f"{title}: ")
        verdict = "met" if result.met else "NOT MET"
        print(f"  THROUGHPUT {what:<23} {result.throughput_ratio:6.2f}x of plain  (target >= {TARGET}x: {verdict})")
    return found


def _reachable(url: str, default_port: int = 6379) -> bool:
    parsed = urlparse(url)
    try:
        with socket.create_connection((parsed.hostname or "127.0.0.1", parsed.port or default_port), timeout=1):
            return True
    except OSError:
        return False


@contextmanager
def _stores(postgres_url: str | None) -> Iterator[list[tuple[str, Any]]]:
    """The stores to measure on: a SQLite file, and PostgreSQL (own table prefix, dropped after) when reachable."""
    from flexiq_plugins import SqlStepStore

    with tempfile.TemporaryDirectory() as tmp:
        stores: list[tuple[str, Any]] = [("SQLite", f"sqlite:///{Path(tmp) / 'steps.db'}")]
        postgres = None
        if postgres_url and _reachable(postgres_url, 5432):
            postgres = SqlStepStore(postgres_url, table_prefix=f"nostep{uuid.uuid4().hex[:8]}_")
            stores.append(("PostgreSQL", postgres))
        try:
            yield stores
        finally:
            if postgres is not None:
                _drop(postgres)


def _drop(store: Any) -> None:
    drop_prefixed_tables(store.engine, store.table_prefix)
    store.close()


def run_no_step(
    *,
    rounds: int = 7,
    messages: int = 300,
    redis_url: str | None = "redis://127.0.0.1:6379/14",
    postgres_url: str | None = "postgresql+psycopg://postgres@127.0.0.1:5432/test",
    declared: bool = False,
    quiet: bool = False,
) -> list[NoStepResult]:
    """Measure every pair (a step-less task with the integration and without it) and return the results (C43).

    Parameters:
      rounds (int): interleaved rounds per pair; the median is kept.
      messages (int): messages per round.
      redis_url (str | None): a Redis broker for the Dramatiq and Celery worker pairs (skipped if unreachable).
      postgres_url (str | None): a PostgreSQL store measured besides SQLite (skipped if unreachable).
      declared (bool): declare the tasks ``durable=True`` (recorded at publish) instead of the defaults.
      quiet (bool): print nothing.
    """
    show: Callable[[str, dict[str, float]], list[NoStepResult]] = pairs if quiet else report
    results: list[NoStepResult] = []
    redis = redis_url if redis_url and _reachable(redis_url) else None
    with _stores(postgres_url) as stores:
        for label, store in stores:
            with dramatiq_pair(store, declared=declared) as timers:
                results += show(f"Dramatiq, StubBroker, {label} store", measure(timers, rounds, messages))
            eager = measure(celery_eager(store, declared), rounds, messages)
            results += show(f"Celery, eager Task.apply, {label} store", eager)
            if redis is None:
                continue
            with dramatiq_pair(store, redis, declared) as timers:
                results += show(f"Dramatiq, Redis broker, {label} store", measure(timers, rounds, messages))
            with celery_worker(store, redis, declared) as timers:
                results += show(f"Celery, threads worker on Redis, {label} store", measure(timers, rounds, messages))
    if redis is None and not quiet:
        print(f"\nDramatiq and Celery on Redis: not reachable at {redis_url}; skipped")
    return results


def main() -> None:
    """Run every measurement and print the ratios."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--messages", type=int, default=300)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/14")
    parser.add_argument("--postgres", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    parser.add_argument("--declared", action="store_true", help="declare the tasks durable=True (recorded, C39)")
    args = parser.parse_args()
    print("tasks declared durable=True (recorded at publish)" if args.declared else "tasks left to be learned (C43)")
    results = run_no_step(
        rounds=args.rounds, messages=args.messages, redis_url=args.redis, postgres_url=args.postgres,
        declared=args.declared,
    )  # fmt: skip
    missed = [r.setting for r in results if not r.met]
    print(f"\n{len(results) - len(missed)} of {len(results)} pairs met the target (>= {TARGET}x of plain throughput)")


if __name__ == "__main__":
    main()
