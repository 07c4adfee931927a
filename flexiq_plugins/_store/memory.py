"""An in-process step store for tests and examples.

It keeps everything in dictionaries behind one lock, so each method is atomic
the way the interface describes. Nothing survives the process: use
:class:`~flexiq_plugins.SqlStepStore` for anything durable.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING

from .._model.records import (
    CLEANABLE_STATUSES,
    TERMINAL_STATUSES,
    UNSTARTED_STATUSES,
    AttemptStarted,
    BeginResult,
    Begun,
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
from ..errors import CancelRequested, UnknownDeadLetter, UnknownRun
from .base import StepStore
from .claims import (
    Granted,
    already_committed,
    claim_lost,
    decide_claim,
    holds,
    may_recover,
    may_settle_cancelled,
    may_take_sweep_lease,
    reported_status,
)
from .events import consumed_event_ids, first_receivable, poll_result, wakes
from .step_attempts import close_lost, decide_step_attempt, failed_attempt, retry_cut_position

if TYPE_CHECKING:
    from .caller import CallerConnection

__all__ = ["MemoryStepStore"]


class MemoryStepStore(StepStore):
    """A :class:`StepStore` held in memory.

    Parameters:
      clock(Callable[[], float] | None): the store's clock in epoch seconds;
        defaults to :func:`time.time`. Tests pass their own to move time.
    """

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self._clock = clock or time.time
        self._lock = threading.RLock()
        self._runs: dict[str, RunRecord] = {}
        self._steps: dict[str, list[StepRow]] = {}
        self._attempts: dict[str, list[StepAttempt]] = {}
        self._dead: dict[int, DeadLetterRecord] = {}
        self._next_dead_id = 1
        self._events: dict[int, EventRecord] = {}
        self._next_event_id = 1
        self._sweep_leases: dict[str, tuple[str | None, float | None]] = {}

    def describe(self) -> str:
        """``memory:// (in this process only)``."""
        return "memory:// (in this process only: lost when it exits)"

    def local_clock(self) -> Callable[[], float]:
        """The clock itself: reading it costs nothing (see :meth:`StepStore.local_clock`)."""
        return self._clock

    # ------------------------------------------------------------------ reads
    def now(self) -> float:
        """Return the store's clock, epoch seconds."""
        return self._clock()

    def get_run(self, run_key: str) -> RunRecord:
        """See :meth:`StepStore.get_run`."""
        with self._lock:
            try:
                return self._runs[run_key]
            except KeyError:
                raise UnknownRun(f"no run has the run key {run_key!r}") from None

    def get_steps(self, run_key: str) -> list[StepRow]:
        """See :meth:`StepStore.get_steps`."""
        with self._lock:
            return sorted(self._steps.get(run_key, ()), key=lambda s: s.position)

    # ----------------------------------------------------------------- claims
    def begin(self, run_key: str, job_id: str, envelope: JobEnvelope, owner: str, lease_seconds: float) -> BeginResult:
        """See :meth:`StepStore.begin`."""
        with self._lock:
            now = self.now()
            run = self._runs.get(run_key) or self._new_run(run_key, envelope, now)
            decision = decide_claim(run, now=now, owner=owner, lease_seconds=lease_seconds)
            if not isinstance(decision, Granted):
                return decision
            run = dataclasses.replace(run, **decision.values(), job_id=job_id, updated_at=now)
            self._runs[run_key] = run
            snapshot = tuple(self._steps.get(run_key, ()))
            claim = decision.claim(run_key)
            return Begun(claim, snapshot, now, decision.takeovers, run.envelope, run.created_at, run.cancel_reason)

    def _new_run(self, run_key: str, envelope: JobEnvelope, now: float) -> RunRecord:
        return RunRecord(
            run_key=run_key,
            task_name=envelope.task_name,
            framework=envelope.framework,
            queue=envelope.queue,
            status="pending",
            owner=None,
            attempt=0,
            lease_until=None,
            takeovers=0,
            job_id=None,
            envelope=envelope,
            step_count=0,
            step_bytes=0,
            created_at=now,
            updated_at=now,
        )

    def _fenced(self, claim: Claim) -> RunRecord:
        run = self._runs.get(claim.run_key)
        if run is None or not holds(run, claim):
            raise claim_lost(claim)
        return run

    def renew(self, claim: Claim, lease_seconds: float) -> Claim:
        """See :meth:`StepStore.renew`."""
        with self._lock:
            run = self._fenced(claim)
            until = self.now() + lease_seconds
            self._runs[claim.run_key] = dataclasses.replace(run, lease_until=until)
            return dataclasses.replace(claim, lease_until=until)

    # ------------------------------------------------------------- publishing
    def record_queued(self, run_key: str, job_id: str, envelope: JobEnvelope, delay_seconds: float = 0.0) -> None:
        """See :meth:`StepStore.record_queued`."""
        with self._lock:
            if run_key not in self._runs:
                now = self.now()
                run = self._new_run(run_key, envelope, now)
                due = now + max(delay_seconds, 0.0)
                self._runs[run_key] = dataclasses.replace(run, status="queued", job_id=job_id, wake_at=due)

    # ------------------------------------------------------------------ steps
    def commit_step(self, claim: Claim, row: StepRow) -> StepRow:
        """See :meth:`StepStore.commit_step`."""
        with self._lock:
            run = self._fenced(claim)
            stored = self._insert_step(run, claim, row, self.now())
        if run.cancel_reason is not None:
            raise CancelRequested(run.cancel_reason, stored)
        return stored

    def _insert_step(self, run: RunRecord, claim: Claim, row: StepRow, now: float) -> StepRow:
        steps = self._steps.setdefault(claim.run_key, [])
        if any(s.step_key == row.step_key for s in steps):
            raise already_committed(claim, row.step_key)
        stored = dataclasses.replace(row, committed_at=now, attempt=claim.attempt)
        steps.append(stored)
        self._runs[claim.run_key] = dataclasses.replace(
            run,
            step_count=run.step_count + 1,
            step_bytes=run.step_bytes + row.size,
            updated_at=now,
        )
        return stored

    def commit_step_on(self, connection: CallerConnection, claim: Claim, row: StepRow) -> StepRow:
        """:meth:`commit_step`, at once: memory shares no database transaction (C42).

        So that task bodies with transactional steps can be unit-tested on the
        memory store (``flexiq_plugins.testing``): the body still runs inside
        the caller's transaction, but the memo does not roll back with it.
        """
        return self.commit_step(claim, row)

    # ---------------------------------------------------------- step attempts
    def begin_step_attempt(self, claim: Claim, step_key: str, max_attempts: int) -> StepAttemptBegin:
        """See :meth:`StepStore.begin_step_attempt`."""
        with self._lock:
            run = self._fenced(claim)
            now = self.now()
            self._runs[claim.run_key] = dataclasses.replace(run, updated_at=now)
            others, mine = self._split_attempts(claim.run_key, step_key)
            mine = list(close_lost(mine))
            decision = decide_step_attempt(mine, now=now, max_attempts=max_attempts)
            if isinstance(decision, AttemptStarted):
                mine.append(StepAttempt(claim.run_key, step_key, decision.number, claim.attempt, now))
            self._attempts[claim.run_key] = others + mine
            return decision

    def _split_attempts(self, run_key: str, step_key: str) -> tuple[list[StepAttempt], list[StepAttempt]]:
        attempts = self._attempts.get(run_key, [])
        mine = sorted((a for a in attempts if a.step_key == step_key), key=lambda a: a.number)
        return [a for a in attempts if a.step_key != step_key], mine

    def fail_step_attempt(
        self, claim: Claim, failure: StepAttemptFailure, *, row: StepRow | None = None
    ) -> StepAttemptFailed:
        """See :meth:`StepStore.fail_step_attempt`."""
        with self._lock:
            run = self._fenced(claim)
            now = self.now()
            if row is None:
                self._runs[claim.run_key] = dataclasses.replace(run, updated_at=now)
            stored = self._insert_step(run, claim, row, now) if row is not None else None
            others, mine = self._split_attempts(claim.run_key, failure.step_key)
            number = failure.number or (mine[-1].number + 1 if mine else 1)
            journaled = next((a for a in mine if a.number == number), None)
            fresh = StepAttempt(claim.run_key, failure.step_key, number, claim.attempt, now)
            attempt = failed_attempt(journaled or fresh, failure, now)
            kept = [a for a in mine if a.number != number]
            self._attempts[claim.run_key] = others + sorted([*kept, attempt], key=lambda a: a.number)
            return StepAttemptFailed(attempt, stored)

    # ------------------------------------------------------- waiting on events
    def poll_event(self, claim: Claim, topic: str, key: str, deadline: float | None) -> EventPoll:
        """See :meth:`StepStore.poll_event`."""
        with self._lock:
            run = self._fenced(claim)
            if run.cancel_reason is not None:
                raise CancelRequested(run.cancel_reason)
            now = self.now()
            found = self._next_event(run, topic, key)
            result = poll_result(found, now, deadline)
            waiting = result.event is None and not result.timed_out
            self._runs[claim.run_key] = dataclasses.replace(
                run, wait_topic=topic if waiting else None, wait_key=key if waiting else None
            )
            return result

    def _next_event(self, run: RunRecord, topic: str, key: str) -> EventRecord | None:
        consumed = consumed_event_ids(self._steps.get(run.run_key, ()))
        return first_receivable(
            self._events.values(),
            run_key=run.run_key,
            run_created_at=run.created_at,
            topic=topic,
            key=key,
            consumed=consumed,
        )

    # ---------------------------------------------------------- ends of a run
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
        """See :meth:`StepStore.finish`."""
        with self._lock:
            run = self._fenced(claim)
            now = self.now()
            run = dataclasses.replace(run, status=status, owner=None, lease_until=None, updated_at=now)
            run = dataclasses.replace(run, wake_at=wake_at, outcome=outcome)
            if drop_steps:
                self._steps.pop(claim.run_key, None)
                self._attempts.pop(claim.run_key, None)
                run = dataclasses.replace(run, step_count=0, step_bytes=0)
            self._runs[claim.run_key] = run
            if dead_letter is not None:
                self._add_dead_letter(run, dead_letter, now)

    def _add_dead_letter(self, run: RunRecord, dead: NewDeadLetter, now: float) -> None:
        record = DeadLetterRecord(
            id=self._next_dead_id,
            run_key=run.run_key,
            job_id=dead.job_id,
            task_name=run.task_name,
            reason=dead.reason,
            message=dead.message,
            traceback=dead.traceback,
            envelope=run.envelope,
            created_at=now,
            retried_at=None,
        )
        self._dead[record.id] = record
        self._next_dead_id += 1

    def start_compensation(self, run_key: str, marker: StepRow, *, status: str, attempt: int) -> bool:
        """See :meth:`StepStore.start_compensation`."""
        with self._lock:
            run = self._runs.get(run_key)
            if run is None or run.status != status or run.attempt != attempt or run.owner is not None:
                return False
            now = self.now()
            steps = self._steps.setdefault(run_key, [])
            position = max((s.position for s in steps), default=-1) + 1
            steps.append(dataclasses.replace(marker, position=position, committed_at=now, attempt=attempt))
            count, size = run.step_count + 1, run.step_bytes + marker.size
            self._runs[run_key] = dataclasses.replace(
                run, status="pending", step_count=count, step_bytes=size, updated_at=now
            )
            return True

    def settle_failed(self, run_key: str, attempt: int) -> bool:
        """See :meth:`StepStore.settle_failed`."""
        with self._lock:
            run = self._runs.get(run_key)
            if run is None or run.status != "retrying" or run.attempt != attempt:
                return False
            self._runs[run_key] = dataclasses.replace(run, status="failed", updated_at=self.now())
            return True

    def release_run(
        self, run_key: str, status: RunStatus, *, while_status: Collection[str], outcome: bytes | None = None
    ) -> bool:
        """See :meth:`StepStore.release_run`."""
        with self._lock:
            run = self._runs.get(run_key)
            if run is None or run.status not in while_status:
                return False
            run = dataclasses.replace(run, status=status, owner=None, lease_until=None, wake_at=None)
            self._runs[run_key] = dataclasses.replace(run, updated_at=self.now(), outcome=outcome)
            return True

    def dead_letter_unstarted(self, run_key: str, dead_letter: NewDeadLetter, *, outcome: bytes | None = None) -> bool:
        """See :meth:`StepStore.dead_letter_unstarted`: attempt 0, or a retried dead letter unchanged since."""
        with self._lock:
            run = self._runs.get(run_key)
            if run is None or run.status not in UNSTARTED_STATUSES or not (run.attempt == 0 or self._retried(run)):
                return False
            now = self.now()
            run = dataclasses.replace(run, status="dead", owner=None, lease_until=None, wake_at=None)
            run = dataclasses.replace(run, updated_at=now, outcome=outcome)
            self._runs[run_key] = run
            self._add_dead_letter(run, dead_letter, now)
            return True

    def _retried(self, run: RunRecord) -> bool:
        """Whether ``run`` is a retried dead letter no attempt started since: unchanged since the retry.

        ``prepare_retry`` stamps the run's ``updated_at`` and the dead
        letter's ``retried_at`` with one clock reading; a later start,
        put-back or recovery stamps ``updated_at`` anew.
        """
        if run.status != "pending" or run.owner is not None:
            return False
        return any(d.run_key == run.run_key and d.retried_at == run.updated_at for d in self._dead.values())

    def request_cancel(self, run_key: str, reason: str) -> RunRecord:
        """See :meth:`StepStore.request_cancel`."""
        with self._lock:
            run = self.get_run(run_key)
            if run.status not in TERMINAL_STATUSES and run.cancel_reason is None:
                run = dataclasses.replace(run, cancel_reason=reason)
                self._runs[run_key] = run
            return run

    def settle_cancelled(self, run_key: str, *, status: str, attempt: int, outcome: bytes | None = None) -> bool:
        """See :meth:`StepStore.settle_cancelled`."""
        with self._lock:
            run = self._runs.get(run_key)
            now = self.now()
            if run is None or not may_settle_cancelled(run, status=status, attempt=attempt, now=now):
                return False
            self._runs[run_key] = dataclasses.replace(
                run, status="cancelled", owner=None, lease_until=None, wake_at=None, updated_at=now, outcome=outcome
            )
            return True

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
        """See :meth:`StepStore.list_runs`."""
        with self._lock:
            runs = [
                r
                for r in self._runs.values()
                if (status is None or r.status == status)
                and (task_name is None or r.task_name == task_name)
                and (since is None or r.updated_at >= since)
                and (job_id is None or r.job_id == job_id)
            ]
        runs.sort(key=lambda r: (r.updated_at, r.run_key), reverse=True)
        return runs[:limit]

    def get_step_attempts(self, run_key: str) -> list[StepAttempt]:
        """See :meth:`StepStore.get_step_attempts`."""
        with self._lock:
            return sorted(self._attempts.get(run_key, ()), key=lambda a: (a.started_at, a.step_key, a.number))

    # ----------------------------------------------------------- dead letters
    def list_dead_letters(
        self, *, task_name: str | None = None, include_retried: bool = False
    ) -> list[DeadLetterRecord]:
        """See :meth:`StepStore.list_dead_letters`."""
        with self._lock:
            return [
                d
                for d in sorted(self._dead.values(), key=lambda d: d.id)
                if (task_name is None or d.task_name == task_name) and (include_retried or d.retried_at is None)
            ]

    def get_dead_letter(self, dead_letter_id: int) -> DeadLetterRecord:
        """See :meth:`StepStore.get_dead_letter`."""
        with self._lock:
            try:
                return self._dead[dead_letter_id]
            except KeyError:
                raise UnknownDeadLetter(f"no dead letter has the id {dead_letter_id!r}") from None

    def prepare_retry(self, dead_letter_id: int, *, reset_from: str | None = None) -> DeadLetterRecord:
        """See :meth:`StepStore.prepare_retry`."""
        with self._lock:
            dead = self.get_dead_letter(dead_letter_id)
            run = self.get_run(dead.run_key)
            steps = self.get_steps(dead.run_key)
            cut = retry_cut_position(steps, reset_from, dead.run_key)
            if cut is not None:
                dropped = {s.step_key for s in steps if s.position >= cut}
                steps = [s for s in steps if s.position < cut]
                self._steps[dead.run_key] = steps
                attempts = self._attempts.get(dead.run_key, [])
                self._attempts[dead.run_key] = [a for a in attempts if a.step_key not in dropped]
            now = self.now()
            self._runs[dead.run_key] = dataclasses.replace(
                run,
                status="pending",
                owner=None,
                lease_until=None,
                takeovers=0,
                step_count=len(steps),
                step_bytes=sum(s.size for s in steps),
                updated_at=now,
            )
            dead = dataclasses.replace(dead, retried_at=now)
            self._dead[dead.id] = dead
            return dead

    def purge_dead_letters(self, ids: Sequence[int] | None = None) -> int:
        """See :meth:`StepStore.purge_dead_letters`."""
        with self._lock:
            doomed = list(self._dead) if ids is None else sorted({i for i in ids if i in self._dead})
            for i in doomed:
                del self._dead[i]
            return len(doomed)

    # ---------------------------------------------------------------- cleanup
    def cleanup(self, *, older_than: float) -> int:
        """See :meth:`StepStore.cleanup`."""
        with self._lock:
            doomed = [k for k, r in self._runs.items() if r.status in CLEANABLE_STATUSES and r.updated_at < older_than]
            for k in doomed:
                del self._runs[k]
                self._steps.pop(k, None)
                self._attempts.pop(k, None)
            return len(doomed)

    def cleanup_events(self, *, older_than: float) -> int:
        """See :meth:`StepStore.cleanup_events`."""
        with self._lock:
            doomed = [i for i, e in self._events.items() if e.created_at < older_than]
            for i in doomed:
                del self._events[i]
            return len(doomed)

    # --------------------------------------------------------------- recovery
    def acquire_sweep_lease(self, owner: str, lease_seconds: float, *, name: str = "recovery") -> bool:
        """See :meth:`StepStore.acquire_sweep_lease`."""
        with self._lock:
            now = self.now()
            if not may_take_sweep_lease(*self._sweep_leases.get(name, (None, None)), owner=owner, now=now):
                return False
            self._sweep_leases[name] = (owner, now + lease_seconds)
            return True

    def release_sweep_lease(self, owner: str, *, name: str = "recovery") -> None:
        """See :meth:`StepStore.release_sweep_lease`."""
        with self._lock:
            if self._sweep_leases.get(name, (None, None))[0] == owner:
                self._sweep_leases.pop(name)

    def mark_recovered(self, run_key: str, *, status: str, updated_at: float) -> bool:
        """See :meth:`StepStore.mark_recovered`."""
        with self._lock:
            run = self._runs.get(run_key)
            now = self.now()
            if run is None or not may_recover(run, status=status, updated_at=updated_at, now=now):
                return False
            self._runs[run_key] = dataclasses.replace(run, updated_at=now, recovered_at=now)
            return True

    def unmark_recovered(self, run_key: str, *, recovered_at: float | None) -> None:
        """See :meth:`StepStore.unmark_recovered`."""
        with self._lock:
            run = self._runs.get(run_key)
            if run is not None:
                self._runs[run_key] = dataclasses.replace(run, recovered_at=recovered_at)

    def settle_reported(self, run_key: str, status: str) -> bool:
        """See :meth:`StepStore.settle_reported`."""
        return self.release_run(run_key, reported_status(status), while_status={"queued"})

    # ----------------------------------------------------------------- events
    def add_event(self, topic: str, key: str, payload: bytes | None, *, run_key: str | None = None) -> SentEvent:
        """See :meth:`StepStore.add_event`."""
        with self._lock:
            event = EventRecord(self._next_event_id, topic, key, run_key, payload, self.now())
            self._events[event.id] = event
            self._next_event_id += 1
            waiters = tuple(sorted((r for r in self._runs.values() if wakes(r, event)), key=lambda r: r.run_key))
            return SentEvent(event, waiters)

    def next_event(self, run_key: str, topic: str, key: str) -> EventRecord | None:
        """See :meth:`StepStore.next_event`."""
        with self._lock:
            run = self._runs.get(run_key)
            return None if run is None else self._next_event(run, topic, key)
