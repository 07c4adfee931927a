"""The conformance harness of the Celery adapter (``celery_ext``) on Redis and RabbitMQ.

Observation points, all on the real app:

- every publish goes through ``app.amqp.send_task_message``, which the harness
  wraps to record it and to inject broker faults (kombu's ``OperationalError``
  is what a publish raises when the broker is down);
- ``task_postrun`` fires once the worker finished handling a message, whatever
  it did (return, ``Ignore``, ``Reject``, retry);
- the dead-letter path is the queue bound to the RabbitMQ dead-letter exchange
  (the adapter rejects with ``requeue=False``), or the Redis list ``<queue>.dlq``
  the adapter publishes dead letters to.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from datetime import datetime, timezone
from pathlib import Path
from subprocess import Popen
from typing import Any

import redis
from celery import signals
from kombu import Exchange, Queue
from kombu.exceptions import OperationalError

from celery_ext import RUN_KEY_HEADER, run_key_of, runtime_of
from flexiq_plugins import StepStore, operations
from flexiq_plugins.integration import HAND_OFF_PAUSES
from tests.conformance.celery_app import BROKER_URLS, dead_letter_names, make_app
from tests.conformance.harness import Harness, HarnessConfig, Job, WorkerExit, WorkerProcesses
from tests.workers import celery_thread_worker, celery_worker_command, celery_worker_process, worker_env

__all__ = ["CeleryHarness"]


class CeleryHarness(Harness):
    """``celery_ext.install`` on a real broker, with in-thread and prefork workers."""

    framework = "celery"
    publish_tries = 1 + len(HAND_OFF_PAUSES)  # the core's hand_off tries, then Reject(requeue=True)

    def __init__(self, config: HarnessConfig) -> None:
        super().__init__(config)
        self.app = make_app(config)
        self._declare_dead_letter_exchange()
        self._real_send = self.app.amqp.send_task_message
        self.app.amqp.send_task_message = self._send_task_message
        signals.task_postrun.connect(self._on_postrun, weak=False)
        self._redis: Any = redis.Redis.from_url(BROKER_URLS["redis"]) if config.broker == "redis" else None
        self._dead_seen: list[tuple[str, str]] = []
        self._workers_started = 0
        self._stamped: dict[str, str] = {}

    # --------------------------------------------------------------- workers
    @contextmanager
    def thread_worker(self) -> Iterator[None]:
        """A real worker with the ``threads`` pool (two threads) in this process."""
        with celery_thread_worker(self.app, pool="threads", concurrency=2):
            yield

    @contextmanager
    def worker_processes(self) -> Iterator[WorkerProcesses]:
        """``celery -A tests.conformance.celery_app worker -P prefork -c 1`` on the queue."""
        self._workers_started += 1
        log = Path(self.config.directory) / f"celery-worker-{self._workers_started}.log"
        app_module = "tests.conformance.celery_app"
        with celery_worker_process(app_module, self.config.queue, self.config.to_env(), log, concurrency=1) as proc:
            yield _PreforkWorker(proc, log)

    def worker_exit(self, config: HarnessConfig, timeout: float = 60.0) -> WorkerExit:
        """``celery -A tests.conformance.celery_app worker`` built from ``config``, until it exits."""
        command = celery_worker_command("tests.conformance.celery_app", config.queue, 1)
        done = subprocess.run(
            command,
            env=worker_env(config.to_env()),
            capture_output=True,
            timeout=timeout,
            cwd=config.directory,
            check=False,
        )
        return WorkerExit(done.returncode, (done.stdout + done.stderr).decode(errors="replace"))

    # ------------------------------------------------------------- publishing
    @property
    def tasks(self) -> object:
        """The app: its tasks are the scenarios."""
        return self.app

    def task_name(self, scenario: str) -> str:
        """``<app name>.<scenario>``."""
        return f"{self.app.main}.{scenario}"

    def _send(self, job: Job) -> None:
        if job.job_id in self._unstamped:
            self._send_unstamped(job)
            return
        self.app.send_task(
            self.task_name(job.scenario),
            args=list(job.args),
            task_id=job.job_id,
            headers={RUN_KEY_HEADER: job.run_key},
        )

    def _send_new(self, scenario: str, args: tuple[Any, ...], job_id: str) -> str:
        """``app.send_task`` with no headers: ``before_task_publish`` stamps the run key (and records the run)."""
        self.app.send_task(self.task_name(scenario), args=list(args), task_id=job_id)
        return self._stamped.pop(job_id)

    def purge(self) -> int:
        """``queue_purge`` of the harness's queue on the broker."""
        with self.app.connection_for_write() as conn:
            return int(conn.default_channel.queue_purge(self.config.queue) or 0)

    def _send_unstamped(self, job: Job) -> None:
        """A protocol-2 task message published with kombu, as a client without ``celery_ext`` sends it.

        Built by Celery's own ``as_task_v2`` but published without
        ``send_task_message``, so no ``before_task_publish`` receiver (the
        adapter's run-key stamp included) ever sees it: the message carries
        no ``flexiq_run_key`` header.
        """
        message = self.app.amqp.as_task_v2(job.job_id, self.task_name(job.scenario), args=list(job.args), kwargs={})
        queue = self.app.amqp.queues[self.config.queue]
        with self.app.producer_or_acquire() as producer:
            producer.publish(
                message.body,
                exchange=queue.exchange,
                routing_key=queue.routing_key,
                declare=[queue],
                headers=message.headers,
                serializer="json",
                **message.properties,
            )

    def publishers(self) -> dict[str, operations.Publisher]:
        """``{"celery": …}`` from the installed adapter (``celery_ext.republish``)."""
        return operations.publishers_for(self.app)

    def adapter_store(self) -> StepStore:
        """The store of ``celery_ext.runtime_of(app)`` in this process."""
        runtime = runtime_of(self.app)
        assert runtime is not None
        return runtime.store

    def _send_task_message(self, producer: Any, name: str, message: Any, **options: Any) -> Any:
        headers = {**message.headers, **(options.get("headers") or {})}
        eta = headers.get("eta")
        delay = None if eta is None else (datetime.fromisoformat(eta) - datetime.now(timezone.utc)).total_seconds()
        action = self._publishing(headers.get(RUN_KEY_HEADER), str(headers["id"]), delay, int(headers["retries"] or 0))
        if action == "refused":
            raise OperationalError("[Errno 111] Connection refused (injected by the conformance harness)")
        if action == "lost":
            return None
        sent = self._real_send(producer, name, message, **options)
        self._stamped[str(message.headers["id"])] = str(message.headers.get(RUN_KEY_HEADER))
        return sent

    def _on_postrun(self, sender: Any = None, task_id: str | None = None, task: Any = None, **_: Any) -> None:
        if task is not None and task.app is self.app:
            self._delivered(run_key_of(task.request), str(task_id))

    # ------------------------------------------------------------ dead letters
    def _declare_dead_letter_exchange(self) -> None:
        if self.config.broker != "rabbitmq":
            return
        exchange, queue = dead_letter_names(self.config)
        with self.app.connection_for_write() as conn:
            Queue(queue, Exchange(exchange, "fanout", auto_delete=True)).bind(conn.default_channel).declare()

    def broker_dead_letters(self, run_key: str) -> list[str]:
        """Job ids of ``run_key`` in the Redis DLQ list, or drained from the queue bound to the DLX."""
        _, queue = dead_letter_names(self.config)
        if self._redis is not None:
            messages = [json.loads(raw) for raw in self._redis.lrange(queue, 0, -1)]
            return [m["headers"]["id"] for m in messages if m["headers"].get(RUN_KEY_HEADER) == run_key]
        with self.app.connection_for_write() as conn:
            channel = conn.default_channel
            while (message := channel.basic_get(queue, no_ack=True)) is not None:
                self._dead_seen.append((message.headers[RUN_KEY_HEADER], message.headers["id"]))
        return [job_id for key, job_id in self._dead_seen if key == run_key]

    def close(self) -> None:
        """Disconnect the signal, delete the queues (and RabbitMQ exchange), close connections and the store."""
        signals.task_postrun.disconnect(self._on_postrun)
        with self.app.connection_for_write() as conn:
            channel = conn.default_channel
            for queue in {self.config.queue, dead_letter_names(self.config)[1]}:
                with suppress(Exception):  # never declared
                    channel.queue_delete(queue)
            if self.config.broker == "rabbitmq":
                with suppress(Exception):
                    channel.exchange_delete(self.config.queue)
        if self._redis is not None:
            self._redis.close()
        self.app.close()
        super().close()


class _PreforkWorker(WorkerProcesses):
    """One ``celery worker`` whose prefork child runs the bodies.

    Killing the child is what a crash of the process running a task looks
    like: the parent sees the child die and, since durable tasks have
    ``reject_on_worker_lost``, gives the message back to the broker; then it
    forks a new child, so nothing needs restarting.
    """

    def __init__(self, proc: Popen[bytes], log: Path) -> None:
        self.proc = proc
        self.log = log

    def revive(self) -> None:
        """The parent outlives its child and forks a new one: check it is still there."""
        assert self.proc.poll() is None, self.log.read_text()[-3000:]

    def shut_down(self, *, interrupt: bool) -> None:
        """SIGQUIT (cold shutdown: the child running a task is terminated) or SIGTERM (warm)."""
        self.proc.send_signal(signal.SIGQUIT if interrupt else signal.SIGTERM)

    def wait_exit(self, timeout: float = 60.0) -> None:
        """Wait for the worker to exit."""
        self.proc.wait(timeout)
