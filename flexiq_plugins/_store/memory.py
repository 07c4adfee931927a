"""An in-process step store for tests and examples.

It keeps everything in dictionaries behind one lock, so each method is atomic
the way the interface describes. Nothing survives the process: use
[`SqlStepStore`][flexiq_plugins.SqlStepStore] for anything durable.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING

from .._model.listings import ListedEvent, RunCursor, RunFilter, RunGroup, RunOrder, SweepLease
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
    KnownTask,
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
from ..errors import CancelRequested, InvalidRunKey, UnknownDeadLetter, UnknownRun
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
from .forks import fork_position
from .step_attempts import close_lost, decide_step_attempt, failed_attempt, retry_cut_position

if TYPE_CHECKING:
    from .caller import CallerConnection

__all__ = ["MemoryStepStore"]


class MemoryStepStore(StepStore):
    """A [`StepStore`][flexiq_plugins.StepStore] held in memory.

    Parameters:
      clock (Callable[[], float] | None): the store's clock in epoch seconds;
        defaults to `time.time`. Tests pass their own to move time.
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
        self._swept_at: dict[str, float] = {}
        self._tasks: dict[tuple[str, str], float] = {}

    def describe(self) -> str:
        """``memory:// (in this process only)``."""
        return "memory:// (in this process only: lost when it exits)"

    def local_clock(self) -> Callable[[], float]:
        """The clock itself: reading it costs nothing (see `StepStore.local_clock`)."""
        return self._clock

    # ------------------------------------------------------------------ reads
    def now(self) -> float:
        """Return the store's clock, epoch seconds."""
        return self._clock()

    def get_run(self, run_key: str) -> RunRecord:
        """See `StepStore.get_run`."""
        with self._lock:
            try:
                return self._runs[run_key]
            except KeyError:
                raise UnknownRun(f"no run has the run key {run_key!r}") from None

    def get_steps(self, run_key: str) -> list[StepRow]:
        """See `StepStore.get_steps`."""
        with self._lock:
            return sorted(self._steps.get(run_key, ()), key=lambda s: s.position)

    # ----------------------------------------------------------------- claims
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
        """See `StepStore.begin`."""
        with self._lock:
            now = self.now()
            run = self._runs.get(run_key) or self._new_run(run_key, envelope, now)
            decision = decide_claim(run, now=now, owner=owner, lease_seconds=lease_seconds)
            if not isinstance(decision, Granted):
                return decision
            stored_trace = run.trace_context
            run = dataclasses.replace(
                run, **decision.values(), job_id=job_id, updated_at=now, trace_context=stored_trace or trace_context
            )
            self._runs[run_key] = run
            snapshot = tuple(self._steps.get(run_key, ()))
            claim = decision.claim(run_key)
            return Begun(
                claim, snapshot, now, decision.takeovers, run.envelope, run.created_at, run.cancel_reason, stored_trace
            )

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
        """See `StepStore.renew`."""
        with self._lock:
            run = self._fenced(claim)
            until = self.now() + lease_seconds
            self._runs[claim.run_key] = dataclasses.replace(run, lease_until=until)
            return dataclasses.replace(claim, lease_until=until)

    # ------------------------------------------------------------- publishing
    def record_queued(self, run_key: str, job_id: str, envelope: JobEnvelope, delay_seconds: float = 0.0) -> None:
        """See `StepStore.record_queued`."""
        with self._lock:
            if run_key not in self._runs:
                now = self.now()
                run = self._new_run(run_key, envelope, now)
                due = now + max(delay_seconds, 0.0)
                self._runs[run_key] = dataclasses.replace(run, status="queued", job_id=job_id, wake_at=due)

    def note_durable_task(self, name: str, framework: str) -> None:
        """See `StepStore.note_durable_task`."""
        with self._lock:
            self._tasks.setdefault((framework, name), self.now())

    def durable_tasks(self) -> list[KnownTask]:
        """See `StepStore.durable_tasks`."""
        with self._lock:
            known = sorted(self._tasks.items())
        return [KnownTask(name, framework, first_seen) for (framework, name), first_seen in known]

    # ------------------------------------------------------------------ steps
    def commit_step(self, claim: Claim, row: StepRow) -> StepRow:
        """See `StepStore.commit_step`."""
        with self._lock:
            run = self._fenced(claim)
            stored = self._insert_step(run, claim, row, self.now())
        if run.cancel_reason is not None:
            raise CancelRequested(run.cancel_reason, stored)
        return stored

    def commit_steps(self, claim: Claim, rows: Sequence[StepRow]) -> tuple[StepRow, ...]:
        """See `StepStore.commit_steps`."""
        with self._lock:
            run = self._fenced(claim)
            committed = {s.step_key for s in self._steps.get(claim.run_key, ())}
            for i, row in enumerate(rows):
                if row.step_key in committed or any(r.step_key == row.step_key for r in rows[:i]):
                    raise already_committed(claim, row.step_key)
            now = self.now()
            stored = tuple(dataclasses.replace(row, committed_at=now, attempt=claim.attempt) for row in rows)
            self._steps.setdefault(claim.run_key, []).extend(stored)
            self._runs[claim.run_key] = dataclasses.replace(
                run,
                step_count=run.step_count + len(stored),
                step_bytes=run.step_bytes + sum(row.size for row in stored),
                updated_at=now,
            )
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
        """`commit_step`, at once: memory shares no database transaction (C42).

        So that task bodies with transactional steps can be unit-tested on the
        memory store (``flexiq_plugins.testing``): the body still runs inside
        the caller's transaction, but the memo does not roll back with it.
        """
        return self.commit_step(claim, row)

    # ---------------------------------------------------------- step attempts
    def begin_step_attempt(self, claim: Claim, step_key: str, max_attempts: int) -> StepAttemptBegin:
        """See `StepStore.begin_step_attempt`."""
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
        """See `StepStore.fail_step_attempt`."""
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
        """See `StepStore.poll_event`."""
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
        """See `StepStore.finish`."""
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
        """See `StepStore.start_compensation`."""
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
        """See `StepStore.settle_failed`."""
        with self._lock:
            run = self._runs.get(run_key)
            if run is None or run.status != "retrying" or run.attempt != attempt:
                return False
            self._runs[run_key] = dataclasses.replace(run, status="failed", updated_at=self.now())
            return True

    def release_run(
        self, run_key: str, status: RunStatus, *, while_status: Collection[str], outcome: bytes | None = None
    ) -> bool:
        """See `StepStore.release_run`."""
        with self._lock:
            run = self._runs.get(run_key)
            if run is None or run.status not in while_status:
                return False
            run = dataclasses.replace(run, status=status, owner=None, lease_until=None, wake_at=None)
            self._runs[run_key] = dataclasses.replace(run, updated_at=self.now(), outcome=outcome)
            return True

    def dead_letter_unstarted(self, run_key: str, dead_letter: NewDeadLetter, *, outcome: bytes | None = None) -> bool:
        """See `StepStore.dead_letter_unstarted`: attempt 0, or a retried dead letter unchanged since."""
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
        """See `StepStore.request_cancel`."""
        with self._lock:
            run = self.get_run(run_key)
            if run.status not in TERMINAL_STATUSES and run.cancel_reason is None:
                run = dataclasses.replace(run, cancel_reason=reason)
                self._runs[run_key] = run
            return run

    def settle_cancelled(self, run_key: str, *, status: str, attempt: int, outcome: bytes | None = None) -> bool:
        """See `StepStore.settle_cancelled`."""
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
        """See `StepStore.list_runs`."""
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

    def count_statuses(self, statuses: Collection[str]) -> dict[str, int]:
        """See `OperatorStore.count_statuses`."""
        with self._lock:
            counted = Counter(r.status for r in self._runs.values())
        return {status: counted[status] for status in statuses}

    def get_step_attempts(self, run_key: str) -> list[StepAttempt]:
        """See `StepStore.get_step_attempts`."""
        with self._lock:
            return sorted(self._attempts.get(run_key, ()), key=lambda a: (a.started_at, a.step_key, a.number))

    # ----------------------------------------------------------- dead letters
    def list_dead_letters(
        self, *, task_name: str | None = None, include_retried: bool = False
    ) -> list[DeadLetterRecord]:
        """See `StepStore.list_dead_letters`."""
        with self._lock:
            return [
                d
                for d in sorted(self._dead.values(), key=lambda d: d.id)
                if (task_name is None or d.task_name == task_name) and (include_retried or d.retried_at is None)
            ]

    def get_dead_letter(self, dead_letter_id: int) -> DeadLetterRecord:
        """See `StepStore.get_dead_letter`."""
        with self._lock:
            try:
                return self._dead[dead_letter_id]
            except KeyError:
                raise UnknownDeadLetter(f"no dead letter has the id {dead_letter_id!r}") from None

    def prepare_retry(self, dead_letter_id: int, *, reset_from: str | None = None) -> DeadLetterRecord:
        """See `StepStore.prepare_retry`."""
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

    def fork_run(self, run_key: str, from_step: str, new_run_key: str) -> RunRecord:
        """See `OperatorStore.fork_run`."""
        with self._lock:
            run = self.get_run(run_key)
            if new_run_key in self._runs:
                raise InvalidRunKey(f"a run with the key {new_run_key!r} exists already; a fork needs a new one")
            steps = self.get_steps(run_key)
            cut = fork_position(steps, from_step, run_key)
            copied = [s for s in steps if s.position < cut]
            now = self.now()
            forked = dataclasses.replace(
                self._new_run(new_run_key, run.envelope, now),
                status="queued",
                wake_at=now,
                step_count=len(copied),
                step_bytes=sum(s.size for s in copied),
            )
            self._runs[new_run_key] = forked
            self._steps[new_run_key] = copied
            return forked

    def purge_dead_letters(self, ids: Sequence[int] | None = None) -> int:
        """See `StepStore.purge_dead_letters`."""
        with self._lock:
            doomed = list(self._dead) if ids is None else sorted({i for i in ids if i in self._dead})
            for i in doomed:
                del self._dead[i]
            return len(doomed)

    # ---------------------------------------------------------------- cleanup
    def cleanup(self, *, older_than: float) -> int:
        """See `StepStore.cleanup`."""
        with self._lock:
            lettered = {d.run_key for d in self._dead.values()}
            doomed = [
                k
                for k, r in self._runs.items()
                if r.updated_at < older_than
                and (r.status in CLEANABLE_STATUSES or (r.status == "dead" and k not in lettered))
            ]
            for k in doomed:
                del self._runs[k]
                self._steps.pop(k, None)
                self._attempts.pop(k, None)
            return len(doomed)

    def cleanup_events(self, *, older_than: float) -> int:
        """See `StepStore.cleanup_events`."""
        with self._lock:
            doomed = [i for i, e in self._events.items() if e.created_at < older_than]
            for i in doomed:
                del self._events[i]
            return len(doomed)

    # --------------------------------------------------------------- recovery
    def acquire_sweep_lease(self, owner: str, lease_seconds: float, *, name: str = "recovery") -> bool:
        """See `StepStore.acquire_sweep_lease`."""
        with self._lock:
            now = self.now()
            if not may_take_sweep_lease(*self._sweep_leases.get(name, (None, None)), owner=owner, now=now):
                return False
            self._sweep_leases[name] = (owner, now + lease_seconds)
            self._swept_at[name] = now
            return True

    def release_sweep_lease(self, owner: str, *, name: str = "recovery") -> None:
        """See `StepStore.release_sweep_lease`."""
        with self._lock:
            if self._sweep_leases.get(name, (None, None))[0] == owner:
                self._sweep_leases.pop(name)

    def mark_recovered(self, run_key: str, *, status: str, updated_at: float) -> bool:
        """See `StepStore.mark_recovered`."""
        with self._lock:
            run = self._runs.get(run_key)
            now = self.now()
            if run is None or not may_recover(run, status=status, updated_at=updated_at, now=now):
                return False
            self._runs[run_key] = dataclasses.replace(run, updated_at=now, recovered_at=now)
            return True

    def unmark_recovered(self, run_key: str, *, recovered_at: float | None) -> None:
        """See [`StepStore.unmark_recovered`][flexiq_plugins.OperatorStore.unmark_recovered]."""
        with self._lock:
            run = self._runs.get(run_key)
            if run is not None:
                self._runs[run_key] = dataclasses.replace(run, recovered_at=recovered_at)

    def settle_reported(self, run_key: str, status: str) -> bool:
        """See [`StepStore.settle_reported`][flexiq_plugins.OperatorStore.settle_reported]."""
        return self.release_run(run_key, reported_status(status), while_status={"queued"})

    # ----------------------------------------------------------------- events
    def add_event(self, topic: str, key: str, payload: bytes | None, *, run_key: str | None = None) -> SentEvent:
        """See `StepStore.add_event`."""
        with self._lock:
            event = EventRecord(self._next_event_id, topic, key, run_key, payload, self.now())
            self._events[event.id] = event
            self._next_event_id += 1
            waiters = tuple(sorted((r for r in self._runs.values() if wakes(r, event)), key=lambda r: r.run_key))
            return SentEvent(event, waiters)

    def next_event(self, run_key: str, topic: str, key: str) -> EventRecord | None:
        """See `StepStore.next_event`."""
        with self._lock:
            run = self._runs.get(run_key)
            return None if run is None else self._next_event(run, topic, key)

    # ------------------------------------------------ the operator's window (C52)
    def count_runs(self, *, by: RunGroup, cap: int, max_groups: int = 50) -> dict[str, int]:
        """See `StepStore.count_runs`."""
        with self._lock:
            counts: dict[str, int] = {}
            for run in self._runs.values():
                group = run.status if by == "status" else run.task_name
                counts[group] = min(counts.get(group, 0) + 1, cap + 1)
        return {group: counts[group] for group in sorted(counts)[:max_groups]}

    def find_runs(
        self, where: RunFilter, *, order: RunOrder = "updated_desc", after: RunCursor | None = None, limit: int = 50
    ) -> list[RunRecord]:
        """See `StepStore.find_runs`."""
        with self._lock:
            found = [r for r in self._runs.values() if _selected(r, where)]

        def place(run: RunRecord) -> tuple[float, str]:
            value = run.wake_at if order == "wake_asc" else run.updated_at
            return (value if value is not None else 0.0, run.run_key)

        if order == "wake_asc":
            found = [r for r in found if r.wake_at is not None]
        descending = order == "updated_desc"
        found.sort(key=place, reverse=descending)
        if after is not None:
            mark = (after.value, after.run_key)
            found = [r for r in found if (place(r) < mark if descending else place(r) > mark)]
        return found[:limit]

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
        """See `StepStore.find_dead_letters`."""
        with self._lock:
            letters = sorted(self._dead.values(), key=lambda d: d.id, reverse=True)
        return [
            d
            for d in letters
            if (before_id is None or d.id < before_id)
            and (task_name is None or d.task_name == task_name)
            and (reason is None or d.reason == reason)
            and (run_key is None or d.run_key == run_key)
            and (retried is None or (d.retried_at is not None) == retried)
        ][:limit]

    def count_dead_letters(self, *, since: float, cap: int) -> dict[str, int]:
        """See `StepStore.count_dead_letters`."""
        with self._lock:
            recent = sorted((d for d in self._dead.values() if d.created_at >= since), key=lambda d: -d.created_at)
        counts: dict[str, int] = {}
        for d in recent[: cap + 1]:
            counts[d.reason] = counts.get(d.reason, 0) + 1
        return counts

    def find_events(
        self,
        *,
        ids: Sequence[int] | None = None,
        before_id: int | None = None,
        limit: int = 50,
        received: bool | None = None,
    ) -> list[ListedEvent]:
        """See `StepStore.find_events`."""
        with self._lock:
            receivers: dict[int, list[str]] = {}
            for run_key, rows in self._steps.items():
                for event_id in consumed_event_ids(rows):
                    receivers.setdefault(event_id, []).append(run_key)
            events = sorted(self._events.values(), key=lambda e: e.id, reverse=True)
        wanted = None if ids is None else set(ids)
        listed = [
            ListedEvent(e, tuple(sorted(receivers.get(e.id, ()))))
            for e in events
            if (wanted is None or e.id in wanted)
            and (before_id is None or e.id < before_id)
            and (received is None or (e.id in receivers) == received)
        ]
        return listed[:limit]

    def sweep_leases(self) -> list[SweepLease]:
        """See `StepStore.sweep_leases`."""
        with self._lock:
            return [
                SweepLease(name, owner, until, self._swept_at.get(name))
                for name, (owner, until) in sorted(self._sweep_leases.items())
            ]


def _selected(run: RunRecord, where: RunFilter) -> bool:
    """Whether ``run`` passes every field of ``where`` that is given."""
    equal = (
        (where.status, run.status),
        (where.task_name, run.task_name),
        (where.framework, run.framework),
        (where.queue, run.queue),
    )
    if any(wanted is not None and wanted != value for wanted, value in equal):
        return False
    if where.updated_since is not None and run.updated_at < where.updated_since:
        return False
    if where.updated_until is not None and run.updated_at >= where.updated_until:
        return False
    return where.wake_before is None or (run.wake_at is not None and run.wake_at < where.wake_before)
