"""What an adapter makes of a message: its envelope, its arguments, and whether it claims before its body.

The envelope is what re-publishes a job (C35, [`build_envelope`][flexiq_plugins.integration.build_envelope]); a
delivery claims its run before the body when it may continue a run or was
recorded at publish ([`claims_before_body`][flexiq_plugins.integration.claims_before_body], C39, C23), else lazily at
the body's first step.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .._model.codec import Serializer
from .._model.records import JobEnvelope

PAYLOAD_OPTION = "flexiq_payload"
"""The envelope option holding arguments that are not JSON, encoded by the framework's serializer."""

__all__ = [
    "PAYLOAD_OPTION",
    "body_traceback",
    "build_envelope",
    "claims_before_body",
    "envelope_arguments",
    "first_publish",
    "is_json",
    "resume_mark_at_publish",
]


# ---------------------------------------------------------------- claims
def claims_before_body(
    resume: bool | None,
    *,
    run_key_given: bool,
    redelivered: bool = False,
    recorded: bool = False,
    takes_steps: Callable[[], bool] | None = None,
) -> bool:
    """Whether a delivery claims its run before the body runs, or lazily at its first step (C23, C37, C39).

    The one rule both adapters follow. A delivery that may continue an
    existing run claims first, so a duplicate of a finished run replays its
    outcome without running any of the body (C37) and a busy run is never run
    twice at once (C24). So does a job whose run was recorded at publish
    (C39): its run row exists, and recovery re-publishes a run that stays
    ``queued``; claiming first marks it started, so neither a long body
    before its first step nor a copy recovery published can run it twice. A
    genuinely new job that was not recorded claims at its first step, so a
    body that takes no step costs no store I/O. A message the broker
    delivers again may continue a run only if its task takes steps: a task
    never known to take one has no run, and its redelivery claims at its
    first step too (C43).

    Parameters:
      resume (bool | None): the message's resume mark (``flexiq_resume``):
        ``True`` on the library's own re-publishes, put-backs and retries of an
        attempt that claimed, and on a job published with a run key the
        producer chose; ``False`` on a job whose run key the integration
        stamped at publish (a new run); ``None`` when no integration marked it.
      run_key_given (bool): whether the message carries a run key.
      redelivered (bool): whether the broker says it delivered the message before.
      recorded (bool): whether the message says its run was recorded at publish (C39).
      takes_steps (Callable[[], bool] | None): whether the message's task is declared durable or known to take
        steps (`durable_at_publish`), asked only of a redelivery; ``None``: assume it does.

    Returns:
      bool: ``True`` to claim before the body.
    """
    if recorded or (redelivered and (takes_steps is None or takes_steps())):
        return True
    if resume is None:
        return run_key_given  # a run key from a producer without the integration may name an existing run
    return resume


def resume_mark_at_publish(resume: bool | None, *, run_key_given: bool) -> bool:
    """The resume mark a publish hook sets (C23, C37): kept if set, else ``True`` for a producer's own run key.

    Parameters:
      resume (bool | None): the mark already on the message, if any.
      run_key_given (bool): whether the producer put a run key on the message
        (``False``: the hook is stamping a new one, the job is a new run).
    """
    if resume is not None:
        return resume
    return run_key_given


def first_publish(resume: bool | None) -> bool:
    """Whether a publish hook sees a job's first publish, whose run it records (C39, C46): no resume mark yet.

    The one rule both adapters follow. A message without ``flexiq_resume`` is
    a job a producer publishes for the first time: its run key was minted by
    the hook, chosen by the producer, or derived by the integration from a
    parent's (C44); its run is recorded ``queued`` unless it exists, so a
    message the broker loses is recovered whichever key it carries. A
    message with the mark is one the library publishes again for a run it
    knows (a sleep hop, a put-back, a retry, a recovery, a dead-letter
    retry), or a framework retry of a job already published: not recorded again.

    Parameters:
      resume (bool | None): the message's resume mark before the hook sets it.
    """
    return resume is None


# ---------------------------------------------------------------- envelopes
def is_json(*values: Any) -> bool:
    """Whether ``values`` can be stored as JSON (the envelope is stored as JSON)."""
    try:
        json.dumps(values)
    except (TypeError, ValueError):
        return False
    return True


def build_envelope(
    task_name: str,
    framework: str,
    *,
    queue: str | None,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    options: Mapping[str, Any],
    serializer: Serializer,
) -> JobEnvelope:
    """The [`JobEnvelope`][flexiq_plugins.JobEnvelope] stored with a run, what re-publishes its job (C35).

    Arguments a JSON encoder cannot take (a pickle-configured app sending a
    ``datetime``) are kept encoded by the framework's ``serializer``, base64,
    under the option [`PAYLOAD_OPTION`][flexiq_plugins.integration.PAYLOAD_OPTION];
    [`envelope_arguments`][flexiq_plugins.integration.envelope_arguments] reads them back. Options must be JSON already.

    Parameters:
      task_name (str): the task or actor name.
      framework (str): the adapter's framework name.
      queue (str | None): the queue the job was delivered from.
      args (Sequence[Any]): positional arguments.
      kwargs (Mapping[str, Any]): keyword arguments.
      options (Mapping[str, Any]): what re-publishing needs besides the arguments.
      serializer (Serializer): encodes non-JSON arguments.
    """
    args, kwargs, kept = list(args), dict(kwargs), dict(options)
    if not is_json(args, kwargs):
        data = serializer.dumps({"args": args, "kwargs": kwargs})
        kept[PAYLOAD_OPTION] = {"serializer": serializer.name, "data": base64.b64encode(data).decode()}
        args, kwargs = [], {}
    return JobEnvelope(task_name, framework, queue, args, kwargs, kept)


def envelope_arguments(envelope: JobEnvelope, serializer: Serializer) -> tuple[list[Any], dict[str, Any]]:
    """The job's ``(args, kwargs)``, decoding [`PAYLOAD_OPTION`][flexiq_plugins.integration.PAYLOAD_OPTION] with
    ``serializer`` if present."""
    payload = envelope.options.get(PAYLOAD_OPTION)
    if not payload:
        return list(envelope.args), dict(envelope.kwargs)
    data = serializer.loads(base64.b64decode(payload["data"]))
    return list(data["args"]), dict(data["kwargs"])


# -------------------------------------------------------------- tracebacks
_OWN_MODULES = ("flexiq_plugins.", "celery_ext.", "dramatiq_ext.")


def body_traceback(error: BaseException) -> BaseException:
    """``error`` with the integration's frames dropped from the top of its traceback; returns ``error``.

    A body's error is caught by the attempt; its traceback then starts with
    the attempt's and the adapter's frames before the body's. An adapter
    re-raising it for the framework drops them, so the framework logs and
    formats (Dramatiq's Retries formats every retried traceback) what it
    would without the integration: the body's frames and below.
    """
    tb = error.__traceback__
    while (
        tb is not None and tb.tb_next is not None and tb.tb_frame.f_globals.get("__name__", "").startswith(_OWN_MODULES)
    ):
        tb = tb.tb_next
    return error.with_traceback(tb)


def _is_own(frame: Any) -> bool:
    return str(frame.f_globals.get("__name__", "")).startswith(_OWN_MODULES)
