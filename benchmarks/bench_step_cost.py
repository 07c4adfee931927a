"""Where a new step's time goes on PostgreSQL, next to the database's floor, in one run.

    python -m benchmarks.bench_step_cost [--rounds 15] [--steps 50] [--history N] [--url postgresql://…]

``bench_store`` shows that a new step costs about twice a committed
``INSERT`` on PostgreSQL although it is one autocommitted statement. This
benchmark splits that cost, in interleaved rounds (every variant once per
round, a fresh run each, so a noisy neighbour slows them all alike), and
prints medians and their ratio to the floor (``bench_store``'s: ``BEGIN``,
``INSERT``, ``COMMIT`` on a raw DBAPI connection):

**The server's part**: the store's step statement (the ``WITH`` of the
fenced run ``UPDATE`` and the step ``INSERT``, compiled as the store compiles
it), sent as text on a held, autocommitted DBAPI connection, no SQLAlchemy:

- **as is**: the run's ``updated_at`` is stamped, an indexed column, so the
  update is not HOT and inserts into every index of the runs table;
- **no updated_at**: the same without stamping it (the clock still returned):
  no indexed column changes, so PostgreSQL can update the row in place (HOT)
  and insert into no runs index;
- both again on a runs table with ``fillfactor = 50`` (room on the page for
  HOT versions).

It prints how many of each table's updates were HOT.

**The client's part**: the same statement (as is) through each layer a step
goes through, from the bottom: a held DBAPI connection (the server's part
above); a pool checkout and return around it; SQLAlchemy's
``exec_driver_sql`` on a held connection; the store's compiled Core
statement on a held connection (``Folded.commit_step``); ``store.commit_step``
(a pooled connection, autocommit, error translation), and the same inside
``store.held()`` (the connection the attempt holds); ``step.run`` (the whole
path of a worker's step inside a held attempt, as ``AttemptDriver.run_job``
runs it: encoding, the step protocol, the store call).
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import sqlalchemy as sa

from benchmarks.bench_store import fill_history
from benchmarks.schema import drop_prefixed_tables
from flexiq_plugins import JobEnvelope, SqlStepStore, current_job
from flexiq_plugins._attempt.attempt import Attempt
from flexiq_plugins._model.records import Claim, StepRow
from flexiq_plugins._store.sql.folded import Folded, postgresql_step_params
from flexiq_plugins.integration import AttemptDriver, JobInfo

URL = os.environ.get("FLEXIQ_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
VALUE = b"FQ1|json\n1"
_ids = itertools.count()


def step_statement(store: SqlStepStore, stamp: bool) -> sa.Select[Any]:
    """The store's PostgreSQL step statement (``Folded._step_statement_postgresql``), maybe not stamping ``updated_at``.

    Without the stamp the clock is still read and returned (and written in the step row), as the store needs it.
    """
    t, clock = store._t, store._clock
    runs, steps = t.runs, t.steps
    folded = store._folded
    values: dict[str, Any] = {
        "step_count": runs.c.step_count + 1,
        "step_bytes": runs.c.step_bytes + sa.bindparam("p_size", type_=runs.c.step_bytes.type),
    }
    if stamp:
        values["updated_at"] = clock
    stamped = runs.c.updated_at if stamp else clock.label("updated_at")
    held = sa.update(runs).where(*folded._fence).values(**values).returning(stamped, runs.c.cancel_reason).cte("held")
    names = [c.name for c in steps.c if c.name not in ("run_key", "attempt", "committed_at")]
    source = sa.select(
        sa.bindparam("p_run_key", type_=steps.c.run_key.type),
        sa.bindparam("p_attempt", type_=steps.c.attempt.type),
        held.c.updated_at,
        *(sa.bindparam(f"p_s_{name}", type_=steps.c[name].type) for name in names),
    ).select_from(held)
    wrote = sa.insert(steps).from_select(["run_key", "attempt", "committed_at", *names], source).cte("wrote")
    return sa.select(held.c.updated_at, held.c.cancel_reason).add_cte(wrote)


class Variant:
    """One store (table prefix) and a compiled step statement on it."""

    def __init__(self, store: SqlStepStore, stamp: bool) -> None:
        self.store = store
        self.driver = AttemptDriver(store)
        self.compiled = step_statement(store, stamp).compile(dialect=store.engine.dialect)

    def params(self, claim: Claim, row: StepRow) -> dict[str, Any]:
        given = postgresql_step_params(claim, row)
        return dict(self.compiled.construct_params(given))

    def start(self) -> Attempt:
        job = JobInfo(f"cost-{os.getpid()}-{next(_ids)}", f"job-{next(_ids)}", JobEnvelope("t", "test", "q", [], {}))
        started = self.driver.start(job)
        assert isinstance(started, Attempt), started
        return started


class Bench:
    def __init__(self, url: str, steps: int) -> None:
        self.steps = steps
        base = f"cost_{os.getpid()}_"
        self.plain = SqlStepStore(url, table_prefix=f"{base}a_")
        self.sparse = SqlStepStore(url, table_prefix=f"{base}f_")
        self.stores = (self.plain, self.sparse)
        for store in self.stores:
            store.describe()  # creates the tables
        self.engine = self.plain.engine
        if self.engine.dialect.name != "postgresql":
            raise SystemExit("bench_step_cost measures PostgreSQL (--url postgresql://…)")
        with self.engine.begin() as conn:
            conn.exec_driver_sql(f"ALTER TABLE {self.sparse._t.runs.name} SET (fillfactor = 50)")
            conn.exec_driver_sql(f"CREATE TABLE {base}floor (id serial PRIMARY KEY, v varchar(64) NOT NULL)")
        self.floor_table = f"{base}floor"
        self.raw = self.engine.raw_connection()  # the floor's: BEGIN, INSERT, COMMIT
        self.auto = self.engine.raw_connection()  # held, autocommitted: the server's part
        self.auto.driver_connection.autocommit = True
        self.auto_engine = sa.create_engine(self.engine.url, isolation_level="AUTOCOMMIT", pool_size=1)
        self.variants = {
            "as is": Variant(self.plain, stamp=True),
            "no updated_at": Variant(self.plain, stamp=False),
            "as is, fillfactor 50": Variant(self.sparse, stamp=True),
            "no updated_at, fillfactor 50": Variant(self.sparse, stamp=False),
        }
        self.samples: dict[str, list[float]] = {}
        self.cpu: dict[str, list[float]] = {}  # this process's own CPU time (Python, the driver), not the server's

    def add(self, key: str, t0: float, c0: float) -> None:
        """Record the wall time and this thread's CPU time since ``t0`` and ``c0``."""
        self.samples.setdefault(key, []).append(time.perf_counter() - t0)
        self.cpu.setdefault(key, []).append(time.thread_time() - c0)

    def floor(self) -> None:
        for i in range(self.steps):
            cursor = self.raw.cursor()
            t0, c0 = time.perf_counter(), time.thread_time()
            cursor.execute(f"INSERT INTO {self.floor_table} (v) VALUES (%s)", (f"row-{i}",))
            self.raw.commit()
            self.add("floor", t0, c0)
            cursor.close()

    def floor_autocommit(self) -> None:
        for i in range(self.steps):
            cursor = self.auto.cursor()
            t0, c0 = time.perf_counter(), time.thread_time()
            cursor.execute(f"INSERT INTO {self.floor_table} (v) VALUES (%s)", (f"auto-{i}",))
            self.add("floor, autocommit", t0, c0)
            cursor.close()

    def timed_steps(self, key: str, variant: Variant, send: Callable[[Claim, StepRow], None]) -> None:
        attempt = variant.start()
        claim = attempt.claim
        assert claim is not None
        for i in range(self.steps):
            row = StepRow(i, f"s#{i}", "run", VALUE)
            t0, c0 = time.perf_counter(), time.thread_time()
            send(claim, row)
            self.add(key, t0, c0)
        attempt.conclude(value=None)

    def server(self) -> None:
        for name, variant in self.variants.items():

            def send(claim: Claim, row: StepRow, v: Variant = variant) -> None:
                cursor = self.auto.cursor()
                cursor.execute(v.compiled.string, v.params(claim, row))
                cursor.fetchall()
                cursor.close()

            self.timed_steps(f"server: {name}", variant, send)
        runs, steps = self.plain._t.runs, self.plain._t.steps
        clock = self.plain._clock
        fence = self.plain._folded._fence
        halves = {
            "server: the run UPDATE alone": sa.update(runs)
            .where(*fence)
            .values(step_count=runs.c.step_count + 1, updated_at=clock),
            "server: the step INSERT alone": sa.insert(steps).values(
                run_key=sa.bindparam("p_run_key"),
                attempt=sa.bindparam("p_attempt"),
                position=sa.bindparam("p_s_position"),
                step_key=sa.bindparam("p_s_step_key"),
                kind="run",
                value=sa.bindparam("p_s_value"),
                committed_at=clock,
            ),
        }
        for name, statement in halves.items():
            compiled = statement.compile(dialect=self.engine.dialect)

            def send_half(claim: Claim, row: StepRow, c: Any = compiled) -> None:
                cursor = self.auto.cursor()
                given = {"p_run_key": claim.run_key, "p_owner": claim.owner, "p_attempt": claim.attempt}
                given.update(p_s_position=row.position, p_s_step_key=row.step_key, p_s_value=row.value)
                cursor.execute(c.string, dict(c.construct_params(given)))
                cursor.close()

            self.timed_steps(name, self.variants["as is"], send_half)

    def layers(self) -> None:
        variant = self.variants["as is"]
        folded: Folded = self.plain._folded

        def checkout(claim: Claim, row: StepRow) -> None:
            raw = self.auto_engine.raw_connection()
            cursor = raw.cursor()
            cursor.execute(variant.compiled.string, variant.params(claim, row))
            cursor.fetchall()
            cursor.close()
            raw.close()

        self.timed_steps("+ pool checkout", variant, checkout)
        with self.auto_engine.connect() as conn:

            def driver_sql(claim: Claim, row: StepRow) -> None:
                conn.exec_driver_sql(variant.compiled.string, variant.params(claim, row)).first()

            self.timed_steps("SQLAlchemy exec_driver_sql, held", variant, driver_sql)

            def core(claim: Claim, row: StepRow) -> None:
                folded.commit_step(conn, claim, row)

            self.timed_steps("SQLAlchemy Core statement, held", variant, core)

        def store_step(claim: Claim, row: StepRow) -> None:
            self.plain.commit_step(claim, row)

        self.timed_steps("store.commit_step", variant, store_step)
        with self.plain.held():
            self.timed_steps("store.commit_step, held", variant, store_step)
        with self.plain.held():  # as AttemptDriver.run_job holds the attempt's connection
            attempt = variant.start()
            with attempt.activate():
                for i in range(self.steps):
                    t0, c0 = time.perf_counter(), time.thread_time()
                    current_job.step.run("s", lambda i=i: i)
                    self.add("step.run (the library's path)", t0, c0)
            attempt.conclude(value=None)

    def hot_counts(self) -> list[str]:
        """Each runs table's updates and HOT updates (all of them: starts and finishes too, never HOT)."""
        query = "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = %(n)s"
        deadline = time.monotonic() + 15  # a backend reports its counts within about 10 s of going idle
        while True:
            with self.engine.connect() as conn:
                rows = [(s._t.runs.name, conn.exec_driver_sql(query, {"n": s._t.runs.name}).one()) for s in self.stores]
            if all(row.n_tup_hot_upd for _, row in rows) or time.monotonic() > deadline:
                return [f"{name}: {row.n_tup_upd} updates, {row.n_tup_hot_upd} HOT" for name, row in rows]
            time.sleep(1)

    def close(self) -> None:
        self.raw.close()
        self.auto.close()
        self.auto_engine.dispose()
        with self.engine.begin() as conn:
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {self.floor_table}")
        for store in self.stores:
            drop_prefixed_tables(store.engine, store._prefix)
            store.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=URL)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=50, help="steps (and floor inserts) per variant a round")
    parser.add_argument("--history", type=int, default=0, help="fill N finished runs (5 steps each) first")
    args = parser.parse_args(argv)
    bench = Bench(args.url, args.steps)
    try:
        for store in bench.stores if args.history else ():
            fill_history(SimpleNamespace(store=store, engine=store.engine), args.history)  # type: ignore[arg-type]
        for _ in range(args.rounds):  # interleaved: every variant once per round
            bench.floor()
            bench.floor_autocommit()
            bench.server()
            bench.layers()
        floor = statistics.median(bench.samples["floor"])
        history = f"; {args.history} finished runs in each store's tables" if args.history else "; empty store"
        print(f"machine: {os.cpu_count()} cores; {args.rounds} rounds × {args.steps} steps; medians{history}")
        print(f"{'':<40} {'median ms':>9} {'× floor':>8} {'client CPU ms':>13} {'n':>6}")
        for key, values in bench.samples.items():
            med = statistics.median(values)
            cpu = statistics.median(bench.cpu[key])
            print(f"{key:<40} {med * 1e3:9.3f} {med / floor:8.2f} {cpu * 1e3:13.3f} {len(values):>6}")
        for line in bench.hot_counts():
            print(line)
    finally:
        bench.close()


if __name__ == "__main__":
    main()
