"""Durations as people write them: ``"500ms"``, ``"30s"``, ``"5m"``, ``"1h30m"``, ``"3d"``, ``"1w"``.

A sleep's duration is parsed once, before anything is committed, so a typo
fails loudly instead of sleeping for a surprising time (C19).
"""

from __future__ import annotations

import math
import re
from datetime import timedelta

from .errors import InvalidDuration

__all__ = ["ACCEPTED_FORMS", "parse_duration"]

ACCEPTED_FORMS = (
    "a string of number+unit parts such as '500ms', '30s', '5m', '1h30m', '3d', '1w' "
    "(units: ms, s, m, h, d, w), a datetime.timedelta, or int/float seconds; never negative"
)

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_WHOLE = re.compile(r"(?:\d+(?:\.\d+)?(?:ms|s|m|h|d|w))+")


def parse_duration(value: object) -> float:
    """Return ``value`` as a number of seconds (``float``, ≥ 0).

    Parameters:
      value(str | timedelta | int | float): ``"500ms"``, ``"30s"``, ``"5m"``,
        ``"1h30m"``, ``"3d"``, ``"1w"``; a ``timedelta``; or seconds.

    Raises:
      InvalidDuration: (a ``ValueError``) for a negative, non-finite or unparsable value, naming the
        value and the accepted forms (C19).
    """
    seconds = _to_seconds(value)
    if not math.isfinite(seconds) or seconds < 0:
        raise InvalidDuration(f"invalid duration {value!r}: must be finite and not negative; use {ACCEPTED_FORMS}")
    return seconds


def _to_seconds(value: object) -> float:
    if isinstance(value, bool):
        raise InvalidDuration(f"invalid duration {value!r}; use {ACCEPTED_FORMS}")
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        text = value.strip().lower()
        if text and _WHOLE.fullmatch(text):
            return sum(float(n) * _UNITS[u] for n, u in _PART.findall(text))
    raise InvalidDuration(f"invalid duration {value!r}; use {ACCEPTED_FORMS}")
