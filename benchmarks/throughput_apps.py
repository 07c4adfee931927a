"""The Celery app and the Dramatiq actors :mod:`benchmarks.bench_throughput` runs in real worker processes.

Configured from the environment (the worker is a subprocess):
``FLEXIQ_BENCH_QUEUE`` (queue and table-prefix stem), ``FLEXIQ_STORE_URL``
(the step store), ``FLEXIQ_BENCH_REDIS`` (broker and the counters),
``FLEXIQ_BENCH_RESULTS=1`` (Celery: store results in Redis).

Every database connection the store opens names its process: on
PostgreSQL its ``application_name`` is ``<APP_NAME>-<pid>`` (set when the
connection is opened, so a forked child's connections carry the child's pid),
which lets :mod:`benchmarks.bench_throughput` count the connections each
worker process holds from ``pg_stat_activity``.

Each job runs ``k`` trivial steps (``k`` = 3 or 5): durable ones through
``current_job.step.run``, or, for the plain task, the same functions called
directly in a task declared ``durable=False``; the durable task is declared
``durable=True``, so it is recorded at publish from its first job. Its last act is an ``INCR`` of
a Redis counter (and the first job sets the start time), so the benchmark
sees completions without a result backend; it also adds the statements and
round trips the process sent to the store since the previous job (so a
job's finish is counted with the next one; a process's first job, which
carries the worker's start, is not counted).
"""

from __future__ import annotations

import os
import threading
import time
import zlib
from typing import Any

import redis
from sqlalchemy import event

from benchmarks.counting import on_statements
from flexiq_plugins import SqlStepStore, current_job

QUEUE = os.environ.get("FLEXIQ_BENCH_QUEUE", "flexiq-bench")
REDIS_URL = os.environ.get("FLEXIQ_BENCH_REDIS", "redis://127.0.0.1:6379/14")
STORE_URL = os.environ.get("FLEXIQ_STORE_URL", "postgresql://postgres@127.0.0.1:5432/test")
PREFIX = f"fqb{zlib.crc32(QUEUE.encode()):08x}_"  # short: index names carry it (PostgreSQL: 63 characters)
APP_NAME = f"fqb{zlib.crc32(QUEUE.encode()):08x}"
"""The ``application_name`` stem of this run's store connections (PostgreSQL), ``<APP_NAME>-<pid>`` each."""
_redis = redis.Redis.from_url(REDIS_URL)


def store() -> SqlStepStore:
    """The step store of this benchmark run (its own table prefix; each connection named by its process's pid)."""
    opened = SqlStepStore(STORE_URL, table_prefix=PREFIX)
    if opened.engine.dialect.name == "postgresql":

        @event.listens_for(opened.engine, "do_connect")
        def _name(_dialect: Any, _record: Any, _cargs: Any, cparams: dict[str, Any]) -> None:
            cparams["application_name"] = f"{APP_NAME}-{os.getpid()}"  # the pid of the process connecting

    if opened.engine.dialect.name == "postgresql":  # a SQLite trace would expand every statement: CPU of its own
        _count_round_trips(opened.engine)
    return opened


_trips = {"statements": 0, "round_trips": 0}
_pushed = {"statements": 0, "round_trips": 0}
_trips_lock = threading.Lock()


def _count_round_trips(engine: Any) -> None:
    """Count the statements and round trips (with psycopg's ``BEGIN`` and every ``COMMIT``) this process sends."""
    begin_trip = 1 if engine.dialect.name == "postgresql" else 0

    def add(what: str, n: int = 1) -> None:
        with _trips_lock:
            _trips[what] += n

    def autocommit(conn: Any) -> bool:
        # The attempt's held connection is switched to autocommit on the driver itself (psycopg's
        # ``autocommit``), where SQLAlchemy's execution options do not show it; no BEGIN or COMMIT is sent then.
        flag = getattr(conn.connection.driver_connection, "autocommit", None)
        if isinstance(flag, bool):
            return flag
        return bool(conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT")

    on_statements(engine, lambda _sql: (add("statements"), add("round_trips")))  # at the driver
    event.listen(engine, "begin", lambda conn: None if autocommit(conn) else add("round_trips", begin_trip))
    event.listen(engine, "commit", lambda conn: None if autocommit(conn) else add("round_trips"))
    event.listen(engine, "rollback", lambda *_: add("round_trips"))


def _done() -> None:
    """Count the job done; add what this process sent to the store since the last job (the last one's finish too)."""
    now = time.time()
    with _trips_lock:
        delta = {k: _trips[k] - _pushed[k] for k in _trips}
        _pushed.update(_trips)
        first = _pushed.setdefault("jobs", 0) == 0  # a process's first job also carries its start (schema check)
        _pushed["jobs"] += 1
    if not first:
        pipe = _redis.pipeline(transaction=False)
        for what, n in delta.items():
            pipe.incrby(f"{QUEUE}:{what}", n)
        pipe.incr(f"{QUEUE}:counted")
        pipe.execute()
    _redis.set(f"{QUEUE}:first", now, nx=True)
    _redis.set(f"{QUEUE}:last", now)
    _redis.incr(f"{QUEUE}:done")


def _step(i: int) -> int:
    return i


def plain_body(k: int) -> None:
    """The plain task: ``k`` calls, then done."""
    for i in range(k):
        _step(i)
    _done()


def durable_body(k: int) -> None:
    """The durable task: ``k`` durable steps, then done."""
    for i in range(k):
        current_job.step.run(f"s{i}", lambda i=i: _step(i))
    _done()


# ----------------------------------------------------------------- Celery
def celery_app() -> Any:
    """The Celery app with ``plain(k)`` (``durable=False``) and ``durable(k)``."""
    from celery import Celery

    import celery_ext

    results = os.environ.get("FLEXIQ_BENCH_RESULTS") == "1"  # a Redis result backend, as many deployments have
    app = Celery(QUEUE, broker=REDIS_URL, backend=REDIS_URL if results else None, set_as_current=False)
    app.conf.update(
        task_default_queue=QUEUE,
        task_ignore_result=not results,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        worker_prefetch_multiplier=4,
    )
    celery_ext.install(app, store=store())

    @app.task(name="bench.plain", durable=False)
    def plain(k: int) -> None:
        plain_body(k)

    @app.task(name="bench.durable", durable=True)
    def durable(k: int) -> None:
        durable_body(k)

    return app


# ---------------------------------------------------------------- Dramatiq
def dramatiq_broker() -> Any:
    """The Dramatiq Redis broker with :class:`~dramatiq_ext.DurableSteps` and the two actors."""
    import dramatiq
    from dramatiq.brokers.redis import RedisBroker

    from dramatiq_ext import DurableSteps

    broker = RedisBroker(url=REDIS_URL, namespace=QUEUE)
    broker.add_middleware(DurableSteps(store=store()))
    dramatiq.set_broker(broker)

    @dramatiq.actor(actor_name="bench_plain", queue_name=QUEUE, durable=False, max_retries=0)
    def bench_plain(k: int) -> None:
        plain_body(k)

    @dramatiq.actor(actor_name="bench_durable", queue_name=QUEUE, durable=True, max_retries=0)
    def bench_durable(k: int) -> None:
        durable_body(k)

    return broker


def enqueue(kind: str, k: int, jobs: int) -> None:
    """Publish ``jobs`` jobs of ``kind`` (``plain`` or ``durable``) with ``k`` steps, through the installed app."""
    if os.environ.get("FLEXIQ_BENCH_FRAMEWORK") == "celery":
        task = app.tasks[f"bench.{kind}"]
        for _ in range(jobs):
            task.delay(k)
    else:
        actor = broker.get_actor(f"bench_{kind}")
        for _ in range(jobs):
            actor.send(k)


if os.environ.get("FLEXIQ_BENCH_FRAMEWORK") == "celery":
    app = celery_app()
elif os.environ.get("FLEXIQ_BENCH_FRAMEWORK") == "dramatiq":
    broker = dramatiq_broker()
