"""Click parameter types of the ``flexiq`` command line."""

from __future__ import annotations

from typing import Any

import click

from ..durations import ACCEPTED_FORMS, parse_duration

__all__ = ["DURATION"]


class Duration(click.ParamType):  # type: ignore[type-arg]  # generic only since click 8.2
    """A duration such as ``30s``, ``1h``, ``7d`` (or plain seconds), converted to seconds (``float``)."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        """Return ``value`` in seconds; a usage error (exit 2) naming the accepted forms if it is not one."""
        if isinstance(value, float):
            return value
        text = str(value).strip()
        try:
            return parse_duration(float(text) if _is_number(text) else text)
        except ValueError:
            self.fail(f"{value!r} is not a duration; use {ACCEPTED_FORMS}", param, ctx)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


DURATION = Duration()
