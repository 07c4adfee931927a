"""The options of an integration: one frozen dataclass, one name per option, parsed once.

``celery_ext.install(app, **options)`` and ``DurableSteps(**options)`` hand
their keyword arguments to [`DurableConfig.from_options`][flexiq_plugins.DurableConfig.from_options], so an option is
spelled, converted and validated the same way on both frameworks, and an
unknown name is refused with the closest accepted name ("did you mean") and
the one list of accepted options. An adapter with
options of its own subclasses [`DurableConfig`][flexiq_plugins.DurableConfig] (as ``celery_ext`` does
for its dead-letter path); the accepted list is then that subclass's fields.

Units are in the names: ``*_seconds`` fields take seconds (or a duration
string such as ``"15m"``, converted once here), ``*_bytes`` fields bytes.

Where the store comes from is not an option of this class: the store layer
decides it ([`flexiq_plugins._store.factory.resolve_store`][flexiq_plugins.integration.resolve_store]).
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..errors import ConfigurationError, InvalidDuration
from .codec import Codec, CodecChain, Serializer
from .durations import parse_duration
from .policies import CancellationPolicy, RetryPolicy, cancellation_option, retry_policy_option

__all__ = ["DurableConfig", "Limits"]

C = TypeVar("C", bound="DurableConfig")

_SECONDS = (
    "max_hop_seconds",
    "lease_seconds",
    "busy_retry_seconds",
    "store_retry_seconds",
    "store_retry_max_seconds",
    "recovery_interval_seconds",
    "recovery_grace_seconds",
    "recovery_stale_seconds",
    "recovery_queued_seconds",
    "known_tasks_refresh_seconds",
)
_FLAGS = ("keep_succeeded_steps", "record_at_publish", "recovery", "tracing", "metrics", "trace_idempotency_keys")
_OPTIONS_HELP = "docs/configuration.md, 'Integration options'"
"""Where every option is described, named by an unknown option's message."""
_COUNTS = ("step_bytes", "run_bytes", "run_steps")


def _doc(text: str) -> dict[str, str]:
    return {"doc": text}


@dataclass(frozen=True)
class Limits:
    """The size limits on encoded bytes (C22), as [`DurableConfig.limits`][flexiq_plugins.DurableConfig.limits] groups
    them.

    Parameters:
      step_bytes (int): one step's stored value, bytes.
      run_bytes (int): all step values of one run, bytes.
      run_steps (int): the number of steps of one run.
    """

    step_bytes: int
    run_bytes: int
    run_steps: int


@dataclass(frozen=True)
class DurableConfig:
    """Every option both integrations accept; each field's ``doc`` metadata is its help text.

    Durations (``*_seconds``) accept seconds or a duration string (``"15m"``,
    ``"30s"``) or a ``timedelta`` and are stored as ``float`` seconds.

    Raises:
      ConfigurationError: a value of the wrong type or range, naming the
        option and what it accepts.
    """

    max_hop_seconds: float = field(
        default=900.0, metadata=_doc("longest delay of one sleep hop, seconds (default 900 = 15 min, C18)")
    )
    lease_seconds: float = field(
        default=30.0, metadata=_doc("claim lease, seconds; renewed every third of it (default 30, C23)")
    )
    busy_retry_seconds: float = field(
        default=5.0, metadata=_doc("most a delivery whose run is busy is put back for, seconds (default 5, C24)")
    )
    store_retry_seconds: float = field(
        default=5.0, metadata=_doc("delay before a job that met a store outage runs again, seconds (default 5, C28)")
    )
    store_retry_max_seconds: float = field(
        default=10.0,
        metadata=_doc(
            "longest delay of a job put back for a store that stays unreachable, seconds; the delay doubles "
            "from store_retry_seconds up to it (default 10: the backlog drains within about that long once "
            "the store is back, whatever the outage's length; C28, C41)"
        ),
    )
    max_takeovers: int = field(
        default=5, metadata=_doc("claim takeovers from dead workers before 'worker_lost' (default 5, C25)")
    )
    step_bytes: int = field(
        default=262_144, metadata=_doc("size limit of one step's encoded value, bytes (default 262144, C22)")
    )
    run_bytes: int = field(
        default=4 * 1024 * 1024, metadata=_doc("size limit of all step values of one run, bytes (default 4194304, C22)")
    )
    run_steps: int = field(
        default=10_000, metadata=_doc("size limit on the number of steps of one run (default 10000, C22)")
    )
    serializer: Serializer | None = field(
        default=None, metadata=_doc("step value serializer; default: the framework's own (C7)")
    )
    codecs: tuple[Codec, ...] = field(
        default=(), metadata=_doc("byte codecs after the serializer, e.g. [ZlibCodec(), FernetCodec(key)] (C7)")
    )
    keep_succeeded_steps: bool = field(
        default=False, metadata=_doc("keep step rows of succeeded runs for inspection (default False, C27)")
    )
    step_retry: RetryPolicy | None = field(
        default=None,
        metadata=_doc(
            "default retry budget of every step.run, a RetryPolicy or a dict of its fields; a task's or "
            "actor's own step_retry option wins (default None: no budget, C31)"
        ),
    )
    max_run_seconds: float | None = field(
        default=None,
        metadata=_doc(
            "run cap on a run's duration from its creation, seconds or '7d'; over it the run is cancelled and "
            "its compensations run; a task's or actor's own option wins (default None: no cap, C34)"
        ),
    )
    max_suspended_seconds: float | None = field(
        default=None,
        metadata=_doc(
            "run cap on a run's total time in sleeps and waits for events, seconds or '3d'; over it the run is "
            "cancelled; a task's or actor's own option wins (default None: no cap, C34)"
        ),
    )

    record_at_publish: bool = field(
        default=True,
        metadata=_doc(
            "record each new durable job's run as 'queued' when it is published, before the message leaves, so "
            "recovery can re-publish a message the broker lost; a task's or actor's record_at_publish=False, or a "
            "message's flexiq_record=False, opts out (default True, C39)"
        ),
    )
    known_tasks_refresh_seconds: float = field(
        default=30.0,
        metadata=_doc(
            "how often a producer or worker reads again which tasks are known to take steps, seconds: a task "
            "is recorded at publish (and, on Celery, acknowledged late) only once it is known; a task declared "
            "durable=True is known from the start without a read (default 30, C43)"
        ),
    )
    recovery: bool = field(
        default=True,
        metadata=_doc("run recovery in every worker, one sweep at a time across them all (default True, C39)"),
    )
    recovery_interval_seconds: float = field(
        default=10.0,
        metadata=_doc(
            "time between two recovery ticks of a worker, seconds; a Celery worker also sweeps when its "
            "consumer reconnects to the broker (default 10, C39)"
        ),
    )
    recovery_grace_seconds: float = field(
        default=10.0,
        metadata=_doc(
            "how long past its wake time or deadline a run may be before recovery re-publishes it, seconds; "
            "a copy of a wake-up that was only late is a no-op; a run whose claim lease expired (its worker "
            "died) is re-published at once (default 10, C35)"
        ),
    )
    recovery_stale_seconds: float = field(
        default=3600.0,
        metadata=_doc(
            "how long a pending or retrying run, or a run already re-published, may go without a start before "
            "recovery re-publishes it (again), seconds (default 3600, C35)"
        ),
    )
    recovery_queued_seconds: float = field(
        default=30.0,
        metadata=_doc(
            "how long a run recorded at publish may stay queued without a start before recovery re-publishes "
            "it, seconds; a job waiting in a longer backlog gets one copy, which its run's claim makes a no-op "
            "(default 30, C39)"
        ),
    )
    tracing: bool = field(
        default=True,
        metadata=_doc(
            "OpenTelemetry spans for each executed step, linked across a run's attempts, when the "
            "opentelemetry-api package is installed and a tracer provider is configured (default True, C53)"
        ),
    )
    metrics: bool = field(
        default=True,
        metadata=_doc(
            "OpenTelemetry metrics of steps, runs, dead letters and recovery, when the opentelemetry-api "
            "package is installed and a meter provider is configured (default True, C53)"
        ),
    )
    trace_idempotency_keys: bool = field(
        default=False,
        metadata=_doc(
            "put each step's idempotency key on its span as flexiq.step.idempotency_key (default False, C53)"
        ),
    )

    def __post_init__(self) -> None:
        for name in _SECONDS:
            self._set(name, _positive_seconds(name, getattr(self, name)))
        for name in _COUNTS:
            _check_int(name, getattr(self, name), minimum=1)
        _check_int("max_takeovers", self.max_takeovers, minimum=0)
        self._set("codecs", _codecs(self.codecs))
        if self.serializer is not None and not isinstance(self.serializer, Serializer):
            raise ConfigurationError(
                f"option serializer={self.serializer!r} has no name/dumps/loads; pass a Serializer "
                "(e.g. JsonSerializer() or FunctionSerializer(name, dumps, loads))"
            )
        for name in _FLAGS:
            if not isinstance(getattr(self, name), bool):
                raise ConfigurationError(f"option {name}={getattr(self, name)!r} must be a bool")
        self._set("step_retry", retry_policy_option(self.step_retry, where="option step_retry"))
        caps = cancellation_option(self.max_run_seconds, self.max_suspended_seconds, where="options")
        self._set("max_run_seconds", caps.max_run_seconds if caps else None)
        self._set("max_suspended_seconds", caps.max_suspended_seconds if caps else None)

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)

    # ------------------------------------------------------------ building
    @classmethod
    def from_options(cls: type[C], options: Mapping[str, Any], *, where: str = "options") -> C:
        """Check and convert an integration's keyword options (C18, C22–C25, C27, C28).

        Parameters:
          options (Mapping[str, Any]): option names (see `accepted`) to values.
          where (str): who received them, for the error message (``"celery_ext.install"``).

        Raises:
          ConfigurationError: an unknown name, with the closest accepted name and the list of accepted
            names, or an unusable value naming its option ([`InvalidDuration`][flexiq_plugins.errors.InvalidDuration]
            for a duration).
        """
        unknown = sorted(set(options) - set(cls.accepted()))
        if unknown:
            raise ConfigurationError(cls.unknown_options_message(unknown, where=where))
        try:
            return cls(**options)
        except ConfigurationError:
            raise
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(f"{where}: invalid option value: {exc}") from exc

    @classmethod
    def accepted(cls) -> dict[str, str]:
        """The accepted option names with their help text, in declaration order."""
        return {f.name: str(f.metadata.get("doc", "")) for f in dataclasses.fields(cls) if f.init}

    @classmethod
    def unknown_options_message(cls, unknown: Sequence[str], *, where: str = "options") -> str:
        """The message for misspelt option names: each with its closest accepted name, then all names briefly.

        e.g. ``celery_ext.install: unknown option 'leese_seconds'; did you mean 'lease_seconds'? Accepted
        options: max_hop_seconds, lease_seconds, … (each described in docs/configuration.md, 'Integration
        options')``.
        """
        names = list(cls.accepted())
        parts = []
        for name in unknown:
            close = difflib.get_close_matches(str(name), names, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else "."
            parts.append(f"unknown option {str(name)!r}{hint}")
        return f"{where}: {' '.join(parts)} Accepted options: {', '.join(names)} (each described in {_OPTIONS_HELP})"

    @classmethod
    def describe_options(cls) -> str:
        """The accepted options, one ``  name: help`` line each (for error messages)."""
        return "\n".join(f"  {name}: {doc}" for name, doc in cls.accepted().items())

    def with_default_serializer(self: C, serializer: Serializer | None) -> C:
        """This config with ``serializer`` (the framework's own) unless one was configured (C7)."""
        if self.serializer is not None or serializer is None:
            return self
        return dataclasses.replace(self, serializer=serializer)

    # ------------------------------------------------------------- derived
    @property
    def limits(self) -> Limits:
        """The size limits (C22)."""
        return Limits(self.step_bytes, self.run_bytes, self.run_steps)

    @property
    def cancellation(self) -> CancellationPolicy | None:
        """The integration's run caps on every run (C34), ``None`` when neither is set."""
        return cancellation_option(self.max_run_seconds, self.max_suspended_seconds, where="options")

    def codec_chain(self) -> CodecChain:
        """The serializer and codecs step values go through (C7); JSON when no serializer is set."""
        return CodecChain(self.serializer, self.codecs)


def _positive_seconds(name: str, value: object) -> float:
    try:
        seconds = parse_duration(value)
    except InvalidDuration as exc:
        raise InvalidDuration(f"option {name}: {exc}") from exc
    if seconds <= 0:
        raise ConfigurationError(f"option {name}={value!r} must be a positive number of seconds or a duration")
    return seconds


def _check_int(name: str, value: object, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigurationError(f"option {name}={value!r} must be an int of at least {minimum}")


def _codecs(value: Any) -> tuple[Codec, ...]:
    items: tuple[Any, ...] = tuple(value or ())
    for item in items:
        if not isinstance(item, Codec):
            raise ConfigurationError(
                f"codec {item!r} has no name/encode/decode; use ZlibCodec(), FernetCodec(keys) or your own Codec"
            )
    return items
