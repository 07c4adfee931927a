"""A chaos run: five-step jobs, workers SIGKILLed at random, then a count of what was lost (C39).

    .venv/bin/python benchmarks/chaos.py --framework celery --broker redis \\
        --store postgresql://localhost/test --jobs 200 --duration 60

It publishes ``--jobs`` jobs of a five-step task (``s1``, ``s2``, a 1 s
``step.sleep``, ``s3``, ``s4``, ``s5``; each step body appends to a ledger
file when it starts and just before it returns), runs ``--workers`` worker
processes (Celery prefork, or the ``dramatiq`` CLI, each with two children),
and for ``--duration`` seconds SIGKILLs, every ``--kill-every`` seconds on
average from the first step body on, either a whole worker (its process
group) or one pool child, restarting workers that died. Then it drains: it waits until every run has
ended or ``--drain`` seconds pass, and prints

- finished: runs that succeeded;
- lost: runs that did not end (and their statuses);
- dead-lettered: runs dead-lettered, with their reasons;
- bodies started again: step bodies that started more than once for one run
  (the first start was killed inside the body, before it returned: C6);
- re-run bodies: step bodies that returned more than once for one run;
- of those, inside the commit window: the earlier return's process was
  killed after the body returned (before its commit could land);
- back after a kill (median, max): for each kill that interrupted a step
  body, the seconds until that run's next step body started (its queue's
  backlog included); ``--body-seconds`` makes bodies long enough for kills
  to land in them.

**Losing the broker** (``--lose-broker-at SECONDS``, Redis only): that many
seconds after the jobs are published, every key of the run's queue is
deleted from Redis (its list, its delayed messages, the messages workers
had taken without acknowledging them): what a broker restarted without
persistence loses. The report then adds the seconds from the loss until the
last run ended, and how many of the original result waiters (Celery
``AsyncResult``, Dramatiq ``Results``: both configured on Redis) got their
job's result. With ``--defaults`` the workers use the library's own recovery
limits and lease instead of the short ones below; ``--duration 0`` kills
nothing::

    .venv/bin/python benchmarks/chaos.py --framework dramatiq --broker redis \
        --store postgresql://localhost/test --jobs 200 --duration 0 --lose-broker-at 10 --defaults

Workers recover by themselves (C39: recovery in the workers, runs recorded
at publish), with short limits for a one-minute run; ``recovered_by_workers``
counts the runs their sweepers re-published (a lost wake-up, a lost message,
or a job still waiting in the backlog after ``--queued-after`` seconds). The same file is the
worker's app module: a worker imports it with ``FLEXIQ_CHAOS`` in its
environment.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from uuid import uuid4

from benchmarks.schema import drop_prefixed_tables

CONFIG_ENV = "FLEXIQ_CHAOS"
BROKERS = {"redis": "redis://127.0.0.1:6379/13", "rabbitmq": "amqp://guest:guest@127.0.0.1:5672//"}
STEPS = ("s1", "s2", "s3", "s4", "s5")
HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class ChaosConfig:
    """What the driver and its workers share (passed to workers as JSON in ``FLEXIQ_CHAOS``)."""

    framework: str
    broker: str
    store: str
    queue: str
    directory: str
    lease_seconds: float = 5.0
    queued_after: float = 120.0
    grace: float = 30.0
    defaults: bool = False
    body_seconds: float = 0.05

    @property
    def table_prefix(self) -> str:
        """The run's own tables (``chaos<id>_runs`` …), dropped at its end: a shared database stays clean."""
        return f"{self.queue}_"

    def open_store(self) -> Any:
        """A store on the run's own tables."""
        from flexiq_plugins import SqlStepStore

        return SqlStepStore(self.store, table_prefix=self.table_prefix)


# ------------------------------------------------------------------ the app
def _ledger(config: ChaosConfig, step: str, phase: str) -> None:
    from flexiq_plugins import current_job

    entry = {"run": current_job.run_key, "step": step, "phase": phase, "pid": os.getpid(), "t": time.time()}
    fd = os.open(Path(config.directory) / "ledger.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(entry) + "\n").encode())
    finally:
        os.close(fd)


def five_steps(config: ChaosConfig, n: int) -> int:
    """The chaos job: five steps with a 1 s sleep between the second and the third."""
    from flexiq_plugins import current_job

    def body(step: str) -> Any:
        def run() -> str:
            _ledger(config, step, "start")
            time.sleep(config.body_seconds)  # a little work, so kills land inside bodies too
            _ledger(config, step, "return")
            return step

        return run

    step_ctx = current_job.step
    step_ctx.run("s1", body("s1"))
    step_ctx.run("s2", body("s2"))
    step_ctx.sleep(1)
    for name in ("s3", "s4", "s5"):
        step_ctx.run(name, body(name))
    return n


def _options(config: ChaosConfig) -> dict[str, Any]:
    if config.defaults:  # the library's own lease and recovery limits
        return {"store": config.open_store(), "keep_succeeded_steps": True, "max_hop_seconds": 5.0}
    return {
        "store": config.open_store(),
        "lease_seconds": config.lease_seconds,
        "keep_succeeded_steps": True,
        "recovery_interval_seconds": 2.0,
        "recovery_grace_seconds": config.grace,
        "recovery_queued_seconds": config.queued_after,
        "recovery_stale_seconds": 60.0,
        "max_hop_seconds": 5.0,
    }


def make_celery(config: ChaosConfig) -> Any:
    """The Celery app of the run: one durable task, short visibility timeout so killed workers' jobs return."""
    from celery import Celery

    import celery_ext

    app = Celery(f"chaos{config.queue}", broker=BROKERS[config.broker], backend=BROKERS["redis"], set_as_current=False)
    app.conf.update(
        task_default_queue=config.queue,
        broker_connection_retry_on_startup=True,
        worker_prefetch_multiplier=1,
        # short, so a killed worker's jobs also come back through Redis (with --defaults: Celery's own, 1 h)
        broker_transport_options={} if config.defaults else {"visibility_timeout": 15},
        worker_hijack_root_logger=False,
    )
    celery_ext.install(app, **_options(config))

    @app.task(name="chaos.five_steps", acks_late=True, durable=True)  # recorded from its first job (C43)
    def task(n: int) -> int:
        return five_steps(config, n)

    return app


def make_dramatiq(config: ChaosConfig) -> Any:
    """The Dramatiq broker of the run: one durable actor; Redis requeues a dead worker's messages quickly."""
    import dramatiq
    from dramatiq.brokers.rabbitmq import RabbitmqBroker
    from dramatiq.brokers.redis import RedisBroker
    from dramatiq.results import Results

    from dramatiq_ext import DurableSteps

    broker: Any
    if config.broker == "redis":
        quick = {} if config.defaults else {"heartbeat_timeout": 5000}  # with --defaults: Dramatiq's own (60 s)
        broker = RedisBroker(url=BROKERS["redis"], namespace=f"chaos-{config.queue}", dead_message_ttl=600_000, **quick)
        if not config.defaults:
            broker.maintenance_chance = 10_000  # of 100_000 fetches: requeue dead workers' messages soon
    else:
        broker = RabbitmqBroker(host="127.0.0.1", port=5672, heartbeat=0)
    broker.add_middleware(Results(backend=_results_backend(config)))
    broker.add_middleware(DurableSteps(**_options(config)))
    dramatiq.set_broker(broker)

    @dramatiq.actor(
        actor_name="five_steps",
        queue_name=config.queue,
        max_retries=20,
        min_backoff=200,
        store_results=True,
        durable=True,  # recorded from its first job (C43)
    )
    def actor(n: int) -> int:
        return five_steps(config, n)

    return broker


def _results_backend(config: ChaosConfig) -> Any:
    """The Dramatiq ``Results`` backend of the run (Redis, its own namespace)."""
    from dramatiq.results.backends import RedisBackend

    return RedisBackend(url=BROKERS["redis"], namespace=f"chaos-results-{config.queue}")


_CONFIG = ChaosConfig(**json.loads(os.environ[CONFIG_ENV])) if os.environ.get(CONFIG_ENV) else None
if _CONFIG is not None and _CONFIG.framework == "celery":
    app = make_celery(_CONFIG)
elif _CONFIG is not None:
    broker = make_dramatiq(_CONFIG)


# --------------------------------------------------------------- the driver
def _env(config: ChaosConfig) -> dict[str, str]:
    root = str(HERE.parent)
    path = os.pathsep.join([str(HERE), root, os.environ.get("PYTHONPATH", "")])
    return {**os.environ, CONFIG_ENV: json.dumps(asdict(config)), "PYTHONPATH": path, "dramatiq_restart_delay": "200"}


def _worker_command(config: ChaosConfig) -> list[str]:
    if config.framework == "celery":
        return [
            sys.executable, "-m", "celery", "-A", "chaos", "worker", "-P", "prefork", "-c", "2",
            "-Q", config.queue, "--loglevel", "INFO", "--without-gossip", "--without-mingle",
            "--without-heartbeat", "-n", f"{uuid4().hex[:6]}@%h",
        ]  # fmt: skip
    return [sys.executable, "-m", "dramatiq", "chaos", "--processes", "2", "--threads", "1", "--queues", config.queue]


class Workers:
    """Worker processes, each the leader of its own process group."""

    def __init__(self, config: ChaosConfig, count: int) -> None:
        self.config = config
        self.count = count
        self.procs: list[subprocess.Popen[bytes]] = []
        self.kills: list[tuple[float, int]] = []  # (time, pid) of every process a kill took down
        self.started = 0

    def fill(self) -> None:
        """Start workers until ``count`` are alive."""
        self.procs = [p for p in self.procs if p.poll() is None]
        while len(self.procs) < self.count:
            self.started += 1
            log = (Path(self.config.directory) / f"worker-{self.started}.log").open("ab")
            self.procs.append(
                subprocess.Popen(
                    _worker_command(self.config),
                    env=_env(self.config),
                    cwd=self.config.directory,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )

    def kill_one(self, rng: random.Random) -> str:
        """SIGKILL a whole worker (its process group) or one pool child; return what was killed."""
        alive = [p for p in self.procs if p.poll() is None]
        if not alive:
            return "nothing"
        proc = rng.choice(alive)
        children = _children(proc.pid)
        if children and rng.random() < 0.5:
            pid = rng.choice(children)
            self._kill([pid])
            return f"child {pid}"
        self._kill(_group(proc.pid))
        return f"worker {proc.pid}"

    def _kill(self, pids: list[int]) -> None:
        now = time.time()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                self.kills.append((now, pid))
            except ProcessLookupError:
                pass

    def stop(self) -> None:
        """SIGTERM every group, then SIGKILL what is left."""
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.time() + 20
        for proc in self.procs:
            try:
                proc.wait(max(deadline - time.time(), 0.1))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _proc_stat(pid: int) -> tuple[int, int] | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return int(fields[1]), int(fields[2])  # ppid, pgrp


def _all_pids() -> list[int]:
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


def _children(pid: int) -> list[int]:
    return [p for p in _all_pids() if (st := _proc_stat(p)) is not None and st[0] == pid]


def _group(pgid: int) -> list[int]:
    return [p for p in _all_pids() if (st := _proc_stat(p)) is not None and st[1] == pgid]


def publish(config: ChaosConfig, jobs: int) -> list[Any]:
    """Publish the jobs from this process (the integration records each run at publish); return their handles.

    A Celery job's handle is its task id, a Dramatiq job's its message: what a result waiter holds.
    """
    if config.framework == "celery":
        celery_app = make_celery(config)
        ids = [celery_app.send_task("chaos.five_steps", args=[n]).id for n in range(jobs)]
        celery_app.close()
        return ids
    dramatiq_broker = make_dramatiq(config)
    actor = dramatiq_broker.get_actor("five_steps")
    messages = [actor.send(n) for n in range(jobs)]
    dramatiq_broker.close()
    return messages


@dataclass
class Loss:
    """When the broker lost the run's messages, what the waiters got, and when the runs had all ended."""

    at: float | None = None
    keys: int = 0
    drained_at: float | None = None


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Publish, kill for ``args.duration`` seconds (losing the broker's keys on the way), drain; return the counts."""
    directory = args.directory or tempfile.mkdtemp(prefix="flexiq-chaos-")
    store_url = args.store or f"sqlite:///{Path(directory) / 'steps.db'}"
    queue = f"chaos{uuid4().hex[:8]}"
    config = ChaosConfig(
        args.framework,
        args.broker,
        store_url,
        queue,
        directory,
        queued_after=args.queued_after,
        grace=args.grace,
        defaults=args.defaults,
        body_seconds=args.body_seconds,
    )
    store = config.open_store()
    store.now()
    rng = random.Random(args.seed)
    workers = Workers(config, args.workers)
    started = time.time()
    loss = Loss()
    handles: list[Any] = []
    try:
        runs, kills = _publish_kill_drain(args, config, store, workers, rng, loss=loss, handles=handles)
    finally:
        workers.stop()
    drained_s = time.time() - started
    result = _report(store, runs, config, args.jobs, workers.kills)
    result.update(kills=kills, seconds=round(drained_s, 1), directory=directory, workers_started=workers.started)
    if loss.at is not None:
        result.update(_loss_report(config, loss, handles))
    _cleanup(config, handles)
    _drop_tables(store)
    return result


def _publish_kill_drain(
    args: argparse.Namespace,
    config: ChaosConfig,
    store: Any,
    workers: Workers,
    rng: random.Random,
    *,
    loss: Loss,
    handles: list[Any],
) -> tuple[list[Any], int]:
    workers.fill()
    handles.extend(publish(config, args.jobs))
    published = time.time()
    lose_at = published + args.lose_broker_at if args.lose_broker_at is not None else None
    kills = 0
    ledger = Path(config.directory) / "ledger.jsonl"
    next_kill: float | None = None
    while time.time() - published < max(args.duration, args.lose_broker_at or 0):
        time.sleep(0.1)
        now = time.time()
        if next_kill is None and args.duration > 0 and ledger.exists():  # kills begin once a body has run
            next_kill = now + rng.uniform(0.5, 1.5) * args.kill_every
        if lose_at is not None and loss.at is None and now >= lose_at:
            loss.keys = _lose_broker(config)
            loss.at = time.time()
        if next_kill is not None and now >= next_kill and now - published < args.duration:
            workers.kill_one(rng)
            kills += 1
            time.sleep(0.3)
            workers.fill()
            next_kill = time.time() + rng.uniform(0.5, 1.5) * args.kill_every
    deadline = time.time() + args.drain
    runs = _runs(store, config)
    while time.time() < deadline and (len(runs) < args.jobs or any(not _ended(r.status) for r in runs)):
        workers.fill()
        time.sleep(1.0)
        runs = _runs(store, config)
    if len(runs) >= args.jobs and all(_ended(r.status) for r in runs):
        loss.drained_at = time.time()
    return runs, kills


def _lose_broker(config: ChaosConfig) -> int:
    """Delete every Redis key of the run's queue, and its messages workers hold unacknowledged; return the count.

    What a Redis restarted without persistence loses of this run: the queue's
    list (Celery) or lists and message tables (Dramatiq, delayed queue
    included), and Celery's record of the messages its workers took but did
    not acknowledge (else its visibility timeout would give them back).
    """
    import redis

    if config.broker != "redis":
        raise SystemExit("--lose-broker-at needs --broker redis")
    client = redis.Redis.from_url(BROKERS["redis"])
    keys = [k for k in client.scan_iter(f"*{config.queue}*") if b"results" not in k]
    lost = client.delete(*keys) if keys else 0
    for tag, raw in client.hgetall("unacked").items():  # Celery: [message, exchange, routing key]
        with contextlib.suppress(ValueError, TypeError, IndexError):
            if json.loads(raw)[2] == config.queue:
                client.hdel("unacked", tag)
                client.zrem("unacked_index", tag)
                lost += 1
    return int(lost)


def _loss_report(config: ChaosConfig, loss: Loss, handles: list[Any]) -> dict[str, Any]:
    """Seconds from the loss until every run ended, and how many original result waiters got their result."""
    assert loss.at is not None
    drained = round(loss.drained_at - loss.at, 1) if loss.drained_at is not None else None
    return {
        "broker_keys_lost": loss.keys,
        "drained_after_loss_s": drained,
        "original_waiters_with_result": sum(1 for handle in handles if _has_result(config, handle)),
    }


def _has_result(config: ChaosConfig, handle: Any) -> bool:
    """Whether the original waiter of a job (its task id, its message) gets its result now, without waiting."""
    if config.framework == "celery":
        return bool(make_celery_results(config).AsyncResult(handle).state == "SUCCESS")
    from dramatiq.results import ResultMissing

    try:
        _results_backend(config).get_result(handle, block=False)
    except ResultMissing:
        return False
    return True


_RESULTS_APP: dict[str, Any] = {}


def make_celery_results(config: ChaosConfig) -> Any:
    """A Celery app that reads the run's result backend (one per run)."""
    from celery import Celery

    if config.queue not in _RESULTS_APP:
        _RESULTS_APP[config.queue] = Celery(
            f"chaos-results-{config.queue}", broker=BROKERS[config.broker], backend=BROKERS["redis"]
        )
    return _RESULTS_APP[config.queue]


def _ended(status: str) -> bool:
    return status in ("succeeded", "dead", "failed", "cancelled", "compensated")


def _runs(store: Any, config: ChaosConfig) -> list[Any]:
    task = "chaos.five_steps" if config.framework == "celery" else "five_steps"
    return [r for r in store.list_runs(limit=100_000) if r.task_name == task and r.envelope.queue == config.queue]


def _report(
    store: Any, runs: list[Any], config: ChaosConfig, jobs: int, kills: list[tuple[float, int]]
) -> dict[str, Any]:
    ledger = [json.loads(line) for line in (Path(config.directory) / "ledger.jsonl").read_text().splitlines() if line]
    ours = {r.run_key for r in runs}
    returns: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    starts: Counter[tuple[str, str]] = Counter()
    for entry in ledger:
        if entry["run"] not in ours:
            continue
        if entry["phase"] == "return":
            returns[(entry["run"], entry["step"])].append(entry)
        else:
            starts[(entry["run"], entry["step"])] += 1
    killed_at = defaultdict(list)
    for at, pid in kills:
        killed_at[pid].append(at)
    reruns = inside = 0
    for entries in returns.values():
        for earlier in entries[:-1]:
            reruns += 1
            if any(at >= earlier["t"] for at in killed_at.get(earlier["pid"], [])):
                inside += 1
    back = _back_after_kills([e for e in ledger if e["run"] in ours], killed_at)
    dead = [d for d in store.list_dead_letters(include_retried=True) if d.run_key in ours]
    statuses = Counter(r.status for r in runs)
    return {
        "framework": config.framework,
        "broker": config.broker,
        "store": config.store.split(":")[0],
        "jobs": jobs,
        "recorded": len(runs),
        "finished": statuses.get("succeeded", 0),
        "lost": jobs - sum(n for s, n in statuses.items() if _ended(s)),
        "unfinished_statuses": {s: n for s, n in statuses.items() if not _ended(s)},
        "dead_lettered": dict(Counter(d.reason for d in dead)),
        "bodies_started_again": sum(1 for n in starts.values() if n > 1),
        "recovered_by_workers": sum(1 for r in runs if r.recovered_at is not None),
        "takeovers": sum(r.takeovers for r in runs),
        "bodies_re_run": reruns,
        "re_runs_inside_commit_window": inside,
        "runs_killed_in_a_body": len(back),
        "back_after_kill_s_median": round(sorted(back)[len(back) // 2], 1) if back else None,
        "back_after_kill_s_max": round(max(back), 1) if back else None,
    }


def _back_after_kills(ledger: list[dict[str, Any]], killed_at: dict[int, list[float]]) -> list[float]:
    """Seconds from each kill that interrupted a step body to that run's next step body starting elsewhere.

    A body started by a process that was killed before it returned: the
    run's next ledger entry after the kill is the run coming back (through
    the broker's redelivery, or the workers' recovery once the lease ran out).
    """
    by_run: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for entry in sorted(ledger, key=lambda e: e["t"]):
        by_run[entry["run"]].append(entry)
    gaps = []
    for entries in by_run.values():
        for i, entry in enumerate(entries):
            if entry["phase"] != "start":
                continue
            returned = any(e["phase"] == "return" and e["pid"] == entry["pid"] for e in entries[i + 1 : i + 2])
            kill = next((k for k in sorted(killed_at.get(entry["pid"], [])) if k >= entry["t"]), None)
            later = [e for e in entries[i + 1 :] if kill is not None and e["t"] > kill]
            if not returned and kill is not None and later:
                gaps.append(later[0]["t"] - kill)
    return gaps


def _drop_tables(store: Any) -> None:
    """Drop the run's own tables (a SQLite file in the run's directory is kept for a look)."""

    if store.engine.dialect.name == "sqlite":
        return
    drop_prefixed_tables(store.engine, store.table_prefix)
    store.close()


def _cleanup(config: ChaosConfig, handles: Sequence[Any] = ()) -> None:
    try:
        if config.broker == "redis" or handles:
            import redis

            client = redis.Redis.from_url(BROKERS["redis"])
            keys = list(client.scan_iter(f"*{config.queue}*"))
            if config.framework == "celery":
                keys += [f"celery-task-meta-{task_id}" for task_id in handles]
            if keys:
                client.delete(*keys)
        if config.broker == "rabbitmq":
            from kombu import Connection

            with Connection(BROKERS["rabbitmq"]) as conn:  # type: ignore[no-untyped-call]
                for name in (config.queue, f"{config.queue}.DQ", f"{config.queue}.XQ"):
                    with contextlib.suppress(Exception):
                        conn.default_channel.queue_delete(name)
    except Exception as exc:  # cleanup is best effort
        print(f"cleanup: {exc}", file=sys.stderr)


def main() -> None:
    """Parse the arguments, run, print the report (``--json``: one JSON object)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--framework", choices=("celery", "dramatiq"), default="celery")
    parser.add_argument("--broker", choices=("redis", "rabbitmq"), default="redis")
    parser.add_argument("--store", default=None, help="SQLAlchemy URL; default: a SQLite file in --directory")
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of killing (0: no kills)")
    parser.add_argument("--kill-every", type=float, default=3.0, help="mean seconds between kills")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--drain", type=float, default=240.0, help="most seconds to wait for the runs to end")
    parser.add_argument(
        "--queued-after",
        type=float,
        default=120.0,
        help="the workers' recovery_queued_seconds: above the run's backlog, or waiting jobs are re-published",
    )
    parser.add_argument(
        "--grace",
        type=float,
        default=30.0,
        help="the workers' recovery_grace_seconds: how late a wake-up may be before it is re-published",
    )
    parser.add_argument(
        "--lose-broker-at",
        type=float,
        default=None,
        help="seconds after publishing: delete the run's queue keys from Redis (a restart without persistence)",
    )
    parser.add_argument(
        "--defaults",
        action="store_true",
        help="the workers use the library's own lease and recovery limits (--queued-after and --grace unused)",
    )
    parser.add_argument(
        "--body-seconds",
        type=float,
        default=0.05,
        help="how long each step body works: long ones make a kill land inside a body (see back_after_kill)",
    )
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--directory", default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = run(args)
    if args.json:
        print(json.dumps(result))
        return
    for key, value in result.items():
        print(f"{key:>30}: {value}")


if __name__ == "__main__":
    main()
