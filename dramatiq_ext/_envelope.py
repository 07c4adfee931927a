"""A Dramatiq message as the core sees it, and the way back to a message.

The run key travels in the message option ``flexiq_run_key``, stamped when the
message is first enqueued; a message published without it (by a producer that
does not load the middleware) uses its own message id as run key. The
:class:`~flexiq_plugins.JobEnvelope` stored with every run keeps what is needed
to publish the job again (C35): actor, queue, arguments and the options that
describe the job rather than one delivery of it, so a dead-letter retry starts
with a fresh retry budget and no stale ``eta``.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

import dramatiq
from dramatiq.common import q_name
from dramatiq.message import generate_unique_id

from flexiq_plugins._store.base import JobEnvelope
from flexiq_plugins.attempt import JobInfo
from flexiq_plugins.errors import InvalidRunKey

__all__ = ["RUN_KEY_OPTION", "job_info", "republish", "run_key_of"]

RUN_KEY_OPTION = "flexiq_run_key"
"""The message option that carries the run key."""

PAYLOAD_OPTION = "flexiq_payload"
"""The stored envelope option holding non-JSON arguments, encoded by the broker's encoder."""

_DELIVERY_OPTIONS = frozenset(
    {"eta", "redis_message_id", "retries", "traceback", "requeue_timestamp", "flexiq_outages", RUN_KEY_OPTION}
)


def run_key_of(message: Any) -> str:
    """Return the message's run key: its ``flexiq_run_key`` option, else its message id.

    Raises:
      InvalidRunKey: the option is set but is not a ``str`` (C11).
    """
    key = message.options.get(RUN_KEY_OPTION)
    if not key:
        return str(message.message_id)
    if not isinstance(key, str):  # a repr() would not be a stable identity across producers
        raise InvalidRunKey(f"the {RUN_KEY_OPTION} option {key!r} is not a str")
    return key


def job_info(message: Any) -> JobInfo:
    """Describe a Dramatiq message (or proxy) for the attempt driver.

    Arguments that are not JSON (a ``PickleEncoder`` broker sending a
    ``datetime``) are kept encoded with the broker's encoder, base64, under
    the option ``flexiq_payload``; :func:`republish` decodes them (C35).
    """
    args, kwargs = list(message.args), dict(message.kwargs)
    options = _job_options(message.options)
    if not _is_json((args, kwargs)):
        options[PAYLOAD_OPTION] = _encode_payload(args, kwargs)
        args, kwargs = [], {}
    envelope = JobEnvelope(
        task_name=message.actor_name,
        framework="dramatiq",
        queue=q_name(message.queue_name),
        args=args,
        kwargs=kwargs,
        options=options,
    )
    return JobInfo(run_key_of(message), message.message_id, envelope)


def _is_json(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def _encode_payload(args: list[Any], kwargs: dict[str, Any]) -> str:
    return base64.b64encode(dramatiq.get_encoder().encode({"args": args, "kwargs": kwargs})).decode()


def _decode_payload(payload: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
    data = dramatiq.get_encoder().decode(base64.b64decode(payload))
    return tuple(data["args"]), dict(data["kwargs"])


def _job_options(options: Mapping[str, Any]) -> dict[str, Any]:
    kept: dict[str, Any] = {}
    for name, value in options.items():
        if name in _DELIVERY_OPTIONS:
            continue
        if _is_json(value):  # the store keeps JSON; a pickled-only option cannot be re-published
            kept[name] = value
    return kept


def republish(
    broker: dramatiq.Broker,
    envelope: JobEnvelope,
    run_key: str,
    *,
    message_id: str | None = None,
    delay_ms: int | None = None,
) -> dramatiq.Message[Any]:
    """Publish a stored job again, carrying its run key (C11, C30, C35).

    The dead-letter retry of the CLI uses it: the new message has a new
    message id but the same run key, so committed steps replay and
    ``step.idempotency_key`` is unchanged.

    Parameters:
      broker(dramatiq.Broker): the broker to enqueue on.
      envelope(JobEnvelope): the run's stored envelope (a ``dramatiq`` job).
      run_key(str): the run key to carry.
      message_id(str | None): the new message id; a fresh UUID by default.
      delay_ms(int | None): milliseconds to delay the message by.

    Returns:
      dramatiq.Message: the enqueued message.

    Raises:
      ValueError: the envelope is not a Dramatiq job's.
    """
    if envelope.framework != "dramatiq":
        raise ValueError(f"cannot re-publish a {envelope.framework!r} job on Dramatiq: {envelope.task_name!r}")
    queue = envelope.queue or "default"
    broker.declare_queue(queue)
    options = dict(envelope.options)
    payload = options.pop(PAYLOAD_OPTION, None)
    args, kwargs = _decode_payload(payload) if payload else (tuple(envelope.args), dict(envelope.kwargs))
    message: dramatiq.Message[Any] = dramatiq.Message(
        queue_name=queue,
        actor_name=envelope.task_name,
        args=args,
        kwargs=kwargs,
        options={**options, RUN_KEY_OPTION: run_key},
        message_id=message_id or generate_unique_id(),
    )
    return broker.enqueue(message, delay=delay_ms)
