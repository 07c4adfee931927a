"""The benchmarks in one command: the stores, the workers, then each performance target against its measurement.

    python -m benchmarks [--quick] [--no-dbos] [--no-throughput] [--no-map] [--store all] [--rounds 7]
        [--jobs 500] [--throughput-rounds 3]

It runs, one after the other in this process run:

1. :mod:`benchmarks.bench_store` on SQLite, PostgreSQL and MariaDB (each
   store's floor, a committed single-row ``INSERT``, its new step, attempt
   start and finish, memo hit, 1,000 replayed steps, recovery sweep and
   ``runs list``, in interleaved rounds; a DBOS Transact step and workflow in
   the same rounds when ``dbos`` is installed: ``pip install
   'flexiq-plugins[bench]'``);
2. :mod:`benchmarks.bench_throughput` with each framework's default worker
   (Celery prefork ``-c <CPUs>``, Dramatiq ``<CPUs> × 8``): a plain task and
   durable tasks of 3 and 5 steps, interleaved rounds, jobs/s, store
   connections per process, CPU per job and the CPU ceiling;
3. :mod:`benchmarks.bench_map` on each store: 100 items of a 20 ms I/O
   body as sequential ``step.run`` calls and as one ``step.map`` (wall time,
   commits per item);

then prints one table: every performance target, what was measured, and ``met``
or ``NOT MET``. Each report is printed in full above the table. Ratios are
against a baseline measured in the same rounds, so they move much less
than the times between machines; on a shared or busy machine run it again
and compare the medians. ``--quick`` takes fewer rounds and jobs (a smoke
run, not a measurement).

Needs PostgreSQL (127.0.0.1:5432, database ``test``), MariaDB
(127.0.0.1:3306, database ``test``) and Redis (127.0.0.1:6379), as the two
benchmarks do; ``--store sqlite --no-throughput`` needs none.

The history targets (costs with 1,000,000 finished runs, and cleanup) take
minutes to fill and are separate: ``python -m benchmarks.bench_store --store
postgres --history 1000000`` and ``--cleanup-check 100000``.
"""

from __future__ import annotations

import argparse
import dataclasses

from benchmarks import bench_map, bench_store, bench_throughput

PG_STEP_X_FLOOR = 1.5
SQLITE_STEP_MS = 0.2
START_ROUND_TRIPS = 2
REPLAYED_MS = 10.0
THREE_STEP_X_PLAIN = 0.6
FIVE_STEP_X_PLAIN = 0.4


@dataclasses.dataclass(frozen=True)
class Verdict:
    """One target: what it asks, what was measured, whether it was met (``None``: reported, no target)."""

    target: str
    measured: str
    met: bool | None

    def line(self) -> str:
        mark = {True: "met", False: "NOT MET", None: "reported"}[self.met]
        return f"{self.target:<58} {self.measured:<44} {mark}"


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


def throughput_verdicts(
    setups: list[bench_throughput.WorkerConfig], results: bench_throughput.Results
) -> list[Verdict]:
    """The throughput and connection targets against each worker configuration's results."""
    out = []
    for config in setups:
        rates = bench_throughput.rates(results, config)
        ceiling = bench_throughput.ceilings(results[config])
        for label, least in (("durable 3-step", THREE_STEP_X_PLAIN), ("durable 5-step", FIVE_STEP_X_PLAIN)):
            ratio = rates[label] / rates["plain"]
            bound = f", CPU ceiling {ceiling[label]:.2f}" if label in ceiling else ""
            out.append(
                Verdict(
                    f"{config.label}: {label[8:]} ≥ {least}× plain",
                    f"{ratio:.2f}× ({rates[label]:.0f} / {rates['plain']:.0f} jobs/s{bound})",
                    ratio >= least,
                )
            )
        seen = bench_throughput.connections_seen(config, [r for got in results[config].values() for r in got])
        held = ", ".join(f"{tasks} at once: {most}" for tasks, most in sorted(seen.held.items(), reverse=True))
        out.append(Verdict(f"{config.label}: connections ≤ concurrency + 1", held or "none seen", seen.within_target))
    return out


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", default="all", choices=["sqlite", "postgres", "mariadb", "all"])
    parser.add_argument("--rounds", type=int, default=7, help="bench_store's rounds")
    parser.add_argument("--no-dbos", action="store_true", help="skip the DBOS comparison")
    parser.add_argument("--no-throughput", action="store_true", help="skip the Celery and Dramatiq workers")
    parser.add_argument("--no-map", action="store_true", help="skip the step map benchmark")
    parser.add_argument("--jobs", type=int, default=500, help="jobs a throughput round")
    parser.add_argument("--throughput-rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="2 rounds, 10 steps, 100 jobs: a smoke run")
    return parser


def main(argv: list[str] | None = None) -> list[Verdict]:
    """Run both benchmarks, print their reports and the targets table; return the verdicts."""
    args = parser().parse_args(argv)
    store_args = bench_store.parser().parse_args(["--store", args.store, "--rounds", str(args.rounds)])
    store_args.no_dbos = args.no_dbos
    if args.quick:
        store_args.rounds, store_args.steps = 2, 10
    verdicts = [v for run in bench_store.run(store_args) for v in store_verdicts(run, store_args.replayed)]
    if not args.no_throughput:
        jobs, rounds = (100, 1) if args.quick else (args.jobs, args.throughput_rounds)
        worker_args = bench_throughput.parser().parse_args(["--jobs", str(jobs), "--rounds", str(rounds)])
        verdicts += throughput_verdicts(*bench_throughput.run(worker_args))
    if not args.no_map:
        map_args = bench_map.parser().parse_args(["--store", args.store, "--rounds", "1" if args.quick else "3"])
        targets = [t for result in bench_map.run(map_args) for t in bench_map.targets(result)]
        verdicts += [Verdict(t.target, t.measured, t.met) for t in targets]
    print("\n== performance targets against this run" + (" (--quick: a smoke run, not a measurement)" * args.quick))
    print(f"{'target':<58} {'measured':<44} verdict")
    for verdict in verdicts:
        print(verdict.line())
    return verdicts


if __name__ == "__main__":
    main()
