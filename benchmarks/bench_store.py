"""What a durable step costs, next to the database's own floor, in one run.

    python -m benchmarks.bench_store --store sqlite|postgres|mariadb|all [--rounds 7] [--steps 50]
    python -m benchmarks.bench_store --store postgres --history 1000000  # empty store vs N finished runs
    python -m benchmarks.bench_store --store postgres --cleanup-check 100000  # N jobs, then `store cleanup`

For each store, in interleaved rounds (every operation once per round, so a
noisy neighbour slows all of them alike), it times:

- **floor**: one committed single-row ``INSERT`` on the same database through
  the same driver (a raw DBAPI connection: ``execute`` then ``commit``, so
  ``BEGIN``, ``INSERT``, ``COMMIT`` on PostgreSQL); and **floor, autocommit**,
  the same ``INSERT`` committed by the server alone (one round trip), the
  least any durable write can cost;
- **new step**: ``current_job.step.run`` of a new step inside an attempt, the
  store's step-commit path exactly as a worker uses it (``AttemptDriver``,
  the attempt holding one connection as ``AttemptDriver.run_job`` does);
- **attempt start** (``AttemptDriver.start``: the claim) of a new run, of a
  run recorded ``queued`` at publish (C39: the first delivery of a job
  published through an integration) and of a redelivery (a run left
  ``retrying`` by its previous attempt, as after a framework retry), and
  **finish** (``Attempt.conclude``: the run ends ``succeeded``);
- **memo hit**: a replayed step (must send no statement, C9);
- **1,000 replayed steps**: an attempt of a run with 1,000 committed steps,
  the start (it loads the steps) and the body that replays them.

It prints medians, the ratio of each to the floor, and the statements and
round trips each operation sends, counted with SQLAlchemy events (a
statement is one round trip; psycopg sends ``BEGIN`` as one more; every
``COMMIT``, a pool pre-ping and a MySQL reset-on-return ``ROLLBACK`` are one
each; SQLite has no network, its "round trips" are library calls).

It also times a recovery sweep (``find_stranded``, what ``flexiq recover``
and the sweeper run) and ``flexiq runs list`` (``list_runs``: all runs, and
one task's).

``--history N`` compares a small store (``--history-base``, 5,000 finished
runs: every listing still returns a full page, so both return as many rows)
with one holding N finished runs
(5 steps each; 1 in 50 failed, 1 in 50 cancelled, the rest succeeded, their
``updated_at`` spread over the past days), two table prefixes in the same
database, measured in interleaved rounds: a new step, an attempt start, a
finish, one tick of the workers' recovery :class:`Sweeper` (the lease, then
the sweep) and ``flexiq runs list`` (``operations.list_runs``: all, one
task's, one status'), with the ratio filled / empty. The history is written
by set-based SQL (``generate_series`` on PostgreSQL, a recursive CTE on
SQLite, the ``seq_0_to_N`` sequence engine on MariaDB), not through the
library, then analyzed (PostgreSQL: ``VACUUM ANALYZE``) as a database that
grew over time would be.

``--cleanup-check N`` runs N jobs through the library (``AttemptDriver``:
start, ``--cleanup-job-steps`` new steps, a successful finish), then what
``flexiq store cleanup --older-than 0s`` calls (``operations.cleanup`` and
``cleanup_events``), and prints each table's rows (and, on PostgreSQL, its
size) and the new-step cost at the start, after the jobs and after the
cleanup, each step cost measured interleaved with an untouched control store
and given as a ratio to it.

When ``dbos`` is importable (``pip install flexiq-plugins[bench]``) a DBOS
Transact workflow of the same steps is timed on the same PostgreSQL or
SQLite database; otherwise a line says it was skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import itertools
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.pool.base import reset_rollback

from benchmarks.counting import on_statements
from benchmarks.schema import drop_prefixed_tables
from flexiq_plugins import JobEnvelope, SqlStepStore, current_job
from flexiq_plugins._attempt.attempt import Attempt
from flexiq_plugins._store.sql.mapping import dump_envelope
from flexiq_plugins.integration import AttemptDriver, JobInfo
from flexiq_plugins.operations import Sweeper, cleanup, cleanup_events, list_runs

URLS = {
    "postgres": os.environ.get("FLEXIQ_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test"),
    "mariadb": os.environ.get("FLEXIQ_BENCH_MARIADB", "mariadb://root@127.0.0.1:3306/test"),
}
_ids = itertools.count()
STARTS = 10
"""Runs started and finished a round."""
HISTORY_TASK = "bench.history"
HISTORY_STEPS = 5
"""Steps of each finished run of ``--history``."""


# --------------------------------------------------------------- counting
@dataclass
class Counts:
    """Statements and round trips seen on one engine."""

    statements: int = 0
    round_trips: int = 0
    detail: dict[str, int] = field(default_factory=dict)

    def add(self, what: str, round_trips: int = 1) -> None:
        self.detail[what] = self.detail.get(what, 0) + 1
        self.round_trips += round_trips


class Counter:
    """Counts what an engine sends: statements at the driver (benchmarks.counting), the rest by SQLAlchemy events."""

    def __init__(self, engine: Engine) -> None:
        self.on = False
        self.counts = Counts()
        backend = engine.dialect.name
        begin_trip = 1 if backend == "postgresql" else 0  # psycopg sends BEGIN; PyMySQL/pysqlite do not
        # PyMySQL's rollback always goes to the server: count the pool's reset-on-return rollback there
        # (the store's own MySQL engines switch it off and roll back only an open transaction).
        reset_trip = 1 if backend in ("mysql", "mariadb") and engine.pool._reset_on_return is reset_rollback else 0

        def _stmt(*_: Any) -> None:
            if self.on:
                self.counts.statements += 1
                self.counts.add("statement")

        on_statements(engine, _stmt, active=lambda: self.on)  # at the driver (benchmarks/counting.py)

        def autocommit(conn: Any) -> bool:  # the driver sends no BEGIN/COMMIT then
            return bool(conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT")

        @event.listens_for(engine, "begin")
        def _begin(conn: Any) -> None:
            if self.on and begin_trip and not autocommit(conn):
                self.counts.add("BEGIN")

        @event.listens_for(engine, "commit")
        def _commit(conn: Any) -> None:
            if self.on and not autocommit(conn):
                self.counts.add("COMMIT")

        @event.listens_for(engine, "rollback")
        def _rollback(*_: Any) -> None:
            if self.on:
                self.counts.add("ROLLBACK")

        @event.listens_for(engine.pool, "reset")
        def _reset(_dbapi: Any, _record: Any, state: Any) -> None:
            if self.on and reset_trip and not state.transaction_was_reset:
                self.counts.add("reset ROLLBACK")

        ping = engine.dialect.do_ping

        def counted_ping(dbapi_connection: Any) -> bool:
            if self.on:
                self.counts.add("pre-ping")
            return ping(dbapi_connection)

        engine.dialect.do_ping = counted_ping  # type: ignore[method-assign]

    @contextlib.contextmanager
    def counting(self) -> Iterator[Counts]:
        self.counts = Counts()
        self.on = True
        try:
            yield self.counts
        finally:
            self.on = False


def _const(i: int) -> Callable[[], int]:
    return lambda: i


# --------------------------------------------------------------- one store
class Bench:
    """The operations of one store, each a callable that returns its own duration(s) in seconds."""

    def __init__(  # noqa: PLR0917 - a benchmark's knobs
        self, name: str, url: str, steps: int, replayed: int, tag: str = "", counting: bool = True
    ) -> None:
        self.name = name
        self.prefix = f"bench_{os.getpid()}{tag}_"
        self.store = SqlStepStore(url, table_prefix=self.prefix)
        self.store.describe()  # creates the tables
        self.engine = self.store.engine
        # counting=False: no counting cursor nor transaction listeners, whose own CPU a CPU measurement would count
        self.counter = Counter(self.engine) if counting else None
        self.driver = AttemptDriver(self.store)
        self.steps = steps
        self.replayed = replayed
        self._floor_setup()
        self.long_run = self._long_run(replayed)
        self._sweeper: Sweeper | None = None

    # ---- the floor: one committed INSERT through the same driver
    def _floor_setup(self) -> None:
        meta = sa.MetaData()
        self.floor_table = sa.Table(
            f"{self.prefix}floor",
            meta,
            sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
            sa.Column("v", sa.String(64), nullable=False),
        )
        meta.create_all(self.engine)
        self.floor_meta = meta
        self.raw = self.engine.raw_connection()
        self.auto: Any = None
        if self.engine.dialect.name != "sqlite":
            self.auto = self.engine.raw_connection()
            driver = self.auto.driver_connection
            if self.engine.dialect.name == "postgresql":
                driver.autocommit = True
            else:
                driver.autocommit(True)
        placeholder = "?" if self.engine.dialect.paramstyle == "qmark" else "%s"
        self.floor_sql = f"INSERT INTO {self.prefix}floor (v) VALUES ({placeholder})"
        if self.engine.dialect.name == "sqlite":  # the store's own transaction handling (BEGIN IMMEDIATE … COMMIT)
            self.floor_sql_begin: str | None = "BEGIN IMMEDIATE"
        else:
            self.floor_sql_begin = None

    def floor_autocommit(self) -> dict[str, list[float]]:
        """The same INSERT autocommitted by the server (no BEGIN/COMMIT round trips): PostgreSQL, MySQL/MariaDB."""
        if self.auto is None:
            return {}
        out = []
        for i in range(self.steps):
            cursor = self.auto.cursor()
            t0 = time.perf_counter()
            cursor.execute(self.floor_sql, (f"auto-{i}",))
            out.append(time.perf_counter() - t0)
            cursor.close()
        return {"floor, autocommit": out}

    def floor(self) -> list[float]:
        out = []
        for i in range(self.steps):
            cursor = self.raw.cursor()
            t0 = time.perf_counter()
            if self.floor_sql_begin:
                cursor.execute(self.floor_sql_begin)
            cursor.execute(self.floor_sql, (f"row-{i}",))
            self.raw.commit() if not self.floor_sql_begin else cursor.execute("COMMIT")
            out.append(time.perf_counter() - t0)
            cursor.close()
        return out

    # ---- attempts
    def job(self, run_key: str | None = None) -> JobInfo:
        key = run_key or f"bench-{os.getpid()}-{next(_ids)}"
        return JobInfo(key, f"job-{next(_ids)}", JobEnvelope("bench.task", "test", "q", [], {}))

    def start(self, job: JobInfo) -> Attempt:
        started = self.driver.start(job)
        assert isinstance(started, Attempt), started
        return started

    def new_steps(self) -> dict[str, list[float]]:
        per_step = []
        with self.store.held():  # one connection for the attempt, as AttemptDriver.run_job holds it
            attempt = self.start(self.job())
            with attempt.activate():
                for i in range(self.steps):
                    t0 = time.perf_counter()
                    current_job.step.run("s", _const(i))
                    per_step.append(time.perf_counter() - t0)
            attempt.conclude(value=None)
        return {"new step": per_step}

    def starts_and_finishes(self) -> dict[str, list[float]]:
        """``STARTS`` new runs started (the claim) and finished ``succeeded`` with one step each."""
        starts, finishes = [], []
        for _ in range(STARTS):
            job = self.job()
            with self.store.held():
                t0 = time.perf_counter()
                attempt = self.start(job)
                starts.append(time.perf_counter() - t0)
                with attempt.activate():
                    current_job.step.run("s", _const(1))
                t0 = time.perf_counter()
                attempt.conclude(value=None)
                finishes.append(time.perf_counter() - t0)
        return {"attempt start": starts, "finish": finishes}

    def queued_job(self) -> JobInfo:
        """A new job whose run was recorded ``queued`` at publish (C39), as an integration records it."""
        job = self.job()
        self.store.record_queued(job.run_key, job.job_id, job.envelope)
        return job

    def retrying_job(self) -> JobInfo:
        """A job whose run's first attempt committed one step and ended ``retrying``: its next delivery."""
        job = self.job()
        attempt = self.start(job)
        with attempt.activate():
            current_job.step.run("s", _const(1))
        attempt.conclude(error=RuntimeError("retried"))
        return self.job(job.run_key)

    def other_starts(self) -> dict[str, list[float]]:
        """``STARTS`` starts of a run recorded at publish, and of a redelivery; each then finishes ``succeeded``."""
        out: dict[str, list[float]] = {"attempt start (queued)": [], "attempt start (redelivery)": []}
        for _ in range(STARTS):
            for key, job in (
                ("attempt start (queued)", self.queued_job()),
                ("attempt start (redelivery)", self.retrying_job()),
            ):
                with self.store.held():
                    t0 = time.perf_counter()
                    attempt = self.start(job)
                    out[key].append(time.perf_counter() - t0)
                    self.replay_and_succeed(attempt)
        return out

    def replay_and_succeed(self, attempt: Attempt) -> None:
        """Run the one-step body (a memo hit on a redelivery) and end the run ``succeeded``."""
        with attempt.activate():
            current_job.step.run("s", _const(1))
        attempt.conclude(value=None)

    def _long_run(self, steps: int) -> JobInfo:
        """A run with ``steps`` committed steps, left retrying (not finished) so it can be replayed."""
        job = self.job()
        attempt = self.start(job)
        with attempt.activate():
            for i in range(steps):
                current_job.step.run("s", _const(i))
        attempt.conclude(error=RuntimeError("left for replay"))
        return job

    def replay(self) -> dict[str, list[float]]:
        t0 = time.perf_counter()
        attempt = self.start(self.job(self.long_run.run_key))
        t1 = time.perf_counter()
        hits = []
        with attempt.activate():
            for i in range(self.replayed):
                t = time.perf_counter()
                current_job.step.run("s", _const(i))
                hits.append(time.perf_counter() - t)
        t2 = time.perf_counter()
        attempt.conclude(error=RuntimeError("left for replay"))
        return {
            "memo hit": hits,
            f"{self.replayed} replayed: start": [t1 - t0],
            f"{self.replayed} replayed: body": [t2 - t1],
        }

    def history_ops(self, repeat: int = 3) -> dict[str, list[float]]:
        """``repeat`` ticks of the workers' recovery sweeper, and ``flexiq runs list`` (its default limit, 100)."""
        out: dict[str, list[float]] = {}
        for _ in range(repeat):
            for label, call in (
                ("recovery sweep", self.sweeper.tick),
                ("runs list", lambda: list_runs(self.store)),
                ("runs list --task", lambda: list_runs(self.store, task_name=HISTORY_TASK)),
                ("runs list --status failed", lambda: list_runs(self.store, status="failed")),
            ):
                t0 = time.perf_counter()
                call()
                out.setdefault(label, []).append(time.perf_counter() - t0)
        return out

    @property
    def sweeper(self) -> Sweeper:
        """The recovery sweeper a worker runs (its lease, then :func:`recover`), never started as a thread."""
        if self._sweeper is None:
            self._sweeper = Sweeper(self.store, {}, name="bench")
        return self._sweeper

    def rows(self) -> dict[str, int]:
        """Rows in each of the store's tables."""
        t = self.store._t
        with self.engine.connect() as conn:
            return {
                table.name.removeprefix(self.prefix): int(
                    conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one()
                )
                for table in (t.runs, t.steps, t.attempts, t.events, t.dead)
            }

    def table_bytes(self) -> int | None:
        """The store's tables with their indexes and TOAST, bytes (PostgreSQL; ``None`` elsewhere)."""
        sizes = self.table_sizes()
        return None if sizes is None else sum(sizes)

    def table_sizes(self) -> tuple[int, int] | None:
        """The store's tables (with TOAST) and their indexes, bytes (PostgreSQL; ``None`` elsewhere)."""
        if self.engine.dialect.name != "postgresql":
            return None
        t = self.store._t
        names = "{" + ",".join(table.name for table in (t.runs, t.steps, t.attempts, t.events, t.dead)) + "}"
        query = sa.text(
            "SELECT sum(pg_table_size(c)), sum(pg_indexes_size(c)) FROM unnest(CAST(:names AS regclass[])) AS c"
        )
        with self.engine.connect() as conn:
            heap, indexes = conn.execute(query, {"names": names}).one()
        return int(heap), int(indexes)

    def counted(self) -> dict[str, Counts]:
        """Statements and round trips of each operation, from one extra (untimed) pass."""
        c = self.counter
        assert c is not None, "a Bench made with counting=False counts nothing"
        out: dict[str, Counts] = {}
        with c.counting() as counts:
            self.floor_one()
        out["floor"] = counts
        published = self.job()
        with c.counting() as counts:
            self.store.record_queued(published.run_key, published.job_id, published.job_envelope)
        out["record at publish"] = counts
        job = self.job()
        with c.counting() as counts:
            attempt = self.start(job)
        out["attempt start"] = counts
        with attempt.activate():
            with c.counting() as counts:
                current_job.step.run("s", lambda: 1)
            out["new step"] = counts
        with c.counting() as counts:
            attempt.conclude(value=None)
        out["finish"] = counts
        for key, job in (
            ("attempt start (queued)", self.queued_job()),
            ("attempt start (redelivery)", self.retrying_job()),
        ):
            with c.counting() as counts:
                attempt = self.start(job)
            out[key] = counts
            self.replay_and_succeed(attempt)
        attempt = self.start(self.job(self.long_run.run_key))
        with attempt.activate():
            with c.counting() as counts:
                for _ in range(self.replayed):
                    current_job.step.run("s", lambda: 1)
            out[f"memo hit ×{self.replayed}"] = counts
        attempt.conclude(error=RuntimeError("left for replay"))
        return out

    def floor_one(self) -> None:
        with self.engine.connect() as conn, conn.begin():  # through the engine, so the events count it
            conn.execute(self.floor_table.insert().values(v="counted"))

    def close(self) -> None:
        self.raw.close()
        if self.auto is not None:
            self.auto.close()
        self.floor_meta.drop_all(self.engine)
        drop_prefixed_tables(self.engine, self.prefix)
        self.store.close()


# --------------------------------------------------------------- history
def fill_history(bench: Bench, runs: int, steps_each: int = HISTORY_STEPS, spread_s: float = 2.0) -> None:
    """Insert ``runs`` finished runs of ``steps_each`` steps with set-based SQL (set-up, not through the library).

    Run ``i`` is ``hist-<i>`` of task ``bench.history``, last updated ``i *
    spread_s`` seconds before an hour ago; 1 in 50 failed, 1 in 50 cancelled,
    the others succeeded (their steps kept, as with ``keep_succeeded_steps``:
    the larger tables). The tables are analyzed afterwards (PostgreSQL:
    ``VACUUM ANALYZE``), as autovacuum or InnoDB's statistics would have done
    for a history that grew over time: a planner that still believes the
    tables empty, or a heap never vacuumed, is no production database.
    """
    t = bench.store._t
    dialect = bench.engine.dialect.name
    params = {
        "n": runs,
        "top": bench.store.now() - 3600,
        "spread": spread_s,
        "envelope": dump_envelope(JobEnvelope(HISTORY_TASK, "test", "q", [42], {"order": "A-1"})),
        "value": b"\x80\x04K\x01.",  # a small pickled/JSON-sized value
    }
    if dialect == "postgresql":
        seq, i, key, step_key = "generate_series(0, :n - 1) AS g(i)", "g.i", "'hist-' || g.i", "'s#' || ps.p"
    elif dialect == "sqlite":
        seq, i, key, step_key = "seq", "seq.i", "'hist-' || seq.i", "'s#' || ps.p"
    else:  # MariaDB's sequence engine
        seq, i, key, step_key = f"seq_0_to_{runs - 1} AS g", "g.seq", "CONCAT('hist-', g.seq)", "CONCAT('s#', ps.p)"
    with_seq = ""
    if dialect == "sqlite":
        with_seq = "WITH RECURSIVE seq(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM seq WHERE i < :n - 1) "
    status = f"CASE WHEN {i} % 50 = 0 THEN 'failed' WHEN {i} % 50 = 1 THEN 'cancelled' ELSE 'succeeded' END"
    updated = f"(:top - {i} * :spread)"
    positions = " UNION ALL ".join(f"SELECT {p} AS p" for p in range(steps_each))
    runs_sql = (
        f"INSERT INTO {t.runs.name} (run_key, task_name, framework, queue, status, attempt, takeovers, envelope,"
        " step_count, step_bytes, created_at, updated_at) "
        f"{with_seq}SELECT {key}, '{HISTORY_TASK}', 'test', 'q', {status}, 1, 0, :envelope, {steps_each},"
        f" {steps_each * len(params['value'])}, {updated} - 1, {updated} FROM {seq}"
    )
    steps_sql = (
        f"INSERT INTO {t.steps.name} (run_key, position, step_key, kind, value, committed_at, attempt) "
        f"{with_seq}SELECT {key}, ps.p, {step_key}, 'step', :value, {updated}, 1"
        f" FROM {seq} CROSS JOIN ({positions}) AS ps"
    )
    value = sa.bindparam("value", type_=sa.LargeBinary)
    with bench.engine.begin() as conn:
        conn.execute(sa.text(runs_sql), params)
        conn.execute(sa.text(steps_sql).bindparams(value), params)
    _analyze(bench, [t.runs.name, t.steps.name])


def _vacuum(bench: Bench) -> None:
    """A plain ``VACUUM`` of the store's tables (PostgreSQL), as autovacuum runs it: dead rows' space is reused."""
    t = bench.store._t
    with bench.engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT")
        for table in (t.runs, t.steps, t.attempts, t.events, t.dead):
            conn.exec_driver_sql(f"VACUUM {table.name}")


def _analyze(bench: Bench, tables: list[str]) -> None:
    dialect = bench.engine.dialect.name
    if dialect == "postgresql":
        with bench.engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT")  # VACUUM runs outside a transaction
            for table in tables:
                conn.exec_driver_sql(f"VACUUM ANALYZE {table}")
        return
    with bench.engine.begin() as conn:
        if dialect == "sqlite":
            conn.exec_driver_sql("ANALYZE")
        for table in tables if dialect != "sqlite" else []:
            conn.exec_driver_sql(f"ANALYZE TABLE {table}")


def history_compare(name: str, url: str, args: argparse.Namespace) -> None:
    """``args.history_base`` vs ``args.history`` finished runs, interleaved rounds, ratios filled / small."""
    empty = Bench(name, url, args.steps, replayed=0, tag="e")
    filled = Bench(name, url, args.steps, replayed=0, tag="h")
    try:
        fill_history(empty, args.history_base)  # enough that every listing returns a full page on both stores
        t0 = time.perf_counter()
        fill_history(filled, args.history)
        rows = filled.rows()
        print(
            f"[{name}] filled {args.history:,} finished runs ({rows['runs']:,} runs, {rows['steps']:,} steps)"
            f" in {time.perf_counter() - t0:.1f} s"
            + (f", {filled.table_bytes() / 2**20:.0f} MiB" if filled.table_bytes() is not None else "")  # type: ignore[operator]
        )
        samples: dict[str, dict[str, list[float]]] = {"empty": {}, "filled": {}}
        for n in range(args.rounds):  # interleaved: each operation on both stores every round, alternating order
            pair = [("empty", empty), ("filled", filled)]
            for which, bench in pair if n % 2 == 0 else reversed(pair):
                for op in (bench.new_steps, bench.starts_and_finishes, bench.history_ops):
                    for key, values in op().items():
                        samples[which].setdefault(key, []).extend(values)
        load = os.getloadavg()
        print(
            f"\n== {name}: {SqlStepStore(url).url}; {args.history_base:,} vs {args.history:,} finished runs;"
            f" {args.rounds} rounds, {args.steps} steps a round; load average {load[0]:.2f}"
        )
        print(f"{'operation':<26} {'small ms':>9} {'filled ms':>9} {'filled/small':>12} {'n':>5}")
        for key in samples["empty"]:
            e, f = statistics.median(samples["empty"][key]), statistics.median(samples["filled"][key])
            print(f"{key:<26} {_ms(e)} {_ms(f)} {f / e:>12.2f} {len(samples['empty'][key]):>5}")
    finally:
        empty.close()
        filled.close()


# --------------------------------------------------------------- cleanup
def run_jobs(bench: Bench, jobs: int, steps_each: int) -> None:
    """``jobs`` jobs through the library: start, ``steps_each`` new steps, a successful finish."""
    for _ in range(jobs):
        attempt = bench.start(bench.job())
        with attempt.activate():
            for i in range(steps_each):
                current_job.step.run(f"s{i}", _const(i))
        attempt.conclude(value=None)


def cleanup_check(name: str, url: str, args: argparse.Namespace) -> None:
    """``args.cleanup_check`` jobs, then ``store cleanup``: rows, size and step cost at each phase."""
    control = Bench(name, url, args.steps, replayed=0, tag="c")
    subject = Bench(name, url, args.steps, replayed=0, tag="s")
    phases: list[tuple[str, dict[str, int], tuple[int, int] | None, float, float, float]] = []

    def measure(phase: str, seconds: float) -> None:
        mine: list[float] = []
        base: list[float] = []
        for n in range(args.rounds):
            for bench, out in ((subject, mine), (control, base)) if n % 2 == 0 else ((control, base), (subject, mine)):
                out.extend(bench.new_steps()["new step"])
        own, ref = statistics.median(mine), statistics.median(base)
        phases.append((phase, subject.rows(), subject.table_sizes(), own, own / ref, seconds))

    try:
        measure("start", 0.0)
        deleted = events = 0
        for cycle in range(1, args.cleanup_cycles + 1):
            t0 = time.perf_counter()
            run_jobs(subject, args.cleanup_check, args.cleanup_job_steps)
            measure(f"{cycle}: after {args.cleanup_check:,} jobs", time.perf_counter() - t0)
            t0 = time.perf_counter()
            deleted += cleanup(subject.store, 0.0)
            events += cleanup_events(subject.store, 0.0)
            measure(f"{cycle}: after store cleanup", time.perf_counter() - t0)
            if subject.engine.dialect.name == "postgresql":  # what autovacuum does next: the space is reused
                t0 = time.perf_counter()
                _vacuum(subject)
                measure(f"{cycle}: after VACUUM", time.perf_counter() - t0)
        load = os.getloadavg()
        print(
            f"\n== {name}: {SqlStepStore(url).url}; {args.cleanup_cycles} × ({args.cleanup_check:,} jobs of"
            f" {args.cleanup_job_steps} step(s), then store cleanup); deleted {deleted:,} runs, {events:,} events;"
            f" load average {load[0]:.2f}"
        )
        tables = list(phases[0][1])
        print(
            f"{'phase':<25} "
            + " ".join(f"{t:>13}" for t in tables)
            + f" {'MiB table + indexes':>19} {'step ms':>8} {'× control':>9} {'took s':>7}"
        )
        for phase, rows, size, own, ratio, seconds in phases:
            shown = "" if size is None else f"{size[0] / 2**20:.1f} + {size[1] / 2**20:.1f}"
            print(
                f"{phase:<25} "
                + " ".join(f"{rows[t]:>13,}" for t in tables)
                + f" {shown:>19} {own * 1e3:>8.3f} {ratio:>9.2f} {seconds:>7.2f}"
            )
    finally:
        control.close()
        subject.close()


# --------------------------------------------------------------- DBOS
class DbosBench:  # pragma: no cover - optional (pip install 'flexiq-plugins[bench]')
    """A DBOS Transact workflow of the same trivial steps, on the same database, timed like ours.

    DBOS keeps its tables in a schema of its own (``dbos_bench_<pid>``,
    dropped afterwards) of the same PostgreSQL database (on SQLite: the same
    file). Each round times every step of a workflow of ``steps`` steps (a
    DBOS step checkpoints its output, one committed row), and a workflow
    that takes no step, start to end (what our attempt start plus finish
    are).
    """

    def __init__(self, store: str, url: str, steps: int) -> None:
        from dbos import DBOS, DBOSConfig

        self.steps = steps
        self.schema = f"dbos_bench_{os.getpid()}"
        self.url = url
        config: DBOSConfig = {"name": "flexiq-bench", "system_database_url": url, "log_level": "WARNING"}
        if store == "postgres":
            config["dbos_system_schema"] = self.schema
        DBOS(config=config)

        @DBOS.step()  # type: ignore[untyped-decorator,unused-ignore]
        def one(i: int) -> int:
            return i

        @DBOS.workflow()  # type: ignore[untyped-decorator,unused-ignore]
        def flow(n: int) -> list[float]:
            out = []
            for i in range(n):
                t0 = time.perf_counter()
                one(i)
                out.append(time.perf_counter() - t0)
            return out

        self.flow = flow
        DBOS.launch()

    def round(self) -> dict[str, list[float]]:
        per_step = self.flow(self.steps)
        empty = []
        for _ in range(STARTS):
            t0 = time.perf_counter()
            self.flow(0)
            empty.append(time.perf_counter() - t0)
        return {"DBOS step": per_step, "DBOS workflow, no step": empty}

    def close(self) -> None:
        from dbos import DBOS

        DBOS.destroy()
        if self.url.startswith("postgresql"):
            engine = sa.create_engine(self.url.replace("postgresql://", "postgresql+psycopg://", 1))
            with engine.begin() as conn:
                conn.exec_driver_sql(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE")
            engine.dispose()


def open_dbos(store: str, url: str, steps: int) -> tuple[DbosBench | None, str]:
    """A :class:`DbosBench`, or ``None`` and why not."""
    if store not in ("postgres", "sqlite"):
        return None, f"DBOS Transact: skipped for {store} (DBOS supports PostgreSQL and SQLite)"
    try:
        import dbos  # noqa: F401
    except ImportError:
        return None, "DBOS Transact: skipped (dbos is not installed: pip install 'flexiq-plugins[bench]')"
    version = importlib.metadata.version("dbos")
    return DbosBench(store, url, steps), f"DBOS Transact {version}: timed in the same rounds, same database"


# --------------------------------------------------------------- report
def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:9.3f}"


@dataclass
class StoreRun:
    """One store's results: every sample in seconds, per operation, and each operation's counted statements."""

    name: str
    samples: dict[str, list[float]]
    counts: dict[str, Counts]

    def median(self, operation: str) -> float:
        """The median of ``operation``'s samples, seconds."""
        return statistics.median(self.samples[operation])

    def ratio(self, operation: str) -> float:
        """``operation``'s median over the floor's (one committed ``INSERT``)."""
        return self.median(operation) / self.median("floor")


def run_store(name: str, args: argparse.Namespace) -> StoreRun | None:
    """Measure one store and print its report; ``None`` for ``--history`` and ``--cleanup-check``."""
    url = URLS.get(name) or f"sqlite:///{tempfile.mkdtemp(prefix='flexiq-bench-')}/bench.db"
    if name == "sqlite" and args.sqlite_url:
        url = args.sqlite_url
    if args.history or args.cleanup_check:
        if args.history:
            history_compare(name, url, args)
        if args.cleanup_check:
            cleanup_check(name, url, args)
        return None
    bench = Bench(name, url, args.steps, args.replayed)
    dbos_bench, dbos_note = (None, "DBOS Transact: skipped (--no-dbos)") if args.no_dbos else (None, "")
    try:
        if not args.no_dbos:
            dbos_bench, dbos_note = open_dbos(name, url, args.steps)
        samples: dict[str, list[float]] = {}
        for _ in range(args.rounds):  # interleaved: every operation once per round
            for op in (
                *([dbos_bench.round] if dbos_bench is not None else []),
                bench.floor,
                bench.floor_autocommit,
                bench.new_steps,
                bench.starts_and_finishes,
                bench.other_starts,
                bench.replay,
                bench.history_ops,
            ):
                got = op()
                for key, values in got.items() if isinstance(got, dict) else [("floor", got)]:
                    samples.setdefault(key, []).extend(values)
        counts = bench.counted()
        report(name, url, samples, counts, args)
        print(dbos_note)
        return StoreRun(name, samples, counts)
    finally:
        if dbos_bench is not None:
            dbos_bench.close()
        bench.close()


def report(name: str, url: str, samples: dict[str, list[float]], counts: dict[str, Counts], args: Any) -> None:
    floor = statistics.median(samples["floor"])
    print(f"\n== {name}: {SqlStepStore(url).url}, empty store; {args.rounds} rounds, {args.steps} steps a round")
    print(f"{'operation':<26} {'median ms':>9} {'p90 ms':>9} {'× floor':>8} {'n':>6}")
    for key, unsorted in samples.items():
        values = sorted(unsorted)
        p90 = values[min(len(values) - 1, int(len(values) * 0.9))]
        med = statistics.median(values)
        print(f"{key:<26} {_ms(med)} {_ms(p90)} {med / floor:>8.2f} {len(values):>6}")
    print(f"{'counted (one pass)':<26} {'statements':>10} {'round trips':>12}  detail")
    for key, c in counts.items():
        detail = ", ".join(f"{k} {v}" for k, v in sorted(c.detail.items()))
        print(f"{key:<26} {c.statements:>10} {c.round_trips:>12}  {detail}")


def parser() -> argparse.ArgumentParser:
    """This benchmark's command line (``python -m benchmarks`` takes the same options)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", default="all", choices=["sqlite", "postgres", "mariadb", "all"])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=50, help="new steps (and floor inserts) a round")
    parser.add_argument("--replayed", type=int, default=1000, help="steps of the replayed run")
    parser.add_argument("--history", type=int, default=0, help="compare an empty store with N finished runs")
    parser.add_argument(
        "--history-base",
        type=int,
        default=5000,
        help="finished runs of the store --history compares with (a full page of every listing)",
    )
    parser.add_argument("--cleanup-check", type=int, default=0, metavar="N", help="N jobs, then store cleanup")
    parser.add_argument("--cleanup-cycles", type=int, default=1, help="--cleanup-check's jobs-then-cleanup cycles")
    parser.add_argument("--cleanup-job-steps", type=int, default=1, help="new steps of each --cleanup-check job")
    parser.add_argument("--sqlite-url", default="", help="e.g. sqlite:////tmp/x.db?synchronous=full")
    parser.add_argument("--no-dbos", action="store_true", help="skip the DBOS comparison")
    return parser


def run(args: argparse.Namespace) -> list[StoreRun]:
    """Measure the stores ``args.store`` names, printing each report; return their results."""
    names = ["sqlite", "postgres", "mariadb"] if args.store == "all" else [args.store]
    load = os.getloadavg()
    print(f"machine: {os.cpu_count()} cores, {_cpu_model()}; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return [got for name in names if (got := run_store(name, args)) is not None]


def main(argv: list[str] | None = None) -> None:
    run(parser().parse_args(argv))


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


if __name__ == "__main__":
    main()
