"""Durations as people write them: ``"500ms"``, ``"30s"``, ``"5m"``, ``"1h30m"``, ``"3d"``, ``"1w"``.

A sleep's duration is parsed once, before anything is committed, so a typo
fails loudly instead of sleeping for a surprising time (C19). A sleep is also
capped at `MAX_SLEEP_SECONDS` (366 days): a longer one is almost always
a unit mistake (milliseconds for seconds, an epoch timestamp for a duration)
that would otherwise hop every 15 minutes for decades.
"""

from __future__ import annotations

import math
import re
from datetime import date, timedelta

from ..errors import InvalidDuration

__all__ = ["ACCEPTED_FORMS", "MAX_SLEEP_SECONDS", "parse_duration", "parse_sleep"]

ACCEPTED_FORMS = (
    "a string of number+unit parts such as '500ms', '30s', '5m', '1h30m', '3d', '1w' "
    "(units: ms, s, m, h, d, w), a datetime.timedelta, or int/float seconds; never negative"
)

MAX_SLEEP_SECONDS = 366 * 86400.0
"""The longest sleep, in seconds (366 days): ``step.sleep`` and ``step.sleep_until`` refuse longer ones."""

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_WHOLE = re.compile(r"(?:\d+(?:\.\d+)?(?:ms|s|m|h|d|w))+")


def parse_duration(value: object) -> float:
    """Return ``value`` as a number of seconds (``float``, ≥ 0).

    Parameters:
      value (str | timedelta | int | float): ``"500ms"``, ``"30s"``, ``"5m"``,
        ``"1h30m"``, ``"3d"``, ``"1w"``; a ``timedelta``; or seconds.

    Raises:
      InvalidDuration: (a ``ValueError``) for a negative, non-finite or unparsable value, naming the
        value and the accepted forms (C19).
    """
    try:
        seconds = _to_seconds(value)
    except OverflowError as exc:  # an int beyond float, e.g. 10**400
        raise InvalidDuration(f"invalid duration {_short(value)}: too large; use {ACCEPTED_FORMS}") from exc
    if not math.isfinite(seconds) or seconds < 0:
        raise InvalidDuration(f"invalid duration {value!r}: must be finite and not negative; use {ACCEPTED_FORMS}")
    return seconds


def parse_sleep(value: object) -> float:
    """Return a sleep's duration in seconds: [`parse_duration`][flexiq_plugins.parse_duration], at most
    `MAX_SLEEP_SECONDS`.

    Raises:
      InvalidDuration: what [`parse_duration`][flexiq_plugins.parse_duration] refuses, or a duration longer than 366
        days.
    """
    seconds = parse_duration(value)
    if seconds > MAX_SLEEP_SECONDS:
        raise InvalidDuration(
            f"invalid duration {_short(value)}: {seconds:.0f} s is longer than the longest sleep, "
            f"{MAX_SLEEP_SECONDS:.0f} s (366 days); was it meant in another unit? Sleep in several named "
            "steps to wait longer"
        )
    return seconds


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _to_seconds(value: object) -> float:
    if isinstance(value, date):
        raise InvalidDuration(
            f"invalid duration {value!r}: a point in time, not a duration; to wait until it, "
            "use step.sleep_until(when) with a timezone-aware datetime"
        )
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
