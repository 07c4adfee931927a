"""What observability costs a new step (C53): without the OpenTelemetry API, with it and no SDK, off, and on.

    python -m benchmarks.bench_observe [--rounds 9] [--steps 2000] [--store memory|sqlite] [--callgrind]

Each variant runs in a fresh interpreter (the API can only be absent from a
process that never imported it), once per round, the variants interleaved
so that a noisy neighbour slows them all alike. A run is one job whose body
takes ``--steps`` new steps, after a warm-up job; the variant reports its
time per new step, and the table gives each variant's median over the
rounds and its ratio to **no API**:

- **no API**: ``opentelemetry`` cannot be imported (the ``[otel]`` extra not installed);
- **API, no SDK**: ``opentelemetry-api`` installed, no tracer or meter
  provider configured (the API's defaults, which record nothing): the
  claim of C53 is that this costs a step nothing measurable;
- **options off**: the SDK configured, ``tracing=False, metrics=False``;
- **SDK on**: the SDK configured with a span processor that drops every span
  and a metric reader, ``tracing`` and ``metrics`` on: what recording costs.

The memory store (the default) leaves the library's own CPU alone in the
measurement, where any cost of the observer would show most; ``--store
sqlite`` adds a real commit per step.

On a shared machine times move with the neighbours' load; ``--callgrind``
counts instructions instead (valgrind's callgrind, once per variant): a run
of ``--steps`` new steps minus a run of a third as many, divided by the
steps between them, so the start-up is left out and the number is the same
on every run of the same machine and Python.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("no API", "API, no SDK", "options off", "SDK on")
_WARM_UP = 200

_BLOCK = """
import sys
from importlib.abc import MetaPathFinder

class _NoOpenTelemetry(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ModuleNotFoundError(name, name=name)
        return None

sys.meta_path.insert(0, _NoOpenTelemetry())
"""

_SDK = """
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

provider = TracerProvider()
provider.add_span_processor(SpanProcessor())  # sees every span end, keeps none
trace.set_tracer_provider(provider)
metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))
"""

_RUN = """
import gc, json, time
from flexiq_plugins import DurableConfig, JobEnvelope, current_job
from flexiq_plugins.integration import AttemptDriver, JobInfo
from flexiq_plugins import MemoryStepStore, SqlStepStore

STEPS, STORE, OPTIONS, TMP = {steps}, {store!r}, {options!r}, {tmp!r}
store = MemoryStepStore() if STORE == "memory" else SqlStepStore(f"sqlite:///{{TMP}}/steps.db")
driver = AttemptDriver(store, DurableConfig(**OPTIONS))

def body(n):
    step = current_job.step
    for i in range(n):
        step.run(f"s{{i}}", int)

def job(key, n):
    info = JobInfo(key, key, JobEnvelope("bench.observe", "test"), task_name="bench.observe")
    started = time.perf_counter()
    outcome = driver.run_job(info, lambda: body(n))
    assert type(outcome).__name__ == "Completed", outcome
    return (time.perf_counter() - started) / n

job("warm-up", min(STEPS, {warm_up}))
gc.collect()
gc.freeze()  # what is loaded so far (more modules with the API or the SDK) is not traversed by every collection
times = [job(f"job-{{k}}", STEPS) for k in range(3)]
probe = driver.start(JobInfo("probe", "probe", JobEnvelope("bench.observe", "test"), task_name="bench.observe"))
print(json.dumps({{"us_per_step": min(times) * 1e6, "observed": type(probe.journal).__name__ != "StepJournal"}}))
"""


def variant_script(variant: str, steps: int, store: str, tmp: str) -> str:
    """The program that measures one variant in a fresh interpreter and prints its JSON line."""
    prelude = {"no API": _BLOCK, "API, no SDK": "", "options off": _SDK, "SDK on": _SDK}[variant]
    options = {"tracing": False, "metrics": False} if variant == "options off" else {}
    return textwrap.dedent(prelude) + textwrap.dedent(_RUN).format(
        steps=steps, store=store, options=options, tmp=tmp, warm_up=_WARM_UP
    )


def measure(variant: str, steps: int, store: str) -> float:
    """One run of ``variant``: microseconds per new step (the best of three jobs)."""
    return float(_run(variant, steps, store)["us_per_step"])


def instructions_per_step(variant: str, steps: int, store: str) -> float:
    """Instructions a new step of ``variant`` takes under callgrind (two runs: ``steps`` and a third of it)."""
    counts = {}
    for n in (steps // 3, steps):
        with tempfile.TemporaryDirectory() as tmp:
            done = subprocess.run(
                ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, "-c",
                 variant_script(variant, n, store, tmp)],
                cwd=ROOT, capture_output=True, text=True, check=True,
                env={**os.environ, "PYTHONHASHSEED": "0"},
            )  # fmt: skip
        counts[n] = int(re.search(r"Collected : (\d+)", done.stderr).group(1))  # type: ignore[union-attr]
    low, high = sorted(counts)
    return (counts[high] - counts[low]) / (_steps_run(high) - _steps_run(low))


def _steps_run(steps: int) -> int:
    """The new steps a variant's process takes: the warm-up job's and three timed jobs'."""
    return min(steps, _WARM_UP) + 3 * steps


def observed(variant: str) -> bool:
    """Whether an attempt of ``variant`` gets the observed journal (the plain one costs a step nothing more)."""
    return bool(_run(variant, 1, "memory")["observed"])


def _run(variant: str, steps: int, store: str) -> dict[str, float | bool]:
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(
            [sys.executable, "-c", variant_script(variant, steps, store, tmp)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": "0"},  # the same dict layouts in every variant's process
        )
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Run the rounds, print the table, and return each variant's median, microseconds per step."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--store", choices=("memory", "sqlite"), default="memory")
    parser.add_argument("--callgrind", action="store_true", help="count instructions per step instead of time")
    args = parser.parse_args(argv)
    if args.callgrind:
        return _callgrind(args.steps, args.store)
    samples: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for _ in range(args.rounds):
        for variant in VARIANTS:
            samples[variant].append(measure(variant, args.steps, args.store))
    medians = {v: statistics.median(s) for v, s in samples.items()}
    base = medians["no API"]
    print(f"new step, {args.store} store, {args.steps} steps a job, median of {args.rounds} interleaved rounds")
    print(f"{'variant':<14} {'µs/step':>9} {'vs no API':>10}")
    for variant in VARIANTS:
        print(f"{variant:<14} {medians[variant]:>9.2f} {medians[variant] / base:>9.3f}x")
    return medians


def _callgrind(steps: int, store: str) -> dict[str, float]:
    counted = {v: instructions_per_step(v, steps, store) for v in VARIANTS}
    base = counted["no API"]
    print(f"new step, {store} store, instructions per step under callgrind ({steps} vs {steps // 3} steps a job)")
    print(f"{'variant':<14} {'instr/step':>11} {'vs no API':>10}")
    for variant in VARIANTS:
        print(f"{variant:<14} {counted[variant]:>11,.0f} {counted[variant] / base:>9.3f}x")
    return counted


if __name__ == "__main__":
    main()
