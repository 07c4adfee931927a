"""Step overhead, measured against a plain call in the same process run.

    .venv/bin/python benchmarks/bench_steps.py [--steps 20] [--runs 50]

For each store it times whole attempts of a body with ``--steps`` steps:
the first attempt (every step runs and commits: one fenced transaction each)
and a replay (every step is a memo hit: no statement, C9). It prints the
time per step and the ratio to the baseline, the same body calling the step
functions directly. Ratios, not absolute times, are what to compare between
machines. Each store is measured for plain steps, steps with a retry budget
(``retry=``: one more transaction per new step, to journal its attempt, C31)
and steps with an undo (``compensate=``: no extra statement, C32).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flexiq_plugins import JobEnvelope, MemoryStepStore, RetryPolicy, SqlStepStore, StepStore, current_job
from flexiq_plugins.integration import AttemptDriver, Completed, Failure, JobInfo

KINDS: dict[str, dict[str, Any]] = {
    "plain": {},
    "retry=": {"retry": RetryPolicy(max_attempts=3)},
    "compensate=": {"compensate": lambda value: None},
}


def _body(steps: int, fail_at_end: bool, options: dict[str, Any]) -> Callable[[], int]:
    def body() -> int:
        total = 0
        for i in range(steps):
            total += current_job.step.run("add", lambda i=i: i, **options)
        if fail_at_end:
            raise RuntimeError("end of first attempt")  # keeps the rows for the replay
        return total

    return body


def _baseline(steps: int, runs: int) -> float:
    def plain() -> int:
        fns = [lambda i=i: i for i in range(steps)]
        return sum(fn() for fn in fns)

    start = time.perf_counter()
    for _ in range(runs):
        plain()
    return (time.perf_counter() - start) / (runs * steps)


def _measure(store: StepStore, steps: int, runs: int, options: dict[str, Any]) -> tuple[float, float]:
    driver = AttemptDriver(store)
    first, replay = [], []
    for n in range(runs):
        job = JobInfo(f"bench-{time.time_ns()}-{n}", f"job-{n}", JobEnvelope("bench", "test"))
        attempt = driver.start(job)
        t0 = time.perf_counter()
        assert isinstance(attempt.run(_body(steps, True, options)), Failure)  # type: ignore[union-attr]
        t1 = time.perf_counter()
        attempt = driver.start(job)
        assert isinstance(attempt.run(_body(steps, False, options)), Completed)  # type: ignore[union-attr]
        t2 = time.perf_counter()
        first.append((t1 - t0) / steps)
        replay.append((t2 - t1) / steps)
    return statistics.median(first), statistics.median(replay)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--postgres", default="", help="e.g. postgresql://postgres@127.0.0.1:5432/test")
    args = parser.parse_args()
    base = _baseline(args.steps, args.runs * 50)
    stores: dict[str, StepStore] = {"memory": MemoryStepStore()}
    tmp = Path(tempfile.mkdtemp(prefix="flexiq-bench-"))
    stores["sqlite"] = SqlStepStore(f"sqlite:///{tmp}/steps.db")
    if args.postgres:
        stores["postgres"] = SqlStepStore(args.postgres, table_prefix="bench_")
    print(f"baseline (plain call): {base * 1e6:.3f} µs per step")
    print(f"{'store':<10} {'steps':<12} {'first run µs/step':>18} {'ratio':>10} {'memo hit µs/step':>18} {'ratio':>10}")
    for name, store in stores.items():
        for kind, options in KINDS.items():
            first, replay = _measure(store, args.steps, args.runs, options)
            print(
                f"{name:<10} {kind:<12} {first * 1e6:>18.1f} {first / base:>10.0f} "
                f"{replay * 1e6:>18.1f} {replay / base:>10.0f}"
            )


if __name__ == "__main__":
    main()
