"""The SQL store's operator side: listing, repairing, recovering and events.

`OperatorStore` on SQL: reads for
operators, the retry and purge of dead letters, cleanup, the recovery sweep's
lease and its compare-and-set on a stranded run (C35, C39), and the events
senders store (C33). The listings of an operator's window (keyset pages,
capped counts, C52) are in `listings`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..._model.records import (
    CLEANABLE_STATUSES,
    DeadLetterRecord,
    EventRecord,
    RunRecord,
    SentEvent,
    StepAttempt,
    StepRow,
)
from ...errors import InvalidRunKey, UnknownDeadLetter, UnknownRun
from ..claims import may_recover, may_take_sweep_lease, reported_status
from ..events import WAITER_STATUSES
from ..forks import fork_position
from ..operator_side import OperatorStore
from ..step_attempts import retry_cut_position
from .listings import SqlListings
from .mapping import dead_letter_record, run_record, step_attempt, step_row, step_values

__all__ = ["SqlOperatorSide"]

_KEYS_PER_QUERY = 500
"""Run keys in one ``IN (...)`` of `SqlOperatorSide.get_steps_of` (well under every database's parameter limit)."""


class SqlOperatorSide(SqlListings, OperatorStore):
    """The methods of `OperatorStore` on SQL."""

    # ------------------------------------------------- runs and step attempts
    def list_runs(
        self,
        *,
        status: str | None = None,
        task_name: str | None = None,
        since: float | None = None,
        limit: int = 100,
        job_id: str | None = None,
    ) -> list[RunRecord]:
        """Return runs, newest ``updated_at`` first.

        Parameters:
          status (str | None): only runs in this status.
          task_name (str | None): only runs of this task or actor.
          since (float | None): only runs updated at or after this time, epoch seconds.
          limit (int): at most this many runs.
          job_id (str | None): only the run whose current job (task or message id) is this one;
            not indexed, for an operator's lookup.

        Raises:
          StoreUnavailable: the database cannot be reached.
        """
        runs = self._t.runs
        query = sa.select(runs).order_by(runs.c.updated_at.desc(), runs.c.run_key.desc()).limit(limit)
        if status is not None:
            query = query.where(runs.c.status == status)
        if task_name is not None:
            query = query.where(runs.c.task_name == task_name)
        if since is not None:
            query = query.where(runs.c.updated_at >= since)
        if job_id is not None:
            query = query.where(runs.c.job_id == job_id)
        rows = self._read(lambda conn: conn.execute(query).all())
        return [run_record(r) for r in rows]

    def count_statuses(self, statuses: Collection[str]) -> dict[str, int]:
        """How many runs are in each of ``statuses``: one ``GROUP BY`` on the status index (C53).

        Raises:
          StoreUnavailable: the database cannot be reached.
        """
        runs = self._t.runs
        wanted = sorted(set(statuses))
        query = sa.select(runs.c.status, sa.func.count()).where(runs.c.status.in_(wanted)).group_by(runs.c.status)
        rows = self._read(lambda conn: conn.execute(query).all())
        counted = {str(status): int(count) for status, count in rows}
        return {status: counted.get(status, 0) for status in statuses}

    def get_steps_of(self, run_keys: Sequence[str]) -> dict[str, list[StepRow]]:
        """Return the step rows of each of ``run_keys`` by position, reading up to 500 runs a query (C48).

        Raises:
          StoreUnavailable: the database cannot be reached.
        """
        steps = self._t.steps
        keys = list(dict.fromkeys(run_keys))
        found: dict[str, list[StepRow]] = {key: [] for key in keys}

        def read(conn: Connection) -> None:
            for start in range(0, len(keys), _KEYS_PER_QUERY):
                chunk = keys[start : start + _KEYS_PER_QUERY]
                query = sa.select(steps).where(steps.c.run_key.in_(chunk)).order_by(steps.c.run_key, steps.c.position)
                for row in conn.execute(query):
                    found[row.run_key].append(step_row(row))

        self._read(read)
        return found

    def get_step_attempts(self, run_key: str) -> list[StepAttempt]:
        """Return the run's step attempts, ordered by ``started_at``, step key and number (C31).

        Raises:
          StoreUnavailable: the database cannot be reached.
        """
        attempts = self._t.attempts
        query = (
            sa.select(attempts)
            .where(attempts.c.run_key == run_key)
            .order_by(attempts.c.started_at, attempts.c.step_key, attempts.c.number)
        )
        return [step_attempt(r) for r in self._read(lambda conn: conn.execute(query).all())]

    # ---------------------------------------------------------- dead letters
    def list_dead_letters(
        self, *, task_name: str | None = None, include_retried: bool = False
    ) -> list[DeadLetterRecord]:
        """Return dead letters, oldest first (C30).

        Parameters:
          task_name (str | None): only dead letters of this task or actor.
          include_retried (bool): include those already retried.

        Raises:
          StoreUnavailable: the database cannot be reached.
        """
        dead = self._t.dead
        query = sa.select(dead).order_by(dead.c.id)
        if task_name is not None:
            query = query.where(dead.c.task_name == task_name)
        if not include_retried:
            query = query.where(dead.c.retried_at.is_(None))
        rows = self._read(lambda conn: conn.execute(query).all())
        return [dead_letter_record(r) for r in rows]

    def get_dead_letter(self, dead_letter_id: int) -> DeadLetterRecord:
        """Return one dead letter.

        Raises:
          UnknownDeadLetter: no dead letter has ``dead_letter_id``.
          StoreUnavailable: the database cannot be reached.
        """
        return self._read(lambda conn: self._dead_letter(conn, dead_letter_id))

    def _dead_letter(self, conn: Connection, dead_letter_id: int) -> DeadLetterRecord:
        dead = self._t.dead
        row = conn.execute(sa.select(dead).where(dead.c.id == dead_letter_id)).first()
        if row is None:
            raise UnknownDeadLetter(f"no dead letter has the id {dead_letter_id!r}")
        return dead_letter_record(row)

    def prepare_retry(self, dead_letter_id: int, *, reset_from: str | None = None) -> DeadLetterRecord:
        """Make a dead-lettered run runnable again, keeping its run key (C11, C30).

        One transaction: the run becomes ``pending`` with its claim and
        takeovers cleared; with ``reset_from`` that step and every later one
        are deleted, without it the last step that failed for good and every
        later one (C31), each with its step attempts; the dead letter's
        ``retried_at`` is set.

        Parameters:
          dead_letter_id (int): the dead letter.
          reset_from (str | None): the step key to replay from.

        Returns:
          DeadLetterRecord: the dead letter with ``retried_at`` set.

        Raises:
          UnknownDeadLetter: no such dead letter.
          UnknownRun: its run is gone, or it has no step ``reset_from``.
          StoreUnavailable: the database cannot be reached.
        """
        return self._write(lambda conn: self._prepare_retry(conn, dead_letter_id, reset_from))

    def _prepare_retry(self, conn: Connection, dead_letter_id: int, reset_from: str | None) -> DeadLetterRecord:
        runs, dead_t = self._t.runs, self._t.dead
        dead = self._dead_letter(conn, dead_letter_id)
        key = dead.run_key
        if conn.execute(sa.select(runs.c.run_key).where(runs.c.run_key == key).with_for_update()).first() is None:
            raise UnknownRun(f"no run has the run key {key!r}")
        kept = self._cut_steps(conn, key, reset_from)
        now = self._now(conn)
        conn.execute(
            sa.update(runs)
            .where(runs.c.run_key == key)
            .values(
                status="pending",
                owner=None,
                lease_until=None,
                takeovers=0,
                step_count=len(kept),
                step_bytes=sum(int(r.size) for r in kept),
                updated_at=now,
            )
        )
        conn.execute(sa.update(dead_t).where(dead_t.c.id == dead_letter_id).values(retried_at=now))
        return dataclasses.replace(dead, retried_at=now)

    def _cut_steps(self, conn: Connection, run_key: str, reset_from: str | None) -> list[Any]:
        """Delete the steps (and their attempts) a retry runs again; return the kept rows with their sizes."""
        steps, attempts = self._t.steps, self._t.attempts
        size = sa.func.coalesce(sa.func.length(steps.c.value), 0).label("size")
        columns = (steps.c.position, steps.c.step_key, steps.c.kind, steps.c.failure, size)
        rows = conn.execute(sa.select(*columns).where(steps.c.run_key == run_key).order_by(steps.c.position)).all()
        cut = retry_cut_position(rows, reset_from, run_key)
        if cut is None:
            return list(rows)
        dropped = [r.step_key for r in rows if r.position >= cut]
        conn.execute(sa.delete(steps).where(steps.c.run_key == run_key, steps.c.position >= cut))
        if dropped:
            conn.execute(sa.delete(attempts).where(attempts.c.run_key == run_key, attempts.c.step_key.in_(dropped)))
        return [r for r in rows if r.position < cut]

    # ----------------------------------------------------------------- forks
    def fork_run(self, run_key: str, from_step: str, new_run_key: str) -> RunRecord:
        """Make a new ``queued`` run from the steps ``run_key`` recorded before ``from_step`` (C50).

        One transaction: read the run and its steps, decide the cut with
        `fork_position`, insert the new run (the old one's envelope text,
        due now) and the copied step rows. See `OperatorStore.fork_run`.

        Raises:
          UnknownRun: no run has ``run_key``.
          UnknownStep: it has no step ``from_step``.
          InvalidForkStep: ``from_step`` is a step of another kind.
          InvalidRunKey: a run has ``new_run_key`` already.
          StoreUnavailable: the database cannot be reached.
        """
        return self._write(lambda conn: self._fork(conn, run_key, from_step, new_run_key))

    def _fork(self, conn: Connection, run_key: str, from_step: str, new_run_key: str) -> RunRecord:
        runs, steps = self._t.runs, self._t.steps
        old = conn.execute(sa.select(runs).where(runs.c.run_key == run_key)).first()
        if old is None:
            raise UnknownRun(f"no run has the run key {run_key!r}")
        if conn.execute(sa.select(runs.c.run_key).where(runs.c.run_key == new_run_key)).first() is not None:
            raise InvalidRunKey(f"a run with the key {new_run_key!r} exists already; a fork needs a new one")
        rows = self._steps_of(conn, run_key)
        cut = fork_position(rows, from_step, run_key)
        copied = [r for r in rows if r.position < cut]
        now = self._now(conn)
        values = {
            "run_key": new_run_key,
            "task_name": old.task_name,
            "framework": old.framework,
            "queue": old.queue,
            "status": "queued",
            "job_id": None,
            "wake_at": now,
            "attempt": 0,
            "takeovers": 0,
            "envelope": old.envelope,
            "step_count": len(copied),
            "step_bytes": sum(r.size for r in copied),
            "created_at": now,
            "updated_at": now,
        }
        conn.execute(sa.insert(runs).values(**values))
        if copied:
            conn.execute(sa.insert(steps), [{"run_key": new_run_key, **step_values(r)} for r in copied])
        forked = conn.execute(sa.select(runs).where(runs.c.run_key == new_run_key)).one()
        return run_record(forked)

    def purge_dead_letters(self, ids: Sequence[int] | None = None) -> int:
        """Delete the given dead letters, all when ``ids`` is ``None`` (C30).

        Returns:
          int: how many were deleted.

        Raises:
          StoreUnavailable: the database cannot be reached.
        """
        dead = self._t.dead
        if ids is not None and not ids:
            return 0
        query = sa.delete(dead)
        if ids is not None:
            query = query.where(dead.c.id.in_(sorted(set(ids))))
        return self._write(lambda conn: conn.execute(query).rowcount)

    # --------------------------------------------------------------- cleanup
    def cleanup(self, *, older_than: float) -> int:
        """Delete finished runs (and their steps and step attempts) updated before ``older_than``.

        Succeeded, failed, cancelled and compensated runs go; a dead-lettered
        run is kept while a dead letter names it, so a retry can replay it
        (C27), and goes once its dead letters were purged (C30).

        Parameters:
          older_than (float): epoch seconds, database clock.

        Returns:
          int: how many runs were deleted.

        Raises:
          StoreUnavailable: the database cannot be reached.
        """
        runs, steps, attempts, dead = self._t.runs, self._t.steps, self._t.attempts, self._t.dead
        purged = sa.and_(runs.c.status == "dead", ~sa.exists().where(dead.c.run_key == runs.c.run_key))
        doomed = sa.and_(sa.or_(runs.c.status.in_(sorted(CLEANABLE_STATUSES)), purged), runs.c.updated_at < older_than)

        def work(conn: Connection) -> int:
            for table in (steps, attempts):
                conn.execute(sa.delete(table).where(table.c.run_key.in_(sa.select(runs.c.run_key).where(doomed))))
            return conn.execute(sa.delete(runs).where(doomed)).rowcount

        return self._write(work)

    def cleanup_events(self, *, older_than: float) -> int:
        """Delete the events sent before ``older_than`` (epoch seconds, database clock); return how many (C33).

        Raises:
          StoreUnavailable: the database cannot be reached.
        """
        events = self._t.events
        return self._write(
            lambda conn: conn.execute(sa.delete(events).where(events.c.created_at < older_than)).rowcount
        )

    # -------------------------------------------------------------- recovery
    def acquire_sweep_lease(self, owner: str, lease_seconds: float, *, name: str = "recovery") -> bool:
        """Take or renew the recovery lease on the database's clock (C39); see `StepStore.acquire_sweep_lease`.

        One transaction: insert the lease row if absent, lock it, decide with
        `may_take_sweep_lease`, write.

        Raises:
          StoreUnavailable: the database cannot be reached.
        """
        sweep = self._t.sweep

        def work(conn: Connection) -> bool:
            conn.execute(self._insert_if_absent(sweep, {"name": name}, "name"))
            row = conn.execute(sa.select(sweep).where(sweep.c.name == name).with_for_update()).one()
            now = self._now(conn)
            if not may_take_sweep_lease(row.owner, row.lease_until, owner=owner, now=now):
                return False
            values = {"owner": owner, "lease_until": now + lease_seconds, "swept_at": now}
            conn.execute(sa.update(sweep).where(sweep.c.name == name).values(**values))
            return True

        return self._write(work)

    def release_sweep_lease(self, owner: str, *, name: str = "recovery") -> None:
        """Give the recovery lease ``name`` up if ``owner`` holds it (C39).

        Raises:
          StoreUnavailable: the database cannot be reached.
        """
        sweep = self._t.sweep
        held = sa.and_(sweep.c.name == name, sweep.c.owner == owner)
        statement = sa.update(sweep).where(held).values(owner=None, lease_until=None)
        self._write(lambda conn: conn.execute(statement))

    def mark_recovered(self, run_key: str, *, status: str, updated_at: float) -> bool:
        """Claim a stranded run for recovery: a compare-and-set on its locked row (C35).

        One transaction: lock the run's row, read the database's clock, and
        set ``updated_at`` to it only if `may_recover`
        allows (``status`` and ``updated_at`` are the ones given and, for a
        ``running`` run, the lease has expired). A concurrent recoverer waits
        on the lock, then reads the new ``updated_at`` and loses.

        Parameters:
          run_key (str): the run.
          status (str): the status the caller read.
          updated_at (float): the ``updated_at`` the caller read, epoch seconds.

        Returns:
          bool: whether this caller won the run.

        Raises:
          StoreUnavailable: the database cannot be reached.
        """
        runs = self._t.runs

        def work(conn: Connection) -> bool:
            run = conn.execute(sa.select(runs).where(runs.c.run_key == run_key).with_for_update()).first()
            now = self._now(conn)
            if run is None or not may_recover(run, status=status, updated_at=updated_at, now=now):
                return False
            conn.execute(sa.update(runs).where(runs.c.run_key == run_key).values(updated_at=now, recovered_at=now))
            return True

        return self._write(work)

    def unmark_recovered(self, run_key: str, *, recovered_at: float | None) -> None:
        """Set the run's ``recovered_at`` back after a failed re-publish (C35); see `StepStore.unmark_recovered`.

        Raises:
          StoreUnavailable: the database cannot be reached.
        """
        runs = self._t.runs
        statement = sa.update(runs).where(runs.c.run_key == run_key).values(recovered_at=recovered_at)
        self._write(lambda conn: conn.execute(statement))

    def settle_reported(self, run_key: str, status: str) -> bool:
        """End a ``queued`` run whose job the framework reported finished (C47); see `StepStore.settle_reported`.

        Raises:
          ValueError: ``status`` is not ``succeeded``, ``failed`` or ``cancelled``.
          StoreUnavailable: the database cannot be reached.
        """
        settled = reported_status(status)
        runs = self._t.runs

        def work(conn: Connection) -> bool:
            cleared = {"owner": None, "lease_until": None, "wake_at": None, "outcome": None}
            statement = sa.update(runs).where(runs.c.run_key == run_key, runs.c.status == "queued")
            return conn.execute(statement.values(status=settled, updated_at=self._now(conn), **cleared)).rowcount == 1

        return self._write(work)

    # ---------------------------------------------------------------- events
    def add_event(self, topic: str, key: str, payload: bytes | None, *, run_key: str | None = None) -> SentEvent:
        """Store an event (committed first), then read the runs to wake for it (C33).

        Parameters:
          topic (str): the topic (at most 255 characters).
          key (str): the key (at most 255 characters).
          payload (bytes | None): the encoded payload.
          run_key (str | None): send it to this run only.

        Raises:
          StoreUnavailable: the database cannot be reached.
        """

        def insert(conn: Connection) -> EventRecord:
            now = self._now(conn)
            values = {"topic": topic, "event_key": key, "run_key": run_key, "payload": payload, "created_at": now}
            inserted = conn.execute(sa.insert(self._t.events).values(**values)).inserted_primary_key
            assert inserted is not None
            return EventRecord(int(inserted[0]), topic, key, run_key, payload, now)

        event = self._write(insert)
        return SentEvent(event, tuple(self._read(lambda conn: self._waiters(conn, event))))

    def _waiters(self, conn: Connection, event: EventRecord) -> list[RunRecord]:
        runs = self._t.runs
        query = sa.select(runs).where(
            runs.c.wait_topic == event.topic,
            runs.c.wait_key == event.key,
            runs.c.status.in_(WAITER_STATUSES),
            runs.c.run_key == event.run_key if event.run_key is not None else runs.c.created_at <= event.created_at,
        )
        return [run_record(r) for r in conn.execute(query.order_by(runs.c.run_key))]

    def next_event(self, run_key: str, topic: str, key: str) -> EventRecord | None:
        """The first event ``run_key`` can receive on ``(topic, key)``, or ``None`` (C33).

        Raises:
          StoreUnavailable: the database cannot be reached.
        """
        runs = self._t.runs

        def work(conn: Connection) -> EventRecord | None:
            run = conn.execute(sa.select(runs.c.created_at).where(runs.c.run_key == run_key)).first()
            return None if run is None else self._next_event(conn, run_key, run.created_at, topic, key)

        return self._read(work)
