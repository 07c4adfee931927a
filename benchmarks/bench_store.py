"""What a durable step costs, next to the database's own floor, in one run.

    python -m benchmarks.bench_store --store sqlite|postgres|mariadb|all [--rounds 7] [--steps 50]
    python -m benchmarks.bench_store --store postgres --history 100000   # the same with N finished runs

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
one task's). ``--history N`` first fills the tables with N finished runs of
5 steps each (a bulk insert, not through the library): compare with a run
without it to see that no operation's cost grows with the history.

When ``dbos`` is importable (``pip install flexiq-plugins[bench]``) a DBOS
Transact workflow of the same steps is timed on the same PostgreSQL or
SQLite database; otherwise a line says it was skipped.
"""

from __future__ import annotations

import argparse
import contextlib
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

from flexiq_plugins import AttemptDriver, JobEnvelope, JobInfo, SqlStepStore, current_job
from flexiq_plugins.attempt import Attempt
from flexiq_plugins.operations import find_stranded

URLS = {
    "postgres": os.environ.get("FLEXIQ_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test"),
    "mariadb": os.environ.get("FLEXIQ_BENCH_MARIADB", "mariadb://root@127.0.0.1:3306/test"),
}
_ids = itertools.count()
STARTS = 10
"""Runs started and finished a round."""


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
    """Counts what an engine sends, with SQLAlchemy events (and the dialect's ping)."""

    def __init__(self, engine: Engine) -> None:
        self.on = False
        self.counts = Counts()
        backend = engine.dialect.name
        begin_trip = 1 if backend == "postgresql" else 0  # psycopg sends BEGIN; PyMySQL/pysqlite do not
        # PyMySQL's rollback always goes to the server: count the pool's reset-on-return rollback there
        # (the store's own MySQL engines switch it off and roll back only an open transaction).
        reset_trip = 1 if backend in ("mysql", "mariadb") and engine.pool._reset_on_return is reset_rollback else 0

        @event.listens_for(engine, "before_cursor_execute")
        def _stmt(*_: Any) -> None:
            if self.on:
                self.counts.statements += 1
                self.counts.add("statement")

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

    def __init__(self, name: str, url: str, steps: int, replayed: int) -> None:
        self.name = name
        self.prefix = f"bench_{os.getpid()}_"
        self.store = SqlStepStore(url, table_prefix=self.prefix)
        self.store.describe()  # creates the tables
        self.engine = self.store.engine
        self.counter = Counter(self.engine)
        self.driver = AttemptDriver(self.store)
        self.steps = steps
        self.replayed = replayed
        self._floor_setup()
        self.long_run = self._long_run(replayed)

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

    def history_ops(self) -> dict[str, list[float]]:
        t0 = time.perf_counter()
        find_stranded(self.store)
        t1 = time.perf_counter()
        self.store.list_runs(limit=50)
        t2 = time.perf_counter()
        self.store.list_runs(task_name="bench.history", limit=50)
        t3 = time.perf_counter()
        return {"recovery sweep": [t1 - t0], "runs list (50)": [t2 - t1], "runs list --task (50)": [t3 - t2]}

    def counted(self) -> dict[str, Counts]:
        """Statements and round trips of each operation, from one extra (untimed) pass."""
        c = self.counter
        out: dict[str, Counts] = {}
        with c.counting() as counts:
            self.floor_one()
        out["floor"] = counts
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
        self.store._t.metadata.drop_all(self.engine)
        with self.engine.begin() as conn:
            conn.execute(sa.text(f"DROP TABLE IF EXISTS {self.prefix}alembic_version"))
        self.store.close()


# --------------------------------------------------------------- history
def fill_history(bench: Bench, runs: int, steps_each: int = 5) -> None:
    """Bulk-insert ``runs`` succeeded runs of ``steps_each`` steps (not through the library: it is set-up).

    The tables are analyzed afterwards, as a database's autovacuum (or
    InnoDB's automatic statistics) would have done for a history that grew
    over time: a planner that still believes the tables empty picks plans
    no production database would.
    """
    t = bench.store._t
    now = bench.store.now() - 3600
    batch = 5000
    with bench.engine.begin() as conn:
        for first in range(0, runs, batch):
            keys = [f"hist-{i}" for i in range(first, min(first + batch, runs))]
            conn.execute(
                t.runs.insert(),
                [
                    {
                        "run_key": k,
                        "task_name": "bench.history",
                        "framework": "test",
                        "queue": "q",
                        "status": "succeeded",
                        "attempt": 1,
                        "takeovers": 0,
                        "envelope": '{"args": [], "kwargs": {}}',
                        "step_count": steps_each,
                        "step_bytes": steps_each * 2,
                        "created_at": now,
                        "updated_at": now,
                    }
                    for k in keys
                ],
            )
            conn.execute(
                t.steps.insert(),
                [
                    {
                        "run_key": k,
                        "position": p,
                        "step_key": f"s#{p}",
                        "kind": "step",
                        "value": b"1",
                        "committed_at": now,
                        "attempt": 1,
                    }
                    for k in keys
                    for p in range(steps_each)
                ],
            )
    _analyze(bench, [t.runs.name, t.steps.name])


def _analyze(bench: Bench, tables: list[str]) -> None:
    dialect = bench.engine.dialect.name
    with bench.engine.begin() as conn:
        if dialect == "sqlite":
            conn.exec_driver_sql("ANALYZE")
        for table in tables if dialect != "sqlite" else []:
            conn.exec_driver_sql(f"ANALYZE {'TABLE ' if dialect != 'postgresql' else ''}{table}")


# --------------------------------------------------------------- DBOS
def dbos_line(store: str, url: str, steps: int, rounds: int) -> str:
    try:
        import dbos  # type: ignore[import-not-found]  # noqa: F401
    except ImportError:
        return "DBOS Transact: skipped (dbos is not installed: pip install 'flexiq-plugins[bench]')"
    return _dbos_bench(store, url, steps, rounds)


def _dbos_bench(store: str, url: str, steps: int, rounds: int) -> str:  # pragma: no cover - optional
    from dbos import DBOS, DBOSConfig  # type: ignore[import-not-found]

    if store not in ("postgres", "sqlite"):
        return f"DBOS Transact: skipped for {store} (DBOS supports PostgreSQL and SQLite)"
    config: DBOSConfig = {"name": "flexiq-bench", "system_database_url": url}
    DBOS(config=config)

    @DBOS.step()  # type: ignore[untyped-decorator]
    def one(i: int) -> int:
        return i

    @DBOS.workflow()  # type: ignore[untyped-decorator]
    def flow(n: int) -> list[float]:
        out = []
        for i in range(n):
            t0 = time.perf_counter()
            one(i)
            out.append(time.perf_counter() - t0)
        return out

    DBOS.launch()
    try:
        per_step: list[float] = []
        for _ in range(rounds):
            per_step += flow(steps)
        return f"DBOS Transact step: median {statistics.median(per_step) * 1e3:.3f} ms"
    finally:
        DBOS.destroy()


# --------------------------------------------------------------- report
def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:9.3f}"


def run_store(name: str, args: argparse.Namespace) -> None:
    url = URLS.get(name) or f"sqlite:///{tempfile.mkdtemp(prefix='flexiq-bench-')}/bench.db"
    if name == "sqlite" and args.sqlite_url:
        url = args.sqlite_url
    bench = Bench(name, url, args.steps, args.replayed)
    try:
        if args.history:
            t0 = time.perf_counter()
            fill_history(bench, args.history)
            print(f"[{name}] filled {args.history} finished runs in {time.perf_counter() - t0:.1f} s")
        samples: dict[str, list[float]] = {}
        for _ in range(args.rounds):  # interleaved: every operation once per round
            for op in (
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
        if name in ("postgres", "sqlite") and not args.no_dbos:
            print(dbos_line(name, url, args.steps, args.rounds))
    finally:
        bench.close()


def report(name: str, url: str, samples: dict[str, list[float]], counts: dict[str, Counts], args: Any) -> None:
    floor = statistics.median(samples["floor"])
    history = f", {args.history} finished runs in the tables" if args.history else ", empty store"
    print(f"\n== {name}: {SqlStepStore(url).url}{history}; {args.rounds} rounds, {args.steps} steps a round")
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", default="all", choices=["sqlite", "postgres", "mariadb", "all"])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=50, help="new steps (and floor inserts) a round")
    parser.add_argument("--replayed", type=int, default=1000, help="steps of the replayed run")
    parser.add_argument("--history", type=int, default=0, help="fill N finished runs first")
    parser.add_argument("--sqlite-url", default="", help="e.g. sqlite:////tmp/x.db?synchronous=full")
    parser.add_argument("--no-dbos", action="store_true", help="skip the DBOS comparison")
    args = parser.parse_args(argv)
    names = ["sqlite", "postgres", "mariadb"] if args.store == "all" else [args.store]
    print(f"machine: {os.cpu_count()} cores, {_cpu_model()}")
    for name in names:
        run_store(name, args)


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
