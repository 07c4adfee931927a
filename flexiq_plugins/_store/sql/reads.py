"""The SQL store's reads both sides make: the database's clock, a run, its step rows, a receivable event.

`StoreReads` on SQL, and the one query an
attempt's wait (`poll_event`)
and recovery (`next_event`)
share: the first event a run can receive (C33).
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..._model.records import EventRecord, KnownTask, RunRecord, StepRow
from ...errors import UnknownRun
from ..reads import StoreReads
from .connections import SqlConnections
from .mapping import event_record, run_record, step_row

__all__ = ["SqlReads"]


class SqlReads(SqlConnections, StoreReads):
    """The reads of `StoreReads`, each in one read-only transaction."""

    def now(self) -> float:
        """Return the database's clock, epoch seconds (C23).

        Raises:
          StoreUnavailable: the database cannot be reached.
        """
        return self._read(self._now)

    def get_run(self, run_key: str) -> RunRecord:
        """Return one run.

        Raises:
          UnknownRun: no run has ``run_key``.
          StoreUnavailable: the database cannot be reached.
        """
        runs = self._t.runs
        row = self._read(lambda conn: conn.execute(sa.select(runs).where(runs.c.run_key == run_key)).first())
        if row is None:
            raise UnknownRun(f"no run has the run key {run_key!r}")
        return run_record(row)

    def get_steps(self, run_key: str) -> list[StepRow]:
        """Return the run's step rows ordered by position (empty if none).

        Raises:
          StoreUnavailable: the database cannot be reached.
        """
        return self._read(lambda conn: self._steps_of(conn, run_key))

    def durable_tasks(self) -> list[KnownTask]:
        """Return the tasks known to take steps, ordered by framework and name (C43): one read.

        Raises:
          StoreUnavailable: the database cannot be reached.
        """
        tasks = self._t.tasks
        query = sa.select(tasks).order_by(tasks.c.framework, tasks.c.task_name)
        rows = self._read(lambda conn: conn.execute(query).all())
        return [KnownTask(r.task_name, r.framework, float(r.first_seen)) for r in rows]

    def _steps_of(self, conn: Connection, run_key: str) -> list[StepRow]:
        steps = self._t.steps
        rows = conn.execute(sa.select(steps).where(steps.c.run_key == run_key).order_by(steps.c.position))
        return [step_row(r) for r in rows]

    def _next_event(
        self, conn: Connection, run_key: str, created_at: float, topic: str, key: str
    ) -> EventRecord | None:
        """The first event ``run_key``, created at ``created_at``, can receive on ``(topic, key)`` (C33)."""
        events, steps = self._t.events, self._t.steps
        received = sa.select(steps.c.event_id).where(steps.c.run_key == run_key, steps.c.event_id == events.c.id)
        sent_to_it = sa.or_(
            events.c.run_key == run_key, sa.and_(events.c.run_key.is_(None), events.c.created_at >= created_at)
        )
        query = (
            sa.select(events)
            .where(events.c.topic == topic, events.c.event_key == key, sent_to_it, ~sa.exists(received))
            .order_by(events.c.id)
            .limit(1)
        )
        row = conn.execute(query).first()
        return None if row is None else event_record(row)
