"""The tasks known to take steps, as an operator lists them (``flexiq tasks``, C43)."""

from __future__ import annotations

from .._model.records import KnownTask
from .._store.operator_side import OperatorStore

__all__ = ["known_tasks"]


def known_tasks(store: OperatorStore, *, framework: str | None = None) -> list[KnownTask]:
    """The tasks and actors known to take steps, ordered by framework and name (C43).

    A task is known once one of its attempts took a step (its name is noted
    in the store then, once); from then on its new jobs are recorded at
    publish (C39) and, on Celery, acknowledged late from a worker's next start
    (C26). A task declared ``durable=True`` is treated so from the start,
    and listed here once it has taken a step. Every other task is not touched
    by the integration.

    Parameters:
      store (OperatorStore): the step store.
      framework (str | None): only this framework's (``"celery"``, ``"dramatiq"``).

    Returns:
      list[KnownTask]: each task's name, framework and when it first took a step.

    Raises:
      StoreUnavailable: the store cannot be reached.
    """
    tasks = store.durable_tasks()
    return tasks if framework is None else [t for t in tasks if t.framework == framework]
