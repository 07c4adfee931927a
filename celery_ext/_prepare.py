"""Making tasks durable, whenever and however they were declared.

Tasks declared after ``install`` without a ``base=`` are created from the
app's ``Task``, which ``install`` replaced with a [`DurableTask`][celery_ext.DurableTask]
subclass: nothing to do. The others, tasks with their own ``base=`` class and
tasks created before ``install`` on an already finalized app, get a subclass
of their class with [`DurableTask`][celery_ext.DurableTask] mixed in first; the instance in the
registry keeps its identity (its ``__class__`` is swapped), so references
held by user code stay valid. This runs at ``install`` (finalized apps),
after finalization and at ``worker_init``.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from celery import Task

from ._task import ACK_DEFAULTS, DurableTask

_DURABLE_OPTIONS = ("durable", "record_at_publish", "step_retry", "max_run_seconds", "max_suspended_seconds")
"""The options of [`DurableTask`][celery_ext.DurableTask] a task declared before it was made durable keeps."""

__all__ = ["acknowledge_late", "is_builtin", "prepare_app", "prepare_known_tasks", "prepare_task"]


def is_builtin(name: str | None) -> bool:
    """Whether ``name`` is one of Celery's own tasks (``celery.*``), which stay untouched."""
    return not name or name.startswith("celery.")


def prepare_app(app: Any) -> None:
    """Make every non-built-in, non-opted-out task of the (finalized) ``app`` durable."""
    for name, task in list(app.tasks.items()):
        if not is_builtin(name):
            prepare_task(task, app)


def prepare_task(task: Any, app: Any) -> None:
    """Mix [`DurableTask`][celery_ext.DurableTask] into ``task``'s class unless it is there or ``durable=False``."""
    if isinstance(task, DurableTask) or getattr(task, "durable", True) is False:
        return
    original = type(task)
    kept = {a: getattr(original, a) for a in _DURABLE_OPTIONS if hasattr(original, a)}  # the task's own options
    durable = type(original.__name__, (DurableTask, original), {"__module__": original.__module__, **kept})
    durable.__qualname__ = original.__qualname__
    durable._flexiq_explicit = frozenset(  # type: ignore[attr-defined]  # a DurableTask subclass
        a for a in ACK_DEFAULTS if _explicit(original, a, app.conf.get(f"task_{a}"))
    )
    task.__class__ = durable
    if getattr(task, "durable", None) is True:
        acknowledge_late(task)


def acknowledge_late(task: Any) -> None:
    """Turn ``acks_late`` and ``reject_on_worker_lost`` on for a durable task unless it set them itself (C26).

    For a task declared ``durable=True`` (when it is made durable) and, when
    a worker starts, for each task known to take steps (C43,
    `prepare_known_tasks`). Celery's worker reads ``acks_late`` once per task
    when its consumer starts (``create_request_cls`` keeps it for the success
    path), so a task learned while a worker runs is acknowledged late from
    that worker's next start; changing it under a running consumer would
    acknowledge its successes twice or never.
    """
    explicit: frozenset[str] = getattr(type(task), "_flexiq_explicit", frozenset())
    for attr in ACK_DEFAULTS:
        if attr not in explicit:
            setattr(type(task), attr, True)


def prepare_known_tasks(app: Any, known: Collection[tuple[str, str]]) -> list[str]:
    """At a worker's start: acknowledge late each task of ``app`` known to take steps (C26, C43); return their names.

    Parameters:
      app (celery.Celery): the worker's app, its tasks already made durable.
      known (Collection[tuple[str, str]]): the known tasks, ``(framework, name)``.
    """
    made = []
    for name, task in list(app.tasks.items()):
        if isinstance(task, DurableTask) and task.durable is None and ("celery", name) in known:
            acknowledge_late(task)
            made.append(name)
    return made


def _explicit(cls: type, attr: str, configured: object) -> bool:
    """Whether the task class set ``attr`` itself (C26: the user's choice wins).

    A class Celery already bound holds the app's setting in its own
    ``__dict__``; there, only a value different from the setting is known to be
    the user's.
    """
    for klass in cls.__mro__:
        if klass is Task or klass is object:
            return False
        value = klass.__dict__.get(attr)
        if value is None:
            continue
        if klass.__dict__.get("__bound__"):
            return bool(value != configured)
        return True
    return False
