"""A finished run's outcome as the store keeps it, and what a duplicate replays from it (C37).

When a run ends, its outcome is written in the same statement as its
terminal status (``StepStore.finish``): opaque bytes for the store, written
and read only here.

- ``V`` + the return value, encoded with the run's codec chain exactly as a
  step value is (serializer and codecs, C7). A value over the step bytes limit
  (``step_bytes``), or one the serializer cannot encode, is not kept: a
  marker is stored instead, and a replay raises
  [`OutcomeNotKept`][flexiq_plugins.errors.OutcomeNotKept] saying so, never ``None``.
- ``E`` + JSON: an error, as its kind and text: ``error`` (the body's error:
  its qualified class name and message, rebuilt by name on replay, else a
  [`ReplayedError`][flexiq_plugins.errors.ReplayedError]), ``dead_letter`` (a
  [`DeadLettered`][flexiq_plugins.errors.DeadLettered] naming the reason),
  ``cancelled`` (a [`JobCancelled`][flexiq_plugins.errors.JobCancelled] naming the
  reason) or ``not_kept`` (the marker above). Like dead letters, error texts
  do not go through the step codecs: do not put secrets in error messages.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import DeadLettered, DecodeError, EncodeError, JobCancelled, OutcomeNotKept, ReplayedError
from .codec import CodecChain
from .failures import build_error, error_text

__all__ = [
    "Replayed",
    "cancelled_error",
    "cancelled_outcome",
    "dead_letter_outcome",
    "error_outcome",
    "failure_outcome",
    "load_outcome",
    "read_outcome",
    "StoredOutcome",
    "value_outcome",
]

_VALUE = b"V"
_ERROR = b"E"
_RETURN_VALUE = "<return value>"

ErrorKind = Literal["error", "dead_letter", "cancelled", "not_kept"]


@dataclass(frozen=True)
class Replayed:
    """What a duplicate of a finished run replays: its value, or its error (C37).

    Parameters:
      value (Any): the run's return value (when ``error`` is ``None``).
      error (BaseException | None): the error to raise instead.
    """

    value: Any = None
    error: BaseException | None = None


def value_outcome(value: Any, codec: CodecChain, limit: int) -> bytes:
    """The stored outcome of a run that returned ``value``: encoded with ``codec``, within ``limit`` bytes.

    A value over ``limit`` bytes (the step bytes limit, C22), or one the serializer cannot encode, is kept
    as a marker: its replay raises [`OutcomeNotKept`][flexiq_plugins.errors.OutcomeNotKept]. Never raises.
    """
    try:
        encoded = codec.encode(value, step_key=_RETURN_VALUE)
    except EncodeError as exc:
        return _error_bytes("not_kept", "unencodable", f"the run's return value could not be encoded: {exc}")
    if len(encoded) + 1 > limit:
        why = f"the run's return value ({len(encoded)} bytes encoded) is over the step bytes limit of {limit} bytes"
        return _error_bytes("not_kept", "too_large", why)
    return _VALUE + encoded


def error_outcome(error: BaseException) -> bytes:
    """The stored outcome of a run that failed with ``error``: its class name and message.

    An error made from one string (``KeyError("ar")``) keeps that string, not
    ``str(error)`` (``"'ar'"`` for a ``KeyError``), so the replayed error
    equals the original (C37).
    """
    text = error_text(error, max_traceback=0)
    args: tuple[Any, ...] = tuple(getattr(error, "args", ()))
    message = args[0] if len(args) == 1 and isinstance(args[0], str) else text.message
    return _error_bytes("error", text.error_type, message)


def failure_outcome(error_type: str, message: str) -> bytes:
    """The stored outcome of a run that failed with an error known by its class name and message."""
    return _error_bytes("error", error_type, message)


def dead_letter_outcome(reason: str, message: str) -> bytes:
    """The stored outcome of a dead-lettered run: replayed as [`DeadLettered`][flexiq_plugins.errors.DeadLettered]
    (``"<reason>: <message>"``)."""
    return _error_bytes("dead_letter", reason, message)


def cancelled_outcome(reason: str) -> bytes:
    """The stored outcome of a cancelled run: replayed as [`JobCancelled`][flexiq_plugins.errors.JobCancelled] naming
    ``reason``."""
    return _error_bytes("cancelled", "cancelled", reason)


def cancelled_error(reason: str) -> JobCancelled:
    """What a cancelled run's result waiter and its duplicates get (C37, C45): a ``JobCancelled`` naming ``reason``."""
    return JobCancelled(f"the run was cancelled: {reason}")


def _error_bytes(kind: ErrorKind, name: str, message: str) -> bytes:
    data = {"kind": kind, "name": name, "message": message}
    return _ERROR + json.dumps(data, separators=(",", ":")).encode()


def load_outcome(stored: bytes, codec: CodecChain) -> Replayed:
    """What a duplicate replays from ``stored``; a value that cannot be decoded replays as a
    [`DecodeError`][flexiq_plugins.errors.DecodeError]."""
    tag, data = stored[:1], stored[1:]
    if tag == _VALUE:
        try:
            return Replayed(value=codec.decode(data, step_key=_RETURN_VALUE))
        except DecodeError as exc:
            return Replayed(error=exc)
    try:
        loaded = json.loads(data.decode())
        kind, name, message = loaded["kind"], loaded["name"], loaded["message"]
    except (ValueError, KeyError, TypeError) as exc:
        return Replayed(error=DecodeError(f"the run's stored outcome cannot be read: {exc}"))
    return Replayed(error=_error_of(kind, name, message))


@dataclass(frozen=True)
class StoredOutcome:
    """A stored outcome as text, for an operator to read; nothing is imported or decoded.

    Parameters:
      kind (str): ``value`` (the run returned a value), ``error``,
        ``dead_letter``, ``cancelled``, ``not_kept`` or ``unreadable``.
      name (str): the error's class name, the dead letter's reason, or '' for a value.
      message (str): the error's message or why it was not kept ('' for a value).
      value (bytes | None): the value's stored bytes (codec chain header and
        all), for a ``value``; decode them only on request.
    """

    kind: str
    name: str = ""
    message: str = ""
    value: bytes | None = None


def read_outcome(stored: bytes) -> StoredOutcome:
    """Read a stored outcome's parts without decoding a value or importing an error class (C37, C52)."""
    tag, data = stored[:1], stored[1:]
    if tag == _VALUE:
        return StoredOutcome("value", value=data)
    try:
        loaded = json.loads(data.decode())
        return StoredOutcome(str(loaded["kind"]), str(loaded["name"]), str(loaded["message"]))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return StoredOutcome("unreadable", message=f"the run's stored outcome cannot be read: {exc}")


def _error_of(kind: str, name: str, message: str) -> BaseException:
    if kind == "dead_letter":
        return DeadLettered(f"{name}: {message}")
    if kind == "cancelled":
        return cancelled_error(message)
    if kind == "not_kept":
        return OutcomeNotKept(f"the run succeeded, but {message}; a duplicate cannot replay it")
    error = build_error(name, message)
    return error if error is not None else ReplayedError(f"{name}: {message}", error_type=name)
