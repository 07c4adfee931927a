"""Step retry budgets and compensations on real ``dramatiq`` worker processes and a real Redis broker (C31, C32).

A supervisor keeps one ``dramatiq dq_retry_app`` CLI (one process, one
thread) running for the whole module and starts a new one whenever it exits:
the CLI shuts down when its worker process dies, as it does in production
under a process manager. Each test publishes its own job and waits for its
run to end in the store. What does not need real processes is proven in
``tests/core/test_step_retries.py`` and ``tests/core/test_compensation.py``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import dramatiq
import pytest
from dq_support import dead_letter_count, status_of, wait_until
from dramatiq.brokers.redis import RedisBroker

from dramatiq_ext import RUN_KEY_OPTION
from flexiq_plugins._model.identity import new_run_key
from flexiq_plugins._store.sql import SqlStepStore

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
TERMINAL = {"succeeded", "failed", "dead", "compensated"}

pytestmark = [pytest.mark.slow, pytest.mark.redis, pytest.mark.timeout(180)]


class Supervisor:
    """Keeps one ``dramatiq dq_retry_app`` CLI running, restarting it when it exits, until stopped."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.env = env
        self.log = log
        self.starts = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._keep_running, name="dramatiq-supervisor", daemon=True)

    def start(self) -> None:
        """Start the first CLI and the thread that restarts it."""
        self._thread.start()

    def _keep_running(self) -> None:
        """Run a CLI and wait for it, again and again, until :meth:`stop`."""
        while not self._stop.is_set():
            with self.log.open("ab") as log:
                self._proc = subprocess.Popen(
                    [sys.executable, "-m", "dramatiq", "dq_retry_app", "--processes", "1", "--threads", "1"],
                    env=self.env,
                    cwd=HERE,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            self.starts += 1
            self._proc.wait()

    def stop(self) -> None:
        """Stop restarting; SIGTERM (then SIGKILL) the running CLI's process group."""
        self._stop.set()
        proc = self._proc
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self._thread.join(20)


@dataclass
class Workers:
    """The module's supervised worker, a producer broker, the store and the calls file."""

    producer: RedisBroker
    store: SqlStepStore
    dir: Path
    queue: str
    namespace: str

    def publish(self, actor: str, label: str) -> str:
        """Enqueue ``actor(label)`` with a run key of its own, claiming 50 retries already; return the run key."""
        run_key = new_run_key()
        options = {RUN_KEY_OPTION: run_key, "retries": 50}
        message = dramatiq.Message(queue_name=self.queue, actor_name=actor, args=(label,), kwargs={}, options=options)
        self.producer.enqueue(message)
        return run_key

    def finished(self, run_key: str, timeout: float = 60) -> str:
        """Wait until the run is terminal in the store; return its status."""

        def terminal() -> str | None:
            status = status_of(self.store, run_key)
            return status if status in TERMINAL else None

        return str(wait_until(terminal, timeout, f"run {run_key} to finish"))

    def calls(self, label: str) -> list[str]:
        """The calls ``label`` recorded, in order, without the label."""
        path = self.dir / "calls"
        lines = path.read_text().split() if path.exists() else []
        return [line.partition(":")[2] for line in lines if line.startswith(f"{label}:")]

    def dead_letters(self) -> int:
        """How many messages the queue's dead-letter queue (``.XQ``) holds."""
        return dead_letter_count(self.producer, self.queue, self.namespace)


@pytest.fixture(scope="module")
def workers(
    tmp_path_factory: pytest.TempPathFactory, require_service: Callable[[str, str, int], None]
) -> Iterator[Workers]:
    """A supervised one-process worker on its own Redis namespace and SQLite store, for the whole module."""
    require_service("Redis", "127.0.0.1", 6379)
    here = tmp_path_factory.mktemp("dramatiq-retries")
    queue, namespace = f"fq_{uuid.uuid4().hex[:10]}", f"flexiq-test-{uuid.uuid4().hex[:10]}"
    store_url = f"sqlite:///{here / 'steps.db'}"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE)]),
        "FLEXIQ_TEST_NAMESPACE": namespace,
        "FLEXIQ_TEST_QUEUE": queue,
        "FLEXIQ_TEST_STORE": store_url,
        "FLEXIQ_TEST_DIR": str(here),
    }
    producer = RedisBroker(host="127.0.0.1", namespace=namespace)
    producer.declare_queue(queue)
    store = SqlStepStore(store_url)
    supervisor = Supervisor(env, here / "worker.log")
    supervisor.start()
    try:
        yield Workers(producer, store, here, queue, namespace)
    finally:
        supervisor.stop()
        keys = list(producer.client.scan_iter(f"{namespace}:*"))
        if keys:
            producer.client.delete(*keys)
        producer.close()
        store.close()


def label() -> str:
    """A label of its own for the calls one test records."""
    return uuid.uuid4().hex[:8]


def test_c31_a_failing_step_runs_exactly_five_times_whatever_the_retries_say(workers: Workers) -> None:
    """A step with ``max_attempts=5`` that always raises runs exactly five times, though the actor has
    ``max_retries=0`` and the message claims 50 retries already: attempts 1..5 recorded, the last exhausted;
    one dead letter in the store and one message in ``.XQ``."""
    name = label()
    before = workers.dead_letters()
    run_key = workers.publish("always_fails", name)
    assert workers.finished(run_key) == "dead"

    assert workers.calls(name) == ["ship"] * 5
    attempts = workers.store.get_step_attempts(run_key)
    assert [(a.number, a.ended) for a in attempts] == [(n, "failed") for n in range(1, 5)] + [(5, "exhausted")]
    assert [d.reason for d in workers.store.list_dead_letters() if d.run_key == run_key] == ["step_retry_exhausted"]
    assert workers.dead_letters() == before + 1


def test_c31_a_worker_killed_inside_the_step_uses_its_attempts(workers: Workers) -> None:
    """``os._exit(137)`` inside a step with ``max_attempts=3``: the body runs three times (each death a new
    worker, a redelivery and a takeover), then the run is dead-lettered ``step_retry_exhausted``."""
    name = label()
    run_key = workers.publish("exits_in_step", name)
    assert workers.finished(run_key, timeout=120) == "dead"

    assert workers.calls(name) == ["charge"] * 3
    attempts = workers.store.get_step_attempts(run_key)
    assert [(a.number, a.ended) for a in attempts] == [(1, "lost"), (2, "lost"), (3, "exhausted")]
    assert [d.reason for d in workers.store.list_dead_letters() if d.run_key == run_key] == ["step_retry_exhausted"]


def test_c31_a_non_retryable_error_runs_the_body_once(workers: Workers) -> None:
    """``NonRetryableError`` in a step of an actor with ``max_retries=5``: one call, no retry of any kind."""
    name = label()
    run_key = workers.publish("non_retryable", name)
    assert workers.finished(run_key) == "dead"
    assert workers.calls(name) == ["charge"]
    assert [d.reason for d in workers.store.list_dead_letters() if d.run_key == run_key] == ["non_retryable"]


def test_c32_two_undos_run_once_each_in_reverse_even_when_killed_between_them(workers: Workers) -> None:
    """The third step fails for good: the charge is undone, the worker process is SIGKILLed before the
    reservation's undo does anything, and the redelivered job undoes the reservation without undoing the
    charge again; the run ends ``compensated``."""
    name = label()
    run_key = workers.publish("saga", name)
    pid_file = workers.dir / f"{name}.pid"
    wait_until(pid_file.exists, 60, "the second undo to start")
    os.kill(int(pid_file.read_text()), signal.SIGKILL)
    assert workers.finished(run_key, timeout=90) == "compensated"

    assert [c for c in workers.calls(name) if c.startswith("undo_")] == ["undo_charge", "undo_reserve"]
    assert workers.calls(name).count("ship") == 1
    assert [d.reason for d in workers.store.list_dead_letters() if d.run_key == run_key] == ["non_retryable"]
    assert workers.store.get_run(run_key).takeovers == 1
