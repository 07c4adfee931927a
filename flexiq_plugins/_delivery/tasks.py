"""Task bodies without a worker: a task or actor turned into its plain function, and an app's tasks by name.

What [`flexiq_plugins.testing`][flexiq_plugins.testing] runs a body with, and what the deploy check
([`check_runs`][flexiq_plugins.operations.check_runs]) finds each run's new body in. The core names no
framework: a Celery task, a Dramatiq actor, an app or a broker is handed to the installed adapters
([`task_body`][flexiq_plugins.integration.Adapter.task_body], [`tasks`][flexiq_plugins.integration.Adapter.tasks]).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigurationError
from .registry import all_adapters

__all__ = ["TaskTable", "task_body", "task_table"]


def task_body(task: Callable[..., Any]) -> Callable[..., Any]:
    """The plain function of ``task``: a Celery task's ``run``, a Dramatiq actor's own function.

    A plain function is returned as it is. Other objects are offered to the
    installed adapters.
    """
    if inspect.isfunction(task) or inspect.ismethod(task):
        return task
    for adapter in all_adapters():
        body = adapter.task_body(task)
        if body is not None:
            return body
    return task


@dataclass(frozen=True)
class TaskTable:
    """The task bodies a check runs, by task name.

    Parameters:
      bodies (Mapping[str, Callable[..., Any]]): each task's plain function.
      framework (str | None): the framework of the app or broker they came from; ``None`` for a mapping.
      target (object | None): that app or broker.
    """

    bodies: Mapping[str, Callable[..., Any]]
    framework: str | None = None
    target: object | None = None


def task_table(tasks: object) -> TaskTable:
    """The bodies of ``tasks``: an app or broker (through the adapter that owns it), or a mapping of names to tasks.

    Parameters:
      tasks (object): a Celery app, a Dramatiq broker, or a mapping of task name to a task, an actor or
        a plain function.

    Raises:
      ConfigurationError: ``tasks`` is none of these.
    """
    if isinstance(tasks, Mapping):
        return TaskTable({str(name): task_body(task) for name, task in tasks.items()})
    for adapter in all_adapters():
        if adapter.owns(tasks):
            found = adapter.tasks(tasks)
            return TaskTable({name: task_body(task) for name, task in found.items()}, adapter.framework, tasks)  # type: ignore[arg-type]
    raise ConfigurationError(
        f"{tasks!r} is not an app or broker of an installed integration, nor a mapping of task names to tasks"
    )
