"""The interface between the core and durable storage.

A store keeps the records of :mod:`flexiq_plugins._model.records`: runs, step
rows, step attempts, dead letters and events. Every
method states its atomicity and its fencing; both
implementations (:class:`~flexiq_plugins.MemoryStepStore`,
:class:`~flexiq_plugins.SqlStepStore`) pass one contract test suite.

Times are ``float`` seconds since the epoch **on the store's clock** (C23): a
SQL store reads the database's clock inside the same transaction, so a worker
whose own clock is skewed can neither take a live claim nor extend a sleep.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import InvalidTransaction

if TYPE_CHECKING:
    from .caller import CallerConnection

from .._model.records import (
    BeginResult,
    Claim,
    DeadLetterRecord,
    EventPoll,
    EventRecord,
    JobEnvelope,
    NewDeadLetter,
    RunRecord,
    RunStatus,
    SentEvent,
    StepAttempt,
    StepAttemptBegin,
    StepAttemptFailed,
    StepAttemptFailure,
    StepRow,
)

__all__ = ["StepStore"]


class StepStore(abc.ABC):
    """Durable storage for runs, step rows and dead letters.

    Implementations must be safe to share between threads of one process and,
    for SQL, between processes (each process opens its own connections; a
    forked child never reuses its parent's). Errors from the storage engine are
    translated here: connection loss and timeouts raise
    :class:`~flexiq_plugins.errors.StoreUnavailable`.
    """

    # ------------------------------------------------------------- attempts
    @abc.abstractmethod
    def begin(
        self,
        run_key: str,
        job_id: str,
        envelope: JobEnvelope,
        owner: str,
        lease_seconds: float,
    ) -> BeginResult:
        """Claim the run for a new attempt and read its snapshot (C23–C26).

        One transaction. Creates the run (status ``running``) if it does not
        exist, storing ``envelope``. Then, reading the store's clock ``now``:

        - status terminal → :class:`Finished`, nothing written;
        - a claim is held and ``lease_until > now`` → :class:`Busy`, nothing
          written;
        - otherwise the run is claimed: ``attempt += 1``, ``owner = owner``,
          ``lease_until = now + lease_seconds``, status ``running``, job id
          updated. If the previous claim was still held (its lease expired:
          its worker died) ``takeovers += 1``. Returns :class:`Begun` with
          every step row, the run's ``created_at`` and its requested
          cancellation (C34).

        ``lease_seconds`` is in seconds.
        """

    @abc.abstractmethod
    def record_queued(self, run_key: str, job_id: str, envelope: JobEnvelope, delay_seconds: float = 0.0) -> None:
        """Record a run as ``queued`` when its job is published, before the message leaves (C39).

        One small transaction: inserts the run (status ``queued``, attempt 0,
        no claim, ``envelope`` and ``job_id`` stored, ``wake_at`` = ``now +
        delay_seconds`` on the store's clock: when the job is due to start)
        only if no run has this key; an existing run is left exactly as it
        is (a new job with an existing run key never resets it).
        :meth:`begin` then claims a ``queued`` run like a ``pending`` one.

        Parameters:
          run_key(str): the new job's run key (at most 255 characters).
          job_id(str): the framework's job id.
          envelope(JobEnvelope): what re-publishes the job (C35); JSON-compatible.
          delay_seconds(float): how long after now the job is due (a countdown or ETA), seconds.
        """

    @abc.abstractmethod
    def acquire_sweep_lease(self, owner: str, lease_seconds: float, *, name: str = "recovery") -> bool:
        """Take or renew the recovery lease ``name``, so one sweep runs at a time across all workers (C39).

        One transaction on the store's clock: the lease is granted (to
        ``now + lease_seconds``) if nobody holds it, ``owner`` already holds
        it, or its holder's lease has expired; otherwise nothing changes.

        Parameters:
          owner(str): the sweeping process's id.
          lease_seconds(float): how long the lease lasts without renewal, seconds.
          name(str): which lease (at most 64 characters): sweepers that
            publish for different frameworks hold different leases.

        Returns:
          bool: whether ``owner`` holds the lease now.
        """

    @abc.abstractmethod
    def release_sweep_lease(self, owner: str, *, name: str = "recovery") -> None:
        """Give the recovery lease ``name`` up if ``owner`` holds it (a worker shutting down); else do nothing."""

    @abc.abstractmethod
    def renew(self, claim: Claim, lease_seconds: float) -> Claim:
        """Extend the claim's lease to ``now + lease_seconds`` (store clock).

        One transaction, fenced on ``(run_key, owner, attempt)``: raises
        :class:`~flexiq_plugins.errors.ClaimLost` if the claim is no longer the
        run's. Returns the renewed claim.
        """

    @abc.abstractmethod
    def commit_step(self, claim: Claim, row: StepRow) -> StepRow:
        """Insert one step row (C5, C9).

        One transaction, fenced: the row is inserted only while the run's
        ``(owner, attempt)`` are the claim's; otherwise
        :class:`~flexiq_plugins.errors.ClaimLost` and nothing is written. The
        run's step count and byte total are updated in the same transaction.
        Returns the row with ``committed_at`` set.

        If the run's cancellation was requested (:meth:`request_cancel`), the
        row is committed all the same and
        :class:`~flexiq_plugins.errors.CancelRequested` is raised after the
        transaction, carrying the stored row (C34): the attempt sees the
        cancellation at this step boundary with no extra statement.
        """

    def commit_step_on(self, connection: CallerConnection, claim: Claim, row: StepRow) -> StepRow:
        """Insert one step row on the caller's ``connection``, inside its open transaction (C42).

        Fenced like :meth:`commit_step`, but nothing is committed here: the row
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
        :class:`~flexiq_plugins.errors.ClaimLost`, nothing written). With
        ``drop_steps`` the run's step rows and step attempts are deleted (C27); with
        ``dead_letter`` a dead letter is recorded carrying the run's envelope
        (C30). ``status`` is one of ``sleeping``, ``retrying``, ``succeeded``,
        ``failed``, ``dead``, ``cancelled``, ``compensated``. ``wake_at`` (epoch seconds) is
        recorded as the run's wake time (``None`` clears it): a ``sleeping``
        run's, so recovery can decide on it (C35). ``outcome`` (opaque bytes)
        is written in the same statement as the status (``None`` clears it): a
        terminal run's outcome, which :meth:`begin` hands to a duplicate in
        :class:`Finished` (C37).
        """

    @abc.abstractmethod
    def begin_step_attempt(self, claim: Claim, step_key: str, max_attempts: int) -> StepAttemptBegin:
        """Journal a new attempt of ``step_key`` before its body runs, if its budget allows (C31).

        One transaction, fenced on the claim (else
        :class:`~flexiq_plugins.errors.ClaimLost`, nothing written). The
        step's attempts that have not ended belonged to attempts that are
        over (their worker died, their claim was lost): they become ``lost``.
        Then, by :func:`~flexiq_plugins._store.step_attempts.decide_step_attempt`
        on the store's clock: :class:`AttemptNotDue` if the last attempt
        ``failed`` with a ``retry_at`` still ahead; :class:`AttemptsSpent` if
        ``max_attempts`` attempts exist; else attempt ``count + 1`` is
        inserted (``run_attempt = claim.attempt``, ``started_at = now``) and
        :class:`AttemptStarted` returned.
        """

    @abc.abstractmethod
    def fail_step_attempt(
        self, claim: Claim, failure: StepAttemptFailure, *, row: StepRow | None = None
    ) -> StepAttemptFailed:
        """Record a failed step attempt and, for a step failed for good, commit its step row (C31).

        One transaction, fenced on the claim (else
        :class:`~flexiq_plugins.errors.ClaimLost`, nothing written). The
        attempt ``failure.number`` (a new one numbered ``count + 1`` when
        ``None`` or absent) gets how it ended, the error, ``failed_at = now``
        and ``retry_at = now + retry_delay``. With ``row`` the step row is
        inserted as :meth:`commit_step` does (raising ``ClaimLost`` if its
        key is already committed).
        """

    @abc.abstractmethod
    def get_step_attempts(self, run_key: str) -> list[StepAttempt]:
        """Return the run's step attempts, ordered by ``started_at`` then number (empty if none)."""

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
          (:meth:`prepare_retry` writes both from one reading of the store's
          clock; an attempt's start, a put-back, a recovery and every other
          change of the run's state stamp ``updated_at`` anew, a cancellation
          request alone does not). The attempt count is kept: attempt
          numbers fence claims and never go back.

        A run a delivery has started is never touched (a late copy of its
        message cannot harm it), nor one recovery re-published since its
        retry (:meth:`mark_recovered` moves ``updated_at``). The run becomes
        ``dead`` with its claim and wake time cleared, ``outcome`` written
        with the status (C37), steps kept, and ``dead_letter`` recorded
        carrying the run's envelope (C30).

        Parameters:
          run_key(str): the run.
          dead_letter(NewDeadLetter): the dead letter to record.
          outcome(bytes | None): the run's outcome (``None`` clears it).

        Returns:
          bool: whether it applied (``False`` for a started, terminal or unknown run).
        """

    @abc.abstractmethod
    def now(self) -> float:
        """Return the store's clock, epoch seconds."""

    # -------------------------------------------------------------- events
    @abc.abstractmethod
    def poll_event(self, claim: Claim, topic: str, key: str, deadline: float | None) -> EventPoll:
        """Look for the event a waiting step can receive, for an attempt at ``step.wait_for_event`` (C33).

        Two transactions, each fenced on the claim (else
        :class:`~flexiq_plugins.errors.ClaimLost`, nothing written):

        1. record on the run that it waits on ``(topic, key)`` (``wait_topic``,
           ``wait_key``) and commit, so a sender that commits an event from
           now on finds the run among its waiters (:meth:`add_event`); if the
           run's cancellation was requested, nothing is written and
           :class:`~flexiq_plugins.errors.CancelRequested` is raised (C34);
        2. read the first event the run can receive (the rule of
           :meth:`next_event`). With one, or with none and ``deadline <= now``
           (``timed_out``), the run's wait fields are cleared again.

        Nothing is consumed here: an event counts as received once an
        ``event`` row holding its id is committed (:meth:`commit_step`).
        ``deadline`` is epoch seconds, store clock (``None``: no timeout).
        """

    @abc.abstractmethod
    def next_event(self, run_key: str, topic: str, key: str) -> EventRecord | None:
        """The first event ``run_key`` can receive on ``(topic, key)``, or ``None`` (C33).

        Read only. An event is receivable by a run when its topic and key are
        these and it was sent either to this run (its ``run_key``) or to every
        run (no ``run_key``) at or after the run's ``created_at``, and no
        step row of the run holds its id. The oldest (lowest id) first.
        Returns ``None`` for an unknown run.
        """

    @abc.abstractmethod
    def add_event(self, topic: str, key: str, payload: bytes | None, *, run_key: str | None = None) -> SentEvent:
        """Store an event, then find the runs to wake for it (C33).

        Two transactions. The event is committed first (``created_at = now``,
        a new id). Then the runs waiting on ``(topic, key)`` that can receive
        it are read: status ``waiting`` or ``running`` with these wait fields
        (:meth:`poll_event`), and the run ``run_key`` only when given, else
        runs created at or before the event.

        Parameters:
          topic(str): the topic.
          key(str): the key.
          payload(bytes | None): the encoded payload.
          run_key(str | None): send it to this run only.
        """

    @abc.abstractmethod
    def cleanup_events(self, *, older_than: float) -> int:
        """Delete the events sent before ``older_than`` (epoch seconds, store clock); return how many (C33).

        A run that has not received such an event by then never will.
        Received events live on in the runs' ``event`` rows.
        """

    # -------------------------------------------------------- cancellation
    @abc.abstractmethod
    def request_cancel(self, run_key: str, reason: str) -> RunRecord:
        """Record that ``run_key`` is to be cancelled with ``reason``; return the run as it is now (C34).

        One transaction. A run that is not terminal gets ``cancel_reason``
        (the first reason given is kept); nothing else changes: an attempt
        holding the run sees the request at its next step boundary
        (:meth:`commit_step`), the next one to claim it at :meth:`begin`. A
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

    # ------------------------------------------------------------ operators
    @abc.abstractmethod
    def get_run(self, run_key: str) -> RunRecord:
        """Return one run; raises :class:`~flexiq_plugins.errors.UnknownRun`."""

    @abc.abstractmethod
    def list_runs(
        self,
        *,
        status: str | None = None,
        task_name: str | None = None,
        since: float | None = None,
        limit: int = 100,
        job_id: str | None = None,
    ) -> list[RunRecord]:
        """Return runs, newest first, filtered by status, task, ``updated_at >= since`` and current job id."""

    @abc.abstractmethod
    def get_steps(self, run_key: str) -> list[StepRow]:
        """Return the run's step rows ordered by position (empty if none)."""

    @abc.abstractmethod
    def list_dead_letters(
        self, *, task_name: str | None = None, include_retried: bool = False
    ) -> list[DeadLetterRecord]:
        """Return dead letters, oldest first."""

    @abc.abstractmethod
    def get_dead_letter(self, dead_letter_id: int) -> DeadLetterRecord:
        """Return one dead letter; raises :class:`~flexiq_plugins.errors.UnknownDeadLetter`."""

    @abc.abstractmethod
    def prepare_retry(self, dead_letter_id: int, *, reset_from: str | None = None) -> DeadLetterRecord:
        """Make a dead-lettered run runnable again, keeping its run key (C11, C30).

        One transaction: the run's status becomes ``pending`` (claim cleared),
        the dead letter's ``retried_at`` is set; with ``reset_from`` the step
        row with that key and every later position are deleted. Without it,
        the last ``run`` row that failed for good (the step that ended the
        run, C31) and every later position are deleted, if there is one. The
        step attempts of deleted steps go with them, so a retried step has its
        whole budget again. Returns the dead letter (with ``retried_at`` set).
        """

    @abc.abstractmethod
    def purge_dead_letters(self, ids: Sequence[int] | None = None) -> int:
        """Delete the given dead letters (all when ``ids`` is ``None``); return how many."""

    @abc.abstractmethod
    def cleanup(self, *, older_than: float) -> int:
        """Delete terminal runs but dead ones, with their steps and step attempts, updated before ``older_than``.

        Dead-lettered runs are kept: their rows let a retry replay (C27).
        Returns how many runs were deleted.
        """

    @abc.abstractmethod
    def mark_recovered(self, run_key: str, *, status: str, updated_at: float) -> bool:
        """Claim a stranded run for recovery: a compare-and-set on its state (C35).

        One transaction: sets the run's ``updated_at`` and ``recovered_at``
        to the store's ``now`` only while its ``status`` and ``updated_at``
        are still the given ones (what the caller read) and, for a
        ``running`` run, its lease has expired. Of several recoverers that read the same run, exactly one
        gets ``True`` and re-publishes it; the others get ``False``. Nothing
        else changes (claim, attempt, takeovers, steps).

        Parameters:
          run_key(str): the run.
          status(str): the status the caller read.
          updated_at(float): the ``updated_at`` the caller read, epoch seconds.

        Returns:
          bool: whether this caller won the run.
        """

    def local_clock(self) -> Callable[[], float] | None:
        """The store's clock as a cheap local function, when it has one (the memory store); else ``None``.

        An attempt then reads time from it exactly, instead of estimating the
        store's clock from the offset it saw when it claimed the run.
        """
        return None

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Keep one connection for the calling thread's store calls inside the ``with`` block (issue 14).

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

    def describe(self) -> str:
        """How a worker's start line names the store (no secrets): ``repr`` unless the store says more."""
        return repr(self)

    def iter_runs(self, **filters: Any) -> Iterator[RunRecord]:
        """Iterate :meth:`list_runs` (convenience)."""
        yield from self.list_runs(**filters)

    def close(self) -> None:  # noqa: B027 - optional hook, no-op by default
        """Release connections. Optional."""
