"""Options of :func:`celery_ext.install`, checked once when it is called.

The options both integrations share (``max_hop``, ``lease_seconds``, caps,
``codecs`` …) are spelled and validated by :mod:`flexiq_plugins.options`;
this module adds the Celery-only ones (the dead-letter path, the retry
countdown after a store outage, a step-value serializer other than the app's
``task_serializer``). Unknown names and unusable values raise
:class:`ConfigurationError` at install time, never later inside a worker.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from flexiq_plugins.attempt import DurableConfig
from flexiq_plugins.codec import Serializer
from flexiq_plugins.durations import parse_duration
from flexiq_plugins.errors import ConfigurationError
from flexiq_plugins.options import build_config, check_options

__all__ = ["DEFAULT_DEAD_LETTER_QUEUE", "RUN_KEY_HEADER", "CeleryOptions", "DeadLetterPath", "parse_options"]

RUN_KEY_HEADER = "flexiq_run_key"
"""The message header carrying the run key (stamped at publish)."""

DEFAULT_DEAD_LETTER_QUEUE = "flexiq.dead_letter"
"""Where dead letters are published on brokers without a native dead-letter path (Redis)."""

DeadLetterPath = Literal["auto", "reject", "queue"]

CELERY_OPTION_NAMES = ("dead_letter_queue", "dead_letter_path", "store_retry_seconds", "serializer")
"""The options only the Celery adapter accepts (the shared ones are in ``flexiq_plugins.options``)."""


@dataclass(frozen=True)
class CeleryOptions:
    """The Celery adapter's options (see :func:`parse_options` for the accepted input).

    Parameters:
      core(Mapping[str, Any]): the shared options (``max_hop``, ``lease_seconds``,
        ``step_bytes`` …), as given.
      dead_letter_queue(str): queue name for dead letters on brokers without
        a native dead-letter path (C30).
      dead_letter_path(str): ``"auto"`` (RabbitMQ: reject; others: the queue),
        ``"reject"`` or ``"queue"``.
      store_retry_seconds(float): countdown of the retry after a store outage, seconds (C28).
      serializer(str | Serializer | None): a kombu serializer name or a serializer object;
        overrides the app's ``task_serializer``
        for step values.
    """

    core: Mapping[str, Any] = field(default_factory=dict)
    dead_letter_queue: str = DEFAULT_DEAD_LETTER_QUEUE
    dead_letter_path: DeadLetterPath = "auto"
    store_retry_seconds: float = 5.0
    serializer: Serializer | None = None

    def durable_config(self, serializer: Serializer | None) -> DurableConfig:
        """The core's :class:`DurableConfig` for these options, step values through ``serializer`` (C7)."""
        return build_config(self.core, serializer=self.serializer or serializer)

    @property
    def max_hop(self) -> float:
        """The longest delay of one sleep hop, seconds (C18)."""
        return self.durable_config(None).max_hop_seconds


def parse_options(**options: Any) -> CeleryOptions:
    """Check ``install``'s keyword options and return them as :class:`CeleryOptions`.

    Raises:
      ConfigurationError: an unknown option or an unusable value, naming it
        and the accepted options.
    """
    core = {k: v for k, v in options.items() if k not in CELERY_OPTION_NAMES}
    check_options(core, where="celery_ext.install", ignore=CELERY_OPTION_NAMES)
    build_config(core)  # validates the values now, not inside a worker
    own = {k: v for k, v in options.items() if k in CELERY_OPTION_NAMES}
    path = own.get("dead_letter_path", "auto")
    if path not in ("auto", "reject", "queue"):
        raise ConfigurationError(f"dead_letter_path must be 'auto', 'reject' or 'queue', got {path!r}")
    queue = own.get("dead_letter_queue", DEFAULT_DEAD_LETTER_QUEUE)
    if not isinstance(queue, str) or not queue:
        raise ConfigurationError(f"dead_letter_queue must be a non-empty str, got {queue!r}")
    if "store_retry_seconds" in own:
        own["store_retry_seconds"] = _seconds("store_retry_seconds", own["store_retry_seconds"])
    serializer = own.get("serializer")
    if isinstance(serializer, str):  # a kombu serializer name, like task_serializer
        from ._runtime import kombu_serializer

        own["serializer"] = kombu_serializer(serializer)
    elif serializer is not None and not isinstance(serializer, Serializer):
        raise ConfigurationError(
            f"serializer {serializer!r} is neither a kombu serializer name (e.g. 'json', 'pickle') "
            "nor an object with name/dumps/loads"
        )
    return CeleryOptions(core=dict(core), **own)


def _seconds(name: str, value: object) -> float:
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise ConfigurationError(f"option {name}: {exc}") from exc
