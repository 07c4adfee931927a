"""Plain vs durable task throughput on a real Celery and a real Dramatiq worker (Redis broker, PostgreSQL store).

    python -m benchmarks.bench_throughput [--jobs 500] [--rounds 3] [--framework celery|dramatiq|all]
        [--pool prefork,solo,threads] [-c N] [--dramatiq-workers 2x8,1x1] [--store postgres,sqlite]

For each framework, each worker configuration, each round and each body (a
plain task, a durable task of 3 steps, one of 5 steps), it enqueues
``--jobs`` jobs, starts one worker, and measures jobs per second from the
first job's end to the last's (so the worker's start is not counted). Rounds
are interleaved (plain, 3, 5, plain, 3, 5 … for every configuration in
turn); it prints the medians and the ratio of each durable body to the plain
task of the same configuration. The steps are trivial: what is measured is
the library's cost per job (attempt start, a commit per step, finish), not a
workload.

The workers, by default, are the frameworks' own defaults: Celery's prefork
pool (``-c`` defaults to Celery's, the number of CPUs) and Dramatiq's
``<CPUs> processes × 8 threads``. ``--pool solo`` (one process, one task at a
time) and ``--dramatiq-workers 1x1`` measure a single execution thread, where
the plain task costs much less and the ratios are lower; ``--pool`` and
``--dramatiq-workers`` take comma-separated lists, run interleaved.

While a worker runs, a thread samples ``pg_stat_activity`` every 50 ms: each
worker process names its store connections ``<run>-<pid>``
(:mod:`benchmarks.throughput_apps`), so it prints, per configuration, the
most connections any one process held against that process's concurrency + 1
(the target; a process that runs no task, Celery's prefork parent or
Dramatiq's supervisor, is allowed 1), and the most held by the whole worker.
Each job also reports the statements and round trips (psycopg's ``BEGIN``
and each ``COMMIT`` counted) its worker process sent to the store, printed
per job.

It also prints where the CPU goes, per job: between the 10th and the 90th
percentile of a round's jobs (the worker's start and the last stragglers
left out) it reads, from ``/proc``, the CPU time of the worker's processes,
of the local PostgreSQL server's processes and of ``redis-server``, and how
busy the machine was (Linux only; the servers counted only when they run on
this machine). A durable job's database CPU is the least any client could
add to a plain job for the same statements: ``plain CPU / (plain CPU +
database CPU of the durable job)`` is the ratio a worker could reach if the
library itself cost nothing and the machine were the limit, which the
``ceiling`` column prints.

``--store sqlite`` runs the same workers on a SQLite file (WAL,
``synchronous=NORMAL``, the store's defaults), every worker process writing
to it. SQLite runs inside the worker, so its CPU is in the worker's column;
its ``database`` column is then the least that database work can cost: the
job's statements at the worker (``k + 2`` transactions), each at the CPU of
one committed single-row ``INSERT`` on the raw driver, measured in this
process before the rounds. Statements are counted on PostgreSQL only (a
SQLite trace would cost the worker CPU).

Needs Redis on 127.0.0.1:6379 and PostgreSQL on 127.0.0.1:5432 (database
``test``), or ``FLEXIQ_BENCH_REDIS`` / ``FLEXIQ_STORE_URL``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import redis
import sqlalchemy as sa

from benchmarks.schema import drop_prefixed_tables

ROOT = Path(__file__).resolve().parents[1]
REDIS_URL = os.environ.get("FLEXIQ_BENCH_REDIS", "redis://127.0.0.1:6379/14")
STORE_URL = os.environ.get("FLEXIQ_STORE_URL", "postgresql://postgres@127.0.0.1:5432/test")
BODIES = [("plain", 3), ("durable", 3), ("durable", 5)]
SAMPLE_EVERY_S = 0.05


@dataclass(frozen=True)
class WorkerConfig:
    """One worker setup: Celery with a pool and a concurrency, or Dramatiq with processes × threads."""

    framework: str
    pool: str = "prefork"  # Celery: prefork, solo or threads
    concurrency: int = 1  # Celery: -c; Dramatiq: threads per process
    processes: int = 1  # Dramatiq: -p
    store: str = "postgres"  # or sqlite

    @property
    def label(self) -> str:
        on = "" if self.store == "postgres" else f" ({self.store})"
        if self.framework == "celery":
            return f"celery -P {self.pool}" + ("" if self.pool == "solo" else f" -c {self.concurrency}") + on
        return f"dramatiq -p {self.processes} -t {self.concurrency}" + on

    def store_url(self, queue: str) -> str:
        """The store of one round: the PostgreSQL database, or a SQLite file of its own."""
        if self.store == "postgres":
            return STORE_URL
        return f"sqlite:///{Path(tempfile.gettempdir()) / queue}.db"

    def command(self, queue: str) -> list[str]:
        if self.framework == "celery":
            return [
                sys.executable, "-m", "celery", "-A", "benchmarks.throughput_apps", "worker", "-P", self.pool,
                *([] if self.pool == "solo" else ["-c", str(self.concurrency)]),
                "-Q", queue, "--loglevel", "WARNING", "--without-gossip", "--without-mingle", "--without-heartbeat",
                "-n", f"{queue}@%h",
            ]  # fmt: skip
        return [
            sys.executable, "-m", "dramatiq", "benchmarks.throughput_apps:broker",
            "-p", str(self.processes), "-t", str(self.concurrency), "-Q", queue,
        ]  # fmt: skip

    def tasks_in(self, pid: int, main_pid: int) -> int:
        """How many tasks process ``pid`` runs at once (0 for a parent that only supervises)."""
        if self.framework == "celery":
            if self.pool == "prefork":
                return 0 if pid == main_pid else 1
            return 1 if self.pool == "solo" else self.concurrency
        return 0 if pid == main_pid else self.concurrency


@dataclass
class Connections:
    """The store connections of one worker run, sampled from ``pg_stat_activity``."""

    most_by_pid: dict[int, int] = field(default_factory=dict)
    backends_by_pid: dict[int, set[int]] = field(default_factory=dict)
    most_total: int = 0
    samples: int = 0


class ConnectionSampler:
    """Samples, in a thread, how many connections each process of one run holds (``application_name``)."""

    def __init__(self, app_name: str, active: bool = True) -> None:
        self.app_name = app_name
        self.seen = Connections()
        self._stop = threading.Event()
        self._active = active  # PostgreSQL only: a SQLite file has no server connections to sample
        self._engine = sa.create_engine(_sa_url(STORE_URL), poolclass=sa.pool.NullPool)
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> ConnectionSampler:
        if self._active:
            self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._active:
            self._thread.join()
        self._engine.dispose()

    def _loop(self) -> None:
        query = sa.text("SELECT application_name, pid FROM pg_stat_activity WHERE application_name LIKE :pattern")
        with self._engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT")  # each sample sees the current activity
            while True:
                rows = conn.execute(query, {"pattern": f"{self.app_name}-%"}).all()
                self._note(rows)
                if self._stop.wait(SAMPLE_EVERY_S):
                    return

    def _note(self, rows: list[sa.Row[tuple[str, int]]]) -> None:
        count: dict[int, int] = {}
        for app, backend in rows:
            pid = int(app.rsplit("-", 1)[1])
            count[pid] = count.get(pid, 0) + 1
            self.seen.backends_by_pid.setdefault(pid, set()).add(backend)
        for pid, n in count.items():
            self.seen.most_by_pid[pid] = max(self.seen.most_by_pid.get(pid, 0), n)
        self.seen.most_total = max(self.seen.most_total, len(rows))
        self.seen.samples += 1


@dataclass
class RoundResult:
    rate: float
    connections: Connections
    main_pid: int
    statements: float = 0.0  # sent to the store per job by the worker (its finish counted with the next job)
    round_trips: float = 0.0
    cpu: CpuPerJob | None = None  # between the 10th and the 90th percentile of the round's jobs


def _sa_url(url: str) -> str:
    return url.replace("postgresql://", "postgresql+psycopg://", 1)


def _env(framework: str, queue: str, store_url: str = STORE_URL) -> dict[str, str]:
    return {
        **os.environ,
        "FLEXIQ_BENCH_FRAMEWORK": framework,
        "FLEXIQ_BENCH_QUEUE": queue,
        "FLEXIQ_BENCH_REDIS": REDIS_URL,
        "FLEXIQ_STORE_URL": store_url,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }


@dataclass(frozen=True)
class CpuSnapshot:
    """CPU seconds used so far by the worker's processes, the database's and Redis', and by the whole machine."""

    done: int
    worker: float
    database: float
    redis: float
    busy: float  # all CPUs, seconds not idle
    elapsed: float  # all CPUs, seconds in all

    @classmethod
    def read(cls, done: int, worker_pid: int) -> CpuSnapshot:
        tick = os.sysconf("SC_CLK_TCK")
        worker = database = redis_cpu = 0.0
        tree = _descendants(worker_pid)
        for pid, (name, cpu) in proc_cpu().items():
            if pid in tree:
                worker += cpu / tick
            elif name == "postgres":
                database += cpu / tick
            elif name == "redis-server":
                redis_cpu += cpu / tick
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + fields[4]
        return cls(done, worker, database, redis_cpu, (sum(fields) - idle) / tick, sum(fields) / tick)


@dataclass(frozen=True)
class CpuPerJob:
    """Milliseconds of CPU per job between two snapshots, and how busy the machine was (0–1)."""

    worker: float
    database: float
    redis: float
    busy: float

    @classmethod
    def between(cls, a: CpuSnapshot, b: CpuSnapshot) -> CpuPerJob:
        jobs = max(1, b.done - a.done)
        return cls(
            1000 * (b.worker - a.worker) / jobs,
            1000 * (b.database - a.database) / jobs,
            1000 * (b.redis - a.redis) / jobs,
            (b.busy - a.busy) / max(1e-9, b.elapsed - a.elapsed),
        )


def proc_cpu() -> dict[int, tuple[str, int]]:
    """Every process's name and CPU ticks (user + system), from ``/proc``; empty where there is none."""
    out: dict[int, tuple[str, int]] = {}
    for entry in Path("/proc").iterdir() if Path("/proc/stat").exists() else ():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        rest = stat[stat.rindex(")") + 2 :].split()
        out[int(entry.name)] = (name, int(rest[11]) + int(rest[12]))
    return out


def _descendants(root: int) -> set[int]:
    """``root`` and every process below it, from ``/proc/<pid>/stat``'s parent pids."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir() if Path("/proc/stat").exists() else ():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat[stat.rindex(")") + 2 :].split()[1])
    tree = {root}
    grew = True
    while grew:
        below = {pid for pid, parent in parents.items() if parent in tree} - tree
        tree |= below
        grew = bool(below)
    return tree


def _enqueue(framework: str, queue: str, kind: str, k: int, jobs: int, *, store_url: str = STORE_URL) -> None:
    """Publish in a fresh process through the installed app, as a producer does."""
    code = f"from benchmarks.throughput_apps import enqueue; enqueue({kind!r}, {k}, {jobs})"
    subprocess.run([sys.executable, "-c", code], env=_env(framework, queue, store_url), check=True)


def one_round(config: WorkerConfig, kind: str, k: int, jobs: int, tag: str) -> RoundResult:
    """Jobs per second of one worker over ``jobs`` jobs of ``kind`` with ``k`` steps, and its connections."""
    framework = config.framework
    queue = f"flexiq-bench-{framework}-{kind}{k}-{tag}"
    app_name = f"fqb{zlib.crc32(queue.encode()):08x}"  # as benchmarks.throughput_apps.APP_NAME
    r = redis.Redis.from_url(REDIS_URL)
    counters = ("done", "first", "last", "statements", "round_trips", "counted")
    r.delete(*(f"{queue}:{c}" for c in counters))
    store_url = config.store_url(queue)
    _enqueue(framework, queue, kind, k, jobs, store_url=store_url)
    with ConnectionSampler(app_name, active=config.store == "postgres") as sampler:
        env = _env(framework, queue, store_url)
        worker = subprocess.Popen(config.command(queue), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        snapshots: list[CpuSnapshot] = []
        try:
            deadline = time.monotonic() + 600
            while (done := int(r.get(f"{queue}:done") or 0)) < jobs:
                if len(snapshots) < 2 and done >= jobs * (0.1 if not snapshots else 0.9):
                    snapshots.append(CpuSnapshot.read(done, worker.pid))
                if worker.poll() is not None:
                    raise RuntimeError(f"the {framework} worker exited: {worker.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
                if time.monotonic() > deadline:
                    done = int(r.get(f"{queue}:done") or 0)
                    raise RuntimeError(f"{config.label} {kind}{k}: only {done} of {jobs} jobs done")
                time.sleep(0.05)
            first, last = float(r.get(f"{queue}:first") or 0), float(r.get(f"{queue}:last") or 0)
            statements, trips = int(r.get(f"{queue}:statements") or 0), int(r.get(f"{queue}:round_trips") or 0)
            counted = max(1, int(r.get(f"{queue}:counted") or 0))
        finally:
            worker.terminate()
            worker.wait(30)
            _drop_tables(queue, store_url)
    cpu = CpuPerJob.between(*snapshots) if len(snapshots) == 2 else None
    if cpu is not None and config.store == "sqlite":  # its database work is in the worker: count its least
        cpu = dataclasses.replace(cpu, database=(k + 2) * SQLITE_FLOOR_MS[0] if kind == "durable" else 0.0)
    rate = (jobs - 1) / (last - first)
    return RoundResult(rate, sampler.seen, worker.pid, statements / counted, trips / counted, cpu)


def _drop_tables(queue: str, store_url: str = STORE_URL) -> None:
    if store_url.startswith("sqlite:///"):
        for suffix in ("", "-wal", "-shm"):
            Path(store_url.removeprefix("sqlite:///") + suffix).unlink(missing_ok=True)
        return
    prefix = f"fqb{zlib.crc32(queue.encode()):08x}_"  # as benchmarks.throughput_apps.PREFIX
    engine = sa.create_engine(_sa_url(STORE_URL))
    drop_prefixed_tables(engine, prefix)
    engine.dispose()


def configs(args: argparse.Namespace) -> list[WorkerConfig]:
    """The worker configurations to run, from the command line."""
    out: list[WorkerConfig] = []
    for store in args.store.split(","):
        if store not in ("postgres", "sqlite"):
            raise SystemExit(f"--store: {store!r} is not postgres or sqlite")
        if args.framework in ("celery", "all"):
            for pool in args.pool.split(","):
                if pool not in ("prefork", "solo", "threads"):
                    raise SystemExit(f"--pool: {pool!r} is not prefork, solo or threads")
                concurrency = 1 if pool == "solo" else args.concurrency
                out.append(WorkerConfig("celery", pool=pool, concurrency=concurrency, store=store))
        if args.framework in ("dramatiq", "all"):
            for spec in args.dramatiq_workers.split(","):
                processes, _, threads = spec.partition("x")
                out.append(WorkerConfig("dramatiq", concurrency=int(threads), processes=int(processes), store=store))
    return out


SQLITE_FLOOR_MS = [0.0]
"""One committed single-row ``INSERT`` on a SQLite file through the raw driver, client CPU ms (set by `run`)."""


def sqlite_floor_ms(n: int = 3000) -> float:
    """The CPU ms of one committed single-row ``INSERT`` on a SQLite file (WAL, ``synchronous=NORMAL``), raw driver."""
    import sqlite3

    with tempfile.TemporaryDirectory() as tmp:
        conn = sqlite3.connect(Path(tmp) / "floor.db", isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("CREATE TABLE floor (id INTEGER PRIMARY KEY AUTOINCREMENT, v VARCHAR(64) NOT NULL)")
        started = time.process_time()
        for i in range(n):
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO floor (v) VALUES (?)", (f"row-{i}",))
            conn.execute("COMMIT")
        spent = time.process_time() - started
        conn.close()
    return spent * 1000 / n


@dataclass
class ConnectionsSeen:
    """The most store connections seen over a configuration's rounds, by the tasks a process runs at once."""

    held: dict[int, int] = field(default_factory=dict)  # tasks at once -> most connections such a process held
    opened: dict[int, int] = field(default_factory=dict)  # the same -> most it opened in one round
    most_total: int = 0
    processes: int = 0

    @property
    def within_target(self) -> bool:
        """Whether every process held at most its concurrency + 1 connections."""
        return all(most <= tasks + 1 for tasks, most in self.held.items())


def connections_seen(config: WorkerConfig, results: list[RoundResult]) -> ConnectionsSeen:
    """The most connections per process and in all, over every round of ``config``."""
    seen_all = ConnectionsSeen()
    for result in results:
        seen = result.connections
        seen_all.most_total = max(seen_all.most_total, seen.most_total)
        seen_all.processes = max(seen_all.processes, len(seen.most_by_pid))
        for pid, most in seen.most_by_pid.items():
            tasks = config.tasks_in(pid, result.main_pid)
            seen_all.held[tasks] = max(seen_all.held.get(tasks, 0), most)
            opened = len(seen.backends_by_pid.get(pid, ()))
            seen_all.opened[tasks] = max(seen_all.opened.get(tasks, 0), opened)
    return seen_all


def connection_line(config: WorkerConfig, results: list[RoundResult]) -> str:
    """The most connections per process (against its concurrency + 1) and in all, over every round."""
    seen = connections_seen(config, results)
    parts = []
    for tasks in sorted(seen.held, reverse=True):
        role = "supervising process" if tasks == 0 else f"process running {tasks} at once"
        verdict = "ok" if seen.held[tasks] <= tasks + 1 else "OVER"
        parts.append(f"{role}: held ≤ {seen.held[tasks]} (target ≤ {tasks}+1: {verdict}), opened {seen.opened[tasks]}")
    return (
        f"  store connections: {'; '.join(parts) or 'none seen'}; whole worker ≤ {seen.most_total}"
        f" ({seen.processes} processes with a connection)"
    )


def ceilings(by_label: dict[str, list[RoundResult]]) -> dict[str, float]:
    """Per durable body, ``plain CPU / (plain CPU + the durable job's database CPU)`` (medians of the rounds)."""
    medians = _cpu_medians(by_label)
    if "plain" not in medians:
        return {}
    plain = sum(medians["plain"][:3])
    return {label: plain / (plain + m[1]) for label, m in medians.items() if label != "plain"}


def _cpu_medians(by_label: dict[str, list[RoundResult]]) -> dict[str, tuple[float, float, float, float]]:
    """Per body: median CPU ms per job of the worker, the database and Redis, and how busy the machine was."""
    medians: dict[str, tuple[float, float, float, float]] = {}
    for label, got in by_label.items():
        cpus = [r.cpu for r in got if r.cpu is not None]
        if cpus:
            medians[label] = (
                statistics.median(c.worker for c in cpus),
                statistics.median(c.database for c in cpus),
                statistics.median(c.redis for c in cpus),
                statistics.median(c.busy for c in cpus),
            )
    return medians


def cpu_table(by_label: dict[str, list[RoundResult]]) -> str:
    """Per body: median CPU ms per job of the worker, the database and Redis, how busy the machine was, the ceiling."""
    medians = _cpu_medians(by_label)
    if not medians:
        return "  CPU ms per job: not measured (rounds too short to sample, or no /proc)"
    ceiling_of = ceilings(by_label)
    lines = [f"  {'CPU ms per job':<16} {'worker':>8} {'database':>9} {'redis':>7} {'machine busy':>13} {'ceiling':>8}"]
    for label, (worker, database, redis_cpu, busy) in medians.items():
        ceiling = f"{ceiling_of[label]:.2f}" if label in ceiling_of else ""
        lines.append(f"  {label:<16} {worker:>8.2f} {database:>9.2f} {redis_cpu:>7.2f} {busy:>12.0%} {ceiling:>8}")
    return "\n".join(lines)


Results = dict[WorkerConfig, dict[str, list[RoundResult]]]
"""Per worker configuration, per body (``plain``, ``durable 3-step``, ``durable 5-step``), each round's result."""


def rates(results: Results, config: WorkerConfig) -> dict[str, float]:
    """Per body of ``config``: the median jobs/s over its rounds."""
    return {label: statistics.median(r.rate for r in got) for label, got in results[config].items()}


def parser() -> argparse.ArgumentParser:
    """This benchmark's command line (``python -m benchmarks`` takes the same options)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--framework", default="all", choices=["celery", "dramatiq", "all"])
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pool", default="prefork", help="Celery pools, comma-separated: prefork, solo, threads")
    parser.add_argument(
        "-c", "--concurrency", type=int, default=os.cpu_count() or 1, help="Celery -c (default: Celery's, the CPUs)"
    )
    parser.add_argument(
        "--dramatiq-workers",
        default=f"{os.cpu_count() or 1}x8",
        help="Dramatiq processes x threads, comma-separated (default: Dramatiq's, <CPUs>x8)",
    )
    parser.add_argument("--results", action="store_true", help="Celery: a Redis result backend for every task")
    parser.add_argument("--store", default="postgres", help="stores, comma-separated: postgres, sqlite")
    return parser


def run(args: argparse.Namespace) -> tuple[list[WorkerConfig], Results]:
    """Measure every configuration ``args`` names in interleaved rounds, print the report, return the results."""
    if args.results:
        os.environ["FLEXIQ_BENCH_RESULTS"] = "1"
    setups = configs(args)
    if any(config.store == "sqlite" for config in setups):
        SQLITE_FLOOR_MS[0] = sqlite_floor_ms()
        print(f"SQLite floor (one committed INSERT, raw driver): {SQLITE_FLOOR_MS[0]:.3f} ms of CPU")
    load = os.getloadavg()
    print(
        f"machine: {os.cpu_count()} cores, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
        f"{args.jobs} jobs a round, {args.rounds} rounds; one worker at a time"
    )
    results: dict[WorkerConfig, dict[str, list[RoundResult]]] = {config: {} for config in setups}
    for n in range(args.rounds):  # interleaved: every configuration and body once per round
        for config in setups:
            for kind, k in BODIES:
                label = f"{kind} {k}-step" if kind == "durable" else "plain"
                shape = config.pool if config.framework == "celery" else config.processes
                tag = f"{os.getpid()}-{n}-{shape}-{config.store}"
                got = one_round(config, kind, k, args.jobs, tag)
                results[config].setdefault(label, []).append(got)
    backend = ", Redis result backend" if args.results else ""
    for config in setups:
        medians = rates(results, config)
        plain = medians["plain"]
        store = "PostgreSQL" if config.store == "postgres" else "SQLite"
        print(f"\n== {config.label} + Redis + {store}{backend if config.framework == 'celery' else ''}")
        print(f"{'task':<18} {'jobs/s (median)':>16} {'× plain':>8} {'stmts/job':>9} {'trips/job':>9}  rounds")
        for label, med in medians.items():
            shown = ", ".join(f"{r.rate:.0f}" for r in results[config][label])
            stmts = statistics.median(r.statements for r in results[config][label])
            trips = statistics.median(r.round_trips for r in results[config][label])
            print(f"{label:<18} {med:>16.0f} {med / plain:>8.2f} {stmts:>9.1f} {trips:>9.1f}  {shown}")
        print(connection_line(config, [r for got in results[config].values() for r in got]))
        print(cpu_table(results[config]))
    load = os.getloadavg()
    print(f"\nload average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return setups, results


def main(argv: list[str] | None = None) -> None:
    run(parser().parse_args(argv))


if __name__ == "__main__":
    main()
