"""Which tasks take steps: learned from their first step, read back by producers and workers (C43).

A task or actor that never takes a step is not touched by the integration:
its jobs are not recorded at publish, claim nothing at the worker and, on
Celery, keep the acknowledgement they would have without it. The library
learns which tasks do take steps: the first attempt of a task whose body
takes one notes its name in the store
([`note_durable_task`][flexiq_plugins.StepStore.note_durable_task], an
insert-if-absent), once per process; producers and workers read the noted
names back ([`durable_tasks`][flexiq_plugins.StepStore.durable_tasks]) and
keep them, reading again at most every ``known_tasks_refresh_seconds``
(default 30 s). A task declared ``durable=True`` is known from the start
without a read; ``durable=False`` opts out as before.

`KnownTasks` is one process's view, held by its
[`AttemptDriver`][flexiq_plugins.integration.AttemptDriver] (one per process and
store): the attempt layer notes a task as it takes its first step, the
delivery layer asks it at publish (C39). It lives here, beside the attempt,
because noting is the attempt's doing; reading is a plain store read either
side can make.

A store that cannot be reached does not fail anything: a read that fails
keeps what was known and is tried again after the interval; a note that
fails is tried again at the task's next step. Until a task is known its jobs
are claimed at their first step (C23), so none of its committed steps is
ever lost: a job whose worker dies after a step is recovered from its claim
(C35); only a message the broker loses before any step ran goes unrecovered,
as without the integration.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from .._store.attempt_side import AttemptStore
from ..errors import FlexiqError

__all__ = ["KnownTasks"]

logger = logging.getLogger("flexiq_plugins")

TaskId = tuple[str, str]
"""``(framework, task name)``."""


class KnownTasks:
    """One process's view of the tasks known to take steps (C43).

    Parameters:
      store (AttemptStore): where the known tasks are noted and read.
      refresh_seconds (float): the longest time between two reads of the store
        (``known_tasks_refresh_seconds``).
      clock (Callable[[], float]): a monotonic clock, seconds (tests pass their own).
    """

    def __init__(
        self, store: AttemptStore, refresh_seconds: float, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._store = store
        self._refresh_seconds = refresh_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._known: frozenset[TaskId] = frozenset()
        self._due: float | None = None  # the first question reads the store

    def is_known(self, framework: str, name: str) -> bool:
        """Whether the task ``name`` of ``framework`` is known to take steps.

        A task this process knows is answered from memory; otherwise the store
        is read if the last read is older than the refresh interval (one read
        for all the tasks asked about meanwhile), else the answer is ``False``.
        """
        task = (framework, name)
        if task in self._known:
            return True
        due = self._due
        if due is None or self._clock() >= due:
            self.refresh()
        return task in self._known

    def refresh(self, *, force: bool = False) -> frozenset[TaskId]:
        """Read the known tasks from the store now if the interval has passed (or ``force``); return them all.

        A store error keeps what was known; the next read comes after the interval.
        """
        with self._lock:
            now = self._clock()
            if not force and self._due is not None and now < self._due:
                return self._known  # another thread has just read it
            self._due = now + self._refresh_seconds
            try:
                read = self._store.durable_tasks()
            except FlexiqError as exc:
                logger.debug(
                    "the known durable tasks could not be read (%s); read again in %g s", exc, self._refresh_seconds
                )
                return self._known
            self._known = self._known | {(t.framework, t.name) for t in read}
            return self._known

    def took_step(self, framework: str, name: str) -> None:
        """The task ``name`` of ``framework`` took a step: note it in the store unless this process knows it.

        One insert-if-absent statement the first time in a process, nothing
        after that. A store error is logged at DEBUG and the note is tried
        again at the task's next step (its run is claimed either way).
        """
        task = (framework, name)
        if task in self._known:
            return
        try:
            self._store.note_durable_task(name, framework)
        except FlexiqError as exc:
            logger.debug("task %s (%s) took a step but could not be noted as durable: %s", name, framework, exc)
            return
        with self._lock:
            self._known = self._known | {task}
