"""The records of a run as the store keeps them, and what its methods return.

A store keeps six things: *runs* (one row per run key: status, the claim and
the job envelope, [`RunRecord`][flexiq_plugins.RunRecord]), *step rows* (the committed steps of a
run, [`StepRow`][flexiq_plugins.StepRow]), *step attempts* (each attempt of a step with a retry
budget, journaled before its body runs, C31, [`StepAttempt`][flexiq_plugins.StepAttempt]), *dead
letters* ([`DeadLetterRecord`][flexiq_plugins.DeadLetterRecord]) and *events* (`EventRecord`,
C33) and *known tasks*, the tasks known to take steps ([`KnownTask`][flexiq_plugins.KnownTask], C43).
These are plain frozen dataclasses: every layer above the store reads
them, none of them does I/O.

Times are ``float`` seconds since the epoch **on the store's clock** (C23).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "CLEANABLE_STATUSES",
    "LIVE_STATUSES",
    "TERMINAL_STATUSES",
    "UNSTARTED_STATUSES",
    "AttemptNotDue",
    "AttemptStarted",
    "AttemptsSpent",
    "BeginResult",
    "Begun",
    "Busy",
    "Claim",
    "DeadLetterRecord",
    "EventPoll",
    "EventRecord",
    "Finished",
    "JobEnvelope",
    "KnownTask",
    "NewDeadLetter",
    "RunRecord",
    "RunStatus",
    "SentEvent",
    "StepAttempt",
    "StepAttemptBegin",
    "StepAttemptFailed",
    "StepAttemptFailure",
    "StepAttemptEnd",
    "StepKind",
    "StepRow",
]


RunStatus = Literal[
    "queued",
    "pending",
    "running",
    "sleeping",
    "waiting",
    "retrying",
    "succeeded",
    "failed",
    "dead",
    "cancelled",
    "compensated",
]
"""The states of a run. ``succeeded``, ``failed``, ``dead``, ``cancelled`` and ``compensated`` are terminal.

``queued``: recorded when its job was published, no attempt has started yet
(C39); the first claim takes it to ``running`` like a ``pending`` run.

``waiting``: the run waits for an event (C33); ``cancelled``: it was
cancelled on request or over a run cap of its task, its compensations run (C34);
``compensated``: the run failed for good and the compensations of its
committed steps all ran (C32).
"""


TERMINAL_STATUSES: frozenset[str] = frozenset({"succeeded", "failed", "dead", "cancelled", "compensated"})


LIVE_STATUSES: frozenset[str] = frozenset({"queued", "pending", "running", "sleeping", "waiting", "retrying"})
"""The states a run can still leave: those that are not terminal."""


UNSTARTED_STATUSES: frozenset[str] = frozenset({"queued", "pending"})
"""The states of a run no attempt started: with ``attempt`` 0, or (``pending``) a retried dead letter unchanged
since its retry (`StepStore.dead_letter_unstarted`)."""


CLEANABLE_STATUSES: frozenset[str] = frozenset({"succeeded", "failed", "cancelled", "compensated"})
"""Terminal states that `StepStore.cleanup` may drop; a ``dead`` run stays
while a dead letter names it, and is dropped once its dead letters were purged
(C27, C30)."""


StepKind = Literal["run", "sleep", "compensation", "wait", "event", "map", "patch"]
"""``run`` (``step.run``, each undo ``compensate:<step key>``, and each item
``name:key`` of a step map), ``sleep``, ``compensation``: the row that records
why a run is being compensated (C32), ``wait``: the start of
``step.wait_for_event`` (its deadline), ``event``: what the wait received,
``event:<wait step key>`` (C33), ``map``: the entry ``name#n`` of a step
map in the sequence, with no value (C51), and ``patch``: the marker
``patch:<id>`` of a run that took the new branch of ``step.patched(id)`` (C49)."""


StepAttemptEnd = Literal["lost", "failed", "exhausted", "non_retryable"]
"""How a step attempt ended (C31): its worker or claim was lost; it failed and
another attempt follows; it failed and the budget is spent; it failed for
good (a non-retryable error). An attempt still running, or one whose step
then committed, has not ended (``None``)."""


@dataclass(frozen=True)
class JobEnvelope:
    """What is needed to re-publish a job (C35): stored with its run.

    Parameters:
      task_name (str): the Celery task name or Dramatiq actor name.
      framework (str): ``"celery"``, ``"dramatiq"`` or ``"test"``.
      queue (str | None): the queue the job was published to.
      args (list): positional arguments, as the framework serialized them.
      kwargs (dict): keyword arguments.
      options (dict): framework options needed to re-publish (headers, eta …),
        JSON-compatible.
      corrupt (str | None): why the stored envelope could not be read (then only
        ``task_name``, ``framework`` and ``queue`` are known, from their own
        columns, and it cannot be re-published); ``None`` for a sound one.
    """

    task_name: str
    framework: str
    queue: str | None = None
    args: Sequence[Any] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    corrupt: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return the envelope as a JSON-compatible ``dict``."""
        return {
            "task_name": self.task_name,
            "framework": self.framework,
            "queue": self.queue,
            "args": list(self.args),
            "kwargs": dict(self.kwargs),
            "options": dict(self.options),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobEnvelope:
        """Build an envelope from [`to_dict`][flexiq_plugins.JobEnvelope.to_dict]'s output."""
        return cls(
            task_name=data["task_name"],
            framework=data["framework"],
            queue=data.get("queue"),
            args=list(data.get("args") or ()),
            kwargs=dict(data.get("kwargs") or {}),
            options=dict(data.get("options") or {}),
        )


@dataclass(frozen=True)
class Claim:
    """``(run key, owner, attempt, lease_until)``: what every write is fenced on.

    Parameters:
      run_key (str): the run claimed.
      owner (str): the claiming worker's id (host, pid, random part).
      attempt (int): this attempt's number, 1 for the first.
      lease_until (float): lease expiry, epoch seconds, store clock.
    """

    run_key: str
    owner: str
    attempt: int
    lease_until: float


@dataclass(frozen=True)
class StepRow:
    """One committed step.

    Parameters:
      position (int): 0-based index in the run's recorded sequence.
      step_key (str): ``name#n`` or ``name:key`` (C1).
      kind (str): ``"run"``, ``"sleep"``, ``"wait"``, ``"event"``, ``"compensation"`` or ``"patch"``.
      value (bytes | None): the encoded value of a ``run`` step.
      wake_at (float | None): a ``sleep`` step's wake time, epoch seconds.
      committed_at (float | None): commit time, epoch seconds, store clock
        (``None`` before it is stored).
      attempt (int): the attempt that committed it.
      failure (str | None): for a step that failed for good, or a
        ``compensation`` row, the failure as JSON text (written and read by
        `flexiq_plugins._model.failures`; the store does not look inside).
      compensate (str | None): the name of the undo the step registered (C32).
      event_id (int | None): for an ``event`` row, the id of the event it
        received (C33): an event is received at most once per run.
    """

    position: int
    step_key: str
    kind: StepKind
    value: bytes | None = None
    wake_at: float | None = None
    committed_at: float | None = None
    attempt: int = 0
    failure: str | None = None
    compensate: str | None = None
    event_id: int | None = None

    @property
    def size(self) -> int:
        """The stored value's size in bytes (0 for a sleep)."""
        return len(self.value) if self.value is not None else 0


@dataclass(frozen=True)
class StepAttempt:
    """One recorded attempt of a step (C31).

    A step with a retry budget journals each attempt before its body runs;
    a step without one records only its failures.

    Parameters:
      run_key (str): the run.
      step_key (str): the step.
      number (int): 1 for the step's first attempt.
      run_attempt (int): the run's attempt (the job's execution) that made it.
      started_at (float): when it was journaled, epoch seconds, store clock.
      ended (str | None): how it ended, see `StepAttemptEnd`; ``None`` while it runs or once its step committed.
      error_type (str | None): the error's qualified class name.
      message (str | None): the error's message (truncated).
      traceback (str | None): the formatted traceback (truncated to its end).
      failed_at (float | None): when the failure was recorded, epoch seconds.
      retry_at (float | None): when the next attempt is due, epoch seconds.
    """

    run_key: str
    step_key: str
    number: int
    run_attempt: int
    started_at: float
    ended: StepAttemptEnd | None = None
    error_type: str | None = None
    message: str | None = None
    traceback: str | None = None
    failed_at: float | None = None
    retry_at: float | None = None


@dataclass(frozen=True)
class StepAttemptFailure:
    """What `StepStore.fail_step_attempt` records about a failed step
    attempt (C31).

    Parameters:
      step_key (str): the step.
      number (int | None): the attempt journaled by `StepStore.begin_step_attempt`;
        ``None`` for a step without a budget (the store gives it the next number).
      ended (str): how it ended: ``failed``, ``exhausted`` or ``non_retryable``.
      error_type (str | None): the error's qualified class name (``None``: the worker was lost).
      message (str): the error's message, already truncated.
      traceback (str): the formatted traceback, already truncated.
      retry_delay (float | None): seconds from the store's now until the next
        attempt is due (``ended == "failed"`` with a budget).
    """

    step_key: str
    number: int | None
    ended: StepAttemptEnd
    error_type: str | None
    message: str
    traceback: str = ""
    retry_delay: float | None = None


@dataclass(frozen=True)
class AttemptStarted:
    """A new step attempt was journaled: run the body.

    Parameters:
      number (int): the new attempt's number.
      previous (tuple[StepAttempt, ...]): the step's earlier attempts.
    """

    number: int
    previous: tuple[StepAttempt, ...]


@dataclass(frozen=True)
class AttemptNotDue:
    """The step's last attempt failed and its next one is not due yet (an early delivery).

    Parameters:
      retry_at (float): when it is due, epoch seconds, store clock.
    """

    retry_at: float


@dataclass(frozen=True)
class AttemptsSpent:
    """The step's budget is spent: no attempt was journaled.

    Parameters:
      previous (tuple[StepAttempt, ...]): every attempt of the step.
    """

    previous: tuple[StepAttempt, ...]


StepAttemptBegin = AttemptStarted | AttemptNotDue | AttemptsSpent


@dataclass(frozen=True)
class StepAttemptFailed:
    """A recorded step failure, as stored.

    Parameters:
      attempt (StepAttempt): the attempt, ``failed_at`` and ``retry_at`` on the store's clock.
      row (StepRow | None): the step row committed with it (a step failed for good).
    """

    attempt: StepAttempt
    row: StepRow | None


@dataclass(frozen=True)
class Begun:
    """The run was claimed: run the body.

    Parameters:
      claim (Claim): the new claim.
      snapshot (tuple[StepRow, ...]): every committed step row, by position.
      now (float): the store's clock when the claim was taken (epoch seconds).
      takeovers (int): how many times a claim of this run was taken over from a
        worker whose lease expired, this takeover included (C25).
      envelope (JobEnvelope): the run's stored envelope.
      created_at (float): when the run was created, epoch seconds (its duration cap, C34).
      cancel_reason (str | None): the run's requested cancellation, if any (C34).
      trace_context (str | None): the W3C ``traceparent`` of the run's first
        traced attempt, as stored before this claim (C53); ``None`` when no
        attempt stored one yet (this claim may have stored its own).
    """

    claim: Claim
    snapshot: tuple[StepRow, ...]
    now: float
    takeovers: int
    envelope: JobEnvelope
    created_at: float = 0.0
    cancel_reason: str | None = None
    trace_context: str | None = None


@dataclass(frozen=True)
class Busy:
    """Another live claim holds the run (C24).

    Parameters:
      lease_remaining (float): seconds until that claim's lease expires.
    """

    lease_remaining: float


@dataclass(frozen=True)
class Finished:
    """The run is already terminal (C26): acknowledge without running.

    Parameters:
      status (str): the terminal status.
      outcome (bytes | None): the run's stored outcome, written with its
        terminal status (C37): opaque to the store, written and read by
        `flexiq_plugins._model.replays` (``value_outcome`` … / ``load_outcome``);
        ``None`` for a run that keeps none (finished before runs kept their
        outcome, or ended by the framework itself).
    """

    status: str
    outcome: bytes | None = None


BeginResult = Begun | Busy | Finished


@dataclass(frozen=True)
class NewDeadLetter:
    """What the driver records when a job is dead-lettered (C30).

    Parameters:
      job_id (str): the framework's job id.
      reason (str): a short kind, e.g. ``"divergence"``, ``"worker_lost"``.
      message (str): the error's message.
      traceback (str): the formatted traceback ('' if none).
    """

    job_id: str
    reason: str
    message: str
    traceback: str = ""


@dataclass(frozen=True)
class DeadLetterRecord:
    """A stored dead letter."""

    id: int
    run_key: str
    job_id: str
    task_name: str
    reason: str
    message: str
    traceback: str
    envelope: JobEnvelope
    created_at: float
    retried_at: float | None


@dataclass(frozen=True)
class RunRecord:
    """A stored run, as operators see it.

    ``wake_at`` is the wake time of a ``sleeping`` run (a ``waiting`` run's
    deadline, a ``queued`` run's due time: C39) and ``recovered_at`` when a recoverer last re-published it
    (epoch seconds, store clock; both ``None`` otherwise). ``wait_topic`` and
    ``wait_key`` name the event a ``waiting`` run waits for (C33);
    ``cancel_reason`` is a ``cancelled`` run's reason, or a cancellation
    requested and not yet carried out (C34). ``outcome`` is a terminal run's
    stored outcome (C37), opaque bytes (see `Finished`). ``trace_context`` is
    the W3C ``traceparent`` of the run's first traced attempt (C53), ``None``
    if no attempt was traced.
    """

    run_key: str
    task_name: str
    framework: str
    queue: str | None
    status: str
    owner: str | None
    attempt: int
    lease_until: float | None
    takeovers: int
    job_id: str | None
    envelope: JobEnvelope
    step_count: int
    step_bytes: int
    created_at: float
    updated_at: float
    wake_at: float | None = None
    recovered_at: float | None = None
    wait_topic: str | None = None
    wait_key: str | None = None
    cancel_reason: str | None = None
    outcome: bytes | None = None
    trace_context: str | None = None


@dataclass(frozen=True)
class EventRecord:
    """A stored event (C33).

    Parameters:
      id (int): its id; ids grow in the order events are sent and are never reused.
      topic (str): its topic, e.g. ``"payment"``.
      key (str): its key, e.g. an order id.
      run_key (str | None): the one run it was sent to, or ``None`` for every
        run waiting on ``(topic, key)``.
      payload (bytes | None): the encoded payload (``None``: none).
      created_at (float): when it was sent, epoch seconds, store clock.
    """

    id: int
    topic: str
    key: str
    run_key: str | None
    payload: bytes | None
    created_at: float


@dataclass(frozen=True)
class EventPoll:
    """What `StepStore.poll_event` found for a waiting step (C33).

    Parameters:
      event (EventRecord | None): the first event the run can receive, or ``None``.
      now (float): the store's clock, epoch seconds.
      timed_out (bool): no event, and the wait's deadline has passed.
    """

    event: EventRecord | None
    now: float
    timed_out: bool = False


@dataclass(frozen=True)
class SentEvent:
    """What `StepStore.add_event` stored, and the runs to wake for it (C33).

    Parameters:
      event (EventRecord): the stored event.
      waiters (tuple[RunRecord, ...]): the runs waiting on its ``(topic, key)``
        that can receive it (``waiting``, or ``running`` and about to wait).
    """

    event: EventRecord
    waiters: tuple[RunRecord, ...]


@dataclass(frozen=True)
class KnownTask:
    """A task or actor known to take steps: the first attempt of it that took a step wrote it (C43).

    Parameters:
      name (str): the task or actor name.
      framework (str): the framework whose task it is (``"celery"``, ``"dramatiq"``).
      first_seen (float): when its first step was taken, epoch seconds, store clock.
    """

    name: str
    framework: str
    first_seen: float
