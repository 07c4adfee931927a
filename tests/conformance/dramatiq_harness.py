"""The conformance harness of the Dramatiq adapter (``dramatiq_ext.DurableSteps``) on Redis and RabbitMQ.

Observation points, all on the real broker:

- every publish goes through ``broker.enqueue`` (the adapter's sleep hops and
  put-backs, ``Retries``, the worker moving a due delayed message to its queue),
  which the harness wraps to record it and to inject broker faults
  (``ConnectionClosed`` is what a Dramatiq broker raises when it is down);
- a middleware notes each message the worker finished handling
  (``after_process_message`` or ``after_skip_message``);
- the dead-letter path is the queue's ``.XQ`` (a Redis hash of messages, or a
  RabbitMQ queue the harness drains).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import dramatiq
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.brokers.redis import RedisBroker
from dramatiq.common import dq_name, xq_name
from dramatiq.errors import ConnectionClosed
from dramatiq.middleware import Middleware

from dramatiq_ext import RUN_KEY_OPTION, DurableSteps
from flexiq_plugins import StepStore, operations
from flexiq_plugins.integration import HAND_OFF_PAUSES
from tests.conformance.dramatiq_app import make_broker, make_plain_broker
from tests.conformance.harness import Harness, HarnessConfig, Job, WorkerExit, WorkerProcesses

__all__ = ["DramatiqHarness"]

ROOT = Path(__file__).resolve().parents[2]


class DramatiqHarness(Harness):
    """``DurableSteps`` on a real broker, with in-thread and CLI workers."""

    framework = "dramatiq"
    publish_tries = 1 + len(HAND_OFF_PAUSES)  # the core's hand_off tries, before it holds the message

    def __init__(self, config: HarnessConfig) -> None:
        super().__init__(config)
        self.broker = make_broker(config)
        self.broker.add_middleware(_Handled(self))
        self._real_enqueue = self.broker.enqueue
        self.broker.enqueue = self._enqueue  # type: ignore[method-assign]
        self.broker.emit_after("process_boot")
        self._dead_seen: list[tuple[str, str]] = []

    # --------------------------------------------------------------- workers
    @contextmanager
    def thread_worker(self) -> Iterator[None]:
        """A ``dramatiq.Worker`` with two threads in this process."""
        worker = dramatiq.Worker(self.broker, worker_timeout=100, worker_threads=2)
        worker.start()
        try:
            yield
        finally:
            worker.stop()

    @contextmanager
    def worker_processes(self) -> Iterator[WorkerProcesses]:
        """``dramatiq tests.conformance.dramatiq_app --processes 1 --threads 1`` on the queue."""
        workers = _CliWorkers(self.config)
        workers.start()
        try:
            yield workers
        finally:
            workers.stop_all()

    def worker_exit(self, config: HarnessConfig, timeout: float = 60.0) -> WorkerExit:
        """``dramatiq tests.conformance.dramatiq_app`` built from ``config``, until it exits."""
        done = subprocess.run(
            _CliWorkers.command(),
            env=_CliWorkers.env(config),
            capture_output=True,
            timeout=timeout,
            cwd=ROOT,
            check=False,
        )
        return WorkerExit(done.returncode, (done.stdout + done.stderr).decode(errors="replace"))

    # ------------------------------------------------------------- publishing
    @property
    def tasks(self) -> object:
        """The broker: its actors are the scenarios."""
        return self.broker

    def task_name(self, scenario: str) -> str:
        """The actor name: the scenario's own."""
        return scenario

    def _send(self, job: Job) -> None:
        unstamped = job.job_id in self._unstamped
        message: dramatiq.Message[Any] = dramatiq.Message(
            queue_name=self.config.queue,
            actor_name=self.task_name(job.scenario),
            args=job.args,
            kwargs={},
            options={} if unstamped else {RUN_KEY_OPTION: job.run_key},
            message_id=job.job_id,
        )
        if unstamped:
            self._send_without_middleware(message)
        else:
            self.broker.enqueue(message)

    def _send_new(self, scenario: str, args: tuple[Any, ...], job_id: str) -> str:
        """``broker.enqueue`` of a message with no run key: ``before_enqueue`` stamps it (and records the run)."""
        message: dramatiq.Message[Any] = dramatiq.Message(
            queue_name=self.config.queue,
            actor_name=self.task_name(scenario),
            args=args,
            kwargs={},
            options={},
            message_id=job_id,
        )
        sent = self.broker.enqueue(message)
        return str(sent.options[RUN_KEY_OPTION])

    def purge(self) -> int:
        """``broker.flush`` of the harness's queue (and its delay queue)."""
        self.broker.flush(self.config.queue)
        return 0

    def _send_without_middleware(self, message: dramatiq.Message[Any]) -> None:
        """Enqueue ``message`` on a broker of the same kind with no middleware: a producer without ``DurableSteps``."""
        plain = make_plain_broker(self.config)
        try:
            plain.declare_queue(message.queue_name)
            plain.enqueue(message)
        finally:
            plain.close()

    def adapter_store(self) -> StepStore:
        """The store of the broker's ``DurableSteps`` middleware in this process."""
        (middleware,) = [m for m in self.broker.middleware if isinstance(m, DurableSteps)]
        return middleware.store

    def publishers(self) -> dict[str, operations.Publisher]:
        """``{"dramatiq": …}`` from the installed adapter (``dramatiq_ext.republish``)."""
        return operations.publishers_for(self.broker)

    def _enqueue(self, message: Any, *, delay: int | None = None) -> Any:
        seconds = None if delay is None else delay / 1000
        retries = int(message.options.get("retries", 0))
        action = self._publishing(message.options.get(RUN_KEY_OPTION), message.message_id, seconds, retries)
        if action == "refused":
            raise ConnectionClosed("connection refused (injected by the conformance harness)")
        if action == "lost":
            return message
        return self._real_enqueue(message, delay=delay)

    # ------------------------------------------------------------ dead letters
    def broker_dead_letters(self, run_key: str) -> list[str]:
        """Job ids of ``run_key`` in the ``.XQ`` (read from Redis, or drained from RabbitMQ)."""
        xq = xq_name(self.config.queue)
        if isinstance(self.broker, RedisBroker):
            raw = self.broker.client.hvals(f"{self.config.namespace}:{xq}.msgs")
            self._dead_seen = [_identify(dramatiq.Message.decode(data)) for data in raw]
        else:
            assert isinstance(self.broker, RabbitmqBroker)
            while True:
                method, _, body = self.broker.channel.basic_get(queue=xq, auto_ack=True)
                if method is None:
                    break
                self._dead_seen.append(_identify(dramatiq.Message.decode(body)))
        return [job_id for key, job_id in self._dead_seen if key == run_key]

    def close(self) -> None:
        """Delete the queues (Redis namespace or RabbitMQ queues), close the broker and the store."""
        if isinstance(self.broker, RedisBroker):
            keys = list(self.broker.client.scan_iter(f"{self.config.namespace}:*"))
            if keys:
                self.broker.client.delete(*keys)
        elif isinstance(self.broker, RabbitmqBroker):
            queue = self.config.queue
            for name in (queue, dq_name(queue), xq_name(queue)):
                self.broker.channel.queue_delete(name)
        self.broker.close()
        super().close()


def _identify(message: Any) -> tuple[str, str]:
    return message.options.get(RUN_KEY_OPTION, message.message_id), message.message_id


class _Handled(Middleware):
    """Tells the harness about every message a worker finished handling, however it ended."""

    def __init__(self, harness: DramatiqHarness) -> None:
        self.harness = harness

    def after_process_message(
        self, broker: dramatiq.Broker, message: Any, *, result: Any = None, exception: BaseException | None = None
    ) -> None:
        """A message whose actor returned or raised."""
        self.harness._delivered(*_identify(message))

    def after_skip_message(self, broker: dramatiq.Broker, message: Any) -> None:
        """A message skipped: a sleep, a put-back, a duplicate, a dead letter."""
        self.harness._delivered(*_identify(message))


class _CliWorkers(WorkerProcesses):
    """``dramatiq`` CLI processes, one worker process with one thread each.

    The CLI shuts down when one of its worker processes dies, so reviving
    after a kill starts a new CLI.
    """

    def __init__(self, config: HarnessConfig) -> None:
        self.config = config
        self.log = Path(config.directory) / "dramatiq-worker.log"
        self.procs: list[subprocess.Popen[bytes]] = []

    @staticmethod
    def command() -> list[str]:
        """The CLI with one worker process of one thread."""
        return [
            sys.executable,
            "-m",
            "dramatiq",
            "tests.conformance.dramatiq_app",
            "--processes",
            "1",
            "--threads",
            "1",
        ]

    @staticmethod
    def env(config: HarnessConfig) -> dict[str, str]:
        """The CLI's environment: ``config``, the project on ``PYTHONPATH``, a quick restart after a crash."""
        return {
            **os.environ,
            **config.to_env(),
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "dramatiq_restart_delay": "200",
        }

    def start(self) -> None:
        """Start one CLI."""
        with self.log.open("ab") as log:
            self.procs.append(
                subprocess.Popen(
                    self.command(),
                    env=self.env(self.config),
                    cwd=ROOT,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )

    def revive(self) -> None:
        """Start a new CLI: the killed worker's CLI is shutting down."""
        self.start()

    def shut_down(self, *, interrupt: bool) -> None:
        """SIGTERM the CLI (it passes it on once); ``notify_shutdown`` actors get ``Shutdown``, others finish."""
        self.procs[-1].send_signal(signal.SIGTERM)

    def wait_exit(self, timeout: float = 60.0) -> None:
        """Wait for every CLI to exit."""
        for proc in self.procs:
            proc.wait(timeout)

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
