"""The adapter registry: how the core finds a framework integration without importing it.

An integration package announces an [`Adapter`][flexiq_plugins.integration.Adapter] under the Python entry
point group ``flexiq_plugins.adapters`` (its name is the framework's name):

    [project.entry-points."flexiq_plugins.adapters"]
    celery = "celery_ext:adapter"

or calls [`register_adapter`][flexiq_plugins.integration.register_adapter] at import. The operator API and the
``flexiq`` CLI then ask the registry for a publisher of a framework's jobs, or
for a reader of a serializer's bytes, and never name a framework themselves.
An adapter is loaded (its package imported) only when it is asked for.

An integration configured in a process (``celery_ext.install(app)``, the
``DurableSteps`` middleware on a broker) also registers an
`Installation` ([`register_installation`][flexiq_plugins.integration.register_installation]): then
[`flexiq_plugins.send_event`][flexiq_plugins.send_event] and [`flexiq_plugins.cancel_run`][flexiq_plugins.cancel_run],
called from any code of that process (a web request, a script, another task),
use its store and codecs and wake runs through its app or broker (C33, C34).
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, Literal, Protocol, runtime_checkable

from .._attempt.driver import AttemptDriver
from .._model.records import JobEnvelope
from ..errors import ConfigurationError

__all__ = [
    "ENTRY_POINT_GROUP",
    "Adapter",
    "Installation",
    "JobStates",
    "Publisher",
    "ResultReporter",
    "ReportedState",
    "ValueReader",
    "adapter_for",
    "all_adapters",
    "installations",
    "publisher_for_target",
    "register_adapter",
    "register_installation",
    "reported_state",
    "value_reader",
]

logger = logging.getLogger("flexiq_plugins.registry")

ENTRY_POINT_GROUP = "flexiq_plugins.adapters"
"""The entry point group integrations register their [`Adapter`][flexiq_plugins.integration.Adapter] under."""


class Publisher(Protocol):
    """``publish(envelope, run_key) -> job id``: re-publishes a stored job carrying ``run_key`` (C11, C36)."""

    def __call__(
        self, envelope: JobEnvelope, run_key: str, *, job_id: str | None = None, unstarted_only: bool = False
    ) -> str:
        """Publish ``envelope`` again carrying ``run_key``; return the new message's job id.

        ``job_id``: reuse this job id where the framework allows two messages
        of one id (Celery: a result waiter then sees the run's outcome);
        otherwise, or when ``None``, a new id is made. ``unstarted_only``:
        mark the message ([`UNSTARTED_ONLY`][flexiq_plugins.integration.UNSTARTED_ONLY]) so that it runs only while
        its run has never started: recovery's copy of a ``queued`` run whose
        original may still be in a backlog (C39).
        """


@runtime_checkable
class ResultReporter(Protocol):
    """A publisher that can also answer a job's result waiter (C45); the adapters' publishers are.

    [`flexiq_plugins.cancel_run`][flexiq_plugins.cancel_run] ends a run outside any framework path (no
    message of the job is being handled), so the framework's own result store
    never hears of it; through this method the core tells it.
    """

    def report_ended(self, envelope: JobEnvelope, job_id: str, error: BaseException) -> bool:
        """Store ``error`` as the terminal result of the job ``job_id`` of ``envelope``'s task (C45).

        Celery: FAILURE with ``error`` in the task's result backend, so
        ``AsyncResult.get()`` raises it; Dramatiq: the error in the ``Results``
        backend of the broker, for an actor that stores results, so
        ``message.get_result(block=True)`` raises ``ResultFailure`` naming it.
        Nothing is stored when the framework has no result store for the job,
        or when it already holds a terminal state for ``job_id`` (what the
        framework itself reported wins: a Celery ``REVOKED``).

        Returns:
          bool: whether a result was stored.

        Raises:
          Exception: whatever the result store raises (the caller logs it).
        """


ReportedState = Literal["succeeded", "failed", "cancelled"]
"""A terminal state a framework reports for a job: the run status recovery settles it with (C47)."""


@runtime_checkable
class JobStates(Protocol):
    """A publisher that can also read what its framework's result store says of a job (C47).

    The adapters' publishers implement it; a publisher without it (a plain
    function) makes `reported_state` answer ``None``.
    """

    def job_state(self, job_id: str, envelope: JobEnvelope) -> ReportedState | None:
        """The terminal state the framework's result store holds for job ``job_id`` of ``envelope``.

        One read that never waits for a result. ``None``: no result store is
        configured, or it holds nothing terminal for that job (pending,
        started, retrying, expired).

        Raises:
          Exception: the result store could not be read now.
        """


def reported_state(publisher: object, job_id: str, envelope: JobEnvelope) -> ReportedState | None:
    """What ``publisher``'s framework reported for job ``job_id`` ([`JobStates`][flexiq_plugins.integration.JobStates]),
    else ``None`` (C47).

    Raises:
      Exception: the result store could not be read now.
    """
    return publisher.job_state(job_id, envelope) if isinstance(publisher, JobStates) else None


UNSTARTED_ONLY = "flexiq_unstarted_only"
"""The header (Celery) or option (Dramatiq) of a copy that runs only while its run never started (C39)."""

ValueReader = Callable[[bytes], Any]
"""``loads(serialized bytes) -> value``: reads step values for display only, never to run a job."""


@runtime_checkable
class Adapter(Protocol):
    """What an integration tells the core about itself.

    Attributes:
      framework (str): the name stored in each run's envelope (``"celery"``).
      publish_hint (str): how an operator supplies a publisher on the command
        line, for error messages (``"--app module:app"``).
    """

    framework: str
    publish_hint: str

    def owns(self, target: object) -> bool:
        """Whether ``target`` (an app, a broker …) is this framework's, so it can publish."""

    def publisher(self, target: object) -> Publisher:
        """A [`Publisher`][flexiq_plugins.integration.Publisher] that re-publishes this framework's jobs through
        ``target``.

        It should also be a [`ResultReporter`][flexiq_plugins.integration.ResultReporter] (the adapters' are), so
        that a run ended outside the framework ([`flexiq_plugins.cancel_run`][flexiq_plugins.cancel_run])
        answers its job's result waiter at once (C45).
        """

    def value_readers(self) -> Mapping[str, ValueReader]:
        """Readers of the serializers this framework stores values with, by serializer name."""

    def task_body(self, task: object) -> Callable[..., Any] | None:
        """The plain function behind ``task`` (a task or actor object of this framework), else ``None``.

        Used by [`flexiq_plugins.testing`][flexiq_plugins.testing] to run a body without a worker.
        """

    def tasks(self, target: object) -> Mapping[str, object]:
        """The tasks (or actors) of ``target``, an app or broker this adapter owns, by the name runs record.

        Used by the deploy check ([`check_runs`][flexiq_plugins.operations.check_runs]) to find the new
        body of each run's task (C48); each is then turned into its plain function with `task_body`.
        """


_lock = threading.Lock()
_registered: dict[str, Adapter] = {}
_entry_points_loaded: set[str] = set()
_loading = threading.RLock()
"""Held while an adapter's entry point is imported and registered: a second thread asking for it waits for the first
(re-entrant: importing one adapter may ask for another)."""


def register_adapter(adapter: Adapter) -> None:
    """Register ``adapter`` under its framework name (the last registration wins)."""
    with _lock:
        _registered[adapter.framework] = adapter


def _load_entry_point(name: str) -> None:
    """Import and register the adapter ``name`` once; it is marked loaded only when it is registered."""
    if name in _entry_points_loaded:
        return
    with _loading:
        if name in _entry_points_loaded:
            return
        for point in entry_points(group=ENTRY_POINT_GROUP, name=name):
            try:
                adapter = point.load()
            except ImportError as exc:  # the framework is not installed: the adapter is unavailable
                logger.debug("adapter %r is not available: %s", name, exc)
                continue
            if isinstance(adapter, Adapter) and name not in _registered:
                register_adapter(adapter)
        _entry_points_loaded.add(name)


def _names() -> list[str]:
    return sorted({p.name for p in entry_points(group=ENTRY_POINT_GROUP)} | set(_registered))


def adapter_for(framework: str) -> Adapter | None:
    """The adapter of ``framework``, loading its entry point on first use; ``None`` if none is installed."""
    _load_entry_point(framework)
    return _registered.get(framework)


def all_adapters() -> list[Adapter]:
    """Every installed adapter (each package is imported)."""
    return [a for a in (adapter_for(name) for name in _names()) if a is not None]


def publisher_for_target(target: object) -> tuple[str, Publisher]:
    """``(framework, publisher)`` for an app or broker object, from the adapter that owns it.

    Raises:
      ConfigurationError: no installed adapter owns ``target``.
    """
    for adapter in all_adapters():
        if adapter.owns(target):
            return adapter.framework, adapter.publisher(target)
    known = ", ".join(_names()) or "none"
    raise ConfigurationError(f"no installed integration publishes with {target!r} (installed: {known})")


@dataclass(frozen=True)
class Installation:
    """An integration configured in this process: what sends events and cancels runs from here (C33, C34).

    Parameters:
      framework (str): the adapter's framework name.
      target (Callable[[], object | None]): the app or broker it publishes with
        (a weak reference: ``None`` once it is gone).
      driver (Callable[[], AttemptDriver]): the process's attempt driver (its
        store, codecs and options), opened on first use.
    """

    framework: str
    target: Callable[[], object | None]
    driver: Callable[[], AttemptDriver]


_installed: list[Installation] = []


def register_installation(framework: str, target: object, driver: Callable[[], AttemptDriver]) -> None:
    """Note that ``framework`` is configured on ``target`` (an app or broker) in this process (idempotent).

    Held weakly: an app or broker that is gone is forgotten.
    """
    with _lock:
        _installed[:] = [i for i in _installed if i.target() not in (None, target)]
        _installed.append(Installation(framework, weakref.ref(target), driver))


def installations() -> list[Installation]:
    """The integrations configured in this process whose app or broker is alive, the most recent first."""
    with _lock:
        return [i for i in reversed(_installed) if i.target() is not None]


def value_reader(serializer_name: str) -> ValueReader | None:
    """A display reader for bytes written by ``serializer_name``, from any installed adapter."""
    for adapter in all_adapters():
        reader = adapter.value_readers().get(serializer_name)
        if reader is not None:
            return reader
    return None
