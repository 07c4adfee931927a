"""The hot paths (a new step, an attempt's start and finish) folded into as few statements as each database allows.

Why it is built the way it is: a step's cost is its round trips. The rules
are the store's (`flexiq_plugins._store.claims`): every write is fenced
on the claim ``(run_key, owner, attempt)``, times are the database's clock
read after the run's row is locked (C23), and a fence that matches nothing
writes nothing (C25). Only how many statements carry them changes:

- **A new step** on PostgreSQL is *one* statement: a ``WITH`` whose first part
  is the fenced ``UPDATE`` of the run (it locks the row, stamps the clock and
  ``RETURNING`` the cancellation request) and whose second part ``INSERT …
  SELECT``\\ s the step row from it, so no row is inserted unless the fence
  held. SQLite (3.35 or later: ``RETURNING``) needs two statements, the fenced
  ``UPDATE … RETURNING`` and the ``INSERT``; MariaDB (no ``UPDATE …
  RETURNING``) two: the fenced ``UPDATE``, then an ``INSERT … SELECT`` of
  the step row with the stamp the ``UPDATE`` wrote, ``RETURNING`` it and the
  cancellation request (MariaDB 10.5 or later; MySQL, which has no
  ``RETURNING``, reads the stamp first: three).
- **Several new steps** (a step map's items that finished together, C51)
  cost what one does: the fenced ``UPDATE`` counts them all, and their rows
  go in one multi-row ``INSERT`` (PostgreSQL: the same ``WITH``, its ``INSERT
  … SELECT`` unnesting one array parameter per column).
- **An attempt start** is decided by `decide_claim` on the run as stored
  (on PostgreSQL, for the one case `grants_untaken` describes, by that rule
  written as the claim's condition); only how it is read and written differs.

  PostgreSQL: one autocommitted statement, two for a takeover. It is a
  ``WITH`` of the insert of the run already claimed (``ON CONFLICT DO
  NOTHING``), of the claim of a stored run that holds no claim (the one case
  `grants_untaken` describes, where `decide_claim`'s answer does not
  depend on the clock: an ``UPDATE`` whose condition is that rule), and of a
  read of any other stored run with the clock and the row's version
  (``xmin``). The claim applies only while the row is still the version the
  statement's own snapshot holds (``xmin`` compared with a subquery on that
  snapshot): a write by anyone in between (a step, a claim, a compensation's
  marker) makes it match nothing, so the steps it returns, read on the same
  snapshot, are all the run's committed steps. Why this matters: without that
  comparison PostgreSQL would re-check the condition on the newer row after
  waiting for its lock and claim it, while the steps were read before.
  Otherwise (a takeover of an expired lease, or a run the statement found
  changed) the granted claim is written by a compare-and-set on the version
  read, a ``WITH … UPDATE … WHERE xmin = …`` in front of the ``SELECT`` of
  the steps. Any write to the run in between, by anyone, makes it match
  nothing; every step commit writes the run's row, so a matched row also
  means the steps are those of the statement's snapshot. The decision is
  therefore exactly the one a transaction that held the row locked from the
  read to the write would have taken: the clock only moves on, so a lease
  expired at the read is still expired. The claim's ``updated_at`` and lease
  are the clock read once the row is locked (C23). Why not simply lock the
  row in a transaction: psycopg sends its ``BEGIN`` and ``COMMIT`` as round
  trips of their own, so a locked read and a write cost four. When the read
  saw no row (a concurrent first delivery's insert it could not see yet) or
  the compare-and-set matched nothing (someone else wrote the run first), the
  start is decided again in one transaction that locks the row first (the
  upsert ``ON CONFLICT DO UPDATE … RETURNING`` the row and the clock, then
  the claim and the snapshot in one ``WITH``), as it always was before.

  SQLite (3.35 or later: ``RETURNING``): one ``BEGIN IMMEDIATE`` transaction
  (the database's write lock comes first): the insert of the run already
  claimed, and, for a stored run, one read of it, the clock and its steps
  (a ``UNION ALL``: nothing repeated per step), then the claim's ``UPDATE``.
  Three statements, one for a new run. On pysqlite they, and a finish's,
  are sent straight to the driver (`driver`), built once.

  MySQL/MariaDB (no ``UPDATE … RETURNING``): one transaction of a locking
  read with the clock (``SELECT … FOR UPDATE``, which X-locks a stored run),
  the claim's ``UPDATE`` and the read of the steps (three statements and
  the ``COMMIT``). A run not stored yet is then inserted by an upsert and
  read again (five statements). Why not the compare-and-set of PostgreSQL
  or SQLite's one read of the run and its steps: measured with PyMySQL, a
  statement there costs its rows' decoding more than its round trip, and
  that ``UNION ALL`` read alone cost more than the two reads it replaces
  (a start was no faster, and a new run's slower).
- **A finish** stamps the clock inside its fenced ``UPDATE`` (no separate
  clock read), and a dead letter copies the run's task, envelope and that
  stamp with one ``INSERT … SELECT``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.engine import Connection

from ..._model.records import TERMINAL_STATUSES, Claim, JobEnvelope, NewDeadLetter, StepRow
from ..claims import Granted, already_committed, claim_lost, fence, fence_columns, one_already_committed
from .driver import DriverStatement, runs_on_driver
from .mapping import step_values
from .tables import StoreTables

__all__ = ["Folded", "InOne", "StepWritten", "postgresql_step_params"]

_SQLITE_RETURNING = sqlite3.sqlite_version_info >= (3, 35)
_ROWS_PER_INSERT = 50
"""Rows of one multi-row ``INSERT`` of `Folded.commit_steps` (eleven parameters each: below every driver's limit)."""


@dataclass(frozen=True)
class StepWritten:
    """A step committed by `Folded.commit_step`: the database's clock then, and a requested cancellation.

    Parameters:
      now (float): the run's new ``updated_at`` = the step's ``committed_at``, epoch seconds.
      cancel_reason (str | None): the run's requested cancellation, if any (C34).
    """

    now: float
    cancel_reason: str | None


def insert_if_absent(dialect: str, table: sa.Table, values: dict[str, Any], key: str | tuple[str, ...]) -> sa.Insert:
    """An insert of ``values`` into ``table`` that does nothing when the primary key ``key`` exists.

    Parameters:
      dialect (str): ``postgresql``, ``sqlite``, ``mysql`` or ``mariadb``.
      values (dict[str, Any]): column values, or bind parameters and SQL expressions.
      key (str | tuple[str, ...]): the primary key's columns.
    """
    keys = [key] if isinstance(key, str) else list(key)
    if dialect == "postgresql":
        return postgresql.insert(table).values(values).on_conflict_do_nothing(index_elements=keys)
    if dialect == "sqlite":
        return sqlite.insert(table).values(values).on_conflict_do_nothing(index_elements=keys)
    stmt = mysql.insert(table).values(values)
    # Unlike INSERT IGNORE, this X-locks an existing row: no S→X upgrade deadlock.
    return stmt.on_duplicate_key_update({keys[0]: stmt.inserted[keys[0]]})


def _p(name: str, column: sa.Column[Any] | None = None, prefix: str = "p_") -> sa.BindParameter[Any]:
    """A named parameter (prefixed: an ``UPDATE`` reserves its columns' own names)."""
    return sa.bindparam(f"{prefix}{name}", type_=None if column is None else column.type)


def _v(name: str, column: sa.Column[Any]) -> sa.BindParameter[Any]:
    """A parameter for the value an ``UPDATE`` sets (apart from the ``p_`` ones of its ``WHERE``)."""
    return _p(name, column, prefix="v_")


def postgresql_step_params(claim: Claim, row: StepRow) -> dict[str, Any]:
    """The parameters of PostgreSQL's one-statement step (`Folded.commit_step`): the fence and the step's columns.

    Built as one dictionary, by the statement's bind names: a new step's
    client CPU is mostly Python like this (see ``docs/performance.md``).
    """
    return {
        "p_run_key": claim.run_key,
        "p_owner": claim.owner,
        "p_attempt": claim.attempt,
        "p_size": row.size,
        "p_s_position": row.position,
        "p_s_step_key": row.step_key,
        "p_s_kind": row.kind,
        "p_s_value": row.value,
        "p_s_wake_at": row.wake_at,
        "p_s_failure": row.failure,
        "p_s_compensate": row.compensate,
        "p_s_event_id": row.event_id,
    }


class Folded:
    """The folded statements of one store's tables on one dialect, built once and executed with parameters.

    Statements are built here, not per call: SQLAlchemy then reuses their
    compiled form without even rebuilding their cache keys, which costs more
    than a local round trip (SQLite).

    Parameters:
      tables (StoreTables): the store's tables.
      clock (ColumnElement[float]): the database's clock, epoch seconds (C23).
      dialect (str): ``postgresql``, ``sqlite``, ``mysql`` or ``mariadb``.
    """

    def __init__(self, tables: StoreTables, clock: sa.ColumnElement[float], dialect: str) -> None:
        self._t = tables
        self._clock = clock
        self._dialect = dialect
        self._returning = dialect == "postgresql" or (dialect == "sqlite" and _SQLITE_RETURNING)
        runs, steps = tables.runs, tables.steps
        self._fence = [runs.c[name] == _p(name, runs.c[name]) for name in fence_columns()]
        self._counted = (
            sa.update(runs)
            .where(*self._fence)
            .values(
                step_count=runs.c.step_count + sa.literal_column("1", sa.Integer),  # in the text: nothing to bind
                step_bytes=runs.c.step_bytes + _p("size", runs.c.step_bytes),
                updated_at=clock,
            )
        )
        self._counted_returning = self._counted.returning(runs.c.updated_at, runs.c.cancel_reason)
        self._stamp = sa.select(runs.c.updated_at, runs.c.cancel_reason).where(runs.c.run_key == _p("run_key"))
        self._insert_step = sa.insert(steps)
        self._insert_stamped: sa.Insert | None = None
        self._on_driver: tuple[DriverStatement, DriverStatement] | None = None
        self._pg_on_driver: DriverStatement | None = None
        self._step_pg = self._step_statement_postgresql()
        self._snapshot = sa.select(steps).where(steps.c.run_key == _p("run_key")).order_by(steps.c.position)
        self._statements: dict[tuple[str, ...], sa.Executable] = {}
        self._lock_run: tuple[sa.Executable, sa.Executable | None] | None = None
        self._claim_new: sa.Executable | None = None
        self._in_one: tuple[sa.Executable, DriverStatement] | None = None
        self._finish_on_driver: dict[tuple[str, ...], Any] = {}
        self._driver_statements: dict[tuple[str, ...], DriverStatement] = {}
        self._dead = self._dead_letter_statement()

    def _params(self, claim: Claim, **more: Any) -> dict[str, Any]:
        return {**{f"p_{k}": v for k, v in fence(claim).items()}, **{f"p_{k}": v for k, v in more.items()}}

    # ------------------------------------------------------------ a new step
    def commit_step(self, conn: Connection, claim: Claim, row: StepRow) -> StepWritten:
        """Insert ``row`` and count it in the run, fenced on ``claim``, in the caller's transaction (C5, C9, C25).

        Raises:
          ClaimLost: the claim no longer holds the run, or the step key is
            already committed; nothing was written.
        """
        try:
            if self._dialect == "postgresql":
                written = self._step_postgresql(conn, claim, row)
            elif self._returning and runs_on_driver(conn):
                written = self._step_on_driver(conn, claim, row)
            elif self._returning:
                written = self._step_returning(conn, claim, row)
            else:
                written = self._step_plain(conn, claim, row)
        except sa_exc.IntegrityError as exc:
            raise already_committed(claim, row.step_key) from exc
        if written is None:
            raise claim_lost(claim)
        return written

    def _step_columns(self, claim: Claim, row: StepRow, now: float | None = None) -> dict[str, Any]:
        values = step_values(row)
        values.update(run_key=claim.run_key, attempt=claim.attempt, committed_at=now)
        return values

    def _step_statement_postgresql(self) -> sa.Select[Any]:
        steps = self._t.steps
        held = self._counted_returning.cte("held")
        names = [c.name for c in steps.c if c.name not in ("run_key", "attempt", "committed_at")]
        source = sa.select(
            _p("run_key", steps.c.run_key),
            _p("attempt", steps.c.attempt),
            held.c.updated_at,
            *(_p(f"s_{name}", steps.c[name]) for name in names),
        ).select_from(held)
        wrote = sa.insert(steps).from_select(["run_key", "attempt", "committed_at", *names], source).cte("wrote")
        return sa.select(held.c.updated_at, held.c.cancel_reason).add_cte(wrote)

    def _step_postgresql(self, conn: Connection, claim: Claim, row: StepRow) -> StepWritten | None:
        params = postgresql_step_params(claim, row)
        if runs_on_driver(conn):  # psycopg: straight to the driver (.driver)
            if self._pg_on_driver is None:
                self._pg_on_driver = DriverStatement(self._step_pg, conn.dialect)
            found = self._pg_on_driver.first(conn, params)
            return None if found is None else StepWritten(float(found[0]), found[1])
        result = conn.execute(self._step_pg, params).first()
        return None if result is None else StepWritten(float(result.updated_at), result.cancel_reason)

    def _step_returning(self, conn: Connection, claim: Claim, row: StepRow) -> StepWritten | None:
        result = conn.execute(self._counted_returning, self._params(claim, size=row.size)).first()
        if result is None:
            return None
        now = float(result.updated_at)
        conn.execute(self._insert_step, self._step_columns(claim, row, now))
        return StepWritten(now, result.cancel_reason)

    def _step_on_driver(self, conn: Connection, claim: Claim, row: StepRow) -> StepWritten | None:
        """`_step_returning` with both statements sent straight to pysqlite (`driver`)."""
        if self._on_driver is None:
            self._on_driver = (
                DriverStatement(self._counted_returning, conn.dialect),
                DriverStatement(self._insert_step, conn.dialect),
            )
        counted, insert = self._on_driver
        result = counted.first(conn, self._params(claim, size=row.size))
        if result is None:
            return None
        updated_at, cancel_reason = result
        now = float(updated_at)
        insert.first(conn, self._step_columns(claim, row, now))
        return StepWritten(now, cancel_reason)

    def _step_plain(self, conn: Connection, claim: Claim, row: StepRow) -> StepWritten | None:
        if conn.execute(self._counted, self._params(claim, size=row.size)).rowcount != 1:
            return None
        if conn.dialect.insert_returning:  # MariaDB 10.5 or later: the INSERT reads the stamp itself
            values = step_values(row)
            del values["committed_at"], values["attempt"]
            params = {f"p_s_{k}": v for k, v in values.items()}
            params.update(p_run_key=claim.run_key, p_attempt=claim.attempt)
            inserted = conn.execute(self._insert_stamped_statement(), params).one()
            return StepWritten(float(inserted.committed_at), inserted.cancel_reason)
        stamped = conn.execute(self._stamp, {"p_run_key": claim.run_key}).one()
        now = float(stamped.updated_at)
        conn.execute(self._insert_step, self._step_columns(claim, row, now))
        return StepWritten(now, stamped.cancel_reason)

    def _insert_stamped_statement(self) -> sa.Insert:
        """MariaDB: the step's ``INSERT … SELECT`` of the run's stamp, ``RETURNING`` it and the cancellation (C34).

        It follows the fenced ``UPDATE`` in the same transaction, which
        locked the run's row and stamped its ``updated_at``: the step's
        ``committed_at`` is that stamp, read in the ``INSERT`` instead of by
        a ``SELECT`` of its own.
        """
        if self._insert_stamped is None:
            steps, runs = self._t.steps, self._t.runs
            names = [c.name for c in steps.c if c.name not in ("run_key", "attempt", "committed_at")]
            run_key = _p("run_key", runs.c.run_key)
            source = sa.select(
                runs.c.run_key, _p("attempt", steps.c.attempt), runs.c.updated_at,
                *(_p(f"s_{name}", steps.c[name]) for name in names),
            ).where(runs.c.run_key == run_key)  # fmt: skip
            cancel = sa.select(runs.c.cancel_reason).where(runs.c.run_key == run_key).scalar_subquery()
            self._insert_stamped = (
                sa.insert(steps)
                .from_select(["run_key", "attempt", "committed_at", *names], source)
                .returning(steps.c.committed_at, cancel.label("cancel_reason"))
            )
        return self._insert_stamped

    # ------------------------------------------------------ several new steps
    def commit_steps(self, conn: Connection, claim: Claim, rows: Sequence[StepRow]) -> StepWritten:
        """Insert ``rows`` and count them all in the run, fenced on ``claim``, in the caller's transaction (C9, C51).

        The statements of `commit_step` for any number of rows: one on
        PostgreSQL, two on SQLite and MariaDB, three on MySQL (one more
        ``INSERT`` per 50 rows beyond the first 50).

        Raises:
          ClaimLost: the claim no longer holds the run, or one of the keys is
            already committed or repeated; nothing was written.
        """
        size = sum(row.size for row in rows)
        try:
            if self._dialect == "postgresql":
                written = self._steps_postgresql(conn, claim, rows, size)
            elif not self._returning and conn.dialect.insert_returning:
                written = self._steps_stamped_by_insert(conn, claim, rows, size)
            else:
                written = self._counted_rows(conn, claim, len(rows), size)
                if written is not None:
                    for start in range(0, len(rows), _ROWS_PER_INSERT):
                        chunk = rows[start : start + _ROWS_PER_INSERT]
                        values = [self._step_columns(claim, row, written.now) for row in chunk]
                        conn.execute(sa.insert(self._t.steps).values(values))
        except sa_exc.IntegrityError as exc:
            raise one_already_committed(claim, [row.step_key for row in rows]) from exc
        if written is None:
            raise claim_lost(claim)
        return written

    def _steps_stamped_by_insert(
        self, conn: Connection, claim: Claim, rows: Sequence[StepRow], size: int
    ) -> StepWritten | None:
        """MariaDB: the fenced ``UPDATE`` counting ``rows``, then their ``INSERT``\\ s reading its stamp.

        Each row's ``committed_at`` is the run's ``updated_at`` the ``UPDATE``
        wrote, read by a subquery; the first ``INSERT`` returns it and the
        cancellation request (C34).
        """
        if conn.execute(self._counting_many(), self._params(claim, size=size, count=len(rows))).rowcount != 1:
            return None
        runs, steps = self._t.runs, self._t.steps
        stamp = sa.select(runs.c.updated_at).where(runs.c.run_key == claim.run_key).scalar_subquery()
        written: StepWritten | None = None
        for start in range(0, len(rows), _ROWS_PER_INSERT):
            chunk = rows[start : start + _ROWS_PER_INSERT]
            values = [{**self._step_columns(claim, row), "committed_at": stamp} for row in chunk]
            insert = sa.insert(steps).values(values)
            if written is None:
                cancel = sa.select(runs.c.cancel_reason).where(runs.c.run_key == claim.run_key).scalar_subquery()
                first = conn.execute(insert.returning(steps.c.committed_at, cancel.label("cancel_reason"))).first()
                assert first is not None
                written = StepWritten(float(first.committed_at), first.cancel_reason)
            else:
                conn.execute(insert)
        return written

    def _counted_rows(self, conn: Connection, claim: Claim, count: int, size: int) -> StepWritten | None:
        """The fenced ``UPDATE`` counting ``count`` new rows of ``size`` bytes, and the clock it stamped."""
        counted = self._counting_many()
        params = self._params(claim, size=size, count=count)
        if self._returning:
            found = conn.execute(counted.returning(self._t.runs.c.updated_at, self._t.runs.c.cancel_reason), params)
            result = found.first()
            return None if result is None else StepWritten(float(result.updated_at), result.cancel_reason)
        if conn.execute(counted, params).rowcount != 1:
            return None
        stamped = conn.execute(self._stamp, {"p_run_key": claim.run_key}).one()
        return StepWritten(float(stamped.updated_at), stamped.cancel_reason)

    def _counting_many(self) -> sa.Update:
        runs = self._t.runs
        return (
            sa.update(runs)
            .where(*self._fence)
            .values(
                step_count=runs.c.step_count + _p("count", runs.c.step_count),
                step_bytes=runs.c.step_bytes + _p("size", runs.c.step_bytes),
                updated_at=self._clock,
            )
        )

    def _steps_postgresql(
        self, conn: Connection, claim: Claim, rows: Sequence[StepRow], size: int
    ) -> StepWritten | None:
        key = ("steps-pg",)
        if key not in self._statements:
            self._statements[key] = self._steps_statement_postgresql()
        columns = [step_values(row) for row in rows]
        arrays = {f"p_a_{name}": [c[name] for c in columns] for name in self._unnested_names()}
        params = {**self._params(claim, size=size, count=len(rows)), **arrays}
        result = conn.execute(self._statements[key], params).first()
        return None if result is None else StepWritten(float(result.updated_at), result.cancel_reason)

    def _unnested_names(self) -> list[str]:
        return [c.name for c in self._t.steps.c if c.name not in ("run_key", "attempt", "committed_at")]

    def _steps_statement_postgresql(self) -> sa.Select[Any]:
        """``WITH held AS (fenced UPDATE … RETURNING), wrote AS (INSERT … SELECT … FROM held, unnest(…))``."""
        steps = self._t.steps
        runs = self._t.runs
        held = self._counting_many().returning(runs.c.updated_at, runs.c.cancel_reason).cte("held")
        names = self._unnested_names()
        arrays = [sa.cast(_p(f"a_{name}"), postgresql.ARRAY(steps.c[name].type)) for name in names]
        given = sa.func.unnest(*arrays).table_valued(*names).render_derived(name="given")
        source = sa.select(
            _p("run_key", steps.c.run_key),
            _p("attempt", steps.c.attempt),
            held.c.updated_at,
            *(given.c[name] for name in names),
        ).select_from(held.join(given, sa.true()))
        wrote = sa.insert(steps).from_select(["run_key", "attempt", "committed_at", *names], source).cte("wrote")
        return sa.select(held.c.updated_at, held.c.cancel_reason).add_cte(wrote)

    # ------------------------------------------------------ an attempt's start
    @property
    def claims_new_runs(self) -> bool:
        """Whether `claim_new_run` is available (``INSERT … ON CONFLICT DO NOTHING RETURNING``)."""
        return self._returning

    def claim_new_run(
        self,
        conn: Connection,
        run_key: str,
        envelope: JobEnvelope,
        envelope_json: str,
        *,
        job_id: str,
        granted: Granted,
        trace_context: str | None = None,
    ) -> Any:
        """Insert the run already claimed by ``granted`` (see `claim_of_new_run`), if it does not exist.

        One statement. ``granted.lease_until`` is seconds from the database's
        clock; ``created_at`` and ``updated_at`` are that clock; the run keeps
        ``trace_context``, the claiming attempt's (C53).

        Returns:
          Row | None: the new run's ``lease_until`` and ``created_at``; ``None``
          when the run already exists (nothing was written: claim it the usual way).
        """
        if self._claim_new is None:
            self._claim_new = self._claim_new_statement()
        params = claimed_run_params(run_key, envelope, envelope_json, job_id, granted, trace_context)
        if self._dialect == "sqlite" and runs_on_driver(conn):  # pysqlite: straight to the driver (.driver)
            found = self._on_driver_of(("claim-new",), self._claim_new, conn).first(conn, params)
            return None if found is None else _Named(("lease_until", "created_at"), found)
        return conn.execute(self._claim_new, params).first()

    def record_queued(self, conn: Connection, params: dict[str, Any]) -> None:
        """Insert a run ``queued`` unless its key exists (C39): one statement, built once, its values bound.

        Parameters:
          conn (Connection): the store's connection.
          params (dict[str, Any]): ``p_run_key``, ``p_task_name``, ``p_framework``,
            ``p_queue``, ``p_envelope`` (its JSON), ``p_job_id`` and ``p_delay``
            (seconds from the database's clock until it is due, at least 0).
        """
        statement = self._statements.get(("record-queued",))
        if statement is None:
            statement = self._statements[("record-queued",)] = self._record_queued_statement()
        if runs_on_driver(conn):  # pysqlite, psycopg: straight to the driver (.driver)
            self._on_driver_of(("record-queued",), statement, conn).first(conn, params)
        else:
            conn.execute(statement, params)

    def _record_queued_statement(self) -> sa.Executable:
        runs = self._t.runs
        given = ("run_key", "task_name", "framework", "queue", "envelope", "job_id")
        values: dict[str, Any] = {name: _p(name, runs.c[name]) for name in given}
        values.update(
            status=sa.literal("queued", runs.c.status.type),
            wake_at=self._clock + _p("delay", runs.c.wake_at),
            attempt=sa.literal(0, runs.c.attempt.type),
            takeovers=sa.literal(0, runs.c.takeovers.type),
            step_count=sa.literal(0, runs.c.step_count.type),
            step_bytes=sa.literal(0, runs.c.step_bytes.type),
            created_at=self._clock,
            updated_at=self._clock,
        )
        return insert_if_absent(self._dialect, runs, values, "run_key")

    def _on_driver_of(self, key: tuple[str, ...], statement: Any, conn: Connection) -> DriverStatement:
        """The `DriverStatement` of ``statement``, built once per ``key``."""
        on_driver = self._driver_statements.get(key)
        if on_driver is None:
            on_driver = self._driver_statements[key] = DriverStatement(statement, conn.dialect)
        return on_driver

    def _claim_new_statement(self, returning: tuple[sa.Column[Any], ...] = ()) -> Any:
        """``INSERT … SELECT`` from one read of the clock, so ``created_at``, ``updated_at`` and the lease agree."""
        runs = self._t.runs
        given = ("run_key", "task_name", "framework", "queue", "envelope", "job_id", "trace_context")
        claimed = ("status", "owner", "attempt", "takeovers")
        clock = sa.select(self._clock.label("now")).subquery("clock")
        columns: dict[str, Any] = {name: _p(name, runs.c[name]) for name in given}
        columns.update({name: _v(name, runs.c[name]) for name in claimed})
        columns.update(
            lease_until=clock.c.now + _v("lease_until", runs.c.lease_until),
            step_count=sa.literal(0),
            step_bytes=sa.literal(0),
            created_at=clock.c.now,
            updated_at=clock.c.now,
        )
        # WHERE true: SQLite reads an upsert's ON CONFLICT after a bare SELECT … FROM as a join's ON.
        source = sa.select(*(value.label(name) for name, value in columns.items())).where(sa.true())
        dialect_insert = postgresql.insert if self._dialect == "postgresql" else sqlite.insert
        insert = dialect_insert(runs).from_select(list(columns), source)
        insert = insert.on_conflict_do_nothing(index_elements=["run_key"])
        return insert.returning(*(returning or (runs.c.lease_until, runs.c.created_at)))

    @property
    def claims_optimistically(self) -> bool:
        """Whether `claim_new_or_read` and `claim_if_unchanged` are available (PostgreSQL)."""
        return self._dialect == "postgresql"

    def claim_new_or_read(
        self,
        conn: Connection,
        run_key: str,
        envelope: JobEnvelope,
        envelope_json: str,
        *,
        job_id: str,
        granted: Granted,
        trace_context: str | None = None,
    ) -> Any:
        """PostgreSQL: insert the run already claimed by ``granted`` if absent, else read it; one statement.

        A ``WITH`` of `claim_new_run`'s insert in front of a ``UNION
        ALL`` of what it inserted and of the stored row, the database's clock
        (``now``) and the row's version (``xmin``, ``version``), which
        `claim_if_unchanged` compares. The stored row is read, not
        locked: the claim written afterwards applies only to that version.

        Returns:
          Row | None: every column of the run, ``inserted`` (the run was new
          and is claimed: ``now`` is its ``created_at``), ``now`` and
          ``version``; ``None`` when neither part sees a row (a concurrent
          first delivery inserted it after this statement's snapshot was taken).
        """
        key = ("claim-new-or-read",)
        if key not in self._statements:
            self._statements[key] = self._claim_new_or_read_statement()
        params = claimed_run_params(run_key, envelope, envelope_json, job_id, granted, trace_context)
        return conn.execute(self._statements[key], params).first()

    def _claim_new_or_read_statement(self) -> sa.Executable:
        runs = self._t.runs
        inserted = self._claim_new_statement(returning=tuple(runs.c)).cte("inserted")
        version = sa.cast(sa.literal_column("xmin"), sa.Text)
        new = sa.select(
            sa.true().label("inserted"),
            *inserted.c,
            inserted.c.created_at.label("now"),
            sa.cast(sa.null(), sa.Text).label("version"),
        )
        stored = sa.select(
            sa.false().label("inserted"), *runs.c, self._clock.label("now"), version.label("version")
        ).where(runs.c.run_key == _p("run_key", runs.c.run_key))
        return sa.union_all(new, stored)

    def claim_in_one(
        self,
        conn: Connection,
        params: dict[str, Any],
        trace_context: str | None,
    ) -> InOne:
        """PostgreSQL: claim the run in one statement when it is new or holds no claim; else read it.

        One ``WITH`` of three parts, all on the statement's one snapshot:

        - `claim_new_run`'s insert of the run already claimed (``ON
          CONFLICT DO NOTHING``: a stored run is left alone);
        - the grant of a stored run that `grants_untaken` (not
          terminal, no claim held): an ``UPDATE`` whose condition is that
          rule, which writes `decide_claim`'s grant for it (``attempt + 1``,
          the same takeovers, a lease from the clock read once the row is
          locked, C23), and only while the row is still the version the
          statement's snapshot holds (``xmin`` compared with a subquery of that
          snapshot): a run written by anyone since, a step committed, a claim
          taken, makes it match nothing, so the steps it returns, read on that
          snapshot, are all the run's committed steps;
        - else the stored run as read, with the clock and its row version,
          for `decide_claim` and `claim_if_unchanged`, exactly as
          `claim_new_or_read` returns it.

        The claimed run's steps come in the same rows (a left join), its
        stored envelope only when it differs from the job's.

        Parameters:
          conn (Connection): the store's connection.
          params (dict[str, Any]): `claimed_run_params` of the run (its
            key, the job's envelope as stored, the new run's claim).
          trace_context (str | None): the attempt's ``traceparent`` (C53).

        Returns:
          InOne: what happened: inserted, claimed (with the steps), read, or
          nothing seen (a concurrent first delivery's insert).
        """
        if self._in_one is None:
            statement = self._claim_in_one_statement()
            self._in_one = (statement, DriverStatement(statement, conn.dialect))
        statement, on_driver = self._in_one
        if runs_on_driver(conn):  # psycopg: straight to the driver (.driver)
            rows = on_driver.all(conn, params)
        else:
            rows = [tuple(row) for row in conn.execute(statement, params).all()]
        if not rows:
            return InOne("none")
        first = rows[0]
        part = first[0]
        if part == _INSERTED:
            return InOne("inserted", lease_until=float(first[2]), now=float(first[3]), created_at=float(first[3]))
        if part == _CLAIMED:
            stored_trace = first[7] if first[7] != trace_context else None  # ours: the run had none (C53)
            return InOne(
                "claimed",
                attempt=first[1],
                lease_until=float(first[2]),
                now=float(first[3]),
                created_at=float(first[4]),
                takeovers=first[5],
                cancel_reason=first[6],
                trace_context=stored_trace,
                envelope=first[8],
                steps=[_driver_step(r) for r in rows if r[_STEP_AT] is not None],
            )
        return InOne("read", run=_ReadRun(first))

    def _claim_in_one_statement(self) -> sa.Executable:
        runs, steps = self._t.runs, self._t.steps
        key = _p("run_key", runs.c.run_key)
        inserted = self._claim_new_statement(returning=(runs.c.lease_until, runs.c.created_at)).cte("inserted")
        prior = runs.alias("prior")
        version_then = (
            sa.select(sa.cast(sa.literal_column("prior.xmin"), sa.Text)).where(prior.c.run_key == key).scalar_subquery()
        )
        unchanged = sa.cast(sa.literal_column(f"{runs.name}.xmin"), sa.Text) == version_then
        untaken = sa.and_(
            *(runs.c.status != sa.literal(status) for status in sorted(TERMINAL_STATUSES)),
            sa.or_(runs.c.owner.is_(None), runs.c.lease_until.is_(None)),
        )  # claims.grants_untaken, as SQL
        differs = sa.case((runs.c.envelope == _p("envelope", runs.c.envelope), sa.null()), else_=runs.c.envelope)
        claimed = (
            sa.update(runs)
            .where(runs.c.run_key == key, untaken, unchanged)
            .values(
                status="running",
                owner=_v("owner", runs.c.owner),
                attempt=runs.c.attempt + 1,
                lease_until=self._clock + _v("lease_until", runs.c.lease_until),
                updated_at=self._clock,
                job_id=_p("job_id", runs.c.job_id),
                trace_context=sa.func.coalesce(runs.c.trace_context, _p("trace_context", runs.c.trace_context)),
            )
            .returning(
                runs.c.run_key,
                runs.c.attempt,
                runs.c.lease_until,
                runs.c.updated_at,
                runs.c.created_at,
                runs.c.takeovers,
                runs.c.cancel_reason,
                runs.c.trace_context,
                differs.label("envelope"),
            )
            .cte("claimed")
        )
        step_columns = [steps.c[name] for name in _STEP_COLUMNS]
        read_columns = [runs.c[name] for name in _READ_COLUMNS]
        claim_columns = [runs.c[name] for name in ("attempt", "lease_until", "updated_at", "created_at", "takeovers")]
        claim_columns += [runs.c.cancel_reason, runs.c.trace_context, runs.c.envelope]
        # Typed NULLs: a UNION of untyped NULLs would make them text before the next part's numbers.
        step_pads = [_null_of(c) for c in step_columns]
        read_pads = [_null_of(c) for c in read_columns]
        version = sa.cast(sa.literal_column(f"{runs.name}.xmin"), sa.Text)
        read_ends = (_null_of(self._clock), sa.cast(sa.null(), sa.Text))
        new = _numbered(
            sa.literal(_INSERTED),
            sa.literal(1),
            inserted.c.lease_until,
            inserted.c.created_at,
            inserted.c.created_at,
            sa.literal(0),
            *(_null_of(c) for c in claim_columns[5:]),
            *step_pads,
            *read_pads,
            *read_ends,
        )
        got = _numbered(
            sa.literal(_CLAIMED),
            *(claimed.c[c.name] for c in claim_columns),
            *step_columns,
            *read_pads,
            *read_ends,
        ).select_from(claimed.outerjoin(steps, steps.c.run_key == claimed.c.run_key))
        stored = _numbered(
            sa.literal(_READ),
            *(_null_of(c) for c in claim_columns),
            *step_pads,
            *read_columns,
            self._clock,
            version,
        ).where(runs.c.run_key == key, ~sa.exists(sa.select(claimed.c.run_key)))
        union = sa.union_all(new, got, stored).subquery("started")
        return sa.select(union).order_by(union.c.c0, union.c[f"c{_STEP_AT}"])

    def claim_if_unchanged(
        self, conn: Connection, run_key: str, version: str, claimed: dict[str, Any], lease_seconds: float
    ) -> tuple[float, float, list[Any]] | None:
        """PostgreSQL: write the granted claim if the run's row is still ``version``; return it with the steps.

        One statement: a ``WITH`` of the claim's ``UPDATE … WHERE run_key AND
        xmin = version`` (a compare-and-set on the row version
        `claim_new_or_read` read: any write to the run since, by anyone,
        makes it match nothing) in front of the ``SELECT`` of the run's steps.
        ``updated_at`` is the database's clock read once the row is locked,
        and the lease ends ``lease_seconds`` after it (C23). Every step write
        updates the run's row in its transaction, so when the row is unchanged
        no step was committed since it was read.

        Parameters:
          run_key (str): the run.
          version (str): the row version read with the run.
          claimed (dict[str, Any]): the claim's columns (``lease_until`` and ``updated_at`` excepted).
          lease_seconds (float): the lease, seconds from the clock at the write.

        Returns:
          tuple[float, float, list[Row]] | None: the claim's ``lease_until``,
          its ``updated_at`` and the step rows by position; ``None`` if the row
          changed (nothing was written).
        """
        key = ("claim-if-unchanged", *claimed)
        if key not in self._statements:
            self._statements[key] = self._claim_if_unchanged_statement(tuple(claimed))
        params = {f"v_{k}": v for k, v in claimed.items()}
        params.update(p_run_key=run_key, p_version=version, v_lease_seconds=lease_seconds)
        rows = conn.execute(self._statements[key], params).all()
        if not rows:
            return None
        first = rows[0]
        steps = [r for r in rows if r.position is not None]
        return float(first.claimed_lease_until), float(first.claimed_at), steps

    def _claim_if_unchanged_statement(self, names: tuple[str, ...]) -> sa.Executable:
        runs, steps = self._t.runs, self._t.steps
        values: dict[str, Any] = {name: _v(name, runs.c[name]) for name in names}
        values.update(
            lease_until=self._clock + _v("lease_seconds", runs.c.lease_until),
            updated_at=self._clock,
        )
        unchanged = sa.cast(sa.literal_column("xmin"), sa.Text) == _p("version")
        claim = (
            sa.update(runs)
            .where(runs.c.run_key == _p("run_key", runs.c.run_key), unchanged)
            .values(**values)
            .returning(runs.c.run_key, runs.c.lease_until, runs.c.updated_at)
            .cte("claimed")
        )
        joined = claim.outerjoin(steps, steps.c.run_key == claim.c.run_key)
        return (
            sa.select(
                claim.c.lease_until.label("claimed_lease_until"), claim.c.updated_at.label("claimed_at"), *steps.c
            )
            .select_from(joined)
            .order_by(steps.c.position)
        )

    def read_run_and_steps(self, conn: Connection, run_key: str) -> tuple[Any, list[Any]]:
        """SQLite: the run (with the clock, ``now``) and its step rows, in one statement of the caller's transaction.

        A ``UNION ALL`` of the run's row (with the clock) and its steps, each
        part padded with ``NULL`` for the other's columns, so nothing is
        repeated per step. The caller's write transaction (``BEGIN
        IMMEDIATE``) already holds the database's write lock, so the clock is
        read after the lock (C23) and nothing changes before the claim is written.

        Returns:
          tuple[Row | None, list[Row]]: the run's columns and ``now`` (``None``
          if the run does not exist), and its step rows by position.
        """
        key = ("run-and-steps",)
        if key not in self._statements:
            self._statements[key] = self._run_and_steps_statement()
        statement = self._statements[key]
        if runs_on_driver(conn):  # pysqlite: straight to the driver (.driver)
            names = tuple(c.name for c in statement.selected_columns)  # type: ignore[attr-defined]
            found = self._on_driver_of(key, statement, conn).all(conn, {"p_run_key": run_key})
            rows: Sequence[Any] = [_Named(names, row) for row in found]
        else:
            rows = conn.execute(statement, {"p_run_key": run_key}).all()
        if not rows or rows[0].part != 0:
            return None, []
        return _RunColumns(rows[0]), [_StepColumns(r) for r in rows[1:]]

    def _run_and_steps_statement(self) -> sa.Executable:
        runs, steps = self._t.runs, self._t.steps
        key = _p("run_key", runs.c.run_key)

        def pad(column: sa.Column[Any]) -> sa.ColumnElement[Any]:
            return sa.type_coerce(sa.null(), column.type)

        run_part = sa.select(
            sa.literal(0).label("part"),
            *(c.label(f"r_{c.name}") for c in runs.c),
            self._clock.label("r_now"),
            *(pad(c).label(f"s_{c.name}") for c in steps.c),
        ).where(runs.c.run_key == key)
        step_part = sa.select(
            sa.literal(1).label("part"),
            *(pad(c).label(f"r_{c.name}") for c in runs.c),
            sa.type_coerce(sa.null(), self._clock.type).label("r_now"),
            *(c.label(f"s_{c.name}") for c in steps.c),
        ).where(steps.c.run_key == key)
        union = sa.union_all(run_part, step_part).subquery("read")
        return sa.select(union).order_by(union.c.part, union.c.s_position)

    def write_claim(self, conn: Connection, run_key: str, claimed: dict[str, Any]) -> None:
        """Write the granted claim on the run, locked in the caller's transaction (one ``UPDATE``)."""
        key = ("claim-only", *claimed)
        if key not in self._statements:
            runs = self._t.runs
            values = {name: _v(name, runs.c[name]) for name in claimed}
            self._statements[key] = sa.update(runs).where(runs.c.run_key == _p("run_key")).values(**values)
        params = {"p_run_key": run_key, **{f"v_{k}": v for k, v in claimed.items()}}
        if runs_on_driver(conn):  # pysqlite: straight to the driver (.driver)
            self._on_driver_of(key, self._statements[key], conn).first(conn, params)
        else:
            conn.execute(self._statements[key], params)

    def lock_run(self, conn: Connection, run_key: str, envelope: JobEnvelope, envelope_json: str) -> Any:
        """Insert the run if absent, lock its row and read it with the clock (label ``now``), after the lock.

        PostgreSQL and SQLite: one upsert ``RETURNING`` the row. MySQL/MariaDB:
        a locking read (``SELECT … FOR UPDATE``) first, which X-locks a stored
        run at once (the usual case: recorded at publish, C39, or a
        redelivery); only for a run not stored yet, the upsert and the
        locking read again.

        Parameters:
          run_key (str): the run.
          envelope (JobEnvelope): a new run's task name, framework and queue.
          envelope_json (str): the envelope as stored.

        Returns:
          Row: every column of the run, and ``now``.
        """
        params = _new_run_params(run_key, envelope, envelope_json)
        if self._lock_run is None:
            self._lock_run = self._lock_run_statements()
        upsert, locked = self._lock_run
        if locked is None:
            return conn.execute(upsert, params).one()
        stored = conn.execute(locked, params).first()
        if stored is not None:
            return stored
        conn.execute(upsert, params)
        return conn.execute(locked, params).one()

    def _lock_run_statements(self) -> tuple[sa.Executable, sa.Executable | None]:
        runs = self._t.runs
        given = {name: _p(name, runs.c[name]) for name in ("run_key", "task_name", "framework", "queue", "envelope")}
        values = {
            **given,
            "status": "pending",
            "attempt": 0,
            "takeovers": 0,
            "step_count": 0,
            "step_bytes": 0,
            "created_at": self._clock,
            "updated_at": self._clock,
        }
        if self._returning:
            dialect_insert = postgresql.insert if self._dialect == "postgresql" else sqlite.insert
            upsert = dialect_insert(runs).values(values)
            upsert = upsert.on_conflict_do_update(index_elements=["run_key"], set_={"attempt": runs.c.attempt})
            return upsert.returning(*runs.c, self._clock.label("now")), None
        stmt = mysql.insert(runs).values(values)
        # Unlike INSERT IGNORE, this X-locks an existing row: no S→X upgrade deadlock.
        upsert_mysql = stmt.on_duplicate_key_update(run_key=stmt.inserted.run_key)
        locked = sa.select(*runs.c, self._clock.label("now")).where(runs.c.run_key == given["run_key"])
        return upsert_mysql, locked.with_for_update()

    def claim_and_snapshot(self, conn: Connection, run_key: str, claimed: dict[str, Any]) -> Sequence[Any]:
        """Write the granted claim on the locked run and return its step rows, ordered by position.

        Parameters:
          run_key (str): the run, locked by `lock_run` in this transaction.
          claimed (dict[str, Any]): the run's new column values.
        """
        statement, params = self._claim_statement(tuple(claimed)), {f"v_{k}": v for k, v in claimed.items()}
        params["p_run_key"] = run_key
        if self._dialect == "postgresql":
            return conn.execute(statement, params).all()
        conn.execute(statement, params)
        return conn.execute(self._snapshot, {"p_run_key": run_key}).all()

    def _claim_statement(self, names: tuple[str, ...]) -> sa.Executable:
        """The claim's ``UPDATE``; on PostgreSQL a ``WITH`` of it in front of the snapshot's ``SELECT``."""
        key = ("claim", *names)
        if key not in self._statements:
            runs = self._t.runs
            values = {name: _v(name, runs.c[name]) for name in names}
            claim = sa.update(runs).where(runs.c.run_key == _p("run_key")).values(**values)
            pg = self._dialect == "postgresql"
            self._statements[key] = self._snapshot.add_cte(claim.cte("claimed")) if pg else claim
        return self._statements[key]

    # ------------------------------------------------------------ a finish
    def finish(self, conn: Connection, claim: Claim, values: dict[str, Any], dead: NewDeadLetter | None) -> None:
        """End the attempt with ``values`` (``updated_at`` stamped here), fenced; record ``dead`` with it.

        Raises:
          ClaimLost: the claim no longer holds the run; nothing was written.
        """
        statement = self._finish_statement(tuple(values))
        params = {**self._params(claim), **{f"v_{k}": v for k, v in values.items()}}
        if conn.execute(statement, params).rowcount != 1:
            raise claim_lost(claim)
        if dead is not None:
            self.add_dead_letter(conn, claim.run_key, dead)

    def finish_on_driver(self, conn: Connection, claim: Claim, values: dict[str, Any], drop_steps: bool) -> bool:
        """SQLite on pysqlite: `finish` without a dead letter, and the step rows dropped, straight to the driver.

        The statements of `finish` and of the drop (the fenced ``UPDATE …
        RETURNING``, then the two ``DELETE``\\ s), in the caller's transaction,
        built once and sent to the driver (`driver`). ``False`` (nothing
        done) where that is not available: the caller runs `finish`.

        Raises:
          ClaimLost: the claim no longer holds the run; nothing was written.
        """
        if not (self._returning and runs_on_driver(conn)):
            return False
        key = ("finish-driver", str(drop_steps), *values)
        statements = self._finish_on_driver.get(key)
        if statements is None:
            runs, steps, attempts = self._t.runs, self._t.steps, self._t.attempts
            ended = self._finish_statement(tuple(values)).returning(runs.c.run_key)  # type: ignore[attr-defined]
            dropped = [sa.delete(t).where(t.c.run_key == _p("run_key", t.c.run_key)) for t in (steps, attempts)]
            statements = [DriverStatement(s, conn.dialect) for s in (ended, *(dropped if drop_steps else ()))]
            self._finish_on_driver[key] = statements
        params = {**self._params(claim), **{f"v_{k}": v for k, v in values.items()}}
        if statements[0].first(conn, params) is None:
            raise claim_lost(claim)
        for dropping in statements[1:]:
            dropping.first(conn, {"p_run_key": claim.run_key})
        return True

    def add_dead_letter(self, conn: Connection, run_key: str, dead: NewDeadLetter) -> None:
        """Record ``dead`` for the run ``run_key``, copying its task, envelope and ``updated_at`` (C30)."""
        given = {"job_id": dead.job_id, "reason": dead.reason, "message": dead.message, "traceback": dead.traceback}
        conn.execute(self._dead, {f"p_{k}": v for k, v in {"run_key": run_key, **given}.items()})

    def finish_in_one(self, conn: Connection, claim: Claim, values: dict[str, Any], drop_steps: bool) -> None:
        """PostgreSQL: `finish` without a dead letter, and the step rows dropped, in one statement.

        A ``WITH`` whose fenced ``UPDATE`` returns the run's key, and whose
        ``DELETE`` statements on the run's steps and step attempts read it: nothing is
        deleted unless the fence held (C25, C27).

        Raises:
          ClaimLost: the claim no longer holds the run; nothing was written.
        """
        key = ("finish-one", str(drop_steps), *values)
        if key not in self._statements:
            self._statements[key] = self._finish_in_one_statement(tuple(values), drop_steps)
        params = {**self._params(claim), **{f"v_{k}": v for k, v in values.items()}}
        if runs_on_driver(conn):  # psycopg: straight to the driver (.driver)
            on_driver = self._finish_on_driver.get(key)
            if on_driver is None:
                on_driver = self._finish_on_driver[key] = DriverStatement(self._statements[key], conn.dialect)
            found = on_driver.first(conn, params)
            ended = None if found is None else found[0]
        else:
            ended = conn.execute(self._statements[key], params).scalar_one()
        if ended != 1:
            raise claim_lost(claim)

    def _finish_in_one_statement(self, names: tuple[str, ...], drop_steps: bool) -> sa.Executable:
        runs, steps, attempts = self._t.runs, self._t.steps, self._t.attempts
        values: dict[str, Any] = {name: _v(name, runs.c[name]) for name in names}
        ended = sa.update(runs).where(*self._fence).values(**values, updated_at=self._clock)
        held = ended.returning(runs.c.run_key).cte("ended")
        statement = sa.select(sa.func.count()).select_from(held)
        if drop_steps:
            for table in (steps, attempts):
                dropped = sa.delete(table).where(table.c.run_key.in_(sa.select(held.c.run_key)))
                statement = statement.add_cte(dropped.cte(f"dropped_{table.name}"))
        return statement

    def _finish_statement(self, names: tuple[str, ...]) -> sa.Executable:
        key = ("finish", *names)
        if key not in self._statements:
            runs = self._t.runs
            values: dict[str, Any] = {name: _v(name, runs.c[name]) for name in names}
            self._statements[key] = sa.update(runs).where(*self._fence).values(**values, updated_at=self._clock)
        return self._statements[key]

    def _dead_letter_statement(self) -> sa.Insert:
        runs, letters = self._t.runs, self._t.dead
        given = ("run_key", "job_id", "reason", "message", "traceback")
        source = sa.select(
            *(_p(k, letters.c[k]) for k in given), runs.c.task_name, runs.c.envelope, runs.c.updated_at
        ).where(runs.c.run_key == _p("run_key", runs.c.run_key))
        return sa.insert(letters).from_select([*given, "task_name", "envelope", "created_at"], source)


_INSERTED, _CLAIMED, _READ = 0, 1, 2
"""The parts of `Folded.claim_in_one`'s rows: the run inserted claimed, claimed, or read."""
_STEP_COLUMNS = (
    "position", "step_key", "kind", "value", "wake_at", "committed_at", "attempt", "failure", "compensate", "event_id",
)  # fmt: skip
_STEP_AT = 9
"""Where a row of `Folded.claim_in_one` has its step columns (after the part and eight claim columns)."""
_READ_COLUMNS = (
    "run_key", "task_name", "framework", "queue", "status", "owner", "attempt", "lease_until", "takeovers",
    "envelope", "created_at", "updated_at", "cancel_reason", "outcome", "trace_context",
)  # fmt: skip
_READ_AT = _STEP_AT + len(_STEP_COLUMNS)


def _null_of(column: sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
    """``NULL`` cast to ``column``'s type."""
    return sa.cast(sa.null(), column.type)


def _numbered(*columns: sa.ColumnElement[Any]) -> sa.Select[Any]:
    """A ``SELECT`` of ``columns`` named ``c0``, ``c1``, … (the parts of a ``UNION ALL`` read by position)."""
    return sa.select(*(column.label(f"c{i}") for i, column in enumerate(columns)))


def _driver_step(row: tuple[Any, ...]) -> StepRow:
    """The step of a row of `Folded.claim_in_one`, as the driver returned it."""
    position, step_key, kind, value, wake_at, committed_at, attempt, failure, compensate, event_id = row[
        _STEP_AT:_READ_AT
    ]
    return StepRow(
        position=position,
        step_key=step_key,
        kind=kind,
        value=bytes(value) if value is not None else None,
        wake_at=wake_at,
        committed_at=committed_at,
        attempt=attempt,
        failure=failure,
        compensate=compensate,
        event_id=event_id,
    )


class _ReadRun:
    """The stored run of a row of `Folded.claim_in_one` (its ``read`` part): the run's columns, ``now``, ``version``."""

    __slots__ = (*_READ_COLUMNS, "inserted", "now", "version")

    def __init__(self, row: tuple[Any, ...]) -> None:
        for name, value in zip(_READ_COLUMNS, row[_READ_AT:], strict=False):
            setattr(self, name, value)
        self.now, self.version = row[-2], row[-1]
        self.inserted = False


@dataclass(frozen=True)
class InOne:
    """What `Folded.claim_in_one` did.

    Parameters:
      part (str): ``inserted`` (a new run, claimed), ``claimed`` (a stored
        run, claimed), ``read`` (a stored run it did not claim: ``run`` is it
        as read) or ``none`` (no row seen).
      attempt (int): the claim's attempt.
      lease_until (float): the claim's lease.
      now (float): the clock the claim was written at.
      created_at (float): the run's creation.
      takeovers (int): the run's takeovers.
      cancel_reason (str | None): the run's requested cancellation (C34).
      trace_context (str | None): the run's ``traceparent`` before this claim (C53).
      envelope (str | None): the stored envelope, when it differs from the job's.
      steps (list[StepRow]): the claimed run's committed steps, by position.
      run (Any): the stored run as read (``read``).
    """

    part: str
    attempt: int = 1
    lease_until: float = 0.0
    now: float = 0.0
    created_at: float = 0.0
    takeovers: int = 0
    cancel_reason: str | None = None
    trace_context: str | None = None
    envelope: str | None = None
    steps: list[StepRow] | None = None
    run: Any = None


class _Named:
    """A row as the driver returned it, read by column name as a SQLAlchemy row is (``row.name``, ``row._mapping``)."""

    __slots__ = ("_mapping",)

    def __init__(self, names: Sequence[str], row: Sequence[Any]) -> None:
        self._mapping = dict(zip(names, row, strict=True))

    def __getattr__(self, name: str) -> Any:
        try:
            return self._mapping[name]
        except KeyError:
            raise AttributeError(name) from None


class _Prefixed:
    """One part of a row of `Folded.read_run_and_steps`: its columns named without their prefix."""

    __slots__ = ("_prefix", "_row")

    def __init__(self, row: Any, prefix: str) -> None:
        self._row = row._mapping
        self._prefix = prefix

    def __getattr__(self, name: str) -> Any:
        try:
            return self._row[self._prefix + name]
        except KeyError:
            raise AttributeError(name) from None


class _RunColumns(_Prefixed):
    """The run's columns (and ``now``) of a row of `Folded.read_run_and_steps`."""

    __slots__ = ()

    def __init__(self, row: Any) -> None:
        super().__init__(row, "r_")


class _StepColumns(_Prefixed):
    """A step's columns of a row of `Folded.read_run_and_steps`."""

    __slots__ = ()

    def __init__(self, row: Any) -> None:
        super().__init__(row, "s_")


def claimed_run_params(  # noqa: PLR0917 - the statement's parameters, each given once
    run_key: str, envelope: JobEnvelope, envelope_json: str, job_id: str, granted: Granted, trace_context: str | None
) -> dict[str, Any]:
    """The parameters of an insert of a new run already claimed by ``granted``, keeping ``trace_context`` (C53)."""
    return {
        **_new_run_params(run_key, envelope, envelope_json),
        "p_job_id": job_id,
        "p_trace_context": trace_context,
        **{f"v_{k}": v for k, v in granted.values().items()},
    }


def _new_run_params(run_key: str, envelope: JobEnvelope, envelope_json: str) -> dict[str, Any]:
    """The bound parameters naming a new run: its key, task, framework, queue and stored envelope."""
    return {
        "p_run_key": run_key,
        "p_task_name": envelope.task_name,
        "p_framework": envelope.framework,
        "p_queue": envelope.queue,
        "p_envelope": envelope_json,
    }
