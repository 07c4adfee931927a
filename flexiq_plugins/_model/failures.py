"""Failures as the store keeps them, and the errors a replay raises from them (C31, C32).

A failed step attempt is recorded as text: the error's qualified class name,
its message and its traceback, each cut to a size (messages to
:data:`MAX_MESSAGE_CHARS`, tracebacks to their last :data:`MAX_TRACEBACK_CHARS`
characters, never more than the step bytes limit). Like dead letters, these
texts do not go through the step codecs: do not put secrets in error messages.

A step that failed for good keeps its failure in its step row, as JSON; a
replay raises the same error again without calling the body
(:func:`replay_error`): the class is imported by name and built with the
message, so a body's ``except PaymentDeclined`` matches on every attempt
(only ``Exception`` subclasses are imported, by the name the store holds: the
store is trusted like the code that wrote it). A class that can no longer be
imported or built is replaced by a :class:`~flexiq_plugins.NonRetryableError`
naming it.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import traceback
from dataclasses import asdict, dataclass
from typing import Any, Literal

from ..errors import NonRetryableError, StepRetryExhausted, mark_final, reason_of

__all__ = [
    "MAX_MESSAGE_CHARS",
    "MAX_TRACEBACK_CHARS",
    "ErrorText",
    "RunFailure",
    "StepFailure",
    "build_error",
    "error_text",
    "exhausted_error",
    "load_failure",
    "qualified_name",
    "rebuild_error",
    "replay_error",
]

MAX_MESSAGE_CHARS = 2000
"""The longest error message kept, in characters."""

MAX_TRACEBACK_CHARS = 16_000
"""The longest traceback kept (its end), in characters; never more than the step bytes limit."""

MAX_TYPE_CHARS = 255

Origin = Literal["dead_letter", "framework", "cancelled"]


@dataclass(frozen=True)
class ErrorText:
    """An error as text, within the size limits.

    Parameters:
      error_type(str): the qualified class name, ``module.QualName``.
      message(str): ``str(error)``, cut to :data:`MAX_MESSAGE_CHARS`.
      traceback(str): the formatted traceback, its last characters.
    """

    error_type: str
    message: str
    traceback: str


def qualified_name(cls: type) -> str:
    """``module.QualName`` of a class (``builtins`` omitted), at most 255 characters."""
    module = cls.__module__
    name = cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}"
    return name[:MAX_TYPE_CHARS]


def _cut_end(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return "… (truncated)\n" + text[len(text) - limit :]


def error_text(error: BaseException, *, max_traceback: int = MAX_TRACEBACK_CHARS) -> ErrorText:
    """``error`` as :class:`ErrorText`: class name, message and traceback, each cut to its longest length.

    Parameters:
      error(BaseException): the error.
      max_traceback(int): the traceback's longest length in characters (the smaller of
        this and :data:`MAX_TRACEBACK_CHARS` applies).
    """
    message = str(error)
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[: MAX_MESSAGE_CHARS - 1] + "…"
    trace = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    return ErrorText(qualified_name(type(error)), message, _cut_end(trace, min(max_traceback, MAX_TRACEBACK_CHARS)))


@dataclass(frozen=True)
class StepFailure:
    """Why a step failed for good, as its step row keeps it (C31).

    Parameters:
      reason(str): ``non_retryable`` or ``step_retry_exhausted``.
      error_type(str | None): the (last) error's class name; ``None`` when
        the last attempt's worker was lost.
      message(str): the (last) error's message.
      attempts(int): the attempts the step had.
    """

    reason: str
    error_type: str | None
    message: str
    attempts: int

    def to_json(self) -> str:
        """The JSON text stored in the step row's ``failure`` column."""
        return json.dumps({"step": asdict(self)}, separators=(",", ":"))


@dataclass(frozen=True)
class RunFailure:
    """Why a run is being compensated, as its ``compensation`` row keeps it (C32).

    Parameters:
      origin(str): ``dead_letter`` (it failed for good inside an attempt: the
        job is dead-lettered once compensated), ``framework`` (the
        framework gave up retrying it and has already reported the failure)
        or ``cancelled`` (it was cancelled: it ends ``cancelled``, C34).
      reason(str): the dead letter's reason kind, e.g. ``step_retry_exhausted``.
      error_type(str): the error's class name.
      message(str): the error's message.
      traceback(str): the error's traceback.
    """

    origin: Origin
    reason: str
    error_type: str
    message: str
    traceback: str

    @classmethod
    def of(cls, error: BaseException, origin: Origin, *, max_traceback: int = MAX_TRACEBACK_CHARS) -> RunFailure:
        """The failure of ``error``, with its dead-letter reason kind."""
        text = error_text(error, max_traceback=max_traceback)
        return cls(origin, reason_of(error), text.error_type, text.message, text.traceback)

    def to_json(self) -> str:
        """The JSON text stored in the ``compensation`` row's ``failure`` column."""
        return json.dumps({"run": asdict(self)}, separators=(",", ":"))

    @property
    def summary(self) -> str:
        """``"<reason>: <message>"``, how messages name the failure."""
        return f"{self.reason}: {self.message}"


def load_failure(text: str) -> StepFailure | RunFailure:
    """Read what :meth:`StepFailure.to_json` or :meth:`RunFailure.to_json` wrote.

    Raises:
      ValueError: the text is not such JSON.
    """
    data: dict[str, Any] = json.loads(text)
    if "step" in data:
        return StepFailure(**data["step"])
    if "run" in data:
        return RunFailure(**data["run"])
    raise ValueError(f"not a stored failure: {text[:80]!r}")


def rebuild_error(error_type: str | None, message: str) -> BaseException | None:
    """The error ``error_type(message)``, imported by name; ``None`` for ``None``.

    A class that cannot be imported, is not an exception, or cannot be built
    from its message is replaced by :class:`NonRetryableError` naming it.
    """
    if error_type is None:
        return None
    built = build_error(error_type, message)
    return built if built is not None else NonRetryableError(f"{error_type}: {message}")


def build_error(error_type: str, message: str) -> BaseException | None:
    """The error ``error_type(message)``, its ``Exception`` class imported by name; ``None`` if it cannot be built."""
    cls = _exception_class(error_type)
    if cls is None:
        return None
    with contextlib.suppress(Exception):  # the message as its only argument, __init__ not called
        bare = cls.__new__(cls)
        bare.args = (message,)
        if str(bare) == message:
            return bare
    with contextlib.suppress(Exception):
        return cls(message)
    return None


def _exception_class(name: str) -> type[BaseException] | None:
    module_name, _, qualname = name.rpartition(".")
    candidates = [(module_name or "builtins", qualname)]
    while "." in module_name:  # a nested class: some of the dotted name is its qualname
        module_name, _, outer = module_name.rpartition(".")
        qualname = f"{outer}.{qualname}"
        candidates.append((module_name, qualname))
    for module, attr in candidates:
        try:
            found: Any = importlib.import_module(module)
            for part in attr.split("."):
                found = getattr(found, part)
        except (ImportError, AttributeError, ValueError):
            continue
        if isinstance(found, type) and issubclass(found, Exception):
            return found
    return None


def replay_error(failure: StepFailure, step_key: str) -> BaseException:
    """The error a replay of a step that failed for good raises, marked final (C31).

    ``non_retryable``: the body's own error again (its class, its message).
    ``step_retry_exhausted``: :class:`StepRetryExhausted` carrying the
    attempts and the last error.
    """
    last = rebuild_error(failure.error_type, failure.message)
    if failure.reason == "non_retryable" and last is not None:
        return mark_final(last, "non_retryable")
    return exhausted_error(step_key, failure.attempts, last)


def exhausted_error(step_key: str, attempts: int, last: BaseException | None) -> StepRetryExhausted:
    """The :class:`StepRetryExhausted` of ``step_key`` after ``attempts`` attempts, ``last`` its cause."""
    why = f"last error: {type(last).__name__}: {last}" if last is not None else "the last attempt's worker was lost"
    error = StepRetryExhausted(
        f"step {step_key!r} failed {attempts} of {attempts} attempts; {why}",
        step_key=step_key,
        attempts=attempts,
        last_error=last,
    )
    error.__cause__ = last
    return error
