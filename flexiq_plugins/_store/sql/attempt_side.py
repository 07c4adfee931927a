"""The SQL store's attempt side: claims, fenced step writes and the ends of a run.

`AttemptStore` on SQL. Why each
write is built the way it is is in `flexiq_plugins._store.sql.store`
(one transaction per call, fenced ``UPDATE``\\ s, the database's clock) and
`folded` (the hot paths in as few statements as each database allows);
what each decision is, in `flexiq_plugins._store.claims`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection

from ..._model.records import (
    TERMINAL_STATUSES,
    UNSTARTED_STATUSES,
    AttemptStarted,
    BeginResult,
    Begun,
    Claim,
    EventPoll,
    JobEnvelope,
    NewDeadLetter,
    RunRecord,
    RunStatus,
    StepAttempt,
    StepAttemptBegin,
    StepAttemptFailed,
    StepAttemptFailure,
    StepRow,
)
from ...errors import (
    CancelRequested,
    ClaimLost,
    InvalidTransaction,
    RunLocked,
    StoreError,
    UnknownRun,
)
from ..attempt_side import AttemptStore
from ..caller import CallerConnection, family
from ..claims import (
    Granted,
    already_committed,
    claim_lost,
    claim_of_new_run,
    decide_claim,
    fence,
    holds,
    may_settle_cancelled,
)
from ..events import poll_result
from ..step_attempts import decide_step_attempt, failed_attempt
from .connections import Executes
from .errors import describe, is_lock_unavailable, is_missing_table
from .folded import claimed_run_params
from .mapping import attempt_values, dump_envelope, load_envelope, run_record, step_attempt, step_row, step_values
from .reads import SqlReads

__all__ = ["SqlAttemptSide"]


@dataclasses.dataclass(frozen=True)
class _StartArgs:
    """What `SqlStepStore.begin` was given (the envelope also as stored: JSON text)."""

    run_key: str
    job_id: str
    envelope: JobEnvelope
    envelope_json: str
    owner: str
    lease_seconds: float
    trace_context: str | None = None

    def claimed(self, decision: Granted, stored_trace: str | None) -> dict[str, Any]:
        """The columns a granted claim writes: the claim's, the job id, and a first trace context (C53)."""
        claimed = {**decision.values(), "job_id": self.job_id}
        if stored_trace is None and self.trace_context is not None:
            claimed["trace_context"] = self.trace_context
        return claimed


class SqlAttemptSide(SqlReads, AttemptStore):
    """The methods of `AttemptStore` on SQL."""

    # ---------------------------------------------------------------- claims
    def begin(
        self,
        run_key: str,
        job_id: str,
        envelope: JobEnvelope,
        owner: str,
        lease_seconds: float,
        *,
        trace_context: str | None = None,
    ) -> BeginResult:
        """Claim the run for a new attempt and read its snapshot (C23–C26).

        Insert the run if absent, read it with the database clock, decide as
        `StepStore.begin` states (`decide_claim`), and write the
        claim only on the run as read: PostgreSQL, one autocommitted statement
        (two for a takeover of an expired lease), the claim a compare-and-set
        on the row version, else one transaction that locks the row; SQLite, one ``BEGIN
        IMMEDIATE`` transaction of three statements (one for a new run);
        MySQL/MariaDB, one transaction that locks the row (three statements,
        five for a run not stored yet).

        Parameters:
          run_key (str): the run (at most 255 characters).
          job_id (str): the framework's job id.
          envelope (JobEnvelope): stored with a new run (C35); must be JSON-compatible.
          owner (str): the claiming worker's id.
          lease_seconds (float): the lease, in seconds.
          trace_context (str | None): the attempt's W3C ``traceparent``, stored
            with the claim if the run has none (C53).

        Raises:
          StoreUnavailable: the database cannot be reached (retryable, C28).
          StoreError: the envelope is not JSON-compatible, or another database error.
        """
        envelope_json = dump_envelope(envelope)
        args = _StartArgs(run_key, job_id, envelope, envelope_json, owner, lease_seconds, trace_context)
        if self._folded.claims_optimistically:
            begun = self._begin_optimistic(args)
            if begun is not None:
                return begun
        elif self._folded.claims_new_runs:
            return self._write(lambda conn: self._begin_in_three(conn, args))
        return self._write(lambda conn: self._begin(conn, args))

    def _begin_optimistic(self, args: _StartArgs) -> BeginResult | None:
        """PostgreSQL: `begin` in one autocommitted statement, two for a run held by a claim.

        The first statement (`Folded.claim_in_one`) inserts a new run
        already claimed, or claims a stored run that `grants_untaken`
        (not terminal, no claim held: recorded at publish, put back, retried,
        woken) if its row is still as the statement's snapshot holds it, with
        its steps; else it reads the stored run with the clock and its row
        version, and `decide_claim` decides on what it read. A granted claim
        (a takeover of an expired lease, or a run another write changed
        meanwhile) is then written with the snapshot's read in one
        compare-and-set on that row version (`Folded.claim_if_unchanged`):
        the decision stands only if nobody wrote the run in between, exactly
        as if the row had stayed locked, and the claim's times are the clock
        read when it is written (C23). ``None`` if a concurrent write got in
        between (nothing was written): `begin` then decides again with the
        row locked.
        """
        granted_new = claim_of_new_run(args.run_key, owner=args.owner, lease_seconds=args.lease_seconds)
        params = claimed_run_params(
            args.run_key, args.envelope, args.envelope_json, args.job_id, granted_new, args.trace_context
        )
        got = self._single_statement(lambda conn: self._folded.claim_in_one(conn, params, args.trace_context))
        if got.part == "none":
            return None
        if got.part != "read":
            envelope = args.envelope
            if got.envelope is not None:  # stored otherwise than this job's: the run's own is the one that counts
                envelope = load_envelope(
                    got.envelope,
                    task_name=args.envelope.task_name,
                    framework=args.envelope.framework,
                    queue=args.envelope.queue,
                )
            claim = Claim(args.run_key, args.owner, got.attempt, got.lease_until)
            snapshot = tuple(got.steps or ())
            return Begun(
                claim, snapshot, got.now, got.takeovers, envelope, got.created_at, got.cancel_reason, got.trace_context
            )
        run = got.run
        stored = load_envelope(run.envelope, task_name=run.task_name, framework=run.framework, queue=run.queue)
        now = float(run.now)
        decision = decide_claim(run, now=now, owner=args.owner, lease_seconds=args.lease_seconds)
        if not isinstance(decision, Granted):
            return decision
        claimed = args.claimed(decision, run.trace_context)
        del claimed["lease_until"]
        written = self._single_statement(
            lambda conn: self._folded.claim_if_unchanged(
                conn, args.run_key, run.version, claimed, lease_seconds=decision.lease_until - now
            )
        )
        if written is None:
            return None
        lease_until, claimed_at, rows = written
        claim = dataclasses.replace(decision.claim(args.run_key), lease_until=lease_until)
        snapshot = tuple(step_row(r) for r in rows)
        created, cancel, trace = run.created_at, run.cancel_reason, run.trace_context
        return Begun(claim, snapshot, claimed_at, decision.takeovers, stored, created, cancel, trace)

    def _begin_in_three(self, conn: Connection, args: _StartArgs) -> BeginResult:
        """SQLite: `begin` in one write transaction of one statement for a new run, three otherwise.

        ``BEGIN IMMEDIATE`` takes the database's write lock first. The new
        run is inserted already claimed; a stored run is read with the clock
        and its steps in one statement, and a granted claim written in one more.
        """
        granted_new = claim_of_new_run(args.run_key, owner=args.owner, lease_seconds=args.lease_seconds)
        row = self._folded.claim_new_run(
            conn,
            args.run_key,
            args.envelope,
            args.envelope_json,
            job_id=args.job_id,
            granted=granted_new,
            trace_context=args.trace_context,
        )
        if row is not None:
            claim = dataclasses.replace(granted_new.claim(args.run_key), lease_until=float(row.lease_until))
            stored = load_envelope(
                args.envelope_json,
                task_name=args.envelope.task_name,
                framework=args.envelope.framework,
                queue=args.envelope.queue,
            )
            now = float(row.created_at)
            return Begun(claim, (), now, granted_new.takeovers, stored, now, None)
        run, rows = self._folded.read_run_and_steps(conn, args.run_key)
        if run is None:  # not possible under the write lock; decide the usual way all the same
            return self._begin(conn, args)
        now = float(run.now)
        decision = decide_claim(run, now=now, owner=args.owner, lease_seconds=args.lease_seconds)
        if not isinstance(decision, Granted):
            return decision
        self._folded.write_claim(conn, args.run_key, {**args.claimed(decision, run.trace_context), "updated_at": now})
        stored = load_envelope(run.envelope, task_name=run.task_name, framework=run.framework, queue=run.queue)
        snapshot = tuple(step_row(r) for r in rows)
        claim = decision.claim(args.run_key)
        return Begun(
            claim, snapshot, now, decision.takeovers, stored, run.created_at, run.cancel_reason, run.trace_context
        )

    def _begin(self, conn: Connection, args: _StartArgs) -> BeginResult:
        """`begin` with the run's row locked all along (MySQL/MariaDB; PostgreSQL after a race)."""
        run = self._folded.lock_run(conn, args.run_key, args.envelope, args.envelope_json)
        now = float(run.now)
        decision = decide_claim(run, now=now, owner=args.owner, lease_seconds=args.lease_seconds)
        if not isinstance(decision, Granted):
            return decision
        claimed = {**args.claimed(decision, run.trace_context), "updated_at": now}
        snapshot = tuple(step_row(r) for r in self._folded.claim_and_snapshot(conn, args.run_key, claimed))
        stored = load_envelope(run.envelope, task_name=run.task_name, framework=run.framework, queue=run.queue)
        claim = decision.claim(args.run_key)
        return Begun(
            claim, snapshot, now, decision.takeovers, stored, run.created_at, run.cancel_reason, run.trace_context
        )

    def renew(self, claim: Claim, lease_seconds: float) -> Claim:
        """Extend the lease to the database's ``now + lease_seconds`` (C23), without waiting for a row lock.

        Fenced on ``(run_key, owner, attempt)``. PostgreSQL: one autocommitted
        ``UPDATE`` of the row a ``SELECT … FOR UPDATE NOWAIT`` locks, the
        clock read once it is locked. MySQL/MariaDB: one transaction of that
        locking read, the clock and the ``UPDATE``. SQLite: one ``BEGIN
        IMMEDIATE`` transaction (its lock is the whole database's: it waits,
        up to the busy timeout). A row another transaction holds (a
        transactional step's caller transaction, C42) is not waited for:
        [`RunLocked`][flexiq_plugins.errors.RunLocked], so the process's one renewer goes on renewing the
        other claims.

        Parameters:
          claim (Claim): the attempt's claim.
          lease_seconds (float): the new lease, in seconds from now.

        Raises:
          ClaimLost: another attempt holds the run (C25); nothing was written.
          RunLocked: the run's row is locked by another open transaction while
            the claim, as last committed, still holds it (PostgreSQL,
            MySQL/MariaDB); nothing was written: try again shortly.
          StoreUnavailable: the database cannot be reached.
        """
        if self._dialect == "sqlite":
            return self._write(lambda conn: self._renew_locked(conn, claim, lease_seconds))
        try:
            if self._dialect == "postgresql":
                return self._single_statement(lambda conn: self._renew_in_one(conn, claim, lease_seconds))
            return self._write(lambda conn: self._renew_nowait(conn, claim, lease_seconds))
        except StoreError as exc:
            if not is_lock_unavailable(exc.__cause__):
                raise
            refused = exc
        # InnoDB locks the row by its key before it reads the rest of the fence: a claim taken over is refused
        # the lock while the new owner's transaction holds the row. A plain read (the last committed row)
        # tells a lost claim (C25) from a held row.
        if not self._still_holds(claim):
            raise claim_lost(claim) from refused
        raise RunLocked(f"run {claim.run_key!r} is locked by another open transaction") from refused

    def _renew_locked(self, conn: Connection, claim: Claim, lease_seconds: float) -> Claim:
        until = self._now(conn) + lease_seconds
        self._fenced_update(conn, claim, lease_until=until)
        return dataclasses.replace(claim, lease_until=until)

    def _renew_in_one(self, conn: Connection, claim: Claim, lease_seconds: float) -> Claim:
        """PostgreSQL: ``UPDATE … WHERE run_key = (SELECT … fenced FOR UPDATE NOWAIT) RETURNING lease_until``."""
        runs = self._t.runs
        held = sa.select(runs.c.run_key).where(*self._fence_of(claim)).with_for_update(nowait=True)
        statement = (
            sa.update(runs)
            .where(runs.c.run_key == held.scalar_subquery())
            .values(lease_until=self._clock + lease_seconds)
            .returning(runs.c.lease_until)
        )
        until = conn.execute(statement).scalar_one_or_none()
        if until is None:
            raise claim_lost(claim)
        return dataclasses.replace(claim, lease_until=float(until))

    def _renew_nowait(self, conn: Connection, claim: Claim, lease_seconds: float) -> Claim:
        """MySQL/MariaDB: lock the fenced row without waiting (``FOR UPDATE NOWAIT``), then renew it."""
        runs = self._t.runs
        held = sa.select(runs.c.run_key).where(*self._fence_of(claim)).with_for_update(nowait=True)
        if conn.execute(held).first() is None:
            raise claim_lost(claim)
        return self._renew_locked(conn, claim, lease_seconds)

    def _fence_of(self, claim: Claim) -> list[sa.ColumnElement[bool]]:
        runs = self._t.runs
        return [runs.c[name] == value for name, value in fence(claim).items()]

    def _fenced_update(self, conn: Executes, claim: Claim, **values: Any) -> None:
        """Update the run only while ``claim`` holds it, else raise [`ClaimLost`][flexiq_plugins.errors.ClaimLost]
        (C25)."""
        runs = self._t.runs
        result = conn.execute(sa.update(runs).where(*self._fence_of(claim)).values(**values))
        if result.rowcount != 1:
            raise claim_lost(claim)

    # ------------------------------------------------------------ publishing
    def record_queued(self, run_key: str, job_id: str, envelope: JobEnvelope, delay_seconds: float = 0.0) -> None:
        """Record a job's run as ``queued``, unless the run exists (C39, C46); see `StepStore.record_queued`.

        One statement, an insert that does nothing on an existing run key
        (PostgreSQL and SQLite ``ON CONFLICT DO NOTHING``, MySQL/MariaDB an
        ``ON DUPLICATE KEY UPDATE`` of nothing), in one round trip on
        PostgreSQL (autocommitted); a transaction of that one statement
        elsewhere. An existing run's row is never changed; a row another
        transaction is writing is waited for.

        Raises:
          StoreUnavailable: the database cannot be reached.
          StoreError: the envelope is not JSON-compatible, or another database error.
        """
        params = {
            "p_run_key": run_key,
            "p_task_name": envelope.task_name,
            "p_framework": envelope.framework,
            "p_queue": envelope.queue,
            "p_envelope": dump_envelope(envelope),
            "p_job_id": job_id,
            "p_delay": max(delay_seconds, 0.0),
        }
        self._single_statement(lambda conn: self._folded.record_queued(conn, params))

    def note_durable_task(self, name: str, framework: str) -> None:
        """Note that the task takes steps, unless noted already (C43); see `StepStore.note_durable_task`.

        One insert-if-absent statement (autocommitted on PostgreSQL), its
        first-seen time the database's clock; an existing row is never changed.

        Raises:
          StoreUnavailable: the database cannot be reached.
        """
        values = {"framework": framework, "task_name": name, "first_seen": self._clock}
        statement = self._insert_if_absent(self._t.tasks, values, ("framework", "task_name"))
        self._single_statement(lambda conn: conn.execute(statement))

    # ----------------------------------------------------------------- steps
    def commit_step(self, claim: Claim, row: StepRow) -> StepRow:
        """Insert one step row and update the run's step totals (C5, C9).

        One transaction, fenced on the claim, in as few statements as the
        database allows (one on PostgreSQL: `folded`).

        Parameters:
          claim (Claim): the attempt's claim.
          row (StepRow): the step to store; ``committed_at`` and ``attempt`` are set here.

        Returns:
          StepRow: the stored row, ``committed_at`` on the database's clock.

        Raises:
          ClaimLost: another attempt holds the run, or the step key is already
            committed (C25); nothing was written.
          CancelRequested: the run's cancellation was requested; the row *is*
            committed and travels with it (C34).
          StoreUnavailable: the database cannot be reached.
        """

        written = self._single_statement(lambda conn: self._folded.commit_step(conn, claim, row))
        stored = StepRow(  # the row as stored: what a dataclasses.replace would give, without its field scan
            position=row.position,
            step_key=row.step_key,
            kind=row.kind,
            value=row.value,
            wake_at=row.wake_at,
            committed_at=written.now,
            attempt=claim.attempt,
            failure=row.failure,
            compensate=row.compensate,
            event_id=row.event_id,
        )
        if written.cancel_reason is not None:
            raise CancelRequested(written.cancel_reason, stored)
        return stored

    def commit_steps(self, claim: Claim, rows: Sequence[StepRow]) -> tuple[StepRow, ...]:
        """Insert several step rows and update the run's step totals once (C9, C51); see `StepStore.commit_steps`.

        One transaction, fenced on the claim, in the statements of one
        `commit_step` (one on PostgreSQL: `folded`), whatever the number of rows.

        Parameters:
          claim (Claim): the attempt's claim.
          rows (Sequence[StepRow]): the steps to store, at least one.

        Returns:
          tuple[StepRow, ...]: the stored rows, ``committed_at`` on the database's clock.

        Raises:
          ClaimLost: another attempt holds the run, or one of the keys is
            already committed (C25); nothing was written.
          CancelRequested: the run's cancellation was requested; the rows *are*
            committed and travel with it as a tuple (C34).
          StoreUnavailable: the database cannot be reached.
        """
        written = self._single_statement(lambda conn: self._folded.commit_steps(conn, claim, rows))
        stored = tuple(dataclasses.replace(row, committed_at=written.now, attempt=claim.attempt) for row in rows)
        if written.cancel_reason is not None:
            raise CancelRequested(written.cancel_reason, stored)
        return stored

    def commit_step_on(self, connection: CallerConnection, claim: Claim, row: StepRow) -> StepRow:
        """Write one step row in the caller's open transaction on ``connection`` (C42).

        The same statements as `commit_step` (the run's row updated,
        fenced on the claim, then the step row inserted), sent on the caller's
        connection and not committed here: they commit or roll back with the
        caller's transaction. The fenced update locks the run's row until then.
        A fence that matches nothing while this store still sees the claim held
        means the connection reaches another database.

        Parameters:
          connection (CallerConnection): the caller's connection, inside its transaction.
          claim (Claim): the attempt's claim.
          row (StepRow): the step to store.

        Raises:
          InvalidTransaction: the connection is to another database, or the
            store's tables are not there (another table prefix).
          ClaimLost: another attempt holds the run, or the step is already committed (C25).
          StoreError: the caller's connection reported another database error.
        """
        if family(connection.dialect_name) != family(self._dialect):
            raise self._elsewhere(connection, f"a {connection.dialect_name} database")
        try:
            return self._commit_step(connection, claim, row)
        except ClaimLost as exc:
            if isinstance(exc.__cause__, sa_exc.IntegrityError) or not self._still_holds(claim):
                raise
            raise self._elsewhere(connection, "a database where this run is not claimed") from exc
        except sa_exc.SQLAlchemyError as exc:
            if is_missing_table(exc):
                raise self._elsewhere(connection, "a database without the store's tables") from exc
            raise StoreError(
                f"step {row.step_key!r} could not be written on {connection.description}: {describe(exc)}"
            ) from exc

    def _elsewhere(self, connection: CallerConnection, what: str) -> InvalidTransaction:
        return InvalidTransaction(
            f"{connection.description} reaches {what}, not the step store's database ({self.url}, table "
            f"prefix {self._prefix!r}); a transactional step needs the store and the tables its body "
            "writes in one database: pass a connection to the store's database, or make it a plain step.run"
        )

    def _still_holds(self, claim: Claim) -> bool:
        """Whether the run as last committed is still ``claim``'s (a read that takes no lock)."""
        try:
            return holds(self.get_run(claim.run_key), claim)
        except UnknownRun:
            return False

    def _commit_step(self, conn: Executes, claim: Claim, row: StepRow, now: float | None = None) -> StepRow:
        runs = self._t.runs
        now = self._now(conn) if now is None else now
        self._fenced_update(
            conn,
            claim,
            step_count=runs.c.step_count + 1,
            step_bytes=runs.c.step_bytes + row.size,
            updated_at=now,
        )
        stored = dataclasses.replace(row, committed_at=now, attempt=claim.attempt)
        try:
            conn.execute(sa.insert(self._t.steps).values(run_key=claim.run_key, **step_values(stored)))
        except sa_exc.IntegrityError as exc:
            raise already_committed(claim, row.step_key) from exc
        return stored

    # --------------------------------------------------------- step attempts
    def begin_step_attempt(self, claim: Claim, step_key: str, max_attempts: int) -> StepAttemptBegin:
        """Journal a new attempt of ``step_key`` before its body runs, if its budget allows (C31).

        One transaction, fenced on the claim: open attempts become ``lost``,
        then `decide_step_attempt`
        decides on the database's clock and a started attempt is inserted.

        Parameters:
          claim (Claim): the attempt's claim.
          step_key (str): the step.
          max_attempts (int): the step's budget, the first attempt included.

        Raises:
          ClaimLost: another attempt holds the run (C25); nothing was written.
          StoreUnavailable: the database cannot be reached.
        """
        return self._write(lambda conn: self._begin_step_attempt(conn, claim, step_key, max_attempts))

    def _attempts_of(self, run_key: str, step_key: str) -> sa.ColumnElement[bool]:
        attempts = self._t.attempts
        return sa.and_(attempts.c.run_key == run_key, attempts.c.step_key == step_key)

    def _begin_step_attempt(self, conn: Connection, claim: Claim, step_key: str, max_attempts: int) -> StepAttemptBegin:
        attempts = self._t.attempts
        now = self._now(conn)
        self._fenced_update(conn, claim, updated_at=now)
        mine = self._attempts_of(claim.run_key, step_key)
        conn.execute(sa.update(attempts).where(mine, attempts.c.outcome.is_(None)).values(outcome="lost"))
        rows = conn.execute(sa.select(attempts).where(mine).order_by(attempts.c.number))
        decision = decide_step_attempt([step_attempt(r) for r in rows], now=now, max_attempts=max_attempts)
        if isinstance(decision, AttemptStarted):
            started = StepAttempt(claim.run_key, step_key, decision.number, claim.attempt, now)
            conn.execute(sa.insert(attempts).values(**attempt_values(started)))
        return decision

    def fail_step_attempt(
        self, claim: Claim, failure: StepAttemptFailure, *, row: StepRow | None = None
    ) -> StepAttemptFailed:
        """Record a failed step attempt and, for a step failed for good, commit its step row (C31).

        One transaction, fenced on the claim; ``failed_at`` and ``retry_at``
        are on the database's clock.

        Parameters:
          claim (Claim): the attempt's claim.
          failure (StepAttemptFailure): the attempt and its error.
          row (StepRow | None): the step row to commit with it.

        Raises:
          ClaimLost: another attempt holds the run, or ``row``'s key is already
            committed (C25); nothing was written.
          StoreUnavailable: the database cannot be reached.
        """
        return self._write(lambda conn: self._fail_step_attempt(conn, claim, failure, row))

    def _fail_step_attempt(
        self, conn: Connection, claim: Claim, failure: StepAttemptFailure, row: StepRow | None
    ) -> StepAttemptFailed:
        attempts = self._t.attempts
        now = self._now(conn)
        stored = self._commit_step(conn, claim, row, now) if row is not None else None
        if row is None:
            self._fenced_update(conn, claim, updated_at=now)
        mine = self._attempts_of(claim.run_key, failure.step_key)
        number = failure.number
        if number is None:
            last = sa.select(sa.func.coalesce(sa.func.max(attempts.c.number), 0)).where(mine)
            number = int(conn.execute(last).scalar_one()) + 1
        existing = conn.execute(sa.select(attempts).where(mine, attempts.c.number == number)).first()
        journaled = step_attempt(existing) if existing is not None else None
        attempt = failed_attempt(
            journaled or StepAttempt(claim.run_key, failure.step_key, number, claim.attempt, now), failure, now
        )
        if journaled is None:
            conn.execute(sa.insert(attempts).values(**attempt_values(attempt)))
        else:
            conn.execute(sa.update(attempts).where(mine, attempts.c.number == number).values(**attempt_values(attempt)))
        return StepAttemptFailed(attempt, stored)

    # ---------------------------------------------------------------- events
    def poll_event(self, claim: Claim, topic: str, key: str, deadline: float | None) -> EventPoll:
        """Look for the event a waiting step can receive (C33); see `StepStore.poll_event`.

        Two transactions, each fenced on the claim: the wait fields are
        recorded and committed first, so a sender that commits an event after
        the read below finds this run among its waiters.

        Parameters:
          claim (Claim): the attempt's claim.
          topic (str): the event's topic.
          key (str): the event's key.
          deadline (float | None): when the wait times out, epoch seconds (``None``: never).

        Raises:
          ClaimLost: another attempt holds the run (C25).
          CancelRequested: the run's cancellation was requested (C34); nothing was written.
          StoreUnavailable: the database cannot be reached.
        """

        def arm(conn: Connection) -> None:
            _, cancel = self._clock_and_cancel(conn, claim.run_key)
            if cancel is not None:
                raise CancelRequested(cancel)
            self._fenced_update(conn, claim, wait_topic=topic, wait_key=key)

        def poll(conn: Connection) -> EventPoll:
            runs = self._t.runs
            run = conn.execute(sa.select(runs.c.created_at).where(runs.c.run_key == claim.run_key)).one()
            result = poll_result(
                self._next_event(conn, claim.run_key, run.created_at, topic, key), self._now(conn), deadline
            )
            if result.event is not None or result.timed_out:
                self._fenced_update(conn, claim, wait_topic=None, wait_key=None)
            return result

        self._write(arm)
        return self._write(poll)

    def _clock_and_cancel(self, conn: Connection, run_key: str) -> tuple[float, str | None]:
        """The database's clock and the run's requested cancellation, in the one statement that read the clock."""
        runs = self._t.runs
        query = sa.select(self._clock.label("now"), runs.c.cancel_reason).where(runs.c.run_key == run_key)
        row = conn.execute(query).first()
        return (self._now(conn), None) if row is None else (float(row.now), row.cancel_reason)

    # --------------------------------------------------------- ends of a run
    def finish(
        self,
        claim: Claim,
        status: RunStatus,
        *,
        drop_steps: bool = False,
        dead_letter: NewDeadLetter | None = None,
        wake_at: float | None = None,
        outcome: bytes | None = None,
    ) -> None:
        """End the attempt: set ``status`` and release the claim (C26, C27, C30, C37).

        One transaction, fenced on the claim.

        Parameters:
          claim (Claim): the attempt's claim.
          status (str): ``sleeping``, ``retrying``, ``succeeded``, ``failed``,
            ``dead``, ``cancelled`` or ``compensated``.
          drop_steps (bool): delete the run's step rows and step attempts (C27).
          dead_letter (NewDeadLetter | None): record a dead letter carrying the
            run's envelope (C30).
          wake_at (float | None): the run's wake time when ``sleeping``, epoch seconds (C35).
          outcome (bytes | None): the run's outcome, written in the same
            ``UPDATE`` as the status (C37); ``None`` clears it.

        Raises:
          ClaimLost: another attempt holds the run (C25); nothing was written.
          StoreUnavailable: the database cannot be reached.
        """

        values: dict[str, Any] = {
            "status": status,
            "owner": None,
            "lease_until": None,
            "wake_at": wake_at,
            "outcome": outcome,
        }
        if drop_steps:
            values.update(step_count=0, step_bytes=0)
        if self._dialect == "postgresql" and dead_letter is None:  # one statement, autocommitted
            self._single_statement(lambda conn: self._folded.finish_in_one(conn, claim, values, drop_steps))
            return

        def work(conn: Connection) -> None:
            if dead_letter is None and self._folded.finish_on_driver(conn, claim, values, drop_steps):
                return
            self._folded.finish(conn, claim, values, dead_letter)
            if drop_steps:
                steps, attempts = self._t.steps, self._t.attempts
                conn.execute(sa.delete(steps).where(steps.c.run_key == claim.run_key))
                conn.execute(sa.delete(attempts).where(attempts.c.run_key == claim.run_key))

        self._write(work)

    def start_compensation(self, run_key: str, marker: StepRow, *, status: str, attempt: int) -> bool:
        """Turn a run that is not running into one that compensates at its next delivery (C32).

        One transaction: a compare-and-set on ``status``, ``attempt`` and an
        unheld claim; then ``marker`` is inserted after the last step and the
        run becomes ``pending``.

        Parameters:
          run_key (str): the run.
          marker (StepRow): the ``compensation`` row; its position is chosen here.
          status (str): the status the run must have.
          attempt (int): the attempt number the run must be at.

        Returns:
          bool: whether it applied.

        Raises:
          StoreUnavailable: the database cannot be reached.
        """
        return self._write(lambda conn: self._start_compensation(conn, run_key, marker, status, attempt))

    def _start_compensation(self, conn: Connection, run_key: str, marker: StepRow, status: str, attempt: int) -> bool:
        runs, steps = self._t.runs, self._t.steps
        now = self._now(conn)
        held = (runs.c.run_key == run_key, runs.c.status == status, runs.c.attempt == attempt, runs.c.owner.is_(None))
        changed = conn.execute(
            sa.update(runs)
            .where(*held)
            .values(
                status="pending",
                step_count=runs.c.step_count + 1,
                step_bytes=runs.c.step_bytes + marker.size,
                updated_at=now,
            )
        )
        if changed.rowcount != 1:
            return False
        last = sa.select(sa.func.coalesce(sa.func.max(steps.c.position), -1)).where(steps.c.run_key == run_key)
        position = int(conn.execute(last).scalar_one()) + 1
        stored = dataclasses.replace(marker, position=position, committed_at=now, attempt=attempt)
        conn.execute(sa.insert(steps).values(run_key=run_key, **step_values(stored)))
        return True

    def settle_failed(self, run_key: str, attempt: int) -> bool:
        """Mark a ``retrying`` run ``failed`` once the framework gives up.

        One transaction; applies only while the run is ``retrying`` at ``attempt``.

        Parameters:
          run_key (str): the run.
          attempt (int): the attempt that ended ``retrying``.

        Returns:
          bool: whether the run was marked ``failed``.

        Raises:
          StoreUnavailable: the database cannot be reached.
        """
        runs = self._t.runs

        def work(conn: Connection) -> bool:
            result = conn.execute(
                sa.update(runs)
                .where(runs.c.run_key == run_key, runs.c.status == "retrying", runs.c.attempt == attempt)
                .values(status="failed", updated_at=self._now(conn))
            )
            return result.rowcount == 1

        return self._write(work)

    def release_run(
        self, run_key: str, status: RunStatus, *, while_status: Collection[str], outcome: bytes | None = None
    ) -> bool:
        """Set the run's ``status`` and release its claim if its status is one of ``while_status`` (C38).

        One transaction, one conditional ``UPDATE``: the claim and the wake
        time are cleared, ``outcome`` is written (C37), no takeover counted.

        Parameters:
          run_key (str): the run.
          status (str): the new status: ``failed``, ``cancelled`` or ``pending``.
          while_status (Collection[str]): the statuses it applies from.
          outcome (bytes | None): the run's outcome, written with the status (``None`` clears it).

        Returns:
          bool: whether it applied.

        Raises:
          StoreUnavailable: the database cannot be reached.
        """
        runs = self._t.runs
        where = (runs.c.run_key == run_key, runs.c.status.in_(sorted(while_status)))
        return self._write(lambda conn: self._release_where(conn, where, status, outcome))

    def _release_where(
        self, conn: Connection, where: tuple[sa.ColumnElement[bool], ...], status: str, outcome: bytes | None
    ) -> bool:
        """Set ``status`` on the run matching ``where``, its claim and wake time cleared; whether it did."""
        runs = self._t.runs
        result = conn.execute(
            sa.update(runs)
            .where(*where)
            .values(status=status, owner=None, lease_until=None, wake_at=None, outcome=outcome)
            .values(updated_at=self._now(conn))
        )
        return result.rowcount == 1

    def dead_letter_unstarted(self, run_key: str, dead_letter: NewDeadLetter, *, outcome: bytes | None = None) -> bool:
        """Dead-letter a run no attempt started, whose message the framework dropped (C30, C38, C39).

        One transaction: a conditional ``UPDATE`` to ``dead`` with the claim
        and wake time cleared and ``outcome`` written, then, if it applied,
        the dead letter copied from the run (task, envelope, the update's
        clock stamp). The ``UPDATE`` applies to a run ``queued`` or
        ``pending`` with ``attempt`` 0, or to a retried dead letter no attempt
        started since its retry: ``pending``, unowned, and an ``EXISTS`` on
        the dead-letter table finds one of the run's dead letters whose
        ``retried_at`` equals the run's ``updated_at`` (``prepare_retry``
        writes both from one clock reading; a later start, put-back or
        recovery stamps ``updated_at`` anew). Equal, not "not earlier": a
        started run put back while the database's clock was stepped back
        must not match. MySQL/MariaDB accept the subquery: it reads another
        table than the one updated.

        Parameters:
          run_key (str): the run.
          dead_letter (NewDeadLetter): the dead letter to record.
          outcome (bytes | None): the run's outcome (``None`` clears it, C37).

        Returns:
          bool: whether it applied.

        Raises:
          StoreUnavailable: the database cannot be reached.
        """
        runs, dead = self._t.runs, self._t.dead
        retried_since = sa.exists().where(dead.c.run_key == run_key, dead.c.retried_at == runs.c.updated_at)
        retried_unstarted = sa.and_(runs.c.status == "pending", runs.c.owner.is_(None), retried_since)
        where = (
            runs.c.run_key == run_key,
            runs.c.status.in_(sorted(UNSTARTED_STATUSES)),
            sa.or_(runs.c.attempt == 0, retried_unstarted),
        )

        def work(conn: Connection) -> bool:
            if not self._release_where(conn, where, "dead", outcome):
                return False
            self._folded.add_dead_letter(conn, run_key, dead_letter)
            return True

        return self._write(work)

    def request_cancel(self, run_key: str, reason: str) -> RunRecord:
        """Record that ``run_key`` is to be cancelled with ``reason`` (C34); see `StepStore.request_cancel`.

        Raises:
          UnknownRun: no run has ``run_key``.
          StoreUnavailable: the database cannot be reached.
        """
        runs = self._t.runs

        def work(conn: Connection) -> RunRecord:
            run = conn.execute(sa.select(runs).where(runs.c.run_key == run_key).with_for_update()).first()
            if run is None:
                raise UnknownRun(f"no run has the run key {run_key!r}")
            if run.status in TERMINAL_STATUSES or run.cancel_reason is not None:
                return run_record(run)
            conn.execute(sa.update(runs).where(runs.c.run_key == run_key).values(cancel_reason=reason))
            return dataclasses.replace(run_record(run), cancel_reason=reason)

        return self._write(work)

    def settle_cancelled(self, run_key: str, *, status: str, attempt: int, outcome: bytes | None = None) -> bool:
        """End a run no attempt holds as ``cancelled`` (C34): a compare-and-set on its locked row.

        Parameters:
          run_key (str): the run.
          status (str): the status it must still have.
          attempt (int): the attempt it must still be at.
          outcome (bytes | None): the run's outcome, written with the status (C37).

        Returns:
          bool: whether it applied.

        Raises:
          StoreUnavailable: the database cannot be reached.
        """
        runs = self._t.runs

        def work(conn: Connection) -> bool:
            run = conn.execute(sa.select(runs).where(runs.c.run_key == run_key).with_for_update()).first()
            now = self._now(conn)
            if run is None or not may_settle_cancelled(run, status=status, attempt=attempt, now=now):
                return False
            ended = {"status": "cancelled", "owner": None, "lease_until": None, "wake_at": None, "updated_at": now}
            conn.execute(sa.update(runs).where(runs.c.run_key == run_key).values(**ended, outcome=outcome))
            return True

        return self._write(work)
