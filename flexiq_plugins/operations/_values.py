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

from .._delivery.readers import chain_name, reader_chain
from .._model.codec import CodecChain
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
        note = "no value (a sleep)" if row.kind == "sleep" else "no value stored (a corrupt row)"
        return DecodedValue(False, note=note)
    chain = codec or reader_chain(row.value)
    if chain is None:
        return DecodedValue(False, note=f"stored by {chain_name(row.value)!r}; pass --codec to decode it")
    try:
        return DecodedValue(True, chain.decode(row.value, step_key=row.step_key))
    except DecodeError as exc:
        return DecodedValue(False, note=str(exc))
