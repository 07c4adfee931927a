"""Where [`DurableSteps`][dramatiq_ext.DurableSteps] gets its store and options.

A middleware listed by dotted path in django_dramatiq's
``DRAMATIQ_BROKER["MIDDLEWARE"]`` is built with no arguments while Django is
still loading its apps, so nothing may be read at construction. Everything is
resolved the first time a worker process needs it, through the core's one
order ([`flexiq_plugins.integration.resolve_store`][flexiq_plugins.integration.resolve_store]):

1. the ``store`` argument given to ``DurableSteps``;
2. the ``FLEXIQ_STORE_URL`` environment variable;
3. Django settings: ``FLEXIQ_STORE_URL``, or a ``FLEXIQ`` dict with
   ``STORE_URL`` and upper-case options (``{"MAX_HOP_SECONDS": "10m"}``);
4. the default SQLite file ``flexiq_steps.db``.

Keyword options always win over the ``FLEXIQ`` dict.
"""

from __future__ import annotations

import os
from typing import Any

from flexiq_plugins import JsonSerializer
from flexiq_plugins.integration import DurableConfig, FunctionSerializer, Serializer

__all__ = ["django_settings", "encoder_serializer", "step_serializer"]


def django_settings() -> tuple[str | None, dict[str, Any]]:
    """Return ``(store URL, options)`` from Django settings, or ``(None, {})`` without Django.

    Raises:
      ConfigurationError: the ``FLEXIQ`` dict names an unknown option.
    """
    try:
        from django.conf import settings
    except ImportError:
        return None, {}
    if not (settings.configured or os.environ.get("DJANGO_SETTINGS_MODULE")):
        return None, {}
    flexiq = {str(k).lower(): v for k, v in dict(getattr(settings, "FLEXIQ", None) or {}).items()}
    url = getattr(settings, "FLEXIQ_STORE_URL", None) or flexiq.pop("store_url", None)
    flexiq.pop("store_url", None)
    DurableConfig.from_options(flexiq, where="settings.FLEXIQ")
    return url, flexiq


def encoder_serializer(encoder: Any) -> FunctionSerializer:
    """Wrap a Dramatiq `Encoder` as a step value serializer (C7).

    An encoder encodes message dicts, so a value is stored as ``{"v": value}``.

    Parameters:
      encoder (dramatiq.Encoder): usually ``dramatiq.get_encoder()``.
    """
    kind = {"JSONEncoder": "json", "PickleEncoder": "pickle"}.get(type(encoder).__name__, type(encoder).__name__)
    return FunctionSerializer(
        f"dramatiq:{kind}",
        lambda value: encoder.encode({"v": value}),  # type: ignore[no-any-return]
        lambda data: encoder.decode(data)["v"],
    )


def step_serializer(encoder: Any) -> Serializer:
    """The serializer of step values for the broker's ``encoder`` (C7).

    Dramatiq's ``JSONEncoder`` gives the core's [`JsonSerializer`][flexiq_plugins.JsonSerializer],
    which keeps ``datetime``, ``Decimal``, ``UUID``, ``timedelta`` and
    ``bytes`` the same way on Celery and Dramatiq; any other encoder is used
    as it is (`encoder_serializer`).
    """
    import dramatiq

    return JsonSerializer() if type(encoder) is dramatiq.JSONEncoder else encoder_serializer(encoder)
