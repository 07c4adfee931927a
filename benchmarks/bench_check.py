"""How long ``flexiq check`` takes over many runs in flight (C48): printed, not asserted.

    python -m benchmarks.bench_check --store sqlite|postgres|all [--runs 10000] [--rounds 3]

It fills a store (a SQLite file, or fresh tables on PostgreSQL) with
``--runs`` sleeping runs of one checkout task, each with the rows a worker
writes (``charge#0`` with its encoded value, ``sleep#0`` with a wake time an
hour ahead); one run in 20 was recorded by an older version (``reserve#0``
first), so the check finds divergences too. The rows are written with bulk
inserts (set-up, not through the library). Then it times, in rounds:

- **read**: what the check reads (every unfinished run and its steps);
- **check**: [`check_runs`][flexiq_plugins.operations.check_runs] with the new
  code, the read included: what ``flexiq check --app ...`` does;

and prints the median seconds, the runs per second, and what the check found.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from benchmarks.bench_store import URLS
from flexiq_plugins import CodecChain, JobEnvelope, SqlStepStore, current_job
from flexiq_plugins._delivery.deploys import CHECKED_STATUSES
from flexiq_plugins._store.sql.mapping import dump_envelope
from flexiq_plugins.operations import check_runs

TASK = "bench.checkout"
OLD_EVERY = 20
"""One run in this many was recorded by the older version."""


def checkout(order: int) -> str:
    """The new code: charge, sleep an hour, receipt."""
    step = current_job.step
    charge = step.run("charge", lambda: {"id": f"ch_{order}"})
    step.sleep("1h")
    return str(step.run("receipt", lambda: f"receipt for {charge['id']}"))


def fill(store: SqlStepStore, runs: int) -> None:
    """Insert ``runs`` sleeping runs of :data:`TASK`, as a worker leaves them after ``charge`` and the sleep."""
    t = store._t  # set-up: the tables themselves
    now = store.now()
    value = CodecChain().encode({"id": "ch_1"})
    rows, steps = [], []
    for i in range(runs):
        key = f"bench-{i}"
        envelope = dump_envelope(JobEnvelope(TASK, "test", "q", [i], {}))
        first = "reserve#0" if i % OLD_EVERY == 0 else "charge#0"
        rows.append(
            {
                "run_key": key,
                "task_name": TASK,
                "framework": "test",
                "queue": "q",
                "status": "sleeping",
                "attempt": 1,
                "takeovers": 0,
                "job_id": f"job-{i}",
                "envelope": envelope,
                "step_count": 2,
                "step_bytes": len(value),
                "created_at": now - 60,
                "updated_at": now - 60 + i * 1e-4,
                "wake_at": now + 3600,
            }
        )
        common = {"run_key": key, "committed_at": now - 60, "attempt": 1}
        steps.append({**common, "position": 0, "step_key": first, "kind": "run", "value": value, "wake_at": None})
        steps.append(
            {**common, "position": 1, "step_key": "sleep#0", "kind": "sleep", "value": None, "wake_at": now + 3600}
        )
    with store.engine.begin() as conn:
        for start in range(0, runs, 2000):
            conn.execute(sa.insert(t.runs), rows[start : start + 2000])
        for start in range(0, len(steps), 4000):
            conn.execute(sa.insert(t.steps), steps[start : start + 4000])


def read_all(store: SqlStepStore) -> int:
    """What a check reads: every unfinished run and its steps; returns how many runs."""
    runs = [run for status in CHECKED_STATUSES for run in store.list_runs(status=status, limit=2**31 - 1)]
    store.get_steps_of([run.run_key for run in runs])
    return len(runs)


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def bench(name: str, url: str, runs: int, rounds: int) -> None:
    """Fill a fresh store at ``url`` and print the read and check times."""
    prefix = f"fqchk{uuid.uuid4().hex[:8]}_"
    store = SqlStepStore(url, table_prefix=prefix)
    try:
        store.now()  # creates the tables
        fill(store, runs)
        reads, checks, report = [], [], None
        for _ in range(rounds):
            reads.append(timed(lambda: read_all(store))[0])
            seconds, report = timed(lambda: check_runs(store, {TASK: checkout}))
            checks.append(seconds)
        assert report is not None
        read_s, check_s = statistics.median(reads), statistics.median(checks)
        found = {v: sum(1 for c in report.checks if c.verdict == v) for v in ("compatible", "divergent", "error")}
        print(f"{name}: {runs:,} runs in flight, {rounds} rounds (median)")
        print(f"  read (runs and their steps)   {read_s:8.2f} s")
        print(f"  check (flexiq check)          {check_s:8.2f} s   {runs / check_s:,.0f} runs/s")
        print(f"  found: {found['compatible']:,} compatible, {found['divergent']:,} divergent, {found['error']} errors")
    finally:
        with store.engine.begin() as conn:
            for table in (store._t.steps, store._t.runs):
                conn.execute(sa.delete(table))
        store._t.metadata.drop_all(store.engine)
        store.close()


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark on the stores asked for."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", choices=["sqlite", "postgres", "all"], default="all")
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    stores = ["sqlite", "postgres"] if args.store == "all" else [args.store]
    for name in stores:
        if name == "sqlite":
            with tempfile.TemporaryDirectory() as directory:
                bench(name, f"sqlite:///{os.path.join(directory, 'check.db')}", args.runs, args.rounds)
        else:
            bench(name, URLS["postgres"], args.runs, args.rounds)


if __name__ == "__main__":
    main()
