"""Where :class:`~dramatiq_ext.DurableSteps` gets its store and options.

A middleware listed by dotted path in django_dramatiq's
``DRAMATIQ_BROKER["MIDDLEWARE"]`` is built with no arguments while Django is
still loading its apps, so nothing may be read at construction. Everything is
resolved the first time a worker process needs it, in this order:

1. the ``store`` argument and keyword options given to ``DurableSteps``;
2. the ``FLEXIQ_STORE_URL`` environment variable;
3. Django settings: ``FLEXIQ_STORE_URL``, or a ``FLEXIQ`` dict with
   ``STORE_URL`` and upper-case options (``{"MAX_HOP": "10m"}``);
4. the default SQLite file ``flexiq_steps.db``.

Keyword options always win over the ``FLEXIQ`` dict.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from sqlalchemy.engine import URL, Engine

from flexiq_plugins import options as options_mod
from flexiq_plugins._store.base import StepStore
from flexiq_plugins._store.factory import STORE_URL_ENV
from flexiq_plugins.attempt import DurableConfig
from flexiq_plugins.codec import FunctionSerializer
from flexiq_plugins.options import OPTION_NAMES

__all__ = [
    "OPTIONS",
    "StoreSpec",
    "build_config",
    "check_options",
    "django_settings",
    "encoder_serializer",
    "store_spec",
]

StoreSpec = StepStore | Engine | URL | str | None
"""What ``DurableSteps(store=...)`` accepts."""

OPTIONS: frozenset[str] = frozenset(OPTION_NAMES)
"""The keyword options ``DurableSteps`` accepts (lower-case keys of Django's ``FLEXIQ`` too): the core's."""


def check_options(options: Mapping[str, Any], where: str = "DurableSteps()") -> None:
    """Raise :class:`~flexiq_plugins.errors.ConfigurationError` naming any unknown option."""
    options_mod.check_options(options, where=where)


def django_settings() -> tuple[str | None, dict[str, Any]]:
    """Return ``(store URL, options)`` from Django settings, or ``(None, {})`` without Django."""
    try:
        from django.conf import settings
    except ImportError:
        return None, {}
    if not (settings.configured or os.environ.get("DJANGO_SETTINGS_MODULE")):
        return None, {}
    flexiq = {str(k).lower(): v for k, v in dict(getattr(settings, "FLEXIQ", None) or {}).items()}
    url = getattr(settings, "FLEXIQ_STORE_URL", None) or flexiq.pop("store_url", None)
    flexiq.pop("store_url", None)
    check_options(flexiq, "settings.FLEXIQ")
    return url, flexiq


def store_spec(explicit: StoreSpec) -> StoreSpec:
    """Return what to open: the argument, else ``FLEXIQ_STORE_URL``, else Django's URL, else ``None``."""
    if explicit is not None:
        return explicit
    if os.environ.get(STORE_URL_ENV):
        return None  # open_store() reads the variable itself
    return django_settings()[0]


def encoder_serializer(encoder: Any) -> FunctionSerializer:
    """Wrap a Dramatiq :class:`~dramatiq.Encoder` as a step value serializer (C7).

    An encoder encodes message dicts, so a value is stored as ``{"v": value}``.

    Parameters:
      encoder(dramatiq.Encoder): usually ``dramatiq.get_encoder()``.
    """
    kind = {"JSONEncoder": "json", "PickleEncoder": "pickle"}.get(type(encoder).__name__, type(encoder).__name__)
    return FunctionSerializer(
        f"dramatiq:{kind}",
        lambda value: encoder.encode({"v": value}),  # type: ignore[no-any-return]
        lambda data: encoder.decode(data)["v"],
    )


def build_config(options: Mapping[str, Any], encoder: Any) -> DurableConfig:
    """Build the core's :class:`~flexiq_plugins.attempt.DurableConfig` from checked options.

    Parameters:
      options(Mapping[str, Any]): see :data:`flexiq_plugins.options.OPTION_NAMES`;
        durations are seconds or strings such as ``"10m"``.
      encoder(dramatiq.Encoder): the broker's encoder, the step serializer (C7).

    Raises:
      ConfigurationError: a value that cannot be used.
    """
    return options_mod.build_config(options, serializer=encoder_serializer(encoder))
