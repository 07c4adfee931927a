"""What ``step.run`` accepts besides its body: a retry budget (C31) and an undo (C32).

A :class:`RetryPolicy` is a durable budget for one step: its attempts are
counted in the store, not in the broker's headers, so a worker killed inside
the body uses one and a redelivery does not give any back. Between two
attempts the job leaves the worker, like a sleep, for the policy's backoff.
The task's own retry settings (Celery's ``max_retries``, Dramatiq's
``Retries``) are not touched by a step's retries.

A :class:`Compensation` is what undoes a committed step when the run fails for
good; ``step.run(..., compensate=undo)`` takes a plain callable too.

A :class:`CancellationPolicy` holds a run's run caps: on its duration and its time
suspended in sleeps and waits (C34, :mod:`flexiq_plugins._attempt.cancellation`).

Both are plain frozen values with no store or framework in them, so they can
be module constants shared by many tasks.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigurationError, NonRetryableError
from .durations import parse_duration

__all__ = ["CancellationPolicy", "Compensation", "RetryPolicy", "cancellation_option", "retry_policy_option"]

ErrorTypes = tuple[type[BaseException], ...]

_DELAY_FIELDS = ("initial_delay", "max_delay", "jitter")
_FORMS = "an exception class or a tuple of them"


@dataclass(frozen=True)
class RetryPolicy:
    """A step's durable retry budget and backoff (C31).

    Parameters:
      max_attempts(int): attempts in all, the first included (default 3);
        at least 1. A worker lost inside the body counts as an attempt.
      initial_delay(float): seconds before the second attempt (default 1);
        a duration string such as ``"30s"`` or a ``timedelta`` is accepted.
      multiplier(float): each later delay is the previous one times this
        (default 2); at least 1.
      max_delay(float): no delay is longer than this, seconds (default 300).
      jitter(float): up to this many seconds, drawn at random, are added to
        each delay so many runs failing at once do not retry at once (default 0).
      retry_on(type | tuple[type, ...]): the errors the budget retries
        (default ``(Exception,)``). Any other error fails the step for good.
      no_retry_on(type | tuple[type, ...]): errors that fail the step for good
        even if ``retry_on`` matches (default none). A
        :class:`~flexiq_plugins.NonRetryableError` always does.

    Raises:
      ConfigurationError: a value of the wrong type or range, naming the field
        and what it accepts.
    """

    max_attempts: int = 3
    initial_delay: float = 1.0
    multiplier: float = 2.0
    max_delay: float = 300.0
    jitter: float = 0.0
    retry_on: ErrorTypes = (Exception,)
    no_retry_on: ErrorTypes = field(default=())

    def __post_init__(self) -> None:
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            raise ConfigurationError(f"RetryPolicy max_attempts={self.max_attempts!r} must be an int of at least 1")
        for name in _DELAY_FIELDS:
            object.__setattr__(self, name, _seconds(name, getattr(self, name)))
        multiplier = self.multiplier
        if isinstance(multiplier, bool) or not isinstance(multiplier, (int, float)) or not 1 <= multiplier < math.inf:
            raise ConfigurationError(f"RetryPolicy multiplier={multiplier!r} must be a finite number of at least 1")
        object.__setattr__(self, "multiplier", float(multiplier))
        object.__setattr__(self, "retry_on", _error_types("retry_on", self.retry_on))
        object.__setattr__(self, "no_retry_on", _error_types("no_retry_on", self.no_retry_on))

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> RetryPolicy:
        """Build a policy from a mapping of its fields (e.g. a settings dict).

        Raises:
          ConfigurationError: an unknown field or an unusable value.
        """
        known = sorted(cls.__dataclass_fields__)
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ConfigurationError(f"RetryPolicy got unknown field(s) {', '.join(unknown)}; accepted: {known}")
        return cls(**values)

    def retries(self, error: BaseException) -> bool:
        """Whether the budget may retry a step that raised ``error`` (attempts left permitting)."""
        if isinstance(error, (NonRetryableError, *self.no_retry_on)):
            return False
        return isinstance(error, self.retry_on)

    def delay_after(self, attempt: int, *, rng: Callable[[], float] = random.random) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1 for the first) before the next one.

        ``min(max_delay, initial_delay * multiplier ** (attempt - 1))``, plus a
        random ``[0, jitter)`` seconds.
        """
        exponent = max(attempt - 1, 0)
        try:
            base = self.initial_delay * self.multiplier**exponent
        except OverflowError:
            base = math.inf
        return min(self.max_delay, base) + self.jitter * rng()


def _seconds(name: str, value: object) -> float:
    try:
        return parse_duration(value)
    except ConfigurationError as exc:
        raise ConfigurationError(f"RetryPolicy {name}={value!r}: {exc}") from exc


def _error_types(name: str, value: object) -> ErrorTypes:
    items = value if isinstance(value, tuple) else (value,)
    for item in items:
        if not (isinstance(item, type) and issubclass(item, BaseException)):
            raise ConfigurationError(f"RetryPolicy {name}={value!r} must be {_FORMS}, e.g. (ConnectionError,)")
    return items  # type: ignore[return-value]


def retry_policy_option(value: object, *, where: str) -> RetryPolicy | None:
    """Check a ``step_retry`` option: a :class:`RetryPolicy`, a mapping of its fields, or ``None``.

    Parameters:
      value(object): what the task, actor or integration was given.
      where(str): names the option in the error message, e.g. ``"task 'shop.checkout' step_retry"``.

    Raises:
      ConfigurationError: any other value, naming the accepted forms.
    """
    if value is None or isinstance(value, RetryPolicy):
        return value
    if isinstance(value, Mapping):
        return RetryPolicy.from_mapping(value)
    raise ConfigurationError(
        f"{where}={value!r} must be a RetryPolicy (e.g. RetryPolicy(max_attempts=3)), a dict of its fields, or None"
    )


@dataclass(frozen=True)
class Compensation:
    """What undoes a committed step when its run fails for good (C32).

    ``step.run("charge", pay, compensate=Compensation(refund, retry=RetryPolicy(max_attempts=5)))``;
    a plain callable (``compensate=refund``) is the same with the defaults.

    Parameters:
      fn(Callable[[Any], Any]): called with the step's value; it runs as a step
        of its own, ``compensate:<step key>``, with its own idempotency key.
        It may return an awaitable, which is awaited.
      retry(RetryPolicy | None): its budget; ``None``: the task's
        ``step_retry`` if set, else ``RetryPolicy()`` (3 attempts).
      name(str | None): how the store and the dead letters name the undo;
        default: the function's qualified name.
    """

    fn: Callable[[Any], Any]
    retry: RetryPolicy | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise ConfigurationError(f"Compensation fn={self.fn!r} must be callable; it is called with the value")
        if self.retry is not None and not isinstance(self.retry, RetryPolicy):
            raise ConfigurationError(f"Compensation retry={self.retry!r} must be a RetryPolicy or None")
        if self.name is None:
            name = getattr(self.fn, "__qualname__", None) or getattr(self.fn, "__name__", None) or repr(self.fn)
            object.__setattr__(self, "name", str(name))

    @property
    def label(self) -> str:
        """The undo's display name (at most 255 characters, as stored)."""
        return str(self.name)[:255]


_FIELDS = ("max_run_seconds", "max_suspended_seconds")


@dataclass(frozen=True)
class CancellationPolicy:
    """The run caps of a run (C34); ``None`` leaves a cap off.

    Parameters:
      max_run_seconds(float | None): the longest a run may last from its
        creation, seconds (a duration string such as ``"7d"`` or a
        ``timedelta`` is accepted).
      max_suspended_seconds(float | None): the longest a run may spend in
        sleeps and waits for events in all, seconds (or a duration).

    Raises:
      ConfigurationError: a cap that is not a positive duration.
    """

    max_run_seconds: float | None = None
    max_suspended_seconds: float | None = None

    def __post_init__(self) -> None:
        for name in _FIELDS:
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, _positive(name, value))

    @property
    def empty(self) -> bool:
        """Whether no cap is set."""
        return self.max_run_seconds is None and self.max_suspended_seconds is None

    def over(self, default: CancellationPolicy | None) -> CancellationPolicy:
        """This policy, each cap it leaves off taken from ``default`` (the integration's)."""
        if default is None:
            return self
        return CancellationPolicy(
            self.max_run_seconds if self.max_run_seconds is not None else default.max_run_seconds,
            self.max_suspended_seconds if self.max_suspended_seconds is not None else default.max_suspended_seconds,
        )


def _positive(name: str, value: object) -> float:
    try:
        seconds = parse_duration(value)
    except ConfigurationError as exc:
        raise ConfigurationError(f"{name}={value!r}: {exc}") from exc
    if seconds <= 0:
        raise ConfigurationError(f"{name}={value!r} must be a positive duration, e.g. '7d' or 3600")
    return seconds


def cancellation_option(
    max_run_seconds: object, max_suspended_seconds: object, *, where: str
) -> CancellationPolicy | None:
    """A task's or actor's run caps from its two options, or ``None`` when both are unset (C34).

    Parameters:
      max_run_seconds(object): the option's value (seconds, a duration string, ``None``).
      max_suspended_seconds(object): the option's value.
      where(str): names the task in the error message, e.g. ``"task 'shop.checkout'"``.

    Raises:
      ConfigurationError: a value that is not a positive duration, naming the task.
    """
    if max_run_seconds is None and max_suspended_seconds is None:
        return None
    try:
        return CancellationPolicy(max_run_seconds, max_suspended_seconds)  # type: ignore[arg-type]
    except ConfigurationError as exc:
        raise ConfigurationError(f"{where}: {exc}") from exc
