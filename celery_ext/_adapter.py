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

__all__ = ["CeleryAdapter", "CeleryPublisher", "adapter", "publisher"]


class CeleryPublisher:
    """Re-publishes Celery jobs with one app, carrying the run key (C11, C30, C36), and reads their state (C47).

    Given a ``job_id`` it reuses that task id, so the result waiter of a run
    woken by an event (C33) or recovered (C39) gets the run's outcome under
    its first task id.

    Parameters:
      app(celery.Celery): the application whose broker receives the job.
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    def __call__(
        self, envelope: JobEnvelope, run_key: str, *, job_id: str | None = None, unstarted_only: bool = False
    ) -> str:
        """Publish ``envelope`` again carrying ``run_key``; return the task id (``job_id`` when given)."""
        return str(republish(self.app, envelope, run_key, task_id=job_id, unstarted_only=unstarted_only).id)

    def job_state(self, job_id: str, envelope: JobEnvelope) -> ReportedState | None:
        """What the app's result backend holds for ``job_id`` (see :func:`celery_ext._job_state.reported_state`)."""
        return reported_state(self.app, job_id)


def publisher(app: Any) -> Publisher:
    """A :class:`CeleryPublisher` on ``app``.

    Parameters:
      app(celery.Celery): the application whose broker receives the job.
    """
    return CeleryPublisher(app)


class CeleryAdapter:
    """:class:`flexiq_plugins.integration.Adapter` for Celery."""

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


adapter = CeleryAdapter()
"""The registered adapter instance."""
