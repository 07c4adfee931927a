"""The Celery adapter as the core's registry sees it (entry point ``flexiq_plugins.adapters: celery``).

The operator tools (``flexiq dlq retry``, ``flexiq recover``) re-publish a
Celery job through the app given with ``--app``; this object tells them which
objects are Celery apps, how to publish with one, and how to read the step
values Celery's JSON serializer stored.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from flexiq_plugins.integration import JobEnvelope, Publisher, ReportedState, ValueReader

from ._envelope import republish
from ._job_state import reported_state
from ._results import tell_waiter

__all__ = ["CeleryAdapter", "CeleryPublisher", "adapter", "publisher"]


def publisher(app: Any) -> CeleryPublisher:
    """A `CeleryPublisher` on ``app``.

    Parameters:
      app (celery.Celery): the application whose broker receives the job.
    """
    return CeleryPublisher(app)


class CeleryPublisher:
    """Re-publishes Celery jobs with one app (C11, C30, C36), answers their waiters (C45) and reads their state (C47).

    Given a ``job_id`` it reuses that task id, so the result waiter of a run
    woken by an event (C33) or recovered (C39) gets the run's outcome under
    its first task id. It also tells a job's result waiter how a run ended
    outside Celery (C45), and reads what the app's result backend holds for a
    job before recovery re-publishes it (C47).

    Parameters:
      app (celery.Celery): the application.
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    def __call__(
        self, envelope: JobEnvelope, run_key: str, *, job_id: str | None = None, unstarted_only: bool = False
    ) -> str:
        """Publish ``envelope`` again carrying ``run_key``; return the task id (``job_id`` when given)."""
        return str(republish(self.app, envelope, run_key, task_id=job_id, unstarted_only=unstarted_only).id)

    def report_ended(self, envelope: JobEnvelope, job_id: str, error: BaseException) -> bool:
        """Store ``error`` as the FAILURE of task id ``job_id`` unless its backend holds a ready state (C45)."""
        return tell_waiter(self.app.tasks.get(envelope.task_name), job_id, error)

    def job_state(self, job_id: str, envelope: JobEnvelope) -> ReportedState | None:
        """What the app's result backend holds for ``job_id`` (see `celery_ext._job_state.reported_state`)."""
        return reported_state(self.app, job_id)


class CeleryAdapter:
    """[`flexiq_plugins.integration.Adapter`][flexiq_plugins.integration.Adapter] for Celery."""

    framework = "celery"
    publish_hint = "--app module:app"

    def owns(self, target: object) -> bool:
        """Whether ``target`` is a Celery application."""
        from celery import Celery

        return isinstance(target, Celery)

    def publisher(self, target: object) -> Publisher:
        """A publisher through the app ``target``."""
        return publisher(target)

    def value_readers(self) -> Mapping[str, ValueReader]:
        """kombu's JSON (with its tagged ``datetime``, ``Decimal``, ``UUID`` … values)."""
        from kombu.utils.json import loads

        return {"kombu:json": loads}

    def task_body(self, task: object) -> Callable[..., Any] | None:
        """A Celery task's ``run`` (what the worker calls inside the attempt), else ``None``."""
        from celery import Task

        return task.run if isinstance(task, Task) else None  # type: ignore[no-any-return]

    def tasks(self, target: object) -> Mapping[str, object]:
        """The app's tasks by name (Celery's own ``celery.*`` tasks left out)."""
        registry = target.tasks  # type: ignore[attr-defined]  # a Celery app: owns() said so
        return {name: task for name, task in registry.items() if not name.startswith("celery.")}


adapter = CeleryAdapter()
"""The registered adapter instance."""
