"""Parallel keyed steps: ``step.map`` against the same items as sequential ``step.run`` calls, on each store.

    python -m benchmarks.bench_map [--store all] [--items 100] [--body-ms 20] [--rounds 3] [--max-concurrency 8]

Each round times one whole attempt (claim, body, finish) of three bodies on
the same store, interleaved: ``--items`` keyed ``step.run`` calls one after
the other, one ``step.map`` over the same items (a thread pool of
``--max-concurrency``), and one ``await step.amap`` (asyncio tasks). Every
item's body waits ``--body-ms`` milliseconds, as an I/O call does (a
``time.sleep`` / ``asyncio.sleep``: the worker is idle meanwhile). It prints
the median wall time of each, the map's speed-up over the sequential steps,
and the step commits (fenced transactions) per item, then the targets:
``map`` at least 5× faster than the sequential steps, and at most half as
many commits as items (the items that finish together commit together).

The stores: ``memory``, ``sqlite`` (a file in a temporary directory),
``postgres`` and ``mariadb`` (``bench_store.URLS``; a server that cannot be
reached is skipped with a note).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from uuid import uuid4

from benchmarks.bench_store import URLS
from benchmarks.schema import drop_prefixed_tables
from flexiq_plugins import DurableConfig, JobEnvelope, MemoryStepStore, SqlStepStore, StepStore, StoreError, current_job
from flexiq_plugins.integration import AttemptDriver, Completed, JobInfo

SPEEDUP_TARGET = 5.0
"""``map`` must be at least this many times faster than the same items as sequential steps."""
COMMITS_PER_ITEM_TARGET = 0.5
"""``map`` must commit at most this many transactions per item."""
STORES = ("memory", "sqlite", "postgres", "mariadb")


@dataclass(frozen=True)
class Target:
    """One target of the step map: what it asks, what was measured, whether it was met."""

    target: str
    measured: str
    met: bool

    def line(self) -> str:
        """The row of the targets table (the layout of ``python -m benchmarks``)."""
        return f"{self.target:<58} {self.measured:<44} {'met' if self.met else 'NOT MET'}"


@dataclass
class Counted:
    """The step commits (fenced transactions) a store made, counted at its two commit methods."""

    commits: int = 0

    def wrap(self, store: StepStore) -> None:
        """Count every ``commit_step`` and ``commit_steps`` of ``store`` from now on."""
        one, many = store.commit_step, store.commit_steps

        def commit_step(claim: Any, row: Any) -> Any:
            self.commits += 1
            return one(claim, row)

        def commit_steps(claim: Any, rows: Any) -> Any:
            self.commits += 1
            return many(claim, rows)

        store.commit_step = commit_step  # type: ignore[method-assign]
        store.commit_steps = commit_steps  # type: ignore[method-assign]


@dataclass
class MapRun:
    """One store's results: wall times in seconds and commits per attempt, per body."""

    name: str
    items: int
    seconds: dict[str, list[float]] = field(default_factory=dict)
    commits: dict[str, list[int]] = field(default_factory=dict)

    def median(self, body: str) -> float:
        """The median wall time of ``body``'s attempts, seconds."""
        return statistics.median(self.seconds[body])

    def commits_per_item(self, body: str) -> float:
        """The most commits an attempt of ``body`` made, per item."""
        return max(self.commits[body]) / self.items

    def speedup(self, body: str) -> float:
        """How many times faster ``body`` was than the sequential steps (medians)."""
        return self.median("sequential run") / self.median(body)


def bodies(items: int, body_s: float, max_concurrency: int) -> dict[str, Callable[[], Any]]:
    """The three task bodies, each over ``range(items)`` with an I/O wait of ``body_s`` seconds per item."""

    def io(n: int) -> int:
        time.sleep(body_s)
        return n

    async def aio(n: int) -> int:
        await asyncio.sleep(body_s)
        return n

    def sequential() -> list[int]:
        return [current_job.step.run("io", lambda n=n: io(n), key=n) for n in range(items)]

    def mapped() -> list[int]:
        return current_job.step.map("io", io, range(items), key=int, max_concurrency=max_concurrency)

    async def amapped() -> list[int]:
        return await current_job.step.amap("io", aio, range(items), key=int, max_concurrency=max_concurrency)

    return {"sequential run": sequential, "map": mapped, "amap": amapped}


def attempt(driver: AttemptDriver, body: Callable[[], Any]) -> None:
    """Run one whole attempt of ``body`` (claim, body, finish) on a new run; it must succeed."""
    job = JobInfo(f"bench-map-{uuid4().hex}", "job-1", JobEnvelope("bench.map", "test"))
    started = driver.start(job)
    coroutine = asyncio.iscoroutinefunction(body)
    decision = asyncio.run(started.arun(body)) if coroutine else started.run(body)  # type: ignore[union-attr]
    assert isinstance(decision, Completed), decision


def open_store(name: str) -> StepStore:
    """The store ``name``; a SQL store gets a table prefix of its own."""
    if name == "memory":
        return MemoryStepStore()
    url = URLS.get(name) or f"sqlite:///{tempfile.mkdtemp(prefix='flexiq-bench-')}/map.db"
    store = SqlStepStore(url, table_prefix=f"bmap{uuid4().hex[:6]}_")
    store.now()  # creates the tables, or fails now for a server that cannot be reached
    return store


def drop(store: StepStore) -> None:
    """Drop a server store's tables (a SQLite file in a temporary directory is left to the system)."""
    if isinstance(store, SqlStepStore):
        if store.engine.dialect.name != "sqlite":
            drop_prefixed_tables(store.engine, store.table_prefix)
        store.close()


def run_store(name: str, args: argparse.Namespace) -> MapRun | None:
    """Measure one store and print its report; ``None`` (and a note) if it cannot be reached."""
    try:
        store = open_store(name)
    except StoreError as exc:
        print(f"\n== {name}: skipped ({exc})")
        return None
    try:
        counted = Counted()
        counted.wrap(store)
        driver = AttemptDriver(store, DurableConfig())
        result = MapRun(name, args.items)
        for _ in range(args.rounds):  # interleaved: each body once a round
            for label, body in bodies(args.items, args.body_ms / 1e3, args.max_concurrency).items():
                before, started = counted.commits, time.perf_counter()
                attempt(driver, body)
                result.seconds.setdefault(label, []).append(time.perf_counter() - started)
                result.commits.setdefault(label, []).append(counted.commits - before)
        report(result, args)
        return result
    finally:
        drop(store)


def report(result: MapRun, args: argparse.Namespace) -> None:
    """Print one store's table: wall time, speed-up and commits per item of each body."""
    print(f"\n== {result.name}: {args.items} items of a {args.body_ms:g} ms I/O body, {args.rounds} rounds")
    print(f"{'body':<16} {'median ms':>10} {'speed-up':>9} {'commits/item':>13}")
    for label in result.seconds:
        print(
            f"{label:<16} {result.median(label) * 1e3:>10.1f} {result.speedup(label):>8.1f}× "
            f"{result.commits_per_item(label):>13.2f}"
        )


def targets(result: MapRun) -> list[Target]:
    """The step map's targets against one store's results."""
    name, speedup, commits = result.name, result.speedup("map"), result.commits_per_item("map")
    return [
        Target(
            f"{name}: map ≥ {SPEEDUP_TARGET:g}× faster than sequential steps",
            f"{speedup:.1f}× ({result.median('map') * 1e3:.0f} vs {result.median('sequential run') * 1e3:.0f} ms)",
            speedup >= SPEEDUP_TARGET,
        ),
        Target(
            f"{name}: map ≤ {COMMITS_PER_ITEM_TARGET:g} commits per item",
            f"{commits:.2f} ({round(commits * result.items)} for {result.items} items)",
            commits <= COMMITS_PER_ITEM_TARGET,
        ),
    ]


def run(args: argparse.Namespace) -> list[MapRun]:
    """Measure every store asked for, printing each report."""
    names = STORES if args.store == "all" else (args.store,)
    return [got for name in names if (got := run_store(name, args)) is not None]


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", default="all", choices=[*STORES, "all"])
    parser.add_argument("--items", type=int, default=100)
    parser.add_argument("--body-ms", type=float, default=20.0, help="each item's I/O wait, milliseconds")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-concurrency", type=int, default=8)
    return parser


def main(argv: list[str] | None = None) -> list[Target]:
    """Measure, print each store's report and the targets table; return the targets."""
    args = parser().parse_args(argv)
    found = [t for result in run(args) for t in targets(result)]
    print("\n== step map targets against this run")
    print(f"{'target':<58} {'measured':<44} verdict")
    for target in found:
        print(target.line())
    return found


if __name__ == "__main__":
    main()
