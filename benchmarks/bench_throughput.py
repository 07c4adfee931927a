"""Plain vs durable task throughput on a real Celery and a real Dramatiq worker (Redis broker, PostgreSQL store).

    python -m benchmarks.bench_throughput [--jobs 500] [--rounds 3] [--framework celery|dramatiq|all]

For each framework, each round and each body (a plain task, a durable task
of 3 steps, one of 5 steps), it enqueues ``--jobs`` jobs, starts one worker
process (Celery: ``-P solo``; Dramatiq: one process, one thread), and
measures jobs per second from the first job's end to the last's (so the
worker's start is not counted). Rounds are interleaved (plain, 3, 5, plain,
3, 5 …); it prints the medians and the ratio of each durable body to the
plain task. The steps are trivial: what is measured is the library's cost
per job (attempt start, a commit per step, finish), not a workload.

Needs Redis on 127.0.0.1:6379 and PostgreSQL on 127.0.0.1:5432 (database
``test``), or ``FLEXIQ_BENCH_REDIS`` / ``FLEXIQ_STORE_URL``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import zlib
from pathlib import Path

import redis
import sqlalchemy as sa

ROOT = Path(__file__).resolve().parents[1]
REDIS_URL = os.environ.get("FLEXIQ_BENCH_REDIS", "redis://127.0.0.1:6379/14")
STORE_URL = os.environ.get("FLEXIQ_STORE_URL", "postgresql://postgres@127.0.0.1:5432/test")
BODIES = [("plain", 3), ("durable", 3), ("durable", 5)]


def _env(framework: str, queue: str) -> dict[str, str]:
    return {
        **os.environ,
        "FLEXIQ_BENCH_FRAMEWORK": framework,
        "FLEXIQ_BENCH_QUEUE": queue,
        "FLEXIQ_BENCH_REDIS": REDIS_URL,
        "FLEXIQ_STORE_URL": STORE_URL,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }


def _worker(framework: str, queue: str) -> subprocess.Popen[bytes]:
    if framework == "celery":
        command = [
            sys.executable, "-m", "celery", "-A", "benchmarks.throughput_apps", "worker", "-P", "solo",
            "-Q", queue, "--loglevel", "WARNING", "--without-gossip", "--without-mingle", "--without-heartbeat",
            "-n", f"{queue}@%h",
        ]  # fmt: skip
    else:
        command = [
            sys.executable, "-m", "dramatiq", "benchmarks.throughput_apps:broker", "-p", "1", "-t", "1", "-Q", queue,
        ]  # fmt: skip
    return subprocess.Popen(command, env=_env(framework, queue), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _enqueue(framework: str, queue: str, kind: str, k: int, jobs: int) -> None:
    """Publish in a fresh process through the installed app, as a producer does."""
    code = f"from benchmarks.throughput_apps import enqueue; enqueue({kind!r}, {k}, {jobs})"
    subprocess.run([sys.executable, "-c", code], env=_env(framework, queue), check=True)


def one_round(framework: str, kind: str, k: int, jobs: int, tag: str) -> float:
    """Jobs per second of one worker over ``jobs`` jobs of ``kind`` with ``k`` steps."""
    queue = f"flexiq-bench-{framework}-{kind}{k}-{tag}"
    r = redis.Redis.from_url(REDIS_URL)
    r.delete(f"{queue}:done", f"{queue}:first", f"{queue}:last")
    _enqueue(framework, queue, kind, k, jobs)
    worker = _worker(framework, queue)
    try:
        deadline = time.monotonic() + 600
        while int(r.get(f"{queue}:done") or 0) < jobs:
            if worker.poll() is not None:
                raise RuntimeError(f"the {framework} worker exited: {worker.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
            if time.monotonic() > deadline:
                done = int(r.get(f"{queue}:done") or 0)
                raise RuntimeError(f"{framework} {kind}{k}: only {done} of {jobs} jobs done")
            time.sleep(0.05)
        first, last = float(r.get(f"{queue}:first") or 0), float(r.get(f"{queue}:last") or 0)
    finally:
        worker.terminate()
        worker.wait(30)
        _drop_tables(queue)
    return (jobs - 1) / (last - first)


def _drop_tables(queue: str) -> None:
    prefix = f"fqb{zlib.crc32(queue.encode()):08x}_"  # as benchmarks.throughput_apps.PREFIX
    engine = sa.create_engine(STORE_URL.replace("postgresql://", "postgresql+psycopg://"))
    with engine.begin() as conn:
        for table in ("step_attempts", "steps", "events", "dead_letters", "runs", "alembic_version"):
            conn.execute(sa.text(f'DROP TABLE IF EXISTS "{prefix}{table}"'))
    engine.dispose()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--framework", default="all", choices=["celery", "dramatiq", "all"])
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--results", action="store_true", help="Celery: a Redis result backend for every task")
    args = parser.parse_args(argv)
    if args.results:
        os.environ["FLEXIQ_BENCH_RESULTS"] = "1"
    frameworks = ["celery", "dramatiq"] if args.framework == "all" else [args.framework]
    print(f"machine: {os.cpu_count()} cores; {args.jobs} jobs a round, {args.rounds} rounds, one worker process")
    for framework in frameworks:
        rates: dict[str, list[float]] = {}
        for n in range(args.rounds):
            for kind, k in BODIES:
                label = f"{kind} {k}-step" if kind == "durable" else "plain"
                rates.setdefault(label, []).append(one_round(framework, kind, k, args.jobs, f"{os.getpid()}-{n}"))
        plain = statistics.median(rates["plain"])
        backend = ", Redis result backend" if args.results and framework == "celery" else ""
        print(f"\n== {framework} + Redis + PostgreSQL{backend}")
        print(f"{'task':<18} {'jobs/s (median)':>16} {'× plain':>8}  rounds")
        for label, values in rates.items():
            med = statistics.median(values)
            shown = ", ".join(f"{v:.0f}" for v in values)
            print(f"{label:<18} {med:>16.0f} {med / plain:>8.2f}  {shown}")


if __name__ == "__main__":
    main()
