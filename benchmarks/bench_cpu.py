"""Where a durable job's CPU goes: this process's (the client's) and the local PostgreSQL server's, per operation.

    python -m benchmarks.bench_cpu [--rounds 3] [--ops 3000] [--steps 3]

Throughput on a machine that the worker and the database share is bounded by
CPU, not by round trips. This benchmark, in interleaved rounds, counts the CPU
milliseconds each of these costs, in this process (``time.process_time``, the
client: this library, SQLAlchemy, psycopg) and in the PostgreSQL server's
processes (their ``/proc`` CPU time, so the server must run on this machine):

- **floor insert**: one autocommitted single-row ``INSERT`` sent by psycopg
  itself (the least a durable write costs both sides);
- **new step**: ``current_job.step.run`` of a new step in a running attempt
  (one statement, as a worker runs it, the attempt holding its connection);
- **job of N steps**: a whole job as a worker runs it, its run recorded
  ``queued`` at publish (C39): the attempt start (2 statements), ``--steps``
  new steps and the finish (1).

The database's CPU for a job is the least any client would add to a plain
task's cost for those statements; :mod:`benchmarks.bench_throughput` prints
the ratio that leaves (its ``ceiling`` column), and ``docs/performance.md``
reasons from both.

Needs PostgreSQL on 127.0.0.1:5432 (database ``test``) or ``FLEXIQ_STORE_URL``,
running on this machine (Linux ``/proc``).
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.bench_store import Bench
from benchmarks.bench_throughput import proc_cpu
from flexiq_plugins import JobEnvelope, current_job
from flexiq_plugins.integration import JobInfo

STORE_URL = os.environ.get("FLEXIQ_STORE_URL", "postgresql://postgres@127.0.0.1:5432/test").replace(
    "postgresql://", "postgresql+psycopg://", 1
)
_ids = itertools.count()


def server_cpu_seconds() -> float:
    """CPU seconds used so far by every process named ``postgres`` on this machine (``/proc``)."""
    ticks = sum(cpu for name, cpu in proc_cpu().values() if name == "postgres")
    return ticks / os.sysconf("SC_CLK_TCK")


def measured(work: Callable[[], int]) -> tuple[float, float]:
    """Run ``work`` (it returns how many operations it did); client and server CPU ms per operation."""
    server, client = server_cpu_seconds(), time.process_time()
    n = work()
    return (time.process_time() - client) * 1000 / n, (server_cpu_seconds() - server) * 1000 / n


def floor_inserts(bench: Bench, n: int) -> int:
    cursor = bench.auto.cursor()
    for i in range(n):
        cursor.execute(bench.floor_sql, (f"cpu-{i}",))
    cursor.close()
    return n


def new_steps(bench: Bench, n: int) -> int:
    with bench.store.held():
        attempt = bench.start(bench.job())
        with attempt.activate():
            for i in range(n):
                current_job.step.run("s", lambda i=i: i)  # type: ignore[misc]
        attempt.conclude(value=None)
    return n


def recorded_jobs(bench: Bench, n: int, steps: int) -> Callable[[], int]:
    """``n`` jobs recorded ``queued`` (not measured), and the work that runs them as a worker does."""
    jobs = [
        JobInfo(f"cpu-{os.getpid()}-{next(_ids)}", f"j-{next(_ids)}", JobEnvelope("bench.task", "test", "q", [], {}))
        for _ in range(n)
    ]
    for job in jobs:
        bench.store.record_queued(job.run_key, job.job_id, job.envelope)

    def body() -> None:
        for i in range(steps):
            current_job.step.run(f"s{i}", lambda i=i: i)  # type: ignore[misc]

    def work() -> int:
        for job in jobs:
            bench.driver.run_job(job, body)  # holds one connection for the attempt, as a worker does
        return n

    return work


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ops", type=int, default=3000, help="floor inserts and new steps a round")
    parser.add_argument("--steps", type=int, default=3, help="steps of each measured job")
    args = parser.parse_args(argv)
    if not Path("/proc/stat").exists():
        raise SystemExit("bench_cpu reads the server's CPU time from /proc: Linux only")
    bench = Bench("postgres", STORE_URL, steps=1, replayed=1, counting=False)
    job_label = f"job of {args.steps} steps"
    results: dict[str, list[tuple[float, float]]] = {}
    try:
        for _ in range(args.rounds):
            results.setdefault("floor insert", []).append(measured(lambda: floor_inserts(bench, args.ops)))
            results.setdefault("new step", []).append(measured(lambda: new_steps(bench, args.ops)))
            work = recorded_jobs(bench, args.ops // (args.steps + 3), args.steps)
            results.setdefault(job_label, []).append(measured(work))
    finally:
        bench.close()
    load = os.getloadavg()
    print(f"machine: {os.cpu_count()} cores, load average {load[0]:.2f}; {args.rounds} rounds, medians")
    print(f"{'operation':<18} {'client CPU ms':>14} {'server CPU ms':>14} {'× floor (server)':>17}")
    floor_server = statistics.median(s for _, s in results["floor insert"])
    for label, got in results.items():
        client = statistics.median(c for c, _ in got)
        server = statistics.median(s for _, s in got)
        print(f"{label:<18} {client:>14.3f} {server:>14.3f} {ratio(server, floor_server):>17}")
    if not floor_server:
        print(
            "the floor insert's server CPU read 0: either no postgres process is visible in /proc"
            " (the server runs in another container or host) or a round was shorter than a clock"
            f" tick (1/{os.sysconf('SC_CLK_TCK')} s; raise --ops); the server columns say nothing here"
        )


def ratio(server: float, floor_server: float) -> str:
    """``server`` as a multiple of the floor's server CPU, or ``n/a`` when the floor read 0 (see ``main``)."""
    return f"{server / floor_server:.2f}" if floor_server else "n/a"


if __name__ == "__main__":
    main()
