"""The benchmarks in one command: the stores, the CPU of a job, the workers, then each target against its measurement.

    python -m benchmarks [--quick] [--no-dbos] [--no-throughput] [--no-map] [--no-no-step] [--store all]
        [--rounds 7] [--cpu-rounds 5] [--jobs 500] [--throughput-rounds 3] [--throughput-stores postgres,sqlite]

It runs, one after the other in this process run:

1. :mod:`benchmarks.bench_store` on SQLite, PostgreSQL and MariaDB (each
   store's floor, a committed single-row ``INSERT``, its new step, attempt
   start and finish, memo hit, 1,000 replayed steps, recovery sweep and
   ``runs list``, in interleaved rounds, and the statements each sends; a
   DBOS Transact step and workflow in the same rounds when ``dbos`` is
   installed: ``pip install 'flexiq-plugins[bench]'``);
2. :mod:`benchmarks.bench_cpu` on PostgreSQL and SQLite: the client's and
   the database server's CPU for the floor, a new step, an attempt start
   plus finish and a job of 3 steps, in interleaved rounds;
3. :mod:`benchmarks.bench_throughput` with each framework's default worker
   (Celery prefork ``-c <CPUs>``, Dramatiq ``<CPUs> × 8``) on PostgreSQL and
   SQLite: a plain task and durable tasks of 3 and 5 steps, interleaved
   rounds, jobs/s, store connections per process, CPU per job and the
   ``ceiling`` (the rate the database's own CPU alone would allow);
4. a task that takes no step, with the library installed and without it,
   when :mod:`benchmarks.bench_no_step` offers ``run_no_step``;
5. :mod:`benchmarks.bench_map` on each store: 100 items of a 20 ms I/O
   body as sequential ``step.run`` calls and as one ``step.map``;

then prints one table: every performance target, what was measured, and ``met``
or ``NOT MET``. Each report is printed in full above the table. Every figure is
a median of interleaved rounds, and every ratio is against a baseline measured
in the same rounds (the floor, the plain task, the same task without the
library), so they move much less than the times between machines; on a
shared or busy machine run it again and compare the medians. No test asserts
a time: the targets live here. ``--quick`` takes fewer rounds and jobs (a
smoke run, not a measurement).

Needs PostgreSQL (127.0.0.1:5432, database ``test``, on this machine for the
server's CPU), MariaDB (127.0.0.1:3306, database ``test``) and Redis
(127.0.0.1:6379), as the benchmarks do; ``--store sqlite --no-throughput
--no-no-step`` needs none of them but leaves the PostgreSQL targets out.

The history targets (costs with 1,000,000 finished runs, and cleanup) take
minutes to fill and are separate: ``python -m benchmarks.bench_store --store
postgres --history 1000000`` and ``--cleanup-check 100000``.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from typing import Any

from benchmarks import bench_cpu, bench_map, bench_no_step, bench_store, bench_throughput

PG_STEP_X_FLOOR = 1.5
SQLITE_STEP_MS = 0.2
START_ROUND_TRIPS = 2
REPLAYED_MS = 10.0
THREE_STEP_X_PLAIN = 0.6
FIVE_STEP_X_PLAIN = 0.4
JOB_STEPS = 3
"""The k of the cost-model targets: a job of 3 new steps."""
STATEMENTS_OVER_STEPS = 2
"""At most k + 2 statements at the worker for a job of k new steps: the claim, the k steps, the finish."""
START_FINISH_MS = 0.4
"""Attempt start plus finish, client CPU ms."""
STEP_X_DRIVER = 2.0
"""A new step's client CPU over the raw driver's for one committed INSERT."""
DATABASE_X_INSERTS = 1.3
"""The database's CPU per job over that of as many single-row INSERTs as the job sends statements."""
CEILING_SHARE = 0.8
"""A durable 3-step task's throughput (× plain) over the benchmark's ceiling."""


@dataclasses.dataclass(frozen=True)
class Verdict:
    """One target: what it asks, what was measured, whether it was met (``None``: reported, no target)."""

    target: str
    measured: str
    met: bool | None

    def line(self) -> str:
        mark = {True: "met", False: "NOT MET", None: "reported"}[self.met]
        return f"{self.target:<68} {self.measured:<48} {mark}"


def store_verdicts(run: bench_store.StoreRun, replayed: int) -> list[Verdict]:
    """The per-store performance targets against one store's results."""
    name, out = run.name, []
    step_ms, step_x = run.median("new step") * 1e3, run.ratio("new step")
    if name == "postgres":
        met = step_x <= PG_STEP_X_FLOOR
        out.append(Verdict(f"postgres: new step ≤ {PG_STEP_X_FLOOR}× floor", f"{step_ms:.3f} ms = {step_x:.2f}×", met))
    elif name == "sqlite":
        out.append(Verdict(f"sqlite: new step ≤ {SQLITE_STEP_MS} ms", f"{step_ms:.3f} ms", step_ms <= SQLITE_STEP_MS))
    else:
        out.append(Verdict(f"{name}: new step × floor", f"{step_ms:.3f} ms = {step_x:.2f}×", None))
    for key in ("attempt start", "attempt start (queued)", "attempt start (redelivery)"):
        trips = run.counts[key].round_trips
        if name == "sqlite":  # in process: a statement is a call, not a round trip to a server
            out.append(Verdict(f"{name}: {key}, statements and commits", f"{trips} (in process)", None))
            continue
        met = trips <= START_ROUND_TRIPS
        out.append(Verdict(f"{name}: {key} ≤ {START_ROUND_TRIPS} round trips", f"{trips}", met))
    out += statement_verdicts(run)
    hits = run.counts[f"memo hit ×{replayed}"].statements
    out.append(Verdict(f"{name}: memo hit, 0 statements", f"{hits} for {replayed}", hits == 0))
    body_ms = run.median(f"{replayed} replayed: body") * 1e3
    start_ms = run.median(f"{replayed} replayed: start") * 1e3
    out.append(
        Verdict(
            f"{name}: {replayed} replayed steps ≤ {REPLAYED_MS:g} ms",
            f"{body_ms:.1f} ms (+ start {start_ms:.1f} ms)",
            body_ms <= REPLAYED_MS if replayed == 1000 else None,
        )
    )
    if "DBOS step" in run.samples:
        out.append(Verdict(f"{name}: DBOS step × floor", f"{run.ratio('DBOS step'):.2f}× (ours {step_x:.2f}×)", None))
    return out


def statement_verdicts(run: bench_store.StoreRun, k: int = JOB_STEPS) -> list[Verdict]:
    """A recorded job of ``k`` new steps: statements at the worker (≤ k + 2) and at the producer (1).

    Counted where they reach the driver (:mod:`benchmarks.counting`) in one
    untimed pass: the start of a run recorded at publish, a new step, the
    finish, and the record itself. On PostgreSQL each is a round trip; on
    SQLite a statement is a call in the worker's process, so what is
    compared there is its transactions (commits).
    """
    name, counts = run.name, run.counts
    parts = (counts["attempt start (queued)"], counts["new step"], counts["finish"])
    most = k + STATEMENTS_OVER_STEPS
    if name == "sqlite":
        worker = sum(c.detail.get("COMMIT", 0) * n for c, n in zip(parts, (1, k, 1), strict=True))
        statements = sum(c.statements * n for c, n in zip(parts, (1, k, 1), strict=True))
        producer = counts["record at publish"].detail.get("COMMIT", 0)
        what = "transactions"
        shown = f"{worker} ({statements} statements, in process)"
    else:
        worker = sum(c.statements * n for c, n in zip(parts, (1, k, 1), strict=True))
        producer = counts["record at publish"].statements
        what = "statements"
        shown = f"{worker} ({parts[0].statements} + {k}×{parts[1].statements} + {parts[2].statements})"
    return [
        Verdict(f"{name}: job of {k} new steps, worker {what} ≤ k + 2 = {most}", shown, worker <= most),
        Verdict(f"{name}: job recorded at publish, producer {what} ≤ 1", f"{producer}", producer <= 1),
    ]


def cpu_verdicts(result: bench_cpu.CpuResult) -> list[Verdict]:
    """The CPU targets of a job against one store's :mod:`benchmarks.bench_cpu` medians."""
    name, k = result.store, result.steps
    floor_client, floor_server = result.medians["floor insert"]
    start_finish = result.client(bench_cpu.START_FINISH)
    step = result.client("new step")
    step_x = step / floor_client
    where = "" if name == "postgres" else ", database included (in process)"
    out = [
        Verdict(
            f"{name}: attempt start + finish ≤ {START_FINISH_MS} ms client CPU",
            f"{start_finish:.3f} ms{where}",
            start_finish <= START_FINISH_MS,
        ),
        Verdict(
            f"{name}: new step ≤ {STEP_X_DRIVER:g}× raw driver's committed INSERT (client CPU)",
            f"{step:.3f} / {floor_client:.3f} ms = {step_x:.2f}×",
            step_x <= STEP_X_DRIVER,
        ),
    ]
    if name == "postgres":
        job_server = result.server(result.job_label)
        statements = k + STATEMENTS_OVER_STEPS
        if floor_server:
            x = job_server / (statements * floor_server)
            shown = f"{job_server:.3f} / ({statements} × {floor_server:.3f}) ms = {x:.2f}×"
            out.append(
                Verdict(
                    f"{name}: database CPU per {k}-step job ≤ {DATABASE_X_INSERTS}× {statements} INSERTs",
                    shown,
                    x <= DATABASE_X_INSERTS,
                )
            )
        else:
            out.append(Verdict(f"{name}: database CPU per {k}-step job", "not measured (no server CPU seen)", None))
    client = result.client(result.job_label)
    out.append(
        Verdict(f"{name}: job of {k} steps, client CPU", f"{client:.3f} ms = {client / floor_client:.1f}× floor", None)
    )
    return out


def throughput_verdicts(
    setups: list[bench_throughput.WorkerConfig], results: bench_throughput.Results
) -> list[Verdict]:
    """The throughput and connection targets against each worker configuration's results."""
    out = []
    for config in setups:
        rates = bench_throughput.rates(results, config)
        ceiling = bench_throughput.ceilings(results[config])
        ratio3 = rates["durable 3-step"] / rates["plain"]
        if "durable 3-step" in ceiling:
            least = CEILING_SHARE * ceiling["durable 3-step"]
            out.append(
                Verdict(
                    f"{config.label}: 3-step ≥ {CEILING_SHARE}× ceiling ({ceiling['durable 3-step']:.2f})",
                    f"{ratio3:.2f}× plain = {ratio3 / ceiling['durable 3-step']:.2f}× ceiling",
                    ratio3 >= least,
                )
            )
        else:
            out.append(Verdict(f"{config.label}: 3-step ≥ {CEILING_SHARE}× ceiling", "ceiling not measured", False))
        for label, least in (("durable 3-step", THREE_STEP_X_PLAIN), ("durable 5-step", FIVE_STEP_X_PLAIN)):
            ratio = rates[label] / rates["plain"]
            bound = f", ceiling {ceiling[label]:.2f}" if label in ceiling else ""
            out.append(
                Verdict(
                    f"{config.label}: {label[8:]} ≥ {least}× plain",
                    f"{ratio:.2f}× ({rates[label]:.0f} / {rates['plain']:.0f} jobs/s{bound})",
                    ratio >= least,
                )
            )
        if config.store == "postgres":
            seen = bench_throughput.connections_seen(config, [r for got in results[config].values() for r in got])
            held = ", ".join(f"{tasks} at once: {most}" for tasks, most in sorted(seen.held.items(), reverse=True))
            out.append(
                Verdict(f"{config.label}: connections ≤ concurrency + 1", held or "none seen", seen.within_target)
            )
    return out


def no_step_verdicts(rounds: int, messages: int) -> list[Verdict]:
    """A task that takes no step, with the library and without it, if ``bench_no_step`` offers ``run_no_step``."""
    run_no_step: Callable[..., list[Any]] | None = getattr(bench_no_step, "run_no_step", None)
    if run_no_step is None:
        return [Verdict("no-step task ≥ 0.95× the same task without the library", "not measured here", None)]
    out = []
    for result in run_no_step(rounds=rounds, messages=messages):
        target = getattr(result, "target", 0.95)
        out.append(
            Verdict(f"no step, {result.setting} ≥ {target}× without", f"{result.throughput_ratio:.2f}×", result.met)
        )
    return out


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", default="all", choices=["sqlite", "postgres", "mariadb", "all"])
    parser.add_argument("--rounds", type=int, default=7, help="bench_store's rounds")
    parser.add_argument("--cpu-rounds", type=int, default=5, help="bench_cpu's rounds")
    parser.add_argument("--no-dbos", action="store_true", help="skip the DBOS comparison")
    parser.add_argument("--no-throughput", action="store_true", help="skip the Celery and Dramatiq workers")
    parser.add_argument("--no-map", action="store_true", help="skip the step map benchmark")
    parser.add_argument("--no-no-step", action="store_true", help="skip the task that takes no step")
    parser.add_argument("--jobs", type=int, default=500, help="jobs a throughput round")
    parser.add_argument("--throughput-rounds", type=int, default=3)
    parser.add_argument("--throughput-stores", default="postgres,sqlite", help="bench_throughput's --store")
    parser.add_argument("--quick", action="store_true", help="2 rounds, 10 steps, 100 jobs: a smoke run")
    return parser


def main(argv: list[str] | None = None) -> list[Verdict]:
    """Run the benchmarks, print their reports and the targets table; return the verdicts."""
    args = parser().parse_args(argv)
    store_args = bench_store.parser().parse_args(["--store", args.store, "--rounds", str(args.rounds)])
    store_args.no_dbos = args.no_dbos
    if args.quick:
        store_args.rounds, store_args.steps = 2, 10
    verdicts = [v for run in bench_store.run(store_args) for v in store_verdicts(run, store_args.replayed)]
    cpu_stores = [s for s in ("postgres", "sqlite") if args.store in (s, "all")]
    for store in cpu_stores:
        cpu_args = ["--store", store, "--rounds", "2" if args.quick else str(args.cpu_rounds)]
        cpu_args += ["--ops", "500" if args.quick else "3000", "--steps", str(JOB_STEPS)]
        verdicts += cpu_verdicts(bench_cpu.run(bench_cpu.parser().parse_args(cpu_args)))
    if not args.no_throughput:
        jobs, rounds = (100, 1) if args.quick else (args.jobs, args.throughput_rounds)
        worker_args = bench_throughput.parser().parse_args(
            ["--jobs", str(jobs), "--rounds", str(rounds), "--store", args.throughput_stores]
        )
        verdicts += throughput_verdicts(*bench_throughput.run(worker_args))
    if not args.no_no_step:
        verdicts += no_step_verdicts(2 if args.quick else 7, 100 if args.quick else 300)
    if not args.no_map:
        map_args = bench_map.parser().parse_args(["--store", args.store, "--rounds", "1" if args.quick else "3"])
        targets = [t for result in bench_map.run(map_args) for t in bench_map.targets(result)]
        verdicts += [Verdict(t.target, t.measured, t.met) for t in targets]
    print("\n== performance targets against this run" + (" (--quick: a smoke run, not a measurement)" * args.quick))
    print(f"{'target':<68} {'measured':<48} verdict")
    for verdict in verdicts:
        print(verdict.line())
    return verdicts


if __name__ == "__main__":
    main()
