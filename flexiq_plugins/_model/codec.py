"""How step values become stored bytes and back (C7, C22).

A value goes through the framework's own *serializer* (Celery: the app's
``task_serializer`` from kombu's registry; Dramatiq: the broker's encoder; JSON
by default), then through a chain of byte *codecs* (zlib compression,
``cryptography`` Fernet encryption with key rotation). The stored bytes start
with a short header naming the serializer and the chain that made them, so a
row written by another chain is a clear [`DecodeError`][flexiq_plugins.errors.DecodeError], never garbage.

The first run of a step returns ``decode(encode(value))``, the same value a
memo hit returns, so a caller never sees one type on the first attempt and
another on replay (a tuple under JSON is a list both times).
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import uuid
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ..errors import ConfigurationError, DecodeError, EncodeError

__all__ = [
    "Codec",
    "CodecChain",
    "FernetCodec",
    "FunctionSerializer",
    "JsonSerializer",
    "Serializer",
    "ZlibCodec",
]

_MAGIC = b"FQ1"


@runtime_checkable
class Serializer(Protocol):
    """Turns a value into bytes and back. ``name`` is recorded in the stored bytes."""

    name: str

    def dumps(self, value: Any) -> bytes:
        """Encode ``value``; raise any exception if it cannot be encoded."""

    def loads(self, data: bytes) -> Any:
        """Decode bytes made by [`dumps`][flexiq_plugins.integration.Serializer.dumps]."""


@runtime_checkable
class Codec(Protocol):
    """A reversible transformation of bytes (compression, encryption)."""

    name: str

    def encode(self, data: bytes) -> bytes:
        """Transform ``data`` for storage."""

    def decode(self, data: bytes) -> bytes:
        """Undo `encode`; raise [`DecodeError`][flexiq_plugins.errors.DecodeError] when it cannot."""


_TAG = "__flexiq__"


def _tagged(value: Any) -> dict[str, Any]:
    """``json.dumps``' ``default``: a value JSON has no type for, as ``{"__flexiq__": type, "v": text}``."""
    for kind, test, dump in _TAGGED_TYPES:
        if test(value):
            return {_TAG: kind, "v": dump(value)}
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _untagged(obj: dict[str, Any]) -> Any:
    kind = obj.get(_TAG)
    if kind is None or len(obj) != 2 or "v" not in obj:
        return obj
    return _LOADERS[kind](obj["v"])


_TAGGED_TYPES: tuple[tuple[str, Callable[[Any], bool], Callable[[Any], Any]], ...] = (
    ("datetime", lambda v: isinstance(v, datetime.datetime), lambda v: v.isoformat()),
    ("date", lambda v: isinstance(v, datetime.date), lambda v: v.isoformat()),
    ("time", lambda v: isinstance(v, datetime.time), lambda v: v.isoformat()),
    ("timedelta", lambda v: isinstance(v, datetime.timedelta), lambda v: [v.days, v.seconds, v.microseconds]),
    ("decimal", lambda v: isinstance(v, decimal.Decimal), str),
    ("uuid", lambda v: isinstance(v, uuid.UUID), str),
    ("bytes", lambda v: isinstance(v, (bytes, bytearray)), lambda v: base64.b64encode(bytes(v)).decode()),
)
_LOADERS: dict[str, Callable[[Any], Any]] = {
    "datetime": datetime.datetime.fromisoformat,
    "date": datetime.date.fromisoformat,
    "time": datetime.time.fromisoformat,
    "timedelta": lambda v: datetime.timedelta(days=v[0], seconds=v[1], microseconds=v[2]),
    "decimal": decimal.Decimal,
    "uuid": uuid.UUID,
    "bytes": base64.b64decode,
}


# One encoder and one decoder for every call: ``json.dumps``/``json.loads`` with
# options build a new one each time, a third of a memo hit's cost. Both are
# stateless between calls, as the json module's own shared default decoder is.
# NaN and the infinities are written as ``NaN``, ``Infinity`` and ``-Infinity``,
# as Python's json, kombu's and Dramatiq's JSON write them: a float comes back
# unchanged (C7). Strict JSON parsers outside Python refuse those three tokens.
_SAME_AFTER_JSON = frozenset({int, str, bool, type(None)})
"""The exact types a JSON round trip returns unchanged (a subclass, e.g. an ``IntEnum``, comes back as its base)."""
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, default=_tagged)
_DECODER = json.JSONDecoder(object_hook=_untagged)


class JsonSerializer:
    """The default serializer of step values: compact UTF-8 JSON that keeps a few more types (C7).

    Besides JSON's own types it round-trips ``datetime``, ``date``, ``time``
    (time zones kept), ``timedelta``, ``Decimal``, ``UUID`` and ``bytes``,
    each stored as ``{"__flexiq__": "<type>", "v": ...}``, and every float,
    NaN and the infinities included (stored as ``NaN``, ``Infinity``,
    ``-Infinity``, as Python's ``json`` writes them). A tuple comes back
    as a list, as with any JSON. Both integrations use it whenever the
    framework's own serializer is JSON, so a step value behaves the same on
    Celery and Dramatiq.
    """

    name = "json"

    def dumps(self, value: Any) -> bytes:
        """Encode ``value`` as JSON bytes; `TypeError` for a type it does not keep."""
        kind = type(value)
        if kind is int:  # what the encoder writes for an int, without setting it up (a step's usual value)
            return int.__repr__(value).encode()
        if value is None:
            return b"null"
        if kind is bool:
            return b"true" if value else b"false"
        return _ENCODER.encode(value).encode()

    def loads(self, data: bytes) -> Any:
        """Decode JSON bytes (UTF-8, as [`dumps`][flexiq_plugins.JsonSerializer.dumps] writes them), turning tagged
        values back into their types."""
        return _DECODER.decode(data.decode("utf-8", "surrogatepass"))


@dataclass
class FunctionSerializer:
    """A serializer made of two functions (how adapters plug in the framework's own).

    Parameters:
      name (str): recorded in the stored bytes, e.g. ``"kombu:json"``.
      dump_fn (Callable[[Any], bytes]): encoder.
      load_fn (Callable[[bytes], Any]): decoder.
    """

    name: str
    dump_fn: Callable[[Any], bytes]
    load_fn: Callable[[bytes], Any]

    def dumps(self, value: Any) -> bytes:
        """Encode ``value`` with ``dump_fn``."""
        return self.dump_fn(value)

    def loads(self, data: bytes) -> Any:
        """Decode ``data`` with ``load_fn``."""
        return self.load_fn(data)


@dataclass
class ZlibCodec:
    """zlib compression.

    Parameters:
      level (int): compression level 0–9 (default 6).
    """

    level: int = 6
    name: str = field(default="zlib", init=False)

    def encode(self, data: bytes) -> bytes:
        """Compress ``data``."""
        return zlib.compress(data, self.level)

    def decode(self, data: bytes) -> bytes:
        """Decompress ``data``; [`DecodeError`][flexiq_plugins.errors.DecodeError] if it is not zlib data."""
        try:
            return zlib.decompress(data)
        except zlib.error as exc:
            raise DecodeError(f"stored bytes are not zlib data: {exc}") from exc


class FernetCodec:
    """Fernet encryption (``cryptography``) with key rotation via ``MultiFernet``.

    Parameters:
      keys (str | bytes | Sequence[str | bytes]): url-safe base64 Fernet keys.
        The first encrypts; all decrypt, so a rotated-out key can still be
        listed for reading while its rows age out.

    Raises:
      ConfigurationError: a key that is not a valid Fernet key, or
        ``cryptography`` not installed (``pip install flexiq-plugins[crypto]``).
    """

    name = "fernet"

    def __init__(self, keys: str | bytes | Sequence[str | bytes]) -> None:
        try:
            from cryptography.fernet import Fernet, MultiFernet
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ConfigurationError(
                "FernetCodec needs the 'cryptography' package: pip install 'flexiq-plugins[crypto]'"
            ) from exc
        key_list = [keys] if isinstance(keys, (str, bytes)) else list(keys)
        if not key_list:
            raise ConfigurationError("FernetCodec needs at least one key; make one with Fernet.generate_key()")
        try:
            self._fernet = MultiFernet([Fernet(k) for k in key_list])
        except (ValueError, TypeError) as exc:
            raise ConfigurationError(
                "FernetCodec got a key that is not a Fernet key (32 url-safe base64-encoded bytes, "
                f"as made by Fernet.generate_key()): {exc}"
            ) from exc

    def encode(self, data: bytes) -> bytes:
        """Encrypt ``data`` with the first key."""
        return self._fernet.encrypt(data)

    def decode(self, data: bytes) -> bytes:
        """Decrypt ``data`` with any configured key; [`DecodeError`][flexiq_plugins.errors.DecodeError] if none
        matches."""
        from cryptography.fernet import InvalidToken

        try:
            return self._fernet.decrypt(data)
        except InvalidToken as exc:
            raise DecodeError(
                "stored bytes cannot be decrypted with any configured Fernet key "
                "(was the key that wrote them rotated out?)"
            ) from exc


class CodecChain:
    """A serializer followed by codecs; what the store keeps is ``header + payload``.

    Parameters:
      serializer (Serializer | None): defaults to [`JsonSerializer`][flexiq_plugins.JsonSerializer].
      codecs (Sequence[Codec]): applied in order on encode, reversed on decode.
    """

    def __init__(self, serializer: Serializer | None = None, codecs: Sequence[Codec] = ()) -> None:
        self.serializer: Serializer = serializer or JsonSerializer()
        self.codecs = tuple(codecs)
        names = [self.serializer.name, *(c.name for c in self.codecs)]
        for n in names:
            if not n or any(ch in n for ch in "|\n"):
                raise ConfigurationError(f"codec name {n!r} must be non-empty without '|' or newline")
        self._header = _MAGIC + b"|" + "|".join(names).encode() + b"\n"
        self._plain_json = type(self.serializer) is JsonSerializer and not self.codecs

    @property
    def description(self) -> str:
        """The chain as recorded in stored bytes, e.g. ``"json|zlib|fernet"``."""
        return self._header[len(_MAGIC) + 1 : -1].decode()

    def encode(self, value: Any, *, step_key: str = "?") -> bytes:
        """Serialize and encode ``value``; [`EncodeError`][flexiq_plugins.errors.EncodeError] naming the step if it
        cannot (C7)."""
        try:
            data = self.serializer.dumps(value)
        except Exception as exc:
            raise EncodeError(
                f"step {step_key!r} returned a value the {self.serializer.name!r} serializer "
                f"cannot encode ({type(value).__name__}): {exc}. Return something the serializer "
                "preserves, or a handle to it."
            ) from exc
        for codec in self.codecs:
            data = codec.encode(data)
        return self._header + data

    def read_back(self, value: Any, encoded: bytes, *, step_key: str = "?") -> Any:
        """What a replay of ``encoded`` (the bytes `encode` made of ``value``) returns: its `decode` (C7).

        A value of exactly ``int``, ``str``, ``bool`` or ``None`` stored by
        the plain JSON chain (no codec) is returned as it is: JSON gives
        these back unchanged, so reading them back would only cost time.

        Raises:
          DecodeError: the bytes cannot be read back.
        """
        if self._plain_json and type(value) in _SAME_AFTER_JSON:
            return value
        return self.decode(encoded, step_key=step_key)

    def decode(self, stored: bytes, *, step_key: str = "?") -> Any:
        """Decode stored bytes; [`DecodeError`][flexiq_plugins.errors.DecodeError] if another chain wrote them or
        decoding fails."""
        header, sep, data = stored.partition(b"\n")
        if not sep or header + b"\n" != self._header:
            made_by = header.decode(errors="replace") if header.startswith(_MAGIC) else "unknown"
            raise DecodeError(
                f"step {step_key!r} was stored by codec chain {made_by!r} but this worker is "
                f"configured with {self._header[:-1].decode()!r}; configure the same serializer "
                "and codecs on every worker"
            )
        try:
            for codec in reversed(self.codecs):
                data = codec.decode(data)
            return self.serializer.loads(data)
        except DecodeError as exc:
            raise DecodeError(f"step {step_key!r}: {exc}") from exc
        except Exception as exc:
            raise DecodeError(f"step {step_key!r}: stored bytes cannot be decoded: {exc}") from exc
