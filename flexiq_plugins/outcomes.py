"""What an attempt tells its adapter: exactly one outcome, turned into the framework's verb.

========================  =====================================================
Outcome                   Adapter's verb
========================  =====================================================
:class:`Completed`        return the value; acknowledge
:class:`Sleeping`         re-enqueue the same job after ``delay`` s, then acknowledge
:class:`Retry`            the framework's retry policy decides (``always``: retry regardless)
:class:`DeadLetter`       no retry: the broker's dead-letter path (store already records it)
:class:`Busy`             put the job back after ``retry_after`` s; run nothing
:class:`Duplicate`        acknowledge without running: the run is already terminal
:class:`Dropped`          the claim was lost: acknowledge, record nothing
========================  =====================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Busy", "Completed", "DeadLetter", "Dropped", "Duplicate", "Outcome", "Retry", "Sleeping"]


@dataclass(frozen=True)
class Completed:
    """The body returned; the run is committed ``succeeded`` (C26).

    Parameters:
      value(Any): what the body returned.
    """

    value: Any


@dataclass(frozen=True)
class Sleeping:
    """The body slept (C15–C18); the claim is released, status ``sleeping``.

    Parameters:
      wake_at(float): the wake time, epoch seconds (store clock).
      delay(float): seconds to delay the re-enqueued job: the time left,
        capped at the maximum hop (C18).
      step_key(str): the sleep's step key.
    """

    wake_at: float
    delay: float
    step_key: str


@dataclass(frozen=True)
class Retry:
    """A retryable failure (C28); the run is ``retrying`` with its claim released.

    Parameters:
      error(BaseException): what was raised.
      always(bool): ``True`` for a store outage: retry even where the task's
        own filters would not.
    """

    error: BaseException
    always: bool = False


@dataclass(frozen=True)
class DeadLetter:
    """The job goes to the dead-letter path, never retried (C13, C29, C30).

    Parameters:
      reason(str): short kind: ``divergence``, ``size_cap``, ``worker_lost`` …
      message(str): a human-readable message.
      error(BaseException | None): the error, when there is one.
    """

    reason: str
    message: str
    error: BaseException | None = None


@dataclass(frozen=True)
class Busy:
    """Another live claim holds the run (C24): put the job back, run nothing.

    Parameters:
      retry_after(float): seconds to wait before delivering it again (a few
        seconds, never longer than the remaining lease).
    """

    retry_after: float


@dataclass(frozen=True)
class Duplicate:
    """The run is already terminal (C26): acknowledge without running.

    Parameters:
      status(str): the run's terminal status.
    """

    status: str


@dataclass(frozen=True)
class Dropped:
    """The claim was taken over (C25): this attempt's outcome is dropped.

    Parameters:
      reason(str): why, for the log.
    """

    reason: str


Outcome = Completed | Sleeping | Retry | DeadLetter | Busy | Duplicate | Dropped
