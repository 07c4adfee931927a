"""Where a durable job's CPU goes: this process's (the client's) and the database server's, per operation.

    python -m benchmarks.bench_cpu [--store postgres|sqlite] [--rounds 5] [--ops 3000] [--steps 3]

Throughput on a machine that the worker and the database share is bounded by
CPU, not by round trips. This benchmark, in interleaved rounds, counts the CPU
milliseconds each of these costs, in this process (``time.process_time``, the
client: this library, SQLAlchemy, the driver) and, on PostgreSQL, in the
server's processes (their ``/proc`` CPU time, so the server must run on this
machine):

- **floor insert**: one committed single-row ``INSERT`` sent by the driver
  itself (PostgreSQL: autocommitted by the server, one round trip; SQLite:
  ``BEGIN IMMEDIATE``, the ``INSERT``, ``COMMIT``): the least a durable write
  costs both sides;
- **new step**: ``current_job.step.run`` of a new step in a running attempt
  (one statement on PostgreSQL, as a worker runs it, the attempt holding its
  connection);
- **start + finish**: a whole job of no step as a worker runs it, its run
  recorded ``queued`` at publish (C39): the attempt start (1 statement on
  PostgreSQL) and the finish (1);
- **job of N steps**: the same with ``--steps`` new steps.

On SQLite the database runs in this process: its CPU is in the client
column, and the server column is empty. The database's CPU for a job is the
least any client would add to a plain task's cost for those statements;
:mod:`benchmarks.bench_throughput` prints the ratio that leaves (its
``ceiling`` column), and ``docs/performance.md`` reasons from both.

Needs PostgreSQL on 127.0.0.1:5432 (database ``test``) or ``FLEXIQ_STORE_URL``,
running on this machine (Linux ``/proc``), for ``--store postgres``.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
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
    """CPU seconds used so far by every process named ``postgres`` on this machine (``/proc``; 0 without it)."""
    ticks = sum(cpu for name, cpu in proc_cpu().values() if name == "postgres")
    return ticks / os.sysconf("SC_CLK_TCK")


def measured(work: Callable[[], int], *, server: bool = True) -> tuple[float, float]:
    """Run ``work`` (it returns how many operations it did); client and server CPU ms per operation.

    ``server=False`` (an in-process database): the server's is 0.
    """
    read: Callable[[], float] = server_cpu_seconds if server else float
    before, client = read(), time.process_time()
    n = work()
    return (time.process_time() - client) * 1000 / n, (read() - before) * 1000 / n


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


@dataclass(frozen=True)
class CpuResult:
    """The medians of one store's rounds: per operation, client and server CPU milliseconds.

    Parameters:
      store (str): ``postgres`` or ``sqlite``.
      steps (int): the new steps of the measured job.
      medians (dict[str, tuple[float, float]]): per operation, (client, server) CPU ms.
    """

    store: str
    steps: int
    medians: dict[str, tuple[float, float]]

    def client(self, label: str) -> float:
        """The median client CPU ms of ``label``."""
        return self.medians[label][0]

    def server(self, label: str) -> float:
        """The median server CPU ms of ``label`` (0 on SQLite: the database runs in the client)."""
        return self.medians[label][1]

    @property
    def job_label(self) -> str:
        """The label of the job of ``steps`` steps."""
        return f"job of {self.steps} steps"


START_FINISH = "start + finish"


def parser() -> argparse.ArgumentParser:
    """This benchmark's command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", default="postgres", choices=["postgres", "sqlite"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ops", type=int, default=3000, help="floor inserts and new steps a round")
    parser.add_argument("--steps", type=int, default=3, help="steps of each measured job")
    return parser


def run(args: argparse.Namespace) -> CpuResult:
    """Measure ``args.store`` in interleaved rounds, print the table, return the medians."""
    postgres = args.store == "postgres"
    if postgres and not Path("/proc/stat").exists():
        raise SystemExit("bench_cpu reads the server's CPU time from /proc: Linux only")
    with contextlib.ExitStack() as stack:
        url = STORE_URL if postgres else f"sqlite:///{stack.enter_context(tempfile.TemporaryDirectory())}/cpu.db"
        result = _measure(args, url)
    _print(result)
    return result


def _measure(args: argparse.Namespace, url: str) -> CpuResult:
    bench = Bench(args.store, url, steps=args.ops, replayed=1, counting=False)
    job_label = f"job of {args.steps} steps"
    jobs = max(1, args.ops // (args.steps + 3))
    results: dict[str, list[tuple[float, float]]] = {}
    floor = (lambda: floor_inserts(bench, args.ops)) if bench.auto is not None else (lambda: sqlite_floor(bench))
    try:
        server = args.store == "postgres"
        for _ in range(args.rounds):
            results.setdefault("floor insert", []).append(measured(floor, server=server))
            results.setdefault("new step", []).append(measured(lambda: new_steps(bench, args.ops), server=server))
            results.setdefault(START_FINISH, []).append(measured(recorded_jobs(bench, jobs, 0), server=server))
            work = recorded_jobs(bench, jobs, args.steps)
            results.setdefault(job_label, []).append(measured(work, server=server))
    finally:
        bench.close()
    medians = {
        label: (statistics.median(c for c, _ in got), statistics.median(s for _, s in got))
        for label, got in results.items()
    }
    return CpuResult(args.store, args.steps, medians)


def sqlite_floor(bench: Bench) -> int:
    """SQLite's floor: ``BEGIN IMMEDIATE``, one ``INSERT``, ``COMMIT`` on the raw driver connection, as the store's."""
    return len(bench.floor())


def _print(result: CpuResult) -> None:
    load = os.getloadavg()
    where = "server" if result.store == "postgres" else "(in process)"
    print(f"\n== {result.store}: CPU per operation; machine: {os.cpu_count()} cores, load average {load[0]:.2f}")
    print(f"{'operation':<18} {'client CPU ms':>14} {'× floor':>8} {'server CPU ms':>14} {'× floor':>8}  {where}")
    floor_client, floor_server = result.medians["floor insert"]
    for label, (client, server) in result.medians.items():
        print(
            f"{label:<18} {client:>14.3f} {client / floor_client:>8.2f} {server:>14.3f}"
            f" {ratio(server, floor_server):>8}"
        )
    if result.store == "postgres" and not floor_server:
        print(
            "the floor insert's server CPU read 0: either no postgres process is visible in /proc"
            " (the server runs in another container or host) or a round was shorter than a clock"
            f" tick (1/{os.sysconf('SC_CLK_TCK')} s; raise --ops); the server columns say nothing here"
        )


def main(argv: list[str] | None = None) -> None:
    run(parser().parse_args(argv))


def ratio(server: float, floor_server: float) -> str:
    """``server`` as a multiple of the floor's server CPU, or ``n/a`` when the floor read 0 (see ``main``)."""
    return f"{server / floor_server:.2f}" if floor_server else "n/a"


if __name__ == "__main__":
    main()
