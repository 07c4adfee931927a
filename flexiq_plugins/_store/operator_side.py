"""The store as operators, recovery and event senders use it: listing, repairing, recovering, waking.

Everything a process that delivers no job asks of the store: the runs, step
attempts and dead letters an operator inspects, the retry and purge of dead
letters and the cleanup of old runs and events, the recovery sweep's lease and
its compare-and-set on a stranded run (C35, C39), and the events a sender
stores and the waiting runs it wakes (C33), and the keyset pages and capped
counts an operator's window reads at any size of history (C52,
`flexiq_plugins._model.listings`). The attempt's side is
`AttemptStore`; both extend
`StoreReads` (the store's clock, a run,
its step rows) and [`StepStore`][flexiq_plugins.StepStore] is both.
"""

from __future__ import annotations

import abc
from collections.abc import Collection, Iterator, Sequence
from typing import Any

from .._model.listings import ListedEvent, RunCursor, RunFilter, RunGroup, RunOrder, SweepLease
from .._model.records import DeadLetterRecord, EventRecord, RunRecord, SentEvent, StepAttempt, StepRow
from .reads import StoreReads

__all__ = ["OperatorStore"]

_COUNT_ALL = 2**31 - 1


class OperatorStore(StoreReads):
    """What operators, recovery and event senders ask of the store (see the module docstring)."""

    # -------------------------------------------------- runs and step attempts
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

    def iter_runs(self, **filters: Any) -> Iterator[RunRecord]:
        """Iterate `list_runs` (convenience)."""
        yield from self.list_runs(**filters)

    def count_statuses(self, statuses: Collection[str]) -> dict[str, int]:
        """How many runs are in each of ``statuses`` (every one of them a key, 0 if none), e.g. for a gauge (C53).

        This default lists them; the shipped stores count them in one query.
        """
        return {status: len(self.list_runs(status=status, limit=_COUNT_ALL)) for status in statuses}

    def get_steps_of(self, run_keys: Sequence[str]) -> dict[str, list[StepRow]]:
        """Return the step rows of each of ``run_keys``, by position; a run without steps maps to ``[]``.

        What a check of new code over many runs reads (C48). This default asks
        `get_steps` once per run; the SQL store reads them in a few queries.
        """
        return {key: self.get_steps(key) for key in run_keys}

    @abc.abstractmethod
    def get_step_attempts(self, run_key: str) -> list[StepAttempt]:
        """Return the run's step attempts, ordered by ``started_at`` then number (empty if none)."""

    # -------------------------------------------------------- dead letters
    @abc.abstractmethod
    def list_dead_letters(
        self, *, task_name: str | None = None, include_retried: bool = False
    ) -> list[DeadLetterRecord]:
        """Return dead letters, oldest first."""

    @abc.abstractmethod
    def get_dead_letter(self, dead_letter_id: int) -> DeadLetterRecord:
        """Return one dead letter; raises [`UnknownDeadLetter`][flexiq_plugins.errors.UnknownDeadLetter]."""

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

    # ---------------------------------------------------------------- forks
    @abc.abstractmethod
    def fork_run(self, run_key: str, from_step: str, new_run_key: str) -> RunRecord:
        """Make a new run from the steps ``run_key`` recorded before ``from_step`` (C50).

        One transaction: the run ``new_run_key`` is inserted ``queued`` (due
        now, no job id yet, the old run's envelope), with a copy of every step
        row of ``run_key`` at a position before ``from_step``'s (same
        positions, keys, kinds, values, wake and commit times); its step count
        and byte total are theirs. Step attempts are not copied. The old run is
        not changed. ``from_step`` must be a ``run``, ``sleep`` or ``wait`` step
        of the body, recorded before any compensation (`flexiq_plugins._store.forks`).
        Nothing is written when it raises.

        Parameters:
          run_key (str): the run to fork.
          from_step (str): the first step the new run runs again.
          new_run_key (str): the new run's key; no run may have it.

        Returns:
          RunRecord: the new run.

        Raises:
          UnknownRun: no run has ``run_key``.
          UnknownStep: it has no step ``from_step`` (the message lists the valid ones).
          InvalidForkStep: ``from_step`` is a step of another kind (the message lists the valid ones).
          InvalidRunKey: a run has ``new_run_key`` already.
        """

    @abc.abstractmethod
    def purge_dead_letters(self, ids: Sequence[int] | None = None) -> int:
        """Delete the given dead letters (all when ``ids`` is ``None``); return how many."""

    # -------------------------------------------------------------- cleanup
    @abc.abstractmethod
    def cleanup(self, *, older_than: float) -> int:
        """Delete finished runs, with their steps and step attempts, updated before ``older_than``.

        A dead-lettered run is kept while a dead letter names it: its rows let
        a retry replay (C27). Once its dead letters were purged (C30) nothing
        can retry it, and it goes like any finished run.
        Returns how many runs were deleted.
        """

    @abc.abstractmethod
    def cleanup_events(self, *, older_than: float) -> int:
        """Delete the events sent before ``older_than`` (epoch seconds, store clock); return how many (C33).

        A run that has not received such an event by then never will.
        Received events live on in the runs' ``event`` rows.
        """

    # ------------------------------------------------------------- recovery
    @abc.abstractmethod
    def acquire_sweep_lease(self, owner: str, lease_seconds: float, *, name: str = "recovery") -> bool:
        """Take or renew the recovery lease ``name``, so one sweep runs at a time across all workers (C39).

        One transaction on the store's clock: the lease is granted (to
        ``now + lease_seconds``) if nobody holds it, ``owner`` already holds
        it, or its holder's lease has expired; otherwise nothing changes.

        Parameters:
          owner (str): the sweeping process's id.
          lease_seconds (float): how long the lease lasts without renewal, seconds.
          name (str): which lease (at most 64 characters): sweepers that
            publish for different frameworks hold different leases.

        Returns:
          bool: whether ``owner`` holds the lease now.
        """

    @abc.abstractmethod
    def release_sweep_lease(self, owner: str, *, name: str = "recovery") -> None:
        """Give the recovery lease ``name`` up if ``owner`` holds it (a worker shutting down); else do nothing."""

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
          run_key (str): the run.
          status (str): the status the caller read.
          updated_at (float): the ``updated_at`` the caller read, epoch seconds.

        Returns:
          bool: whether this caller won the run.
        """

    @abc.abstractmethod
    def unmark_recovered(self, run_key: str, *, recovered_at: float | None) -> None:
        """Undo [`mark_recovered`][flexiq_plugins.OperatorStore.mark_recovered] after the re-publish it allowed failed
        (C35).

        Sets the run's ``recovered_at`` back to ``recovered_at`` (what it was
        before), so the run is a candidate again at the next sweep instead of
        waiting ``stale_after`` for a copy that never left.

        Parameters:
          run_key (str): the run.
          recovered_at (float | None): the ``recovered_at`` read before
            [`mark_recovered`][flexiq_plugins.OperatorStore.mark_recovered].
        """

    @abc.abstractmethod
    def settle_reported(self, run_key: str, status: str) -> bool:
        """End a run that never started whose job the framework reported finished (C47).

        One conditional update: a ``queued`` run becomes ``status``
        (``succeeded``, ``failed`` or ``cancelled``), with no claim, no wake
        time and no stored outcome; a run in any other status (an attempt
        started it meanwhile) is left alone.

        Parameters:
          run_key (str): the run.
          status (str): ``succeeded``, ``failed`` or ``cancelled``.

        Returns:
          bool: whether the run was ``queued`` and is now ``status``.
        """

    # --------------------------------------------------------------- events
    @abc.abstractmethod
    def add_event(self, topic: str, key: str, payload: bytes | None, *, run_key: str | None = None) -> SentEvent:
        """Store an event, then find the runs to wake for it (C33).

        Two transactions. The event is committed first (``created_at = now``,
        a new id). Then the runs waiting on ``(topic, key)`` that can receive
        it are read: status ``waiting`` or ``running`` with these wait fields
        (`AttemptStore.poll_event`), and the run ``run_key`` only when given, else
        runs created at or before the event.

        Parameters:
          topic (str): the topic.
          key (str): the key.
          payload (bytes | None): the encoded payload.
          run_key (str | None): send it to this run only.
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

    # ------------------------------------------------ the operator's window (C52)
    @abc.abstractmethod
    def count_runs(self, *, by: RunGroup, cap: int, max_groups: int = 50) -> dict[str, int]:
        """Count runs per status or per task name, each count capped: read only.

        A group with more than ``cap`` runs counts ``cap + 1`` (read: "more
        than ``cap``"), so the cost is at most ``cap + 1`` index entries a
        group, whatever the history. Groups without runs are left out.

        Parameters:
          by (RunGroup): ``"status"`` or ``"task_name"``.
          cap (int): the most runs counted exactly in one group.
          max_groups (int): with ``by="task_name"``, the first this many task names (in name order).
        """

    @abc.abstractmethod
    def find_runs(
        self, where: RunFilter, *, order: RunOrder = "updated_desc", after: RunCursor | None = None, limit: int = 50
    ) -> list[RunRecord]:
        """Return one keyset page of the runs ``where`` selects, in ``order``: read only.

        ``after`` is the `RunCursor` of the previous page's last run: this page
        starts strictly after it. With ``order="wake_asc"`` only runs with a
        wake time are listed.

        Parameters:
          where (RunFilter): the filter.
          order (RunOrder): the order.
          after (RunCursor | None): continue after this run.
          limit (int): at most this many runs.
        """

    @abc.abstractmethod
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
        """Return one keyset page of dead letters, newest (highest id) first: read only (C30).

        Parameters:
          before_id (int | None): only ids below this one (the previous page's last).
          limit (int): at most this many.
          task_name (str | None): only those of this task or actor.
          reason (str | None): only those of this reason kind.
          run_key (str | None): only those of this run.
          retried (bool | None): only those retried (``True``) or not yet (``False``).
        """

    @abc.abstractmethod
    def count_dead_letters(self, *, since: float, cap: int) -> dict[str, int]:
        """Count the dead letters created at or after ``since`` per reason, over at most ``cap + 1`` of them.

        When more than ``cap`` were created since then, only the newest
        ``cap + 1`` are counted (their sum says so). Read only.

        Parameters:
          since (float): epoch seconds, store clock.
          cap (int): the most dead letters counted.
        """

    @abc.abstractmethod
    def find_events(
        self,
        *,
        ids: Sequence[int] | None = None,
        before_id: int | None = None,
        limit: int = 50,
        received: bool | None = None,
    ) -> list[ListedEvent]:
        """Return one keyset page of events, newest (highest id) first, each with the runs that received it (C33).

        Read only. An event is *received* once a run's ``event`` step holds its
        id; until then it is pending.

        Parameters:
          ids (Sequence[int] | None): only these events.
          before_id (int | None): only ids below this one (the previous page's last).
          limit (int): at most this many.
          received (bool | None): only received (``True``) or pending (``False``) events.
        """

    @abc.abstractmethod
    def sweep_leases(self) -> list[SweepLease]:
        """Return the recovery leases by name, each with when it was last taken or renewed (C39): read only."""
