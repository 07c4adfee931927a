"""The options both integrations accept, with one name each.

``celery_ext.install(app, **options)`` and ``DurableSteps(**options)`` pass
their keyword arguments here, so an option is spelled and validated the same
way on both frameworks. An unknown name is a :class:`ConfigurationError`
listing the accepted ones.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .attempt import DurableConfig, Limits
from .codec import Codec, CodecChain, Serializer
from .durations import parse_duration
from .errors import ConfigurationError

__all__ = ["OPTION_NAMES", "build_config", "check_options"]

OPTION_NAMES: dict[str, str] = {
    "max_hop": "longest delay of one sleep hop: seconds or a duration string (default '15m', C18)",
    "lease_seconds": "claim lease: seconds or a duration string, renewed every third of it (default 30, C23)",
    "busy_retry_seconds": "most a duplicate delivery is put back for: seconds or a duration (default 5, C24)",
    "max_takeovers": "claim takeovers from dead workers before 'worker_lost' (default 5, C25)",
    "step_bytes": "cap on one step's encoded value in bytes (default 262144, C22)",
    "run_bytes": "cap on all step values of one run in bytes (default 4194304, C22)",
    "run_steps": "cap on the number of steps in one run (default 10000, C22)",
    "codecs": "byte codecs after the serializer, e.g. [ZlibCodec(), FernetCodec(key)] (C7)",
    "keep_succeeded_steps": "keep step rows of succeeded runs for inspection (default False, C27)",
}


def check_options(options: Mapping[str, Any], *, where: str = "options", ignore: Sequence[str] = ()) -> None:
    """Raise :class:`ConfigurationError` naming any option not in :data:`OPTION_NAMES` (or ``ignore``)."""
    unknown = sorted(set(options) - set(OPTION_NAMES) - set(ignore))
    if unknown:
        accepted = "\n".join(f"  {k}: {v}" for k, v in OPTION_NAMES.items())
        raise ConfigurationError(f"{where} got unknown option(s) {', '.join(unknown)}; accepted:\n{accepted}")


def build_config(
    options: Mapping[str, Any], *, serializer: Serializer | None = None, ignore: Sequence[str] = ()
) -> DurableConfig:
    """Build a :class:`DurableConfig` from integration keyword options.

    Parameters:
      options(Mapping[str, Any]): names from :data:`OPTION_NAMES`.
      serializer(Serializer | None): the framework's serializer (C7); JSON if ``None``.
      ignore(Sequence[str]): adapter-specific names to skip here.

    Raises:
      ConfigurationError: an unknown option name or a bad value, naming it and the accepted forms.
    """
    check_options(options, ignore=ignore)
    defaults = Limits()
    try:
        limits = Limits(
            step_bytes=_positive_int(options, "step_bytes", defaults.step_bytes),
            run_bytes=_positive_int(options, "run_bytes", defaults.run_bytes),
            run_steps=_positive_int(options, "run_steps", defaults.run_steps),
        )
        base = DurableConfig()
        return DurableConfig(
            codec=CodecChain(serializer, _codecs(options.get("codecs", ()))),
            limits=limits,
            lease_seconds=parse_duration(options.get("lease_seconds", base.lease_seconds)),
            max_hop_seconds=parse_duration(options.get("max_hop", base.max_hop_seconds)),
            busy_retry_seconds=parse_duration(options.get("busy_retry_seconds", base.busy_retry_seconds)),
            max_takeovers=_positive_int(options, "max_takeovers", base.max_takeovers),
            keep_succeeded_steps=bool(options.get("keep_succeeded_steps", False)),
        )
    except ConfigurationError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"invalid option value: {exc}") from exc


def _positive_int(options: Mapping[str, Any], name: str, default: int) -> int:
    value = options.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigurationError(f"option {name}={value!r} must be a positive int ({OPTION_NAMES[name]})")
    return value


def _codecs(value: Any) -> tuple[Codec, ...]:
    items = tuple(value or ())
    for item in items:
        if not isinstance(item, Codec):
            raise ConfigurationError(
                f"codec {item!r} has no name/encode/decode; use ZlibCodec(), FernetCodec(keys) or your own Codec"
            )
    return items
