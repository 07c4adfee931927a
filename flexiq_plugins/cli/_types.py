"""Click parameter types of the ``flexiq`` command line."""

from __future__ import annotations

from typing import Any

import click

from .._model.durations import ACCEPTED_FORMS, parse_duration

__all__ = ["DEAD_LETTER_ID", "DURATION", "ID_COMMAND"]


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


class DeadLetterId(click.ParamType):  # type: ignore[type-arg]
    """A dead letter's id: a positive integer, as ``flexiq dlq list`` shows it.

    The commands taking ids accept tokens that look like options (``-1``), so
    a negative id reaches this type and is named as what it is, instead of
    click's "No such option '-1'"; a real unknown option is still named as one.
    """

    name = "id"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        """Return ``value`` as an id; a usage error (exit 2) otherwise."""
        if isinstance(value, int):
            return value
        text = str(value)
        if text.startswith("-") and not _is_number(text):
            self.fail(f"no such option: {text}", param, ctx)
        try:
            number = int(text)
        except ValueError:
            self.fail(f"{text!r} is not a dead-letter id; ids are positive integers (see flexiq dlq list)", param, ctx)
        if number < 1:
            self.fail(f"{number} is not a dead-letter id; ids are positive integers (see flexiq dlq list)", param, ctx)
        return number


DEAD_LETTER_ID = DeadLetterId()

ID_COMMAND: dict[str, Any] = {"ignore_unknown_options": True}
"""``context_settings`` of a command taking dead-letter ids: ``-1`` is an id to refuse, not an option."""
