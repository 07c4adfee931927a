"""A store outage under load: the database cut (dropped and refused, or black-holed) for a while, then back.

    .venv/bin/python benchmarks/outage.py --framework dramatiq --broker redis --outage 10 --jobs 100
    .venv/bin/python benchmarks/outage.py --mode blackhole --outage 60

The workers of ``chaos.py`` (five-step jobs with a 1 s sleep) reach
PostgreSQL through ``netcut.py``. Once the jobs are running, the database is
cut for ``--outage`` seconds, then let through again:

- ``--mode drop`` (default): a TCP proxy in this process drops every
  connection and refuses new ones, so the workers see errors at once;
- ``--mode blackhole``: a network namespace's link is set down, so every
  packet vanishes without a reset: statements in flight and new connections
  hear nothing and only the client's own timeouts end them. Needs root
  (``ip netns``); without it the benchmark exits with status 77 and says why.

It prints how many jobs finished and were lost, how long after the
database's return the last job finished (the drain), how many
WARNING-or-worse lines the workers logged during the outage and after it,
and how many "step store unavailable" and "reachable again" lines there were
in all.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from uuid import uuid4

import chaos
from netcut import BlackHole, BlackHoleUnavailable, Proxy

UNAVAILABLE_EXIT = 77
"""The exit status when ``--mode blackhole`` cannot make its network namespace here."""


def _warnings(directory: str) -> int:
    count = 0
    for log in Path(directory).glob("worker-*.log"):
        for line in log.read_text(errors="replace").splitlines():
            if any(level in line for level in ("WARNING", "ERROR", "CRITICAL")) and "Results middleware" not in line:
                count += 1
    return count


def _lines(directory: str, text: str) -> int:
    return sum(log.read_text(errors="replace").count(text) for log in Path(directory).glob("worker-*.log"))


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Publish, let the jobs start, cut the store for ``args.outage`` seconds, restore, drain; return the counts."""
    from flexiq_plugins import SqlStepStore

    upstream = ("127.0.0.1", 5432)
    proxy: Proxy | BlackHole = BlackHole(upstream) if args.mode == "blackhole" else Proxy(upstream)
    url = f"postgresql://postgres@{proxy.host}:{proxy.port}/test" + (f"?{args.url_query}" if args.url_query else "")
    directory = tempfile.mkdtemp(prefix="flexiq-outage-")
    queue = f"outage{uuid4().hex[:8]}"
    config = chaos.ChaosConfig(args.framework, args.broker, url, queue, directory, defaults=args.defaults)
    direct = SqlStepStore("postgresql://postgres@127.0.0.1:5432/test", table_prefix=config.table_prefix)
    workers = chaos.Workers(config, 2)
    try:
        workers.fill()
        time.sleep(3)  # the workers boot
        chaos.publish(config, args.jobs)
        time.sleep(2)
        before = _warnings(directory)
        proxy.cut()
        cut_at = time.strftime("%H:%M:%S")
        time.sleep(args.outage)
        during = _warnings(directory) - before
        proxy.restore()
        back = time.time()
        back_at = time.strftime("%H:%M:%S")
        deadline = back + args.drain
        runs = chaos._runs(direct, config)
        while time.time() < deadline and (len(runs) < args.jobs or any(not chaos._ended(r.status) for r in runs)):
            time.sleep(0.5)
            runs = chaos._runs(direct, config)
        drain = time.time() - back
        after = _warnings(directory) - before - during
    finally:
        workers.stop()
        proxy.close()
        chaos._cleanup(config)
        chaos._drop_tables(direct)
    finished = sum(1 for r in runs if r.status == "succeeded")
    return {
        "mode": args.mode,
        "framework": args.framework,
        "broker": args.broker,
        "jobs": args.jobs,
        "outage_s": args.outage,
        "library_defaults": args.defaults,
        "finished": finished,
        "lost": args.jobs - sum(1 for r in runs if chaos._ended(r.status)),
        "drain_after_return_s": round(drain, 1),
        "warning_lines_during_outage": during,
        "warning_lines_after_return": after,
        "unavailable_lines": _lines(directory, "step store unavailable"),
        "reachable_again_lines": _lines(directory, "step store reachable again"),
        "cut_at": cut_at,
        "back_at": back_at,
        "directory": directory,
    }


def main() -> None:
    """Parse the arguments, run, print one JSON object."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--framework", choices=("celery", "dramatiq"), default="dramatiq")
    parser.add_argument("--broker", choices=("redis", "rabbitmq"), default="redis")
    parser.add_argument("--mode", choices=("drop", "blackhole"), default="drop", help="how the store is cut")
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--outage", type=float, default=10.0, help="seconds the store is cut")
    parser.add_argument("--drain", type=float, default=300.0)
    parser.add_argument(
        "--defaults",
        action="store_true",
        help="the workers use the library's own lease and recovery limits (else chaos.py's short ones)",
    )
    parser.add_argument(
        "--url-query",
        default="",
        help="appended to the workers' store URL, e.g. connect_timeout=2",
    )
    args = parser.parse_args()
    # A run that outlives its own budget prints every thread's stack (where it hangs) and exits.
    faulthandler.dump_traceback_later(args.outage + args.drain + 120, exit=True)
    try:
        result = run(args)
    except BlackHoleUnavailable as exc:
        print(f"no black hole on this machine: {exc}", file=sys.stderr)
        sys.exit(UNAVAILABLE_EXIT)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
