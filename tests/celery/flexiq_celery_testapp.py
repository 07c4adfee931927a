"""The Celery apps and tasks the Celery adapter tests run, in-process and in worker subprocesses.

In-process tests call :func:`make_app` with their own broker, store and side
table. Worker subprocesses (``celery -A flexiq_celery_testapp worker``) build
the module-level ``app`` from environment variables (see :func:`app_from_env`).

Real calls of step bodies are counted in a SQLite side table (a file), so a
count survives worker processes being killed.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path
from typing import Any

from celery import Celery, Task, shared_task, signals

import celery_ext
from celery_ext import DurableTask
from flexiq_plugins import NonRetryableError, RetryPolicy, SqlStepStore, current_job

REDIS_BACKEND = "redis://127.0.0.1:6379/13"

VERSION = {"value": 1}
"""The "deployed" version of :func:`diverging`; tests flip it to simulate a deploy."""


# ------------------------------------------------------------------ side table
def record_call(calls: str, what: str, key: str = "") -> int:
    """Record one real call of ``what`` in the SQLite file ``calls``; return how many there are now."""
    with sqlite3.connect(calls, timeout=30) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS calls (what TEXT, key TEXT, pid INTEGER, at REAL)")
        conn.execute("INSERT INTO calls VALUES (?, ?, ?, ?)", (what, key, os.getpid(), time.time()))
        return int(conn.execute("SELECT COUNT(*) FROM calls WHERE what = ?", (what,)).fetchone()[0])


def count_calls(calls: str, what: str) -> int:
    """How many real calls of ``what`` the side table ``calls`` holds."""
    if not Path(calls).exists():
        return 0
    with sqlite3.connect(calls, timeout=30) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS calls (what TEXT, key TEXT, pid INTEGER, at REAL)")
        return int(conn.execute("SELECT COUNT(*) FROM calls WHERE what = ?", (what,)).fetchone()[0])


def call_keys(calls: str, what: str) -> list[str]:
    """The idempotency keys recorded with the calls of ``what``."""
    with sqlite3.connect(calls, timeout=30) as conn:
        return [r[0] for r in conn.execute("SELECT key FROM calls WHERE what = ? ORDER BY at", (what,))]


def call_order(calls: str, prefix: str) -> list[str]:
    """Every recorded call whose ``what`` starts with ``prefix``, in the order they happened."""
    with sqlite3.connect(calls, timeout=30) as conn:
        rows = conn.execute("SELECT what FROM calls WHERE what LIKE ? ORDER BY rowid", (prefix + "%",))
        return [r[0] for r in rows]


# ------------------------------------------------------------------------ apps
def make_app(name: str, broker: str, store: Any, calls: str, **options: Any) -> Celery:
    """A fresh app on queue ``name`` with the durable-steps adapter and the test tasks."""
    app = Celery(name, broker=broker, backend=REDIS_BACKEND, set_as_current=False)
    app.conf.update(
        task_default_queue=name,
        result_expires=600,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        worker_prefetch_multiplier=4,
    )
    options.setdefault("dead_letter_queue", f"{name}.dlq")
    options.setdefault("busy_retry_seconds", 0.5)
    celery_ext.install(app, store=store, **options)
    register_tasks(app, calls)
    return app


class CountingBase(Task):  # type: ignore[misc]
    """A user base class with its own ``__call__``, as projects often have."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        result = super().__call__(*args, **kwargs)
        return {"wrapped": result}


class DiesAfterTheRunEnds(DurableTask):  # type: ignore[misc]
    """Kills its worker process once, after the core recorded the run's end and before Celery stores the result (C37).

    The attempt (``DurableTask.__call__``) has committed the run ``succeeded``
    or ``failed`` when it returns or raises; Celery's tracer has not yet
    published the chain's next task, called the ``link`` callbacks or stored
    the result. A job given ``die_once=<path>`` makes the process exit there
    the first time (``os._exit``, as a SIGKILL would: nothing more runs), and
    writes ``<path>`` so the redelivery does not die again.
    """

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        finally:
            marker = kwargs.get("die_once")
            if marker and not self.request.called_directly and not Path(marker).exists():
                Path(marker).write_text(str(os.getpid()))
                os._exit(137)


def register_tasks(app: Celery, calls: str) -> None:
    """Declare the test tasks on ``app``.

    The tasks that take steps are declared ``durable=True`` (C43): their tests are about durable tasks
    (recorded at publish, acknowledged late); the step-less ``plain*`` ones are left to be learned.
    """

    def charge_and_receipt(task: Any, order: int, pause: float) -> dict[str, Any]:
        step = current_job.step
        charge = step.run("charge", lambda: {"order": order, "n": record_call(calls, "charge", step.idempotency_key)})
        step.sleep(pause)

        def receipt() -> str:
            if record_call(calls, "receipt", step.idempotency_key) == 1:
                raise ConnectionError("mail server down")
            return f"receipt for {charge['order']}"

        return {"charge": charge, "receipt": step.run("receipt", receipt), "retries": task.request.retries}

    @app.task(
        durable=True,
        bind=True,
        name=f"{app.main}.checkout",
        autoretry_for=(Exception,),
        max_retries=3,
        default_retry_delay=0,
    )
    def checkout(self: Any, order: int, pause: float = 1) -> dict[str, Any]:
        return charge_and_receipt(self, order, pause)

    @app.task(durable=True, bind=True, name=f"{app.main}.checkout_manual", max_retries=3)
    def checkout_manual(self: Any, order: int, pause: float = 1) -> dict[str, Any]:
        try:
            return charge_and_receipt(self, order, pause)
        except Exception as exc:
            raise self.retry(exc=exc, countdown=0) from exc

    @app.task(durable=True, bind=True, name=f"{app.main}.sleeper", autoretry_for=(Exception,), max_retries=5)
    def sleeper(self: Any, seconds: float) -> dict[str, Any]:
        step = current_job.step
        started = step.run("start", time.time)
        step.sleep(seconds)
        return {"retries": self.request.retries, "attempt": current_job.attempt, "started": started}

    def diverging_body(pause: float) -> str:
        step = current_job.step
        first = "reserve" if VERSION["value"] == 1 else "allocate"
        step.run(first, lambda: record_call(calls, first))
        step.sleep(pause)
        return step.run("ship", lambda: "shipped")

    @app.task(durable=True, bind=True, name=f"{app.main}.diverging", autoretry_for=(Exception,), max_retries=20)
    def diverging(self: Any, pause: float) -> str:
        return diverging_body(pause)

    @app.task(durable=True, bind=True, name=f"{app.main}.diverging_manual", max_retries=20)
    def diverging_manual(self: Any, pause: float) -> str:
        try:
            return diverging_body(pause)
        except Exception as exc:
            raise self.retry(exc=exc, countdown=0) from exc

    @app.task(durable=True, bind=True, name=f"{app.main}.duplicate_key", autoretry_for=(Exception,), max_retries=20)
    def duplicate_key(self: Any) -> str:
        step = current_job.step
        record_call(calls, "duplicate_key")
        step.run("a", lambda: 1, key="k")
        step.run("a", lambda: 2, key="k")
        return "unreachable"

    @app.task(durable=True, name=f"{app.main}.slow_once")
    def slow_once(seconds: float) -> str:
        def body() -> str:
            record_call(calls, "slow_once")
            time.sleep(seconds)  # the workload: holds the claim while the duplicate arrives
            return "done"

        return current_job.step.run("slow", body)

    @app.task(name=f"{app.main}.plain")
    def plain(x: int) -> int:
        return x * 2

    @app.task(name=f"{app.main}.plain_fails")
    def plain_fails(x: int) -> int:
        raise ValueError(f"bad {x}")

    @app.task(bind=True, name=f"{app.main}.plain_retries", max_retries=5)
    def plain_retries(self: Any, until: int) -> int:
        if self.request.retries < until:
            raise self.retry(countdown=0)
        return int(self.request.retries)

    @app.task(durable=True, bind=True, name=f"{app.main}.custom_base", base=CountingBase)
    def custom_base(self: Any, x: int) -> Any:
        return current_job.step.run("double", lambda: x * 2)

    @app.task(name=f"{app.main}.opted_out", durable=False)
    def opted_out() -> str:
        return "job" if current_job else "no job"

    @app.task(durable=True, name=f"{app.main}.not_late", acks_late=False)
    def not_late() -> str:
        return current_job.step.run("x", lambda: "x")

    @app.task(durable=True, name=f"{app.main}.bulk")
    def bulk(i: int) -> int:
        step = current_job.step
        a = step.run("a", lambda: i)
        return step.run("b", lambda: a + 1)

    register_failure_tasks(app, calls)
    register_replay_tasks(app, calls)


def register_replay_tasks(app: Celery, calls: str) -> None:
    """Tasks of the C37 tests: a finished run's outcome replayed to a duplicate, its body never run again."""

    @app.task(durable=True, name=f"{app.main}.c37_total", base=DiesAfterTheRunEnds)
    def c37_total(label: str, x: int, die_once: str = "") -> int:
        record_call(calls, f"{label}:body")
        return int(current_job.step.run("add", lambda: x + 1))

    @app.task(durable=True, name=f"{app.main}.c37_declines", base=DiesAfterTheRunEnds)
    def c37_declines(label: str, die_once: str = "") -> int:
        record_call(calls, f"{label}:body")
        current_job.step.run("reserve", lambda: "r-1")
        raise ValueError(f"card declined for {label}")

    @app.task(durable=True, name=f"{app.main}.c37_linked")
    def c37_linked(value: Any, label: str) -> None:
        record_call(calls, f"{label}:linked:{value}")

    @app.task(durable=True, name=f"{app.main}.c37_errback")
    def c37_errback(request: Any, exc: BaseException, traceback: Any, label: str) -> None:
        record_call(calls, f"{label}:errback:{type(exc).__name__}:{exc}")

    register_dispatch_tasks(app, calls)


def register_dispatch_tasks(app: Celery, calls: str) -> None:
    """Tasks of the C44 tests: jobs Celery dispatches on behalf of a durable run, each a run of its own."""

    @app.task(durable=True, name=f"{app.main}.c44_noted")
    def c44_noted(value: Any, label: str, die_publishing: str = "") -> Any:
        def note() -> Any:
            record_call(calls, f"{label}:noted:{value}")
            return value

        return current_job.step.run("note", note)

    @app.task(durable=True, name=f"{app.main}.c44_errback")
    def c44_errback(task_id: str, label: str) -> None:
        current_job.step.run("note", lambda: record_call(calls, f"{label}:errback"))

    @app.task(durable=True, name=f"{app.main}.c44_sends")
    def c44_sends(label: str) -> str:
        current_job.step.run("charge", lambda: record_call(calls, f"{label}:charge"))
        return str(c44_noted.delay("sent", label).id)  # the body's own job: a new run

    signals.before_task_publish.connect(die_while_publishing, weak=False, dispatch_uid="flexiq_tests.die_publishing")


def die_while_publishing(sender: Any = None, body: Any = None, **_: Any) -> None:
    """``before_task_publish`` in a worker process: die once while publishing a job given ``die_publishing=<path>``.

    Connected after ``celery_ext.install`` connected its own receiver, so the
    job's run is already recorded ``queued`` (C39) when the process exits
    (``os._exit``, as a SIGKILL would: the message never leaves). The worker
    is publishing a ``link`` callback or a chain's next task after the parent
    run committed (C44); ``<path>`` is written first, so the redelivered
    parent does not die again. Never in the test process.
    """
    kwargs = body[1] if isinstance(body, (tuple, list)) and len(body) == 3 else {}
    marker = kwargs.get("die_publishing") if isinstance(kwargs, dict) else None
    if marker and os.environ.get("FLEXIQ_TEST_BROKER") and not Path(marker).exists():
        Path(marker).write_text(str(os.getpid()))
        os._exit(137)


def register_failure_tasks(app: Celery, calls: str) -> None:
    """Tasks whose steps fail: durable retry budgets, non-retryable errors, compensations (C31, C32).

    Each records every real call of a step body or undo under ``<label>:<what>``,
    so one worker can serve several tests at once.
    """

    @app.task(
        durable=True, name=f"{app.main}.always_fails", autoretry_for=(Exception,), max_retries=1, default_retry_delay=0
    )
    def always_fails(label: str) -> str:
        def ship() -> str:
            n = record_call(calls, f"{label}:ship", current_job.step.idempotency_key)
            raise ConnectionError(f"carrier down (call {n})")

        return current_job.step.run("ship", ship, retry=RetryPolicy(max_attempts=5, initial_delay=0.2, multiplier=1))

    @app.task(durable=True, name=f"{app.main}.exits_in_step")
    def exits_in_step(label: str) -> str:
        def charge() -> str:
            record_call(calls, f"{label}:charge")
            os._exit(137)  # the worker process dies inside the step body

        return current_job.step.run("charge", charge, retry=RetryPolicy(max_attempts=3))

    @app.task(
        durable=True, name=f"{app.main}.non_retryable", autoretry_for=(Exception,), max_retries=5, default_retry_delay=0
    )
    def non_retryable(label: str) -> str:
        def charge() -> str:
            record_call(calls, f"{label}:charge")
            raise NonRetryableError("card expired")

        return current_job.step.run("charge", charge, retry=RetryPolicy(max_attempts=5, initial_delay=0))

    @app.task(durable=True, name=f"{app.main}.saga")
    def saga(label: str, marker_dir: str) -> str:
        step = current_job.step

        def undo(what: str) -> Any:
            def run(value: int) -> None:
                if what == "reserve" and record_call(calls, f"{label}/started:undo_reserve") == 1:
                    (Path(marker_dir) / f"{label}.pid").write_text(str(os.getpid()))
                    time.sleep(60)  # killed here by the test, between the two undos
                record_call(calls, f"{label}:undo_{what}", step.idempotency_key)

            return run

        step.run("reserve", lambda: record_call(calls, f"{label}:reserve"), compensate=undo("reserve"))
        step.run("charge", lambda: record_call(calls, f"{label}:charge"), compensate=undo("charge"))

        def ship() -> str:
            record_call(calls, f"{label}:ship")
            raise NonRetryableError("the carrier refused the parcel")

        return step.run("ship", ship)

    @app.task(
        durable=True, name=f"{app.main}.gives_up", autoretry_for=(ValueError,), max_retries=1, default_retry_delay=0
    )
    def gives_up(label: str) -> str:
        step = current_job.step
        step.run("reserve", lambda: "r-1", compensate=lambda r: record_call(calls, f"{label}:undo_reserve"))
        step.run("charge", lambda: "c-1", compensate=lambda c: record_call(calls, f"{label}:undo_charge"))

        def ship() -> str:
            record_call(calls, f"{label}:ship")
            raise ValueError("no carrier for this address")

        return step.run("ship", ship)

    @app.task(durable=True, name=f"{app.main}.default_budget", step_retry=RetryPolicy(max_attempts=2, initial_delay=0))
    def default_budget(label: str) -> str:
        def ship() -> str:
            record_call(calls, f"{label}:ship")
            raise ConnectionError("carrier down")

        return current_job.step.run("ship", ship)

    @app.task(durable=True, name=f"{app.main}.cancellable")
    def cancellable(label: str, flag: str) -> str:
        step = current_job.step
        step.run("charge", lambda: "c-1", compensate=lambda c: record_call(calls, f"{label}:undo_charge"))

        def work() -> str:
            record_call(calls, f"{label}:work")
            while not Path(flag).exists():  # the workload: runs until the test raises the flag
                time.sleep(0.02)
            return "worked"

        step.run("work", work)
        return step.run("ship", lambda: record_call(calls, f"{label}:ship") and "shipped")

    @app.task(durable=True, name=f"{app.main}.revocable")
    def revocable(label: str, pause: float) -> str:
        step = current_job.step
        step.run("charge", lambda: "c-1", compensate=lambda c: record_call(calls, f"{label}:undo_charge"))
        step.sleep(pause)
        return step.run("ship", lambda: record_call(calls, f"{label}:ship") and "shipped")


@shared_task(name="flexiq_tests.shared_double", bind=True)
def shared_double(self: Any, x: int) -> dict[str, Any]:
    """A ``@shared_task`` declared at import time, before any app is installed."""
    return {"value": current_job.step.run("double", lambda: x * 2), "run_key": current_job.run_key}


# ----------------------------------------------------------- worker processes
def app_from_env() -> Celery | None:
    """The app of a ``celery -A flexiq_celery_testapp worker`` subprocess, or ``None`` in-process."""
    broker = os.environ.get("FLEXIQ_TEST_BROKER")
    if not broker:
        return None
    store_url = os.environ["FLEXIQ_TEST_STORE"]
    prefix = os.environ.get("FLEXIQ_TEST_TABLE_PREFIX")
    store: Any = SqlStepStore(store_url, table_prefix=prefix) if prefix else store_url
    lease = float(os.environ.get("FLEXIQ_TEST_LEASE", "30"))  # a short lease makes a dead worker's takeover quick
    return make_app(
        os.environ["FLEXIQ_TEST_QUEUE"], broker, store, os.environ["FLEXIQ_TEST_CALLS"], lease_seconds=lease
    )


app = app_from_env()
