"""What a conformance test needs from a framework integration: the :class:`Harness` interface.

The behavioural tests of ``tests/conformance`` are written once and run
against every adapter on every real broker it supports. Each adapter brings a
small harness (``celery_harness.py``, ``dramatiq_harness.py``) that knows how to
publish a scenario job, run workers, read the broker's dead-letter path and
re-publish a stored job; everything else (the store, the ledger, the waits,
fault bookkeeping) is shared here. A future adapter is held to the same suite
by writing only its harness and an app module registering
:data:`~tests.conformance.scenarios.SCENARIOS`.

Two kinds of workers:

- an **in-thread worker** (:meth:`Harness.thread_worker`) consuming the
  harness's queue from this process, with two concurrent slots; the harness
  observes every delivery it finishes and every message it publishes, and can
  inject broker faults at the real publish call;
- **real worker processes** (:meth:`Harness.worker_processes`), for crashes:
  a test SIGKILLs the process running a body and revives the workers.

Tests share one harness (queue, store, ledger) per module, so every query is
per run key.
"""

from __future__ import annotations

import abc
import json
import os
import signal
import threading
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from typing import Any, Literal
from uuid import uuid4

from flexiq_plugins import (
    DeadLetterRecord,
    RunRecord,
    SqlStepStore,
    StepRow,
    StepStore,
    StoreUnavailable,
    UnknownRun,
    new_run_key,
)
from flexiq_plugins.operations import Publisher
from tests.conformance.scenarios import Ledger
from tests.polling import wait_for

__all__ = [
    "CONFIG_ENV",
    "Fault",
    "Harness",
    "HarnessConfig",
    "Job",
    "Publish",
    "WorkerExit",
    "WorkerProcesses",
    "adapter_options",
]

CONFIG_ENV = "FLEXIQ_CONFORMANCE"
"""The environment variable a worker process reads its :class:`HarnessConfig` from (JSON)."""


@dataclass(frozen=True)
class HarnessConfig:
    """Everything an app module needs to build the same app in a test and in a worker process.

    Parameters:
      name(str): ``"<framework>-<broker>"``, e.g. ``"celery-redis"``.
      broker(str): ``"redis"`` or ``"rabbitmq"``.
      queue(str): the queue this harness's jobs use (unique per harness).
      namespace(str): a Redis key namespace (unique per harness).
      store_url(str): the step store's SQLAlchemy URL.
      directory(str): where the ledger, the store file and the worker logs live.
      lease_seconds(float): the adapter's claim lease, seconds (C23).
      busy_retry_seconds(float): the most a busy run's duplicate is put back for, seconds (C24).
      recovery_interval_seconds(float): time between the workers' recovery ticks, seconds (C39).
      recovery_grace_seconds(float): how long past its wake time a run may be before it is recovered (C35).
      recovery_queued_seconds(float): how long a run recorded at publish may stay queued (C39).
    """

    name: str
    broker: str
    queue: str
    namespace: str
    store_url: str
    directory: str
    lease_seconds: float = 30.0
    busy_retry_seconds: float = 0.5
    recovery_interval_seconds: float = 60.0
    recovery_grace_seconds: float = 60.0
    recovery_queued_seconds: float = 600.0

    def to_env(self) -> dict[str, str]:
        """The environment of a worker process that builds this configuration's app."""
        return {CONFIG_ENV: json.dumps(asdict(self))}

    @classmethod
    def from_env(cls) -> HarnessConfig | None:
        """The configuration :meth:`to_env` put in this process's environment, or ``None``."""
        raw = os.environ.get(CONFIG_ENV)
        return cls(**json.loads(raw)) if raw else None


@dataclass(frozen=True)
class Job:
    """A job the harness published.

    Parameters:
      scenario(str): the scenario's name.
      args(tuple[Any, ...]): its arguments after the ledger.
      job_id(str): the Celery task id / Dramatiq message id.
      run_key(str): the run key the message carries.
    """

    scenario: str
    args: tuple[Any, ...]
    job_id: str
    run_key: str


@dataclass(frozen=True)
class Publish:
    """A message of a run handed to the broker by a worker or an operator (not by the harness).

    Parameters:
      job_id(str): its job id.
      delay(float | None): its delay (countdown / Dramatiq ``delay``), seconds; ``None`` for none.
      retries(int): the framework's retry count it carries.
      action(str): ``"sent"``, or ``"refused"`` / ``"lost"`` by an injected fault.
    """

    job_id: str
    delay: float | None
    retries: int
    action: str


@dataclass
class Fault:
    """A broker fault on the publishes of one run (see :meth:`Harness.refuse_publishes`).

    Parameters:
      run_key(str): the run whose messages are hit.
      action(str): ``"refused"`` (the publish call raises the broker's error) or
        ``"lost"`` (the broker accepts the message and loses it).
      budget(int): how many publishes are hit; later ones go through.
      statuses(list[str | None]): the run's status in the store at each hit.
      only_status(str | None): hit only publishes made while the run has this status
        (e.g. ``"sleeping"``: its wake-up, not a recovery copy of the ``queued`` run).
    """

    run_key: str
    action: Literal["refused", "lost"]
    budget: int
    statuses: list[str | None] = field(default_factory=list)
    only_status: str | None = None

    @property
    def used(self) -> int:
        """How many publishes were hit so far."""
        return len(self.statuses)


@dataclass(frozen=True)
class WorkerExit:
    """How a worker process that stopped by itself ended.

    Parameters:
      returncode(int): its exit status.
      output(str): everything it wrote (stdout and stderr).
    """

    returncode: int
    output: str


class WorkerProcesses(abc.ABC):
    """Real worker processes consuming the harness's queue (for crash tests)."""

    def kill(self, pid: int) -> None:
        """SIGKILL the process ``pid`` (the one running a body, from :meth:`Ledger.hung`)."""
        os.kill(pid, signal.SIGKILL)

    @abc.abstractmethod
    def revive(self) -> None:
        """After a kill, make sure a live worker consumes the queue again (start one if none is left)."""

    @abc.abstractmethod
    def shut_down(self, *, interrupt: bool) -> None:
        """Ask the workers to shut down as a deploy does, without waiting for them.

        ``interrupt=False`` is the framework's warm shutdown (SIGTERM: running
        bodies finish); ``interrupt=True`` interrupts the body running now
        (Celery's cold shutdown, SIGQUIT; Dramatiq's SIGTERM, which raises
        ``Shutdown`` in actors with ``notify_shutdown``).
        """

    @abc.abstractmethod
    def wait_exit(self, timeout: float = 60.0) -> None:
        """Wait until every worker process has exited (fails after ``timeout`` seconds)."""


class Harness(abc.ABC):
    """One adapter on one real broker, with a store and a ledger, as the conformance tests use it.

    Subclasses implement the framework's part (the abstract methods) and call
    :meth:`_publishing` from their broker's real publish call and
    :meth:`_delivered` when a worker has finished handling a message.

    Parameters:
      config(HarnessConfig): the queue, store, directory and options.
    """

    framework: str
    """``"celery"`` or ``"dramatiq"``: the framework name of the jobs' envelopes."""

    publish_tries: int
    """How many times the adapter itself tries one hand-off to the broker (a sleep's re-enqueue)."""

    def __init__(self, config: HarnessConfig) -> None:
        self.config = config
        self.store = SqlStepStore(config.store_url)
        self.ledger = Ledger(config.directory)
        self._lock = threading.Lock()
        self._local = threading.local()
        self._faults: dict[str, Fault] = {}
        self._published: list[tuple[str, Publish]] = []
        self._deliveries: list[tuple[str, str]] = []
        self._unstamped: set[str] = set()

    # --------------------------------------------------------------- workers
    @abc.abstractmethod
    def thread_worker(self) -> AbstractContextManager[None]:
        """Run an in-thread worker (two concurrent slots) on the queue for the ``with`` block."""

    @abc.abstractmethod
    def worker_processes(self) -> AbstractContextManager[WorkerProcesses]:
        """Run a real worker process on the queue for the ``with`` block (stopped at its end)."""

    @abc.abstractmethod
    def worker_exit(self, config: HarnessConfig, timeout: float = 60.0) -> WorkerExit:
        """Start a real worker process built from ``config``; wait until it exits by itself (at most ``timeout`` s)."""

    # ------------------------------------------------------------- publishing
    def publish(self, scenario: str, *args: Any, run_key: str | None = None) -> Job:
        """Publish a job of ``scenario`` with ``args``; a new run key unless ``run_key`` is given."""
        job = Job(scenario, args, str(uuid4()), run_key or new_run_key())
        self._send_directly(job)
        return job

    def publish_new(self, scenario: str, *args: Any) -> Job:
        """Publish a job of ``scenario`` as a producer with the integration does: the adapter mints its run key.

        The returned :class:`Job` holds the run key the adapter stamped on the message (C11, C39).
        """
        job_id = str(uuid4())
        self._local.direct = True
        try:
            run_key = self._send_new(scenario, args, job_id)
        finally:
            self._local.direct = False
        return Job(scenario, args, job_id, run_key)

    @abc.abstractmethod
    def _send_new(self, scenario: str, args: tuple[Any, ...], job_id: str) -> str:
        """Publish a new job through the framework's own publish path (no run key given); return its run key."""

    @abc.abstractmethod
    def purge(self) -> int:
        """Delete every message waiting in the harness's queue (what a purge or a lost list does); return how many."""

    def publish_duplicate(self, job: Job) -> None:
        """Publish ``job`` again: the same job id and run key (what a broker redelivery looks like)."""
        self._send_directly(job)

    def publish_unstamped(self, scenario: str, *args: Any) -> Job:
        """Publish a job of ``scenario`` as a producer without the integration does: no run key on the message.

        Its run key is then its job id (C1 words); the returned :class:`Job`
        says so. :meth:`publish_duplicate` of it sends the same bare message again.
        """
        job_id = str(uuid4())
        job = Job(scenario, args, job_id, job_id)
        self._unstamped.add(job_id)
        self._send_directly(job)
        return job

    def fail_store_begins(self, run_key: str, count: int) -> None:
        """Make the adapter's store refuse the next ``count`` claims of ``run_key`` (``StoreUnavailable``)."""
        store = self.adapter_store()
        real_begin = store.begin
        left = [count]

        def begin(key: str, *args: Any, **kwargs: Any) -> Any:
            with self._lock:
                refuse = key == run_key and left[0] > 0
                left[0] -= 1 if refuse else 0
            if refuse:
                raise StoreUnavailable("injected by the conformance harness: connection refused")
            return real_begin(key, *args, **kwargs)

        store.begin = begin  # type: ignore[method-assign]

    @abc.abstractmethod
    def adapter_store(self) -> StepStore:
        """The store object the adapter's in-thread worker uses in this process."""

    @property
    @abc.abstractmethod
    def tasks(self) -> object:
        """The app (Celery) or broker (Dramatiq) whose tasks are the scenarios: what a deploy check runs."""

    @abc.abstractmethod
    def task_name(self, scenario: str) -> str:
        """The task or actor name ``scenario`` is registered under (what envelopes and dead letters record)."""

    @abc.abstractmethod
    def publishers(self) -> dict[str, Publisher]:
        """The operations publishers of this adapter (``operations.publishers_for(app_or_broker)``)."""

    @abc.abstractmethod
    def _send(self, job: Job) -> None:
        """Publish ``job``'s message: its scenario's task with its args, job id and run key.

        A job of :meth:`publish_unstamped` (its id in ``self._unstamped``) is
        published with no run key at all, by a producer without the integration.
        """

    def _send_directly(self, job: Job) -> None:
        self._local.direct = True
        try:
            self._send(job)
        finally:
            self._local.direct = False

    # ---------------------------------------------------------------- broker
    @abc.abstractmethod
    def broker_dead_letters(self, run_key: str) -> list[str]:
        """The job ids of ``run_key``'s messages on the broker's dead-letter path (C30)."""

    def refuse_publishes(self, run_key: str, count: int) -> Fault:
        """Make the broker refuse the next ``count`` publishes of ``run_key``'s messages (a broker outage).

        Only publishes by workers and operators are hit, never the harness's
        own :meth:`publish`. The publish call raises what the framework's
        client raises when the broker is down.
        """
        return self._arm(Fault(run_key, "refused", count))

    def lose_publishes(self, run_key: str, count: int = 1, *, only_status: str | None = None) -> Fault:
        """Make the broker accept the next ``count`` publishes of ``run_key``'s messages and lose them.

        What a broker that restarts without persisting the message does: the
        publish call returns as usual and nothing is ever delivered. With
        ``only_status``, only publishes made while the run has that status are hit.
        """
        return self._arm(Fault(run_key, "lost", count, only_status=only_status))

    def _arm(self, fault: Fault) -> Fault:
        with self._lock:
            self._faults[fault.run_key] = fault
        return fault

    def _publishing(self, run_key: str | None, job_id: str, delay: float | None, retries: int) -> str:
        """Called by the broker's publish call: record it and return ``"sent"``, ``"refused"`` or ``"lost"``."""
        if run_key is None or getattr(self._local, "direct", False):
            return "sent"
        with self._lock:
            fault = self._faults.get(run_key)
            action = "sent"
            status = self.status(run_key) if fault is not None and fault.used < fault.budget else None
            if fault is not None and fault.used < fault.budget and fault.only_status in (None, status):
                action = fault.action
                fault.statuses.append(status)
            self._published.append((run_key, Publish(job_id, delay, retries, action)))
        return action

    def published(self, run_key: str) -> list[Publish]:
        """Every message of ``run_key`` handed to the broker by a worker or an operator, in order."""
        with self._lock:
            return [p for key, p in self._published if key == run_key]

    def _delivered(self, run_key: str, job_id: str) -> None:
        """Called when the in-thread worker finished handling a message (whatever it did with it)."""
        with self._lock:
            self._deliveries.append((run_key, job_id))

    def deliveries(self, run_key: str) -> list[str]:
        """The job ids of ``run_key``'s messages the in-thread worker finished handling, in order."""
        with self._lock:
            return [job_id for key, job_id in self._deliveries if key == run_key]

    # ----------------------------------------------------------------- store
    def status(self, run_key: str) -> str | None:
        """The run's status in the store (``None`` before it exists)."""
        try:
            return self.store.get_run(run_key).status
        except UnknownRun:
            return None

    def run(self, run_key: str) -> RunRecord:
        """The run's record in the store."""
        return self.store.get_run(run_key)

    def wait_status(self, run_key: str, *statuses: str, timeout: float = 30.0) -> RunRecord:
        """Wait until the run's status is one of ``statuses``; return the run."""
        wait_for(lambda: self.status(run_key) in statuses, timeout, f"run {run_key} to be {' or '.join(statuses)}")
        return self.run(run_key)

    def steps(self, run_key: str) -> list[StepRow]:
        """The run's committed step rows by position (kept after success: ``keep_succeeded_steps``)."""
        return self.store.get_steps(run_key)

    def dead_letters(self, run_key: str) -> list[DeadLetterRecord]:
        """The run's dead letters in the store, retried ones included (C30)."""
        return [d for d in self.store.list_dead_letters(include_retried=True) if d.run_key == run_key]

    def close(self) -> None:
        """Release the broker's queues and connections and the store."""
        self.store.close()


def adapter_options(config: HarnessConfig) -> Mapping[str, Any]:
    """The shared adapter options every harness installs its adapter with."""
    return {
        "store": config.store_url,
        "lease_seconds": config.lease_seconds,
        "busy_retry_seconds": config.busy_retry_seconds,
        "store_retry_seconds": 0.2,  # an injected store outage puts the job back for 0.2 s
        "keep_succeeded_steps": True,  # the tests read the step rows of finished runs
        "recovery_interval_seconds": config.recovery_interval_seconds,
        "recovery_grace_seconds": config.recovery_grace_seconds,
        "recovery_queued_seconds": config.recovery_queued_seconds,
    }
