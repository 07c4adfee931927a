"""Reading stored step values without the workers' codec chain: for display, and for a check of new code.

The stored bytes start with a header naming the serializer and codecs that
wrote them (C7). The readers known here cover the JSON family: the core's
own ``json``, and the readers each installed adapter announces for its
serializers (``kombu:json``, ``dramatiq:json``), optionally behind ``zlib``.
Anything else (pickle, encrypted values) needs the workers' own
[`CodecChain`][flexiq_plugins.CodecChain]. Nothing here ever unpickles.
"""

from __future__ import annotations

from typing import Any

from .._model.codec import CodecChain, FunctionSerializer, JsonSerializer, ZlibCodec
from .registry import ValueReader, value_reader

__all__ = ["chain_name", "reader_chain"]

_CORE_READERS: dict[str, ValueReader] = {"json": JsonSerializer().loads}


def chain_name(stored: bytes) -> str:
    """The chain named in stored bytes' header, e.g. ``"kombu:json|zlib"``; ``"unknown"`` without a header."""
    header = stored.partition(b"\n")[0].decode(errors="replace")
    return header.partition("|")[2] if header.startswith("FQ1|") else "unknown"


def reader_chain(stored: bytes) -> CodecChain | None:
    """A chain that reads bytes written like ``stored`` (it cannot write), or ``None`` if no reader is known."""
    serializer, *codecs = chain_name(stored).split("|")
    loads = _CORE_READERS.get(serializer) or value_reader(serializer)
    if loads is None or any(c != "zlib" for c in codecs):
        return None
    return CodecChain(FunctionSerializer(serializer, _no_dump, loads), [ZlibCodec() for _ in codecs])


def _no_dump(value: Any) -> bytes:
    raise TypeError("a reader chain does not encode")
