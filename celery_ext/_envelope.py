"""From a Celery request to the core's [`JobInfo`][flexiq_plugins.integration.JobInfo], and back to a message (C35,
C36).

The envelope stored with each run is what an operator needs to publish the job
again (a dead-letter retry, a recovery of a lost sleeper): the task name, its
arguments, the queue and the routing options. Arguments the envelope's JSON
cannot take (``pickle`` apps) are kept encoded with the app's task serializer
([`flexiq_plugins.integration.build_envelope`][flexiq_plugins.integration.build_envelope]).
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Callable, Mapping
from typing import Any

from flexiq_plugins.integration import (
    PAYLOAD_OPTION,
    RECORDED_FLAG,
    TRACE_HEADER,
    UNSTARTED_ONLY,
    JobEnvelope,
    JobInfo,
    build_envelope,
    cancellation_option,
    claims_before_body,
    durable_at_publish,
    envelope_arguments,
    is_json,
    retry_policy_option,
    run_key_from,
)

from ._options import RESUME_HEADER, RUN_KEY_HEADER, kombu_serializer

__all__ = ["job_info", "republish", "run_key_of"]


def run_key_of(request: Any) -> str:
    """The run key of a Celery request: the ``flexiq_run_key`` header, else the task id (C1 words).

    Raises:
      InvalidRunKey: the header is not a ``str`` of 1 to 255 characters (C11).
    """
    headers = request.headers or {}
    carried = getattr(request, RUN_KEY_HEADER, None) or headers.get(RUN_KEY_HEADER)
    return run_key_from(carried, str(request.id), where=f"{RUN_KEY_HEADER} header")


def job_info(task: Any, request: Any, known_tasks: Callable[[], Any] | None = None) -> JobInfo:
    """The core's view of the message ``request`` of ``task``, with its ``step_retry`` (C31) and run caps (C34).

    ``known_tasks`` opens this process's known tasks: a redelivered message
    of a task neither declared ``durable=True`` nor known to take steps has
    no run to continue, and claims at its first step like a first delivery
    (C43); ``None``: every redelivery claims before its body.

    Raises:
      ConfigurationError: the task's ``step_retry`` is not a ``RetryPolicy`` (or a dict of its fields), or
        its ``max_run_seconds`` / ``max_suspended_seconds`` is not a positive duration.
    """
    step_retry = getattr(task, "step_retry", None)
    if step_retry is not None:  # unset (the usual case) names nothing: no message is formatted for it
        step_retry = retry_policy_option(step_retry, where=f"task {task.name!r} step_retry")
    max_run, max_suspended = getattr(task, "max_run_seconds", None), getattr(task, "max_suspended_seconds", None)
    caps = None
    if max_run is not None or max_suspended is not None:
        caps = cancellation_option(max_run, max_suspended, where=f"task {task.name!r}")
    return JobInfo(
        run_key=_eager_run_key(request) if request.is_eager else run_key_of(request),
        job_id=str(request.id),
        envelope=lambda: _envelope(task, request),  # built when the run is claimed (its first step, C23)
        task_name=str(request.task or task.name),
        step_retry=step_retry,
        cancellation=caps,
        eager=bool(request.is_eager),
        lazy=not _may_continue(task, request, known_tasks),
        # a recovery copy of a queued run; its own redelivery (its worker died) claims as usual
        unstarted_only=bool(_header(request, UNSTARTED_ONLY)) and not (request.delivery_info or {}).get("redelivered"),
        publish_trace=_header(request, TRACE_HEADER),
    )


def _eager_run_key(request: Any) -> str:
    """The run key of an eager job (``task_always_eager``, ``Task.apply``): its own run, unless one is carried.

    An eager job is never delivered again, so nothing would ever find its run
    by its task id; and Celery runs every task of an eagerly applied, frozen
    chain under the chain's one task id. A run key must name one job of one
    task (C1), so an eager job without a ``flexiq_run_key`` header gets a new
    one, its task id and a random suffix (``<task id>.<12 hex digits>``):
    tasks run under one id never share a run. An eager retry carries the key
    of the run it retries ([`DurableTask.retry`][celery_ext.DurableTask.retry]).
    """
    if _header(request, RUN_KEY_HEADER):
        return run_key_of(request)
    return f"{request.id}.{secrets.token_hex(6)}"


def without_unstarted_only(headers: Mapping[str, Any] | None) -> dict[str, Any]:
    """``headers`` without the recovery copy's mark: the job's own later messages (a wake-up, a retry) run (C39)."""
    return {k: v for k, v in (headers or {}).items() if k != UNSTARTED_ONLY}


def _may_continue(task: Any, request: Any, known_tasks: Callable[[], Any] | None) -> bool:
    """Whether the job may continue a run, so it claims before its body (C23, C24).

    A put-back, a re-publish or a retry of an attempt that claimed carries
    ``flexiq_resume``; a message the broker delivers again (a worker died, a
    visibility timeout) is ``redelivered``, and may continue a run if its
    task takes steps (`claims_before_body`, C43). Any other job claims at
    its first step.
    """
    mark = getattr(request, RESUME_HEADER, None)
    if mark is None:
        mark = (request.headers or {}).get(RESUME_HEADER)
    redelivered = bool((request.delivery_info or {}).get("redelivered"))
    takes_steps = None
    if known_tasks is not None:
        name, declared = str(request.task or task.name), getattr(task, "durable", None)
        takes_steps = functools.partial(durable_at_publish, known_tasks, "celery", name, declared=declared)
    return claims_before_body(
        mark,
        run_key_given=bool(_header(request, RUN_KEY_HEADER)),
        redelivered=redelivered,
        recorded=bool(_header(request, RECORDED_FLAG)),
        takes_steps=takes_steps,
    )


def _header(request: Any, name: str) -> Any:
    """A custom header of ``request`` (Celery makes them request attributes; eager ones stay in ``headers``)."""
    return getattr(request, name, None) or (request.headers or {}).get(name)


def _envelope(task: Any, request: Any) -> JobEnvelope:
    delivery = request.delivery_info or {}
    exchange = delivery.get("exchange") or ""
    routing_key = delivery.get("routing_key")
    options: dict[str, Any] = {"headers": _json_headers(request.headers or {})}
    if exchange:
        options.update(exchange=exchange, routing_key=routing_key)
    if delivery.get("priority") is not None:
        options["priority"] = delivery["priority"]
    return build_envelope(
        str(request.task or task.name),
        "celery",
        queue=routing_key,
        args=request.args or (),
        kwargs=request.kwargs or {},
        options=options,
        serializer=kombu_serializer(task.app.conf.task_serializer),
    )


def _json_headers(headers: Mapping[str, Any]) -> dict[str, Any]:
    kept = {k: v for k, v in headers.items() if k not in (RUN_KEY_HEADER, RESUME_HEADER)}
    if is_json(kept):  # the usual case: one encoding for all of them
        return kept
    return {k: v for k, v in kept.items() if is_json(v)}


def republish(
    app: Any,
    envelope: JobEnvelope,
    run_key: str,
    *,
    task_id: str | None = None,
    countdown: float | None = None,
    unstarted_only: bool = False,
) -> Any:
    """Publish a stored job again with the run key ``run_key`` (C11, C30, C35, C36).

    Used for dead-letter retries and recovery: the new message carries the run
    key, so the run replays its committed steps and its idempotency keys stay
    the same. It goes to the queue (or exchange and routing key) the job was
    first delivered from.

    Parameters:
      app (celery.Celery): the application to publish with.
      envelope (JobEnvelope): the stored envelope of the run.
      run_key (str): the run key to carry.
      task_id (str | None): the new job's task id (a fresh UUID when ``None``).
      countdown (float | None): delay before the job runs, seconds.
      unstarted_only (bool): the copy runs only while its run never started (C39).

    Returns:
      celery.result.AsyncResult: the new job's result handle.

    Raises:
      kombu.exceptions.OperationalError: the broker refused or could not be reached.
    """
    from celery.utils import uuid

    options = dict(envelope.options)
    args, kwargs = envelope_arguments(envelope, _payload_serializer(options))
    headers = {**dict(options.get("headers") or {}), RUN_KEY_HEADER: run_key, RESUME_HEADER: True}
    if unstarted_only:
        headers[UNSTARTED_ONLY] = True
    route: dict[str, Any] = {}
    if options.get("exchange"):
        route = {"exchange": options["exchange"], "routing_key": options.get("routing_key")}
    elif envelope.queue:
        route = {"queue": envelope.queue}
    if options.get("priority") is not None:
        route["priority"] = options["priority"]
    return app.send_task(
        envelope.task_name,
        args=args,
        kwargs=kwargs,
        task_id=task_id or uuid(),
        countdown=countdown,
        headers=headers,
        **route,
    )


def _payload_serializer(options: Mapping[str, Any]) -> Any:
    payload = options.get(PAYLOAD_OPTION)
    name = str(payload.get("serializer", "kombu:json")) if payload else "kombu:json"
    return kombu_serializer(name.removeprefix("kombu:"))
