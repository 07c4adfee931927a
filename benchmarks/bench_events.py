"""The cost of a wait for an event (C33), measured against a plain step in the same process run.

    .venv/bin/python benchmarks/bench_events.py [--runs 30] [--postgres URL]

For each store it times, per run:

- a plain ``step.run`` (one fenced transaction): the baseline;
- ``send_event`` of an event nobody waits for (one insert, one read of the waiters);
- a ``wait_for_event`` whose event was sent before the wait (two commits and
  the poll's two transactions, no suspension);
- the replay of that wait (a memo hit: no statement, C9).

It prints the time of each and the ratio to the baseline. Ratios, not
absolute times, are what to compare between machines.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flexiq_plugins import JobEnvelope, MemoryStepStore, SqlStepStore, StepStore, current_job
from flexiq_plugins.integration import AttemptDriver, Completed, Failure, JobInfo
from flexiq_plugins.operations import send_event


def _attempt(driver: AttemptDriver, job: JobInfo, body: Callable[[], Any]) -> Any:
    attempt = driver.start(job)
    return attempt.run(body)  # type: ignore[union-attr]


def _body(store: StepStore, key: str, phase: dict[str, float], *, replay: bool) -> Callable[[], Any]:
    """A plain step, a ``send_event`` (first attempt only) and a wait for that event, each timed into ``phase``."""

    def body() -> None:
        step = current_job.step
        t0 = time.perf_counter()
        step.run("plain", lambda: 1)
        t1 = time.perf_counter()
        if not replay:
            send_event("bench", key, {"key": key}, store=store, publishers={})
        t2 = time.perf_counter()
        step.wait_for_event("bench", key=key)
        t3 = time.perf_counter()
        phase.update({"step.run": t1 - t0, "send_event": t2 - t1, "wait": t3 - t2})
        if not replay:
            raise RuntimeError("end of the first attempt")  # keeps the rows for the replay

    return body


def _measure(store: StepStore, runs: int) -> dict[str, float]:
    driver = AttemptDriver(store)
    times: dict[str, list[float]] = {"step.run": [], "send_event": [], "wait (event there)": [], "wait replay": []}
    for n in range(runs):
        key = f"bench-{time.time_ns()}-{n}"
        job = JobInfo(key, f"job-{n}", JobEnvelope("bench", "test"))
        phase: dict[str, float] = {}
        assert isinstance(_attempt(driver, job, _body(store, key, phase, replay=False)), Failure)
        times["step.run"].append(phase["step.run"])
        times["send_event"].append(phase["send_event"])
        times["wait (event there)"].append(phase["wait"])
        assert isinstance(_attempt(driver, job, _body(store, key, phase, replay=True)), Completed)
        times["wait replay"].append(phase["wait"])
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--postgres", default="", help="e.g. postgresql://postgres@127.0.0.1:5432/test")
    args = parser.parse_args()
    stores: dict[str, StepStore] = {"memory": MemoryStepStore()}
    tmp = Path(tempfile.mkdtemp(prefix="flexiq-bench-"))
    stores["sqlite"] = SqlStepStore(f"sqlite:///{tmp}/steps.db")
    if args.postgres:
        stores["postgres"] = SqlStepStore(args.postgres, table_prefix="bench_events_")
    print(f"{'store':<10} {'operation':<20} {'µs':>12} {'ratio to step.run':>18}")
    for name, store in stores.items():
        measured = _measure(store, args.runs)
        base = measured["step.run"]
        for operation, seconds in measured.items():
            print(f"{name:<10} {operation:<20} {seconds * 1e6:>12.1f} {seconds / base:>18.2f}")


if __name__ == "__main__":
    main()
