"""Step values decoded for display, never to run a job, and never unpickled (``flexiq runs show --values``).

The default readers cover the JSON family: the core's own ``json``, and the
readers each installed adapter announces for its serializers (``kombu:json``,
``dramatiq:json``), optionally zlib-compressed. Anything else (pickle,
encrypted values) needs the caller's own [`CodecChain`][flexiq_plugins.CodecChain]
and otherwise gets a note instead of a value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._delivery.registry import ValueReader, value_reader
from .._model.codec import CodecChain, FunctionSerializer, JsonSerializer, ZlibCodec
from .._model.records import StepRow
from ..errors import DecodeError

__all__ = ["DecodedValue", "decode_step_value"]


@dataclass(frozen=True)
class DecodedValue:
    """A step value decoded for display, or why it was not.

    Parameters:
      ok (bool): whether ``value`` holds the decoded value.
      value (Any): the value (``None`` when not decoded).
      note (str): why it was not decoded ('' when it was).
    """

    ok: bool
    value: Any = None
    note: str = ""


_CORE_READERS: dict[str, ValueReader] = {"json": JsonSerializer().loads}


def decode_step_value(row: StepRow, codec: CodecChain | None = None) -> DecodedValue:
    """Decode a step's stored value for display (C7); never raises for bad or foreign bytes.

    With ``codec`` the value is decoded with it. Without, the stored header
    chooses a reader: the core's ``json``, or one an installed adapter
    announces (``kombu:json``, ``dramatiq:json``), each optionally behind
    ``zlib``; other serializers (pickle) and codecs (Fernet) are not decoded
    and the note says which chain wrote the bytes.

    Parameters:
      row (StepRow): a ``run`` step.
      codec (CodecChain | None): the chain the workers use, if known.
    """
    if row.value is None:
        note = _NO_VALUE.get(row.kind, "no value stored (a corrupt row)")
        return DecodedValue(False, note=note)
    chain = codec or _reader_for(row.value)
    if chain is None:
        return DecodedValue(False, note=f"stored by {_chain_name(row.value)!r}; pass --codec to decode it")
    try:
        return DecodedValue(True, chain.decode(row.value, step_key=row.step_key))
    except DecodeError as exc:
        return DecodedValue(False, note=str(exc))


_NO_VALUE = {"sleep": "no value (a sleep)", "map": "no value (a step map's entry: its items hold the values)"}
"""What a row of a kind that stores no value says instead."""


def _chain_name(stored: bytes) -> str:
    header = stored.partition(b"\n")[0].decode(errors="replace")
    return header.partition("|")[2] if header.startswith("FQ1|") else "unknown"


def _reader_for(stored: bytes) -> CodecChain | None:
    serializer, *codecs = _chain_name(stored).split("|")
    loads = _CORE_READERS.get(serializer) or value_reader(serializer)
    if loads is None or any(c != "zlib" for c in codecs):
        return None
    return CodecChain(FunctionSerializer(serializer, _no_dump, loads), [ZlibCodec() for _ in codecs])


def _no_dump(value: Any) -> bytes:
    raise TypeError("a display reader does not encode")
