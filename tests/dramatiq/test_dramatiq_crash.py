"""SIGKILL of a real ``dramatiq`` worker process inside a step body (C6, C25, C26)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import dramatiq
import pytest
from dq_support import status_of, wait_until

from dramatiq_ext import RUN_KEY_OPTION
from flexiq_plugins._store.sql import SqlStepStore
from flexiq_plugins.identity import new_run_key

HERE = Path(__file__).parent
ROOT = HERE.parents[1]

pytestmark = pytest.mark.slow


class Workers:
    """Starts ``dramatiq dq_crash_app`` CLI processes; stops the ones left at the end."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.env = env
        self.log = log
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> subprocess.Popen[bytes]:
        """Start one CLI with one worker process and one thread."""
        with self.log.open("ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "dramatiq", "dq_crash_app", "--processes", "1", "--threads", "1"],
                env=self.env,
                cwd=HERE,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs.append(proc)
        return proc

    def stop_all(self) -> None:
        """SIGTERM, then SIGKILL, every CLI process group still running."""
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()


@pytest.fixture
def crash_setup(
    request: pytest.FixtureRequest, tmp_path: Path, queue: str, namespace: str, sqlite_url: str
) -> Iterator[tuple[str, Workers, dramatiq.Broker, SqlStepStore]]:
    """(broker kind, CLI starter, a producer broker, the store) for one crash test."""
    kind, crash_in = request.param
    broker_fixture = f"{kind}_broker"
    producer: dramatiq.Broker = request.getfixturevalue(broker_fixture)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE)]),
        "FLEXIQ_TEST_BROKER": kind,
        "FLEXIQ_TEST_NAMESPACE": namespace,
        "FLEXIQ_TEST_QUEUE": queue,
        "FLEXIQ_TEST_STORE": sqlite_url,
        "FLEXIQ_TEST_DIR": str(tmp_path),
        "FLEXIQ_TEST_CRASH_IN": crash_in,
        "dramatiq_restart_delay": "200",
    }
    workers = Workers(env, tmp_path / "worker.log")
    store = SqlStepStore(sqlite_url)
    try:
        yield crash_in, workers, producer, store
    finally:
        workers.stop_all()
        store.close()


def _lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


CASES = [
    pytest.param(("redis", "charge"), marks=pytest.mark.redis, id="redis-before-commit"),
    pytest.param(("redis", "receipt"), marks=pytest.mark.redis, id="redis-after-commit"),
    pytest.param(("rabbitmq", "charge"), marks=pytest.mark.rabbitmq, id="rabbitmq-before-commit"),
    pytest.param(("rabbitmq", "receipt"), marks=pytest.mark.rabbitmq, id="rabbitmq-after-commit"),
]


@pytest.mark.parametrize("crash_setup", CASES, indirect=True)
def test_c6_c25_sigkill_inside_a_step_body_charges_once(
    crash_setup: tuple[str, Workers, dramatiq.Broker, SqlStepStore], queue: str, tmp_path: Path
) -> None:
    """A worker process killed inside a step body: a new worker finishes the run with one charge.

    Killed inside the charge body (before its commit) the body runs again with
    the same idempotency key, so the payment service charges once (C6, C11).
    Killed inside the receipt body (after the charge committed) the charge is
    not called again (C5). The broker redelivers the unacknowledged message
    (RabbitMQ when the connection dies; Redis once the dead worker's heartbeat
    times out), the new attempt takes over the expired claim (C25), and the
    run succeeds (C26).
    """
    crash_in, workers, producer, store = crash_setup
    run_key = new_run_key()
    producer.declare_queue(queue)
    producer.enqueue(
        dramatiq.Message(
            queue_name=queue, actor_name="checkout", args=("o-1",), kwargs={}, options={RUN_KEY_OPTION: run_key}
        )
    )
    first = workers.start()
    crashed = wait_until(lambda: _lines(tmp_path / "crashed"), timeout=30, what="the step body to hang")
    os.kill(int(crashed[0]), signal.SIGKILL)
    first.wait(30)  # the CLI shuts down once one of its workers died

    workers.start()
    wait_until(lambda: status_of(store, run_key) == "succeeded", timeout=45, what="the restarted worker")

    key = f"{run_key}:charge#0"
    calls = _lines(tmp_path / "charge_calls")
    assert calls == ([key, key] if crash_in == "charge" else [key])
    assert _lines(tmp_path / "charges") == [key]
    assert len(_lines(tmp_path / "receipts")) == 1
    assert store.get_run(run_key).takeovers == 1
