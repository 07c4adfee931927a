"""What an attempt tells its adapter: exactly one decision, already made by the core.

The core decides; an adapter only translates the decision into its
framework's verbs. The core has committed the run's state and made every
framework-neutral choice (whether a failure is retried, how long a put-back
waits, what a store outage does) before a decision reaches an adapter. The
adapter dispatches with ``match`` over [`Decision`][flexiq_plugins.integration.Decision] ending in
``assert_never``, so a new kind of decision is a type error in every adapter,
never a silent acknowledgement.

(A finished run's *outcome* is something else: its return value or error, as
the store keeps it and a [`Replay`][flexiq_plugins.integration.Replay] hands it back, C37.)

Each decision and the adapter's verb for it:

- [`Completed`][flexiq_plugins.integration.Completed]: return the value; acknowledge.
- [`PutBack`][flexiq_plugins.integration.PutBack]: re-enqueue the same job (same id, same run key) after
  ``delay`` s, then acknowledge; if the re-enqueue fails, keep the current
  message in the broker (no acknowledgement, no retry counted). Reason
  ``SHUTDOWN``: the worker is going away; a framework that gives the message
  of a terminated process back by itself (Celery) lets the process exit
  instead.
- [`Failure`][flexiq_plugins.integration.Failure]: the framework's own retry policy decides; when it gives
  up, call [`AttemptDriver.give_up`][flexiq_plugins.integration.AttemptDriver.give_up] and re-enqueue the job if it
  returns a ``PutBack``.
- [`DeadLetter`][flexiq_plugins.integration.DeadLetter]: no retry: the broker's dead-letter path (the store
  already records the dead letter); what the job raises or reports is a
  [`DeadLettered`][flexiq_plugins.errors.DeadLettered] (a subclass that also fits the framework's own dead-letter or
  skip path), so one ``except`` catches it everywhere.
- [`Ack`][flexiq_plugins.integration.Ack]: acknowledge without running anything more; with an
  ``error`` (a cancellation), first store it as the job's result for its waiter (C45).
- [`Replay`][flexiq_plugins.integration.Replay]: the run already finished (a duplicate): hand the framework
  its stored outcome as if the body had just ended: return ``value``, or raise
  ``error`` past the framework's retry policy (C37).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Ack",
    "AckReason",
    "Completed",
    "DeadLetter",
    "Ended",
    "Failure",
    "Decision",
    "PutBack",
    "PutBackReason",
    "Replay",
    "belongs_to_a_run",
]


class PutBackReason(enum.Enum):
    """Why a job goes back to its queue; none of them is a failure or counts a retry."""

    SLEEP = "sleep"
    """The body slept (C15–C18); the job wakes at its wake time."""
    BUSY = "busy"
    """Another live claim holds the run (C24); the job is checked again shortly."""
    STORE_UNAVAILABLE = "store_unavailable"
    """The store could not be reached (C28); retried whatever the task's filters say."""
    STEP_RETRY = "step_retry"
    """A step with a retry budget failed with attempts left (C31); the job comes back after its backoff."""
    COMPENSATE = "compensate"
    """The framework gave up on a run with compensations (C32); the next delivery runs them."""
    WAIT = "wait"
    """The body waits for an event (C33); the job comes back at the wait's deadline, or earlier when it is sent."""
    SHUTDOWN = "shutdown"
    """The worker shut down in the middle of the attempt (C38); the job runs again at once."""


class AckReason(enum.Enum):
    """Why a job is acknowledged without a value."""

    DUPLICATE = "duplicate"
    """The run is already terminal and keeps no outcome to replay (C26, C37): it finished before
    runs kept their outcome, or the framework ended it itself."""
    DROPPED = "dropped"
    """This attempt's claim was taken over (C25); what it did is dropped."""
    COMPENSATED = "compensated"
    """The run's compensations all ran after the framework had reported its failure (C32)."""
    WAITING = "waiting"
    """The body waits for an event without a deadline (C33): no message is kept; the sender (or recovery) wakes it."""
    CANCELLED = "cancelled"
    """The run was cancelled (C34): on request or over a run cap; its compensations ran."""


@dataclass(frozen=True)
class Completed:
    """The body returned; the run is committed ``succeeded`` (C26).

    A body that took no step returns without a run (lazy claims, C23):
    ``claimed`` is then ``False`` and nothing was written.

    Parameters:
      value (Any): what the body returned.
      claimed (bool): whether the attempt claimed its run.
    """

    value: Any
    claimed: bool = True


@dataclass(frozen=True)
class PutBack:
    """Re-enqueue the same job after ``delay`` seconds; the run's key travels with it (C15, C24, C28, C36).

    Parameters:
      reason (PutBackReason): why.
      delay (float): seconds until the job should run again (a sleep's time
        left, capped at the maximum hop, C18).
      detail (str): a human-readable note for logs, e.g. the sleep's step key.
      wake_at (float | None): a sleep's wake time, or a wait's deadline, epoch
        seconds (store clock); one of the run's run caps may bring it earlier (C34).
    """

    reason: PutBackReason
    delay: float
    detail: str = ""
    wake_at: float | None = None


@dataclass(frozen=True)
class Failure:
    """A retryable failure of user code (C28): the framework's own retry policy decides.

    The run is ``retrying`` with its claim released. If the framework gives up
    (no retry left, a filter that does not match), the adapter calls
    [`give_up`][flexiq_plugins.integration.AttemptDriver.give_up] before the
    message is acknowledged (C26): the run is settled ``failed``, or, when it
    has undos to run, a ``PutBack`` asks for one more delivery (C32).

    An attempt that never claimed its run (its body took no step) fails with
    ``claimed=False``: there is no run to settle, and ``give_up`` does no
    store I/O for it; the framework's own policy alone decides, as without
    the integration.

    Parameters:
      error (BaseException): what the body raised.
      run_key (str): the run.
      attempt (int): the attempt that failed (``0`` when it never claimed its run).
      claimed (bool): whether the attempt claimed its run (lazy claims, C23).
    """

    error: BaseException
    run_key: str
    attempt: int
    claimed: bool = True


@dataclass(frozen=True)
class DeadLetter:
    """The job goes to the dead-letter path, never retried (C13, C29, C30).

    Parameters:
      reason (str): short kind: ``divergence``, ``size_limit``, ``worker_lost`` …
      message (str): a human-readable message.
      error (BaseException | None): the error, when there is one.
    """

    reason: str
    message: str
    error: BaseException | None = None


@dataclass(frozen=True)
class Ack:
    """Acknowledge without running (more): a duplicate of a terminal run, or a dropped attempt.

    Parameters:
      reason (AckReason): why.
      detail (str): for the log, e.g. the run's terminal status.
      error (BaseException | None): what the job's result waiter is told before the
        acknowledgement, if anything (C45): a cancelled run's
        [`JobCancelled`][flexiq_plugins.errors.JobCancelled]. The adapter stores it in the
        framework's result store for this job (Celery's result backend, Dramatiq's
        ``Results``) unless that already holds a terminal state; ``None``: store nothing.
    """

    reason: AckReason
    detail: str = ""
    error: BaseException | None = None


@dataclass(frozen=True)
class Replay:
    """The run already finished: replay its stored outcome, without running the body (C37).

    A duplicate delivery of a finished run (its worker died after the store
    recorded the end and before the framework did), or a new job published
    with a finished run's key. The adapter ends the job through the
    framework's normal path, as if the body had just returned ``value`` or
    raised ``error``: the result backend stores it, chains, callbacks and
    pipelines continue. A replayed ``error`` is never retried: retrying
    would only replay it again.

    Parameters:
      status (str): the run's terminal status.
      value (Any): the run's return value (when ``error`` is ``None``).
      error (BaseException | None): the error to raise: the body's error
        rebuilt by its class name (C31 rules), a ``DeadLettered``, a
        ``JobCancelled``, or an ``OutcomeNotKept`` for a value over the step bytes limit.
    """

    status: str
    value: Any = None
    error: BaseException | None = None


Decision = Completed | PutBack | Failure | DeadLetter | Ack | Replay
"""Every decision an attempt can end with; adapters ``match`` over it exhaustively."""


class Ended(enum.Enum):
    """How the framework ended a job by itself, as an adapter reports it (C38, C45).

    The adapter reports what happened through
    [`framework_ended`][flexiq_plugins.integration.AttemptDriver.framework_ended]; the
    core decides what the run becomes (`flexiq_plugins._attempt.endings`):
    a revoke, an expiry or a skip *cancels* it (C34: its compensations run,
    then it is ``cancelled``); a time limit, an age limit or a failure the
    framework acknowledged *fails* it (C32: with committed undos they run,
    then it is ``compensated``; else ``failed``). Either way the run ends
    terminal and recovery leaves it alone.
    """

    REVOKED = "revoked"
    """Revoked (or terminated) by an operator: Celery ``revoke()``."""
    EXPIRED = "expired"
    """Dropped because its message expired: Celery ``expires``."""
    SKIPPED = "skipped"
    """Skipped before its body ran, and acknowledged: a Dramatiq middleware's ``SkipMessage``."""
    TIME_LIMIT = "time_limit"
    """Killed by the framework's hard time limit while its body ran, its message acknowledged: Celery
    ``time_limit``. The attempt it killed may still hold the run's claim: the core takes the run from it."""
    AGE_LIMIT = "age_limit"
    """Dropped before its body ran because the message was too old, and failed: Dramatiq's ``AgeLimit``
    (a sleeping job's wake-up carries its first enqueue's time)."""
    FAILED = "failed"
    """Given up as failed, its message acknowledged or rejected for good: a Dramatiq nack (a message
    another middleware failed, retries exhausted), a Celery failure it acknowledges."""


def belongs_to_a_run(decision: Decision) -> bool:
    """Whether the attempt that ended with ``outcome`` belongs to a run in the store (C44).

    True for an attempt that claimed its run (it completed or failed), and for
    a replay of a finished run (C37). The jobs the framework then dispatches
    on the job's behalf (callbacks, a chain's next task, a pipeline's next
    stage) get run keys derived from the run's
    ([`derived_run_key`][flexiq_plugins.integration.derived_run_key]); a job that
    took no step has no run, and its dispatches stay new jobs.
    """
    match decision:
        case Replay() | DeadLetter():
            return True
        case Completed(claimed=claimed) | Failure(claimed=claimed):
            return claimed
        case _:
            return False
