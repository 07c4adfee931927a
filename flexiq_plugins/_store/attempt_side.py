"""The store as an attempt and its delivery use it: claims, fenced step writes, the ends of a run.

Everything a worker asks of the store while it delivers a job: the claim and
snapshot at the start (`AttemptStore.begin`), the lease, the step rows
and step attempts written under the claim (each fenced on it, C25), the wait
for an event, the end of the attempt, and the ends a framework gives a job
outside an attempt (given up, revoked, dropped unregistered: C38), besides
the run a producer records when it publishes the job (C39). An operator's
side is `OperatorStore`; both
extend `StoreReads` (the store's clock, a
run, its step rows) and [`StepStore`][flexiq_plugins.StepStore] is both.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import TYPE_CHECKING

from .._model.records import (
    BeginResult,
    Claim,
    EventPoll,
    JobEnvelope,
    NewDeadLetter,
    RunRecord,
    RunStatus,
    StepAttemptBegin,
    StepAttemptFailed,
    StepAttemptFailure,
    StepRow,
)
from ..errors import InvalidTransaction
from .reads import StoreReads

if TYPE_CHECKING:
    from .caller import CallerConnection

__all__ = ["AttemptStore"]


class AttemptStore(StoreReads):
    """What an attempt and its delivery ask of the store (see the module docstring).

    ``request_cancel`` is here though an operator's ``cancel_run`` calls it
    too: an attempt whose body cancels its run records the reason with it,
    and every cancellation, a framework's or an operator's, goes through
    `cancel`, which settles the
    run with this interface's writes.
    """

    # ------------------------------------------------- claims and publishing
    @abc.abstractmethod
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

        One transaction. Creates the run (status ``running``) if it does not
        exist, storing ``envelope``. Then, reading the store's clock ``now``:

        - status terminal → `Finished`, nothing written;
        - a claim is held and ``lease_until > now`` → `Busy`, nothing
          written;
        - otherwise the run is claimed: ``attempt += 1``, ``owner = owner``,
          ``lease_until = now + lease_seconds``, status ``running``, job id
          updated. If the previous claim was still held (its lease expired:
          its worker died) ``takeovers += 1``. Returns `Begun` with
          every step row, the run's ``created_at`` and its requested
          cancellation (C34).

        ``lease_seconds`` is in seconds. A granted claim also stores
        ``trace_context`` (the attempt's W3C ``traceparent``, C53) if the run
        has none yet, in the same write; `Begun.trace_context` is the one
        stored before. Callers pass it only when tracing, so a store written
        before C53 keeps working untraced.
        """

    @abc.abstractmethod
    def renew(self, claim: Claim, lease_seconds: float) -> Claim:
        """Extend the claim's lease to ``now + lease_seconds`` (store clock).

        One transaction, fenced on ``(run_key, owner, attempt)``: raises
        [`ClaimLost`][flexiq_plugins.errors.ClaimLost] if the claim is no longer the
        run's. Returns the renewed claim.
        """

    @abc.abstractmethod
    def record_queued(self, run_key: str, job_id: str, envelope: JobEnvelope, delay_seconds: float = 0.0) -> None:
        """Record a run as ``queued`` when its job is published, before the message leaves (C39, C46).

        One statement: inserts the run (status ``queued``, attempt 0, no
        claim, ``envelope`` and ``job_id`` stored, ``wake_at`` = ``now +
        delay_seconds`` on the store's clock: when the job is due to start)
        only if no run has this key; an existing run, whatever its status, is
        left exactly as it is (a job published with a producer-chosen or
        derived key that names an existing run never resets it, C44).
        `begin` then claims a ``queued`` run like a ``pending`` one.

        Parameters:
          run_key (str): the new job's run key (at most 255 characters).
          job_id (str): the framework's job id.
          envelope (JobEnvelope): what re-publishes the job (C35); JSON-compatible.
          delay_seconds (float): how long after now the job is due (a countdown or ETA), seconds.
        """

    @abc.abstractmethod
    def note_durable_task(self, name: str, framework: str) -> None:
        """Note that the task ``name`` of ``framework`` takes steps: the first attempt of it that does calls it (C43).

        One statement: inserts ``(name, framework)`` with the store's clock as
        its first-seen time only if it is not there; a task noted already is
        left exactly as it is. Producers and workers read the known tasks
        back ([`durable_tasks`][flexiq_plugins.StepStore.durable_tasks]) to
        decide which tasks are recorded at publish (C39) and, on Celery,
        acknowledged late (C26).

        Parameters:
          name (str): the task or actor name (at most 255 characters).
          framework (str): the framework's name (``"celery"``, ``"dramatiq"``).
        """

    # ------------------------------------------------------------- steps
    @abc.abstractmethod
    def commit_step(self, claim: Claim, row: StepRow) -> StepRow:
        """Insert one step row (C5, C9).

        One transaction, fenced: the row is inserted only while the run's
        ``(owner, attempt)`` are the claim's; otherwise
        [`ClaimLost`][flexiq_plugins.errors.ClaimLost] and nothing is written. The
        run's step count and byte total are updated in the same transaction.
        Returns the row with ``committed_at`` set.

        If the run's cancellation was requested (`request_cancel`), the
        row is committed all the same and
        [`CancelRequested`][flexiq_plugins.errors.CancelRequested] is raised after the
        transaction, carrying the stored row (C34): the attempt sees the
        cancellation at this step boundary with no extra statement.
        """

    @abc.abstractmethod
    def commit_steps(self, claim: Claim, rows: Sequence[StepRow]) -> tuple[StepRow, ...]:
        """Insert several step rows together: the items of a step map that finished together (C9, C51).

        One transaction, fenced like `commit_step`: all the rows are inserted
        while the run's ``(owner, attempt)`` are the claim's, or none is
        ([`ClaimLost`][flexiq_plugins.errors.ClaimLost]), and none if one of
        their keys is already committed or repeated among them (``ClaimLost``
        too). The run's step count and byte total grow by all of them in the
        same transaction. Returns the rows in the order given, each with the
        same ``committed_at`` and the claim's attempt.

        A requested cancellation is reported as by `commit_step`: the rows
        are committed all the same and
        [`CancelRequested`][flexiq_plugins.errors.CancelRequested] carries them
        as a tuple in its ``row`` (C34).

        Parameters:
          claim (Claim): the attempt's claim.
          rows (Sequence[StepRow]): at least one row, positions as the journal gave them.
        """

    def commit_step_on(self, connection: CallerConnection, claim: Claim, row: StepRow) -> StepRow:
        """Insert one step row on the caller's ``connection``, inside its open transaction (C42).

        Fenced like `commit_step`, but nothing is committed here: the row
        (and the run's step totals) commit or roll back with the caller's
        transaction, together with the writes the step's body made in it. The
        caller's connection must reach the store's own database.

        Raises:
          InvalidTransaction: this store cannot share a transaction (the
            default), or ``connection`` reaches another database.
          ClaimLost: another attempt holds the run (C25); nothing was written.
        """
        raise InvalidTransaction(
            f"{type(self).__name__} cannot commit a step in {connection.description}'s transaction; "
            "transactional steps need a SQL store in the same database as the business tables"
        )

    @abc.abstractmethod
    def begin_step_attempt(self, claim: Claim, step_key: str, max_attempts: int) -> StepAttemptBegin:
        """Journal a new attempt of ``step_key`` before its body runs, if its budget allows (C31).

        One transaction, fenced on the claim (else
        [`ClaimLost`][flexiq_plugins.errors.ClaimLost], nothing written). The
        step's attempts that have not ended belonged to attempts that are
        over (their worker died, their claim was lost): they become ``lost``.
        Then, by `decide_step_attempt`
        on the store's clock: `AttemptNotDue` if the last attempt
        ``failed`` with a ``retry_at`` still ahead; `AttemptsSpent` if
        ``max_attempts`` attempts exist; else attempt ``count + 1`` is
        inserted (``run_attempt = claim.attempt``, ``started_at = now``) and
        `AttemptStarted` returned.
        """

    @abc.abstractmethod
    def fail_step_attempt(
        self, claim: Claim, failure: StepAttemptFailure, *, row: StepRow | None = None
    ) -> StepAttemptFailed:
        """Record a failed step attempt and, for a step failed for good, commit its step row (C31).

        One transaction, fenced on the claim (else
        [`ClaimLost`][flexiq_plugins.errors.ClaimLost], nothing written). The
        attempt ``failure.number`` (a new one numbered ``count + 1`` when
        ``None`` or absent) gets how it ended, the error, ``failed_at = now``
        and ``retry_at = now + retry_delay``. With ``row`` the step row is
        inserted as `commit_step` does (raising ``ClaimLost`` if its
        key is already committed).
        """

    # -------------------------------------------------------------- events
    @abc.abstractmethod
    def poll_event(self, claim: Claim, topic: str, key: str, deadline: float | None) -> EventPoll:
        """Look for the event a waiting step can receive, for an attempt at ``step.wait_for_event`` (C33).

        Two transactions, each fenced on the claim (else
        [`ClaimLost`][flexiq_plugins.errors.ClaimLost], nothing written):

        1. record on the run that it waits on ``(topic, key)`` (``wait_topic``,
           ``wait_key``) and commit, so a sender that commits an event from
           now on finds the run among its waiters (`OperatorStore.add_event`); if the
           run's cancellation was requested, nothing is written and
           [`CancelRequested`][flexiq_plugins.errors.CancelRequested] is raised (C34);
        2. read the first event the run can receive (the rule of
           `OperatorStore.next_event`). With one, or with none and ``deadline <= now``
           (``timed_out``), the run's wait fields are cleared again.

        Nothing is consumed here: an event counts as received once an
        ``event`` row holding its id is committed (`commit_step`).
        ``deadline`` is epoch seconds, store clock (``None``: no timeout).
        """

    # ------------------------------------------------------- ends of a run
    @abc.abstractmethod
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
        """End the attempt: set ``status`` and release the claim.

        One transaction, fenced on the claim (else
        [`ClaimLost`][flexiq_plugins.errors.ClaimLost], nothing written). With
        ``drop_steps`` the run's step rows and step attempts are deleted (C27); with
        ``dead_letter`` a dead letter is recorded carrying the run's envelope
        (C30). ``status`` is one of ``sleeping``, ``retrying``, ``succeeded``,
        ``failed``, ``dead``, ``cancelled``, ``compensated``. ``wake_at`` (epoch seconds) is
        recorded as the run's wake time (``None`` clears it): a ``sleeping``
        run's, so recovery can decide on it (C35). ``outcome`` (opaque bytes)
        is written in the same statement as the status (``None`` clears it): a
        terminal run's outcome, which `begin` hands to a duplicate in
        `Finished` (C37).
        """

    @abc.abstractmethod
    def start_compensation(self, run_key: str, marker: StepRow, *, status: str, attempt: int) -> bool:
        """Turn a run that is not running into one that compensates at its next delivery (C32).

        One transaction: applies only while the run has ``status``, its last
        attempt is ``attempt`` and no claim is held (a compare-and-set, so a
        new delivery that started meanwhile wins). It then inserts ``marker``
        (a ``compensation`` row) after the run's last step, whatever
        ``marker.position`` says, and sets the status to ``pending``. Returns
        whether it applied.
        """

    @abc.abstractmethod
    def settle_failed(self, run_key: str, attempt: int) -> bool:
        """Mark a ``retrying`` run ``failed`` once the framework gives up.

        One transaction; only applies while the run is ``retrying`` at
        ``attempt`` (no newer attempt started). Returns whether it applied.
        """

    @abc.abstractmethod
    def release_run(
        self, run_key: str, status: RunStatus, *, while_status: Collection[str], outcome: bytes | None = None
    ) -> bool:
        """Set the run's ``status`` and release its claim, whoever holds it, if its status is one of ``while_status``.

        For the framework's own ends of a job (C38): a run whose job the
        framework revoked, timed out or gave up is settled ``failed`` or
        ``cancelled`` from any status that is not terminal; a run whose worker
        shut down in the middle of a step goes back to ``pending`` from
        ``running``. One transaction; the claim (owner, lease) and the wake
        time are cleared, ``outcome`` is written with the status (``None``
        clears it, C37), no takeover is counted, steps are kept. A write of
        the attempt that held the claim is then fenced out (C25). Returns
        whether it applied (``False`` for an unknown run).
        """

    @abc.abstractmethod
    def dead_letter_unstarted(self, run_key: str, dead_letter: NewDeadLetter, *, outcome: bytes | None = None) -> bool:
        """Dead-letter a run that no attempt started, whose message the framework dropped (C30, C38, C39).

        For a job recorded at publish (or re-published by a dead-letter
        retry) that a worker discarded without running it, e.g. a Celery
        task or Dramatiq actor the worker does not have. One transaction;
        applies only while no attempt started the run:

        - it is ``queued`` or ``pending`` with ``attempt`` 0 (no attempt ever
          claimed it); or
        - it is a retried dead letter no attempt started since its retry,
          like a freshly published job: ``pending``, no owner, and one of its
          dead letters has ``retried_at`` equal to the run's ``updated_at``
          (`OperatorStore.prepare_retry` writes both from one reading of the store's
          clock; an attempt's start, a put-back, a recovery and every other
          change of the run's state stamp ``updated_at`` anew, a cancellation
          request alone does not). The attempt count is kept: attempt
          numbers fence claims and never go back.

        A run a delivery has started is never touched (a late copy of its
        message cannot harm it), nor one recovery re-published since its
        retry (`OperatorStore.mark_recovered` moves ``updated_at``). The run becomes
        ``dead`` with its claim and wake time cleared, ``outcome`` written
        with the status (C37), steps kept, and ``dead_letter`` recorded
        carrying the run's envelope (C30).

        Parameters:
          run_key (str): the run.
          dead_letter (NewDeadLetter): the dead letter to record.
          outcome (bytes | None): the run's outcome (``None`` clears it).

        Returns:
          bool: whether it applied (``False`` for a started, terminal or unknown run).
        """

    @abc.abstractmethod
    def request_cancel(self, run_key: str, reason: str) -> RunRecord:
        """Record that ``run_key`` is to be cancelled with ``reason``; return the run as it is now (C34).

        One transaction. A run that is not terminal gets ``cancel_reason``
        (the first reason given is kept); nothing else changes: an attempt
        holding the run sees the request at its next step boundary
        (`commit_step`), the next one to claim it at `begin`. A
        terminal run is returned unchanged.

        Raises:
          UnknownRun: no run has ``run_key``.
        """

    @abc.abstractmethod
    def settle_cancelled(self, run_key: str, *, status: str, attempt: int, outcome: bytes | None = None) -> bool:
        """End a run that no attempt holds as ``cancelled`` (C34); return whether it applied.

        One transaction, a compare-and-set: applies only while the run has
        ``status``, its last attempt is ``attempt`` and no live claim holds
        it (none, or its lease expired). The status becomes ``cancelled``;
        the claim and the wake time are cleared, and ``outcome`` is written
        with the status (C37), so a wake-up message that arrives later finds
        a finished run and replays it (C26, C37).
        """

    # --------------------------------------- the attempt's clock and connection
    def local_clock(self) -> Callable[[], float] | None:
        """The store's clock as a cheap local function, when it has one (the memory store); else ``None``.

        An attempt then reads time from it exactly, instead of estimating the
        store's clock from the offset it saw when it claimed the run.
        """
        return None

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Keep one connection for the calling thread's store calls inside the ``with`` block.

        An attempt's driver enters it around the attempt (its start, steps and
        finish), so a SQL store checks one connection out of its pool for the
        whole attempt instead of one per call. Re-entrant; only the calling
        thread's calls use the held connection (a lease thread or the sweeper
        keep using the pool). The connection goes back to the pool when the
        outermost block exits, however it exits. A no-op here (the memory store
        has no connections).

        Yields:
          None.
        """
        yield
