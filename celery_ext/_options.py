"""The options of [`celery_ext.install`][celery_ext.install]: the core's [`DurableConfig`][flexiq_plugins.DurableConfig]
plus the Celery-only ones.

The shared options (``max_hop_seconds``, ``lease_seconds``, the size limits and run caps,
``codecs`` …) are declared, converted and validated once by
[`flexiq_plugins.integration.DurableConfig`][flexiq_plugins.DurableConfig]; [`CeleryConfig`][celery_ext.CeleryConfig]
adds the dead-letter path and accepts a kombu serializer *name* for
``serializer``. Unknown names and unusable values raise
[`ConfigurationError`][flexiq_plugins.errors.ConfigurationError] at install time (an unknown name
with the closest accepted one, a bad value naming its option), never later
inside a worker.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Literal

from flexiq_plugins import ConfigurationError, JsonSerializer
from flexiq_plugins.integration import DurableConfig, FunctionSerializer, Serializer

__all__ = [
    "DEFAULT_DEAD_LETTER_QUEUE",
    "DEFAULT_DEAD_LETTER_QUEUE_MAX_LENGTH",
    "RESUME_HEADER",
    "RUN_KEY_HEADER",
    "CeleryConfig",
    "DeadLetterPath",
    "kombu_serializer",
    "step_serializer",
]

RUN_KEY_HEADER = "flexiq_run_key"
"""The message header carrying the run key (stamped at publish)."""

RESUME_HEADER = "flexiq_resume"
"""The message header of a delivery that may continue a run (a put-back, a re-publish, a retry of an
attempt that claimed): it claims its run before the body runs (C23)."""

DEFAULT_DEAD_LETTER_QUEUE = "flexiq.dead_letter"
"""Where dead letters are published on brokers without a native dead-letter path (Redis)."""

DEFAULT_DEAD_LETTER_QUEUE_MAX_LENGTH = 10_000
"""How many messages the Redis dead-letter queue keeps (the newest); the store keeps every dead letter."""

DeadLetterPath = Literal["auto", "reject", "queue"]


def kombu_codec() -> tuple[Any, Any]:
    """kombu's registry ``dumps`` and ``loads`` (untyped, hence ``Any``)."""
    from kombu import serialization

    module: Any = serialization
    return module.dumps, module.loads


@functools.lru_cache(maxsize=32)
def kombu_serializer(name: str) -> FunctionSerializer:
    """A step-value serializer backed by kombu's registry entry ``name`` (C7).

    Made once per name (every publish and delivery of a durable task asks for
    the app's); each call encodes and decodes through kombu's registry as it
    is then.

    Raises:
      ConfigurationError: ``name`` is not registered with kombu.
    """
    from kombu.exceptions import SerializerNotInstalled

    dumps, loads = kombu_codec()
    try:
        content_type, encoding, _ = dumps(None, serializer=name)
    except SerializerNotInstalled as exc:
        raise ConfigurationError(f"serializer {name!r} is not registered with kombu: {exc}") from exc

    def dump(value: Any) -> bytes:
        _, _, data = dumps(value, serializer=name)
        return data if isinstance(data, bytes) else str(data).encode(encoding or "utf-8")

    def load(data: bytes) -> Any:
        return loads(data, content_type, encoding, accept={content_type})

    return FunctionSerializer(f"kombu:{name}", dump, load)


def step_serializer(name: str) -> Serializer:
    """The serializer of step values for the kombu serializer ``name`` (C7).

    ``"json"`` is the core's [`JsonSerializer`][flexiq_plugins.JsonSerializer], which
    keeps ``datetime``, ``Decimal``, ``UUID``, ``timedelta`` and ``bytes`` the
    same way on Celery and Dramatiq; any other name is kombu's own.
    """
    return JsonSerializer() if name == "json" else kombu_serializer(name)


@dataclass(frozen=True)
class CeleryConfig(DurableConfig):
    """The Celery integration's options: [`DurableConfig`][flexiq_plugins.DurableConfig]'s and these.

    ``serializer`` also accepts a kombu serializer name (``"json"``,
    ``"pickle"``); by default step values use the app's ``task_serializer`` (C7).
    """

    dead_letter_queue: str = field(
        default=DEFAULT_DEAD_LETTER_QUEUE,
        metadata={"doc": "queue for dead letters on brokers without a native path, e.g. Redis (C30)"},
    )
    dead_letter_queue_max_length: int | None = field(
        default=DEFAULT_DEAD_LETTER_QUEUE_MAX_LENGTH,
        metadata={
            "doc": "messages kept in the dead-letter queue on Redis, the newest (LTRIM after each); None: no bound"
        },
    )
    dead_letter_path: DeadLetterPath = field(
        default="auto",
        metadata={"doc": "'auto' (RabbitMQ: reject to the dead-letter exchange; others: the queue), 'reject', 'queue'"},
    )

    def __post_init__(self) -> None:
        if isinstance(self.serializer, str):  # a kombu serializer name, like task_serializer
            object.__setattr__(self, "serializer", step_serializer(self.serializer))
        super().__post_init__()
        if self.dead_letter_path not in ("auto", "reject", "queue"):
            raise ConfigurationError(
                f"option dead_letter_path={self.dead_letter_path!r} must be 'auto', 'reject' or 'queue'"
            )
        if not isinstance(self.dead_letter_queue, str) or not self.dead_letter_queue:
            raise ConfigurationError(f"option dead_letter_queue={self.dead_letter_queue!r} must be a non-empty str")
        bound = self.dead_letter_queue_max_length
        if bound is not None and (isinstance(bound, bool) or not isinstance(bound, int) or bound < 1):
            raise ConfigurationError(
                f"option dead_letter_queue_max_length={bound!r} must be None or an int of at least 1"
            )
