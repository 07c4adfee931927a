"""The dashboard's pages on a store of a million runs: server time per page, against the 150 ms target (C52).

    python -m benchmarks.bench_dashboard [--store postgres|sqlite|URL] [--runs 1000000] [--rounds 15] [--keep]

It fills a store (tables of their own prefix, ``bdash_`` by default) with
``--runs`` runs by set-based SQL (``generate_series`` on PostgreSQL, a
recursive CTE on SQLite; not through the library), the mix a store that has
run for a week holds:

- ten tasks, two frameworks, three queues; last updates spread over the
  past week;
- 1 % dead (each with its dead letter and 5 kept steps), 1 % sleeping (half
  of them past their wake time), 1 % waiting for an event, 0.5 % queued, 1 %
  failed, 1 % cancelled, 0.2 % running, the rest succeeded; 1 in 10 runs
  keeps 5 steps;
- 20,000 events, half of them received by a waiting run.

Then it analyzes the tables (``VACUUM ANALYZE`` on PostgreSQL: what
autovacuum does for a store that grew over time) and times each page of the
dashboard in interleaved rounds, as *server time*: from the moment the ASGI
application is called until it has sent the last byte of the response (no
client, no network). The pages are the overview, the first runs page, the
next page (its cursor), filtered pages (by status, by task, by framework, by
an update window), a run page (a dead run with its steps and dead letter), the
dead letters, a dead letter with its divergence, the events. It prints each
page's median and slowest round, and whether the four pages of the target
(overview, first runs page, a filtered page, a run page) answer within 150 ms.

Nothing here asserts a time: it prints the figures (the CI smoke test runs
it on a few thousand SQLite runs to keep it working).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from starlette.types import ASGIApp, Receive, Scope, Send

from benchmarks.schema import drop_prefixed_tables
from flexiq_plugins import JobEnvelope, SqlStepStore
from flexiq_plugins._store.sql.mapping import dump_envelope
from flexiq_plugins.dashboard import create_app

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

URLS = {"postgres": "postgresql+psycopg://postgres@127.0.0.1:5432/test"}
TARGET_MS = 150.0
TARGET_PAGES = ("overview", "runs, first page", "runs, status=dead", "run page")
TASKS = 10
EVENTS = 20_000
WEEK_S = 7 * 86_400.0


class Timed:
    """An ASGI application wrapped to record each request's server time, seconds."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.last = 0.0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        await self.app(scope, receive, send)
        self.last = time.perf_counter() - started


def fill(store: SqlStepStore, runs: int) -> None:
    """Insert ``runs`` runs with their steps, dead letters and events by set-based SQL (see the module docstring)."""
    t = store._t
    dialect = store.engine.dialect.name
    top = store.now() - 60
    params: dict[str, Any] = {
        "n": runs,
        "top": top,
        "spread": WEEK_S / max(runs, 1),
        "envelope": dump_envelope(JobEnvelope("shop.task", "celery", "q0", [42], {"order": "A-1"})),
        "value": b'FQ1|json\n{"id": "ch_1", "amount": 1200}',
        "events": min(EVENTS, max(runs // 50, 10)),
    }
    if dialect == "postgresql":
        seq, g, text = "generate_series(1, :n) AS s(g)", "s.g", "s.g::text"
        with_seq = ""
    else:
        seq, g, text = "seq", "seq.g", "CAST(seq.g AS TEXT)"
        with_seq = "WITH RECURSIVE seq(g) AS (SELECT 1 UNION ALL SELECT g + 1 FROM seq WHERE g < :n) "
    key = f"'run-' || {text}"
    status = (
        f"CASE WHEN {g} % 100 = 0 THEN 'dead' WHEN {g} % 100 = 1 THEN 'sleeping' WHEN {g} % 100 = 2 THEN 'waiting'"
        f" WHEN {g} % 200 = 3 THEN 'queued' WHEN {g} % 100 = 4 THEN 'failed' WHEN {g} % 100 = 5 THEN 'cancelled'"
        f" WHEN {g} % 500 = 6 THEN 'running' ELSE 'succeeded' END"
    )
    updated = f"(:top - {g} * :spread)"
    kept = f"({g} % 10 = 0 OR {g} % 100 = 0)"
    runs_sql = (
        f"INSERT INTO {t.runs.name} (run_key, task_name, framework, queue, status, attempt, takeovers, envelope,"
        " step_count, step_bytes, created_at, updated_at, wake_at, wait_topic, wait_key) "
        f"{with_seq}SELECT {key}, 'shop.task' || CAST({g} % {TASKS} AS TEXT),"
        f" CASE WHEN {g} % 2 = 0 THEN 'celery' ELSE 'dramatiq' END, 'q' || CAST({g} % 3 AS TEXT), {status}, 1, 0,"
        f" :envelope, CASE WHEN {kept} THEN 5 ELSE 0 END, CASE WHEN {kept} THEN 200 ELSE 0 END,"
        f" {updated} - 5, {updated},"
        f" CASE WHEN {g} % 100 = 1 THEN :top - 3600 + ({g} % 7200) ELSE NULL END,"
        f" CASE WHEN {g} % 100 = 2 THEN 'payment' ELSE NULL END,"
        f" CASE WHEN {g} % 100 = 2 THEN 'order-' || {text} ELSE NULL END FROM {seq}"
    )
    positions = " UNION ALL ".join(f"SELECT {p} AS p, '{name}' AS k" for p, name in enumerate(_STEPS))
    steps_sql = (
        f"INSERT INTO {t.steps.name} (run_key, position, step_key, kind, value, committed_at, attempt) "
        f"{with_seq}SELECT {key}, ps.p, ps.k, 'run', :value, {updated}, 1"
        f" FROM {seq} CROSS JOIN ({positions}) AS ps WHERE {kept}"
    )
    dead_sql = (
        f"INSERT INTO {t.dead.name} (run_key, job_id, task_name, reason, message, traceback, envelope, created_at) "
        f"SELECT run_key, 'job-' || run_key, task_name, 'divergence', :message, 'Traceback …', envelope, updated_at"
        f" FROM {t.runs.name} WHERE status = 'dead'"
    )
    events_sql = (
        f"INSERT INTO {t.events.name} (topic, event_key, payload, created_at) "
        f"{with_seq}SELECT 'payment', 'order-' || CAST({g} * 100 + 2 AS TEXT), :value, :top - {g}"
        f" FROM {seq} WHERE {g} <= :events"
    )
    received_sql = (
        f"INSERT INTO {t.steps.name} (run_key, position, step_key, kind, value, committed_at, attempt, event_id) "
        f"SELECT 'run-' || CAST(e.id * 100 + 2 AS TEXT), 0, 'event:payment#0', 'event', :value, e.created_at, 1, e.id"
        f" FROM {t.events.name} e WHERE e.id % 2 = 0 AND e.id * 100 + 2 <= :n"
    )
    message = (
        "step sequence changed for job j (run r) at position 1\n  recorded: charge#0, reserve#0, ship#0\n"
        "  running:  charge#0, allocate#0\n  step 1 was 'reserve#0', now 'allocate#0'\n"
    )
    value = sa.bindparam("value", type_=sa.LargeBinary)
    with store.engine.begin() as conn:
        conn.execute(sa.text(runs_sql), params)
        conn.execute(sa.text(steps_sql).bindparams(value), params)
        conn.execute(sa.text(dead_sql), {"message": message})
        events_params = {**params, "n": params["events"]}
        conn.execute(sa.text(events_sql).bindparams(value), events_params)
        conn.execute(sa.text(received_sql).bindparams(value), {"value": params["value"], "n": runs})
    analyze(store)


_STEPS = ("charge#0", "reserve#0", "ship#0", "sleep#0", "audit:order-7")


def analyze(store: SqlStepStore) -> None:
    """Refresh the planner's statistics (and, on PostgreSQL, the visibility map) as autovacuum would."""
    t = store._t
    with store.engine.connect() as conn:
        if store.engine.dialect.name == "postgresql":
            conn.execution_options(isolation_level="AUTOCOMMIT")
            for table in (t.runs, t.steps, t.dead, t.events, t.attempts, t.sweep):
                conn.exec_driver_sql(f"VACUUM ANALYZE {table.name}")
        else:
            conn.exec_driver_sql("ANALYZE")
            conn.commit()


def drop(store: SqlStepStore) -> None:
    """Drop the benchmark's tables."""
    drop_prefixed_tables(store.engine, store.table_prefix)


def pages(runs: int) -> dict[str, str]:
    """The pages timed, by name: URL."""
    dead = f"run-{max(100, (runs // 200) * 100)}"
    return {
        "overview": "/",
        "runs, first page": "/runs",
        "runs, next page": "",  # filled from the first page's cursor
        "runs, status=dead": "/runs?status=dead",
        "runs, task": "/runs?task=shop.task3",
        "runs, framework": "/runs?framework=dramatiq",
        "runs, since 1d until 12h": "/runs?since=1d&until=12h",
        "run page": f"/runs/{dead}",
        "run page, values": f"/runs/{dead}?values=1",
        "dead letters": "/dead-letters",
        "dead letter": "/dead-letters/1",
        "events": "/events",
        "events, pending": "/events?state=pending",
    }


def measure(store: SqlStepStore, runs: int, rounds: int) -> dict[str, list[float]]:
    """Each page's server time in ``rounds`` interleaved rounds, milliseconds (the first, warming round dropped)."""
    timed = Timed(create_app(store))
    client = TestClient(timed)
    urls = pages(runs)
    first = client.get("/runs").text
    cursor = (
        first.split('id="next-page" href="', 1)[1].split('"', 1)[0].replace("&amp;", "&")
        if "next-page" in first
        else "/runs"
    )
    urls["runs, next page"] = cursor
    times: dict[str, list[float]] = {name: [] for name in urls}
    for round_no in range(rounds + 1):
        for name, url in urls.items():
            response = client.get(url)
            if response.status_code != 200:
                raise SystemExit(f"{name} ({url}) answered {response.status_code}: {response.text[:300]}")
            if round_no:
                times[name].append(timed.last * 1000)
    return times


def report(times: dict[str, list[float]], runs: int, where: str, out: Callable[[str], None] = print) -> bool:
    """Print each page's median and slowest time; return whether the target pages met 150 ms (median)."""
    out(f"dashboard pages, server time, {runs:,} runs on {where}, {len(next(iter(times.values())))} rounds")
    out(f"{'page':<28} {'median ms':>10} {'max ms':>10}")
    met = True
    for name, values in times.items():
        median = statistics.median(values)
        mark = ""
        if name in TARGET_PAGES:
            ok = median <= TARGET_MS
            met = met and ok
            mark = "  target 150 ms: " + ("met" if ok else "NOT MET")
        out(f"{name:<28} {median:>10.1f} {max(values):>10.1f}{mark}")
    return met


def main(argv: list[str] | None = None) -> int:
    """Fill, measure, report; the exit status is 0 when the target pages met 150 ms."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", default="postgres", help="postgres, sqlite, or a SQLAlchemy URL")
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--prefix", default="bdash_", help="table prefix of the benchmark's tables")
    parser.add_argument("--keep", action="store_true", help="keep the filled tables (and reuse them next time)")
    args = parser.parse_args(argv)
    url = URLS.get(args.store) or ("sqlite:///bench_dashboard.db" if args.store == "sqlite" else args.store)
    store = SqlStepStore(url, table_prefix=args.prefix)
    try:
        filled = store.count_runs(by="status", cap=args.runs)
        if sum(filled.values()) != args.runs:
            drop(store)
            store.close()
            store = SqlStepStore(url, table_prefix=args.prefix)
            started = time.perf_counter()
            fill(store, args.runs)
            print(f"filled {args.runs:,} runs in {time.perf_counter() - started:.0f} s", file=sys.stderr)
        met = report(measure(store, args.runs, args.rounds), args.runs, store.engine.dialect.name)
    finally:
        if not args.keep:
            drop(store)
        store.close()
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
