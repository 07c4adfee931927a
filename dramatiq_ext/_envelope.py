"""A Dramatiq message as the core sees it, and the way back to a message (C35, C36).

The run key travels in the message option ``flexiq_run_key``, stamped when the
message is first enqueued; a message published without it (by a producer that
does not load the middleware) uses its own message id as run key, and every
message the middleware publishes for that run carries it from then on. The
[`JobEnvelope`][flexiq_plugins.JobEnvelope] stored with every run keeps
what is needed to publish the job again: actor, queue, arguments and the
options that describe the job rather than one delivery of it, so a
dead-letter retry starts with a fresh retry budget and no stale ``eta``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import dramatiq
from dramatiq.common import q_name
from dramatiq.message import generate_unique_id

from flexiq_plugins.integration import (
    PAYLOAD_OPTION,
    RECORDED_FLAG,
    TRACE_HEADER,
    UNSTARTED_ONLY,
    JobEnvelope,
    JobInfo,
    build_envelope,
    claims_before_body,
    envelope_arguments,
    is_json,
    run_key_from,
)

from ._config import encoder_serializer

__all__ = ["RESUME_OPTION", "RUN_KEY_OPTION", "first_delivery", "job_info", "republish", "run_key_of"]

RUN_KEY_OPTION = "flexiq_run_key"
"""The message option that carries the run key."""

RESUME_OPTION = "flexiq_resume"
"""The message option marking a delivery that may continue a run (a put-back, a re-publish): it claims first."""

_DELIVERY_OPTIONS = frozenset(
    {"eta", "redis_message_id", "retries", "traceback", "requeue_timestamp", RUN_KEY_OPTION, RESUME_OPTION}
)


def run_key_of(message: Any) -> str:
    """Return the message's run key: its ``flexiq_run_key`` option, else its message id.

    Raises:
      InvalidRunKey: the option is set but is not a ``str`` of 1 to 255 characters (C11).
    """
    return run_key_from(message.options.get(RUN_KEY_OPTION), str(message.message_id), where=_RUN_KEY_WHERE)


_RUN_KEY_WHERE = f"{RUN_KEY_OPTION} option"


def job_info(message: Any, **fields: Any) -> JobInfo:
    """Describe a Dramatiq message (or proxy) for the attempt driver; ``fields`` are more
    [`JobInfo`][flexiq_plugins.integration.JobInfo] fields.

    Arguments that are not JSON (a ``PickleEncoder`` broker sending a
    ``datetime``) are kept encoded with the broker's encoder (C35). The
    envelope is built only when the run is claimed (its first step, C23).
    """

    def envelope() -> JobEnvelope:
        return build_envelope(
            message.actor_name,
            "dramatiq",
            queue=q_name(message.queue_name),
            args=message.args,
            kwargs=message.kwargs,
            options=_job_options(message.options),
            serializer=encoder_serializer(dramatiq.get_encoder()),
        )

    options = message.options  # each attribute of a worker's MessageProxy is a lookup of its own: read once
    message_id = message.message_id
    return JobInfo(
        run_key_from(options.get(RUN_KEY_OPTION), str(message_id), where=_RUN_KEY_WHERE),
        message_id,
        envelope,
        lazy=not _claims_first(options),
        task_name=message.actor_name,
        # read once: the message's own later enqueues (Retries, a sleep's copy) must not carry it (C39)
        unstarted_only=bool(options.pop(UNSTARTED_ONLY, False)),
        publish_trace=options.get(TRACE_HEADER),
        **fields,
    )


def first_delivery(message: Any) -> bool:
    """Whether ``message`` cannot continue a run, so its claim can wait for its first step (C23).

    A put-back, a re-publish, and a retry of an attempt that claimed its run
    carry ``flexiq_resume``: they may continue a run, so they claim before
    the body runs and their run is settled however the body ends. Any other
    delivery claims at its body's first step; one that takes no step does
    no store I/O at all.
    """
    return not _claims_first(message.options)


def _claims_first(options: Mapping[str, Any]) -> bool:
    return claims_before_body(
        options.get(RESUME_OPTION),
        run_key_given=bool(options.get(RUN_KEY_OPTION)),
        recorded=bool(options.get(RECORDED_FLAG)),
    )


def _job_options(options: Mapping[str, Any]) -> dict[str, Any]:
    # the store keeps JSON; a pickled-only option cannot be re-published
    return {k: v for k, v in options.items() if k not in _DELIVERY_OPTIONS and is_json(v)}


def republish(
    broker: dramatiq.Broker,
    envelope: JobEnvelope,
    run_key: str,
    *,
    message_id: str | None = None,
    delay_ms: int | None = None,
    unstarted_only: bool = False,
) -> dramatiq.Message[Any]:
    """Publish a stored job again, carrying its run key (C11, C30, C35, C36).

    The dead-letter retry of the CLI uses it: the new message has a new
    message id but the same run key, so committed steps replay and
    ``step.idempotency_key`` is unchanged.

    Parameters:
      broker (dramatiq.Broker): the broker to enqueue on.
      envelope (JobEnvelope): the run's stored envelope (a ``dramatiq`` job).
      run_key (str): the run key to carry.
      message_id (str | None): the new message id; a fresh UUID by default.
      delay_ms (int | None): milliseconds to delay the message by.
      unstarted_only (bool): the copy runs only while its run never started (C39).

    Returns:
      dramatiq.Message: the enqueued message.

    Raises:
      ValueError: the envelope is not a Dramatiq job's.
    """
    if envelope.framework != "dramatiq":
        raise ValueError(f"cannot re-publish a {envelope.framework!r} job on Dramatiq: {envelope.task_name!r}")
    queue = envelope.queue or "default"
    broker.declare_queue(queue)
    args, kwargs = envelope_arguments(envelope, encoder_serializer(dramatiq.get_encoder()))
    options = {k: v for k, v in envelope.options.items() if k != PAYLOAD_OPTION}
    message: dramatiq.Message[Any] = dramatiq.Message(
        queue_name=queue,
        actor_name=envelope.task_name,
        args=tuple(args),
        kwargs=kwargs,
        options={**options, RUN_KEY_OPTION: run_key, RESUME_OPTION: True, **_unstarted_only(unstarted_only)},
        message_id=message_id or generate_unique_id(),
    )
    return broker.enqueue(message, delay=delay_ms)


def _unstarted_only(wanted: bool) -> dict[str, Any]:
    return {UNSTARTED_ONLY: True} if wanted else {}
