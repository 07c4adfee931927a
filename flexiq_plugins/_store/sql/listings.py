"""The SQL store's listings for an operator's window: keyset pages and capped counts (C52).

What `OperatorStore` declares under "the operator's window", on SQL. Each
query is shaped so its cost does not grow with the history:

- **Keyset pages.** A page is ``ORDER BY <value>, run_key LIMIT n`` continued
  with ``value <= v AND (value < v OR run_key < k)`` after the previous page's
  last run: the first condition bounds the index range, the second breaks
  ties, so a later page costs what the first does (no ``OFFSET``). The runs
  indexes of migration 0008 end with ``run_key`` for exactly this; a sleeping
  run's wake time has a partial index (migration 0009).
- **Capped counts.** A group's count reads at most ``cap + 1`` index entries
  (``SELECT count(*) FROM (SELECT … LIMIT cap + 1)``), never a full
  ``COUNT(*)`` of a million runs. The groups themselves (statuses, task
  names) are found by a *loose index scan*: a recursive query that jumps from
  one distinct value to the next through the index (PostgreSQL and SQLite
  have no such plan of their own; MySQL and MariaDB do, for ``DISTINCT``).
- **Events and their receivers** are joined through the partial index on the
  step rows' ``event_id`` (migration 0009).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..._model.listings import ListedEvent, RunCursor, RunFilter, RunGroup, RunOrder, SweepLease
from ..._model.records import DeadLetterRecord, RunRecord
from .mapping import dead_letter_record, event_record, run_record
from .reads import SqlReads

__all__ = ["SqlListings"]

_LOOSE_SCAN_BUILTIN = frozenset({"mysql", "mariadb"})


class SqlListings(SqlReads):
    """The operator's window of `OperatorStore` on SQL: each method one read-only transaction."""

    def count_runs(self, *, by: RunGroup, cap: int, max_groups: int = 50) -> dict[str, int]:
        """Count runs per status or task name, each count capped at ``cap + 1`` (see `OperatorStore.count_runs`).

        Raises:
          StoreUnavailable: the database cannot be reached.
        """
        runs = self._t.runs
        column = runs.c.status if by == "status" else runs.c.task_name

        def work(conn: Connection) -> dict[str, int]:
            groups = _distinct(conn, column, max_groups)
            if not groups:
                return {}
            counts = [
                sa.select(sa.func.count())
                .select_from(sa.select(runs.c.run_key).where(column == value).limit(cap + 1).subquery())
                .scalar_subquery()
                .label(f"n{i}")
                for i, value in enumerate(groups)
            ]
            row = conn.execute(sa.select(*counts)).one()
            return {value: int(row[i]) for i, value in enumerate(groups) if row[i]}

        return self._read(work)

    def find_runs(
        self, where: RunFilter, *, order: RunOrder = "updated_desc", after: RunCursor | None = None, limit: int = 50
    ) -> list[RunRecord]:
        """One keyset page of the runs ``where`` selects (see `OperatorStore.find_runs`).

        Raises:
          StoreUnavailable: the database cannot be reached.
        """
        runs = self._t.runs
        value = runs.c.wake_at if order == "wake_asc" else runs.c.updated_at
        query = sa.select(runs).where(*self._run_conditions(where))
        if order == "wake_asc":
            query = query.where(runs.c.wake_at.is_not(None))
        if order == "updated_desc":
            if after is not None:
                query = query.where(value <= after.value, sa.or_(value < after.value, runs.c.run_key < after.run_key))
            query = query.order_by(value.desc(), runs.c.run_key.desc())
        else:
            if after is not None:
                query = query.where(value >= after.value, sa.or_(value > after.value, runs.c.run_key > after.run_key))
            query = query.order_by(value.asc(), runs.c.run_key.asc())
        rows = self._read(lambda conn: conn.execute(query.limit(limit)).all())
        return [run_record(r) for r in rows]

    def _run_conditions(self, where: RunFilter) -> list[Any]:
        c = self._t.runs.c
        equal = [
            (c.status, where.status),
            (c.task_name, where.task_name),
            (c.framework, where.framework),
            (c.queue, where.queue),
        ]
        conditions: list[Any] = [column == value for column, value in equal if value is not None]
        if where.updated_since is not None:
            conditions.append(c.updated_at >= where.updated_since)
        if where.updated_until is not None:
            conditions.append(c.updated_at < where.updated_until)
        if where.wake_before is not None:
            conditions.append(c.wake_at < where.wake_before)
        return conditions

    def find_dead_letters(
        self,
        *,
        before_id: int | None = None,
        limit: int = 50,
        task_name: str | None = None,
        reason: str | None = None,
        run_key: str | None = None,
        retried: bool | None = None,
    ) -> list[DeadLetterRecord]:
        """One keyset page of dead letters, newest first (see `OperatorStore.find_dead_letters`).

        Raises:
          StoreUnavailable: the database cannot be reached.
        """
        dead = self._t.dead
        query = sa.select(dead).order_by(dead.c.id.desc()).limit(limit)
        for column, value in ((dead.c.task_name, task_name), (dead.c.reason, reason), (dead.c.run_key, run_key)):
            if value is not None:
                query = query.where(column == value)
        if before_id is not None:
            query = query.where(dead.c.id < before_id)
        if retried is not None:
            query = query.where(dead.c.retried_at.is_not(None) if retried else dead.c.retried_at.is_(None))
        rows = self._read(lambda conn: conn.execute(query).all())
        return [dead_letter_record(r) for r in rows]

    def count_dead_letters(self, *, since: float, cap: int) -> dict[str, int]:
        """Dead letters created at or after ``since`` per reason, the newest ``cap + 1`` at most.

        Raises:
          StoreUnavailable: the database cannot be reached.
        """
        dead = self._t.dead
        recent = (
            sa.select(dead.c.reason)
            .where(dead.c.created_at >= since)
            .order_by(dead.c.created_at.desc())
            .limit(cap + 1)
            .subquery()
        )
        query = sa.select(recent.c.reason, sa.func.count()).group_by(recent.c.reason)
        return {reason: int(n) for reason, n in self._read(lambda conn: conn.execute(query).all())}

    def find_events(
        self,
        *,
        ids: Sequence[int] | None = None,
        before_id: int | None = None,
        limit: int = 50,
        received: bool | None = None,
    ) -> list[ListedEvent]:
        """One keyset page of events, newest first, with the runs that received each (see
        `OperatorStore.find_events`).

        Raises:
          StoreUnavailable: the database cannot be reached.
        """
        events, steps = self._t.events, self._t.steps
        if ids is not None and not ids:
            return []
        query = sa.select(events).order_by(events.c.id.desc()).limit(limit)
        if ids is not None:
            query = query.where(events.c.id.in_(sorted(set(ids))))
        if before_id is not None:
            query = query.where(events.c.id < before_id)
        if received is not None:
            taken = sa.exists(sa.select(steps.c.event_id).where(steps.c.event_id == events.c.id))
            query = query.where(taken if received else ~taken)

        def work(conn: Connection) -> list[ListedEvent]:
            found = [event_record(r) for r in conn.execute(query)]
            receivers: dict[int, list[str]] = {}
            if found:
                pairs = sa.select(steps.c.event_id, steps.c.run_key).where(steps.c.event_id.in_([e.id for e in found]))
                for event_id, run_key in conn.execute(pairs):
                    receivers.setdefault(int(event_id), []).append(run_key)
            return [ListedEvent(e, tuple(sorted(receivers.get(e.id, ())))) for e in found]

        return self._read(work)

    def sweep_leases(self) -> list[SweepLease]:
        """The recovery leases by name, with when each was last taken or renewed (C39).

        Raises:
          StoreUnavailable: the database cannot be reached.
        """
        sweep = self._t.sweep
        rows = self._read(lambda conn: conn.execute(sa.select(sweep).order_by(sweep.c.name)).all())
        return [SweepLease(r.name, r.owner, r.lease_until, r.swept_at) for r in rows]


def _distinct(conn: Connection, column: sa.Column[Any], limit: int) -> list[str]:
    """The first ``limit`` distinct values of an indexed column, in order, by a loose index scan."""
    if conn.dialect.name in _LOOSE_SCAN_BUILTIN:
        return [v for (v,) in conn.execute(sa.select(column).distinct().order_by(column).limit(limit))]
    inner = column.table.alias("later")
    later = inner.c[column.name]
    seed = sa.select(sa.func.min(column).label("v")).cte("found", recursive=True)
    step = sa.select(sa.select(sa.func.min(later)).where(later > seed.c.v).scalar_subquery()).where(
        seed.c.v.is_not(None)
    )
    found = seed.union_all(step)
    query = sa.select(found.c.v).where(found.c.v.is_not(None)).limit(limit)
    return [v for (v,) in conn.execute(query)]
