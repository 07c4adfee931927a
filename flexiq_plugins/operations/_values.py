"""Stored values decoded for display, never to run a job, and never unpickled (``flexiq runs show --values``).

Step values, a run's returned value and event payloads are all stored as
bytes a codec chain made. The default readers cover the JSON family: the
core's own ``json``, and the readers each installed adapter announces for its
serializers (``kombu:json``, ``dramatiq:json``), optionally zlib-compressed.
Anything else (pickle, encrypted values) needs the caller's own
[`CodecChain`][flexiq_plugins.CodecChain] and otherwise gets a note instead of a
value; a value behind a codec that is not compression is *encrypted* and is
never decoded without that chain (C52).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._delivery.readers import chain_name, reader_chain
from .._model.codec import CodecChain
from .._model.records import StepRow
from ..errors import DecodeError

__all__ = ["DecodedValue", "decode_step_value", "decode_value"]


@dataclass(frozen=True)
class DecodedValue:
    """A step value decoded for display, or why it was not.

    Parameters:
      ok (bool): whether ``value`` holds the decoded value.
      value (Any): the value (``None`` when not decoded).
      note (str): why it was not decoded ('' when it was).
      encrypted (bool): it was not decoded because a codec of its chain
        encrypts it (a chain with a key the reader does not have).
    """

    ok: bool
    value: Any = None
    note: str = ""
    encrypted: bool = False


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
    return decode_value(row.value, codec, what=row.step_key)


def decode_value(stored: bytes, codec: CodecChain | None = None, *, what: str = "value") -> DecodedValue:
    """Decode stored bytes a codec chain made (a step value, a run's value, an event payload) for display.

    Never raises for bad or foreign bytes: the note says why nothing was
    decoded. Without ``codec`` only the JSON family behind ``zlib`` is read;
    bytes behind another codec are reported ``encrypted``.

    Parameters:
      stored (bytes): the stored bytes, header included.
      codec (CodecChain | None): the chain the workers use, if known.
      what (str): names the value in a decoding error (a step key).
    """
    chain = codec or reader_chain(stored)
    if chain is None:
        name = chain_name(stored)
        if any(c != "zlib" for c in name.split("|")[1:]):
            return DecodedValue(False, note=f"encrypted by {name!r}; pass --codec to decode it", encrypted=True)
        return DecodedValue(False, note=f"stored by {name!r}; pass --codec to decode it")
    try:
        return DecodedValue(True, chain.decode(stored, step_key=what))
    except DecodeError as exc:
        return DecodedValue(False, note=str(exc))


_NO_VALUE = {"sleep": "no value (a sleep)", "map": "no value (a step map's entry: its items hold the values)"}
"""What a row of a kind that stores no value says instead."""
