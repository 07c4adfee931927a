"""A new Celery job at publish: its run key, and its run recorded ``queued`` before the message leaves (C39).

Called from ``before_task_publish`` with the message Celery is about to send.
A message without a run key gets a new one. A job's first publish (no
``flexiq_resume`` header yet: a new key, a key the producer chose, or one
derived from a parent run's, C44) of a task known to take steps (declared
``durable=True``, or learned: C43) has its run recorded ``queued`` unless the
run exists (C39, C46), through the core's
[`record_at_publish`][flexiq_plugins.integration.record_at_publish], unless its task
(``record_at_publish=False``) or the message (header ``flexiq_record``) opts
out; the header ``flexiq_recorded`` then says so. The library's own
re-publishes (a sleep hop, a put-back, a recovery, a dead-letter retry)
carry the resume mark and are left alone.
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from flexiq_plugins import InvalidRunKey
from flexiq_plugins.integration import (
    RECORD_OPTION,
    RECORD_TASK_OPTION,
    RECORDED_FLAG,
    TRACE_HEADER,
    JobEnvelope,
    build_envelope,
    durable_at_publish,
    first_publish,
    is_json,
    new_run_key,
    publishing_trace,
    record_at_publish,
    resume_mark_at_publish,
    run_key_from,
    wants_record,
)

from ._options import RESUME_HEADER, RUN_KEY_HEADER, kombu_serializer
from ._runtime import Runtime, all_runtimes, runtime_of

__all__ = ["note_publishing_app", "stamp_new_job"]

_publishing: contextvars.ContextVar[Any] = contextvars.ContextVar("flexiq_celery_publishing_app", default=None)
"""The app whose ``send_task`` is publishing in this context (``before_task_publish`` does not say)."""

_NOT_ENVELOPE = frozenset({RUN_KEY_HEADER, RESUME_HEADER, RECORD_OPTION})
_PROTOCOL: frozenset[str] | None = None


def stamp_new_job(
    task_name: str,
    body: Any,
    headers: dict[str, Any],
    properties: Mapping[str, Any],
    *,
    exchange: str | None,
    routing_key: str | None,
) -> None:
    """Stamp a run key on a new job's message, record a job's run at its first publish (C11, C39, C46);
    set every message's resume mark (C37). A task declared ``durable=False`` is left alone (C43)."""
    runtime, task = _owner(task_name)
    if getattr(task, "durable", None) is False:
        return  # a task that opts out is not touched (C43)
    given = bool(headers.get(RUN_KEY_HEADER))
    first = first_publish(headers.get(RESUME_HEADER))
    # a run key the producer chose may name an existing run: the job claims before its body (C37)
    headers[RESUME_HEADER] = resume_mark_at_publish(headers.get(RESUME_HEADER), run_key_given=given)
    if not given:
        headers[RUN_KEY_HEADER] = run_key = new_run_key()  # valid as minted
    if not first:
        return  # the library's own re-publish, or a retry: its run is known
    if given:
        try:
            run_key = run_key_from(headers[RUN_KEY_HEADER], "", where=_RUN_KEY_WHERE)
        except InvalidRunKey:
            return  # the worker refuses the job and says why (C11)
    published = None if runtime is None else publishing_trace(runtime.config)
    if published is not None:
        headers[TRACE_HEADER] = published  # the run's first attempt links to this span (C53)
    call_option = headers.get(RECORD_OPTION)
    if (
        runtime is None
        or not wants_record(
            runtime.config, task_option=getattr(task, RECORD_TASK_OPTION, None), call_option=call_option
        )
        or not durable_at_publish(
            lambda: runtime.driver().known_tasks,
            "celery",
            task_name,
            declared=getattr(task, "durable", None),
            run_key_given=given,
        )
    ):
        return  # a task not known to take steps is not touched: no store statement (C43)
    arguments = _arguments(body)
    if arguments is None:  # a message protocol this does not read: the run is recorded when it starts
        return
    route = {"exchange": exchange, "routing_key": routing_key}
    flagged = {**headers, RECORDED_FLAG: True}  # re-publishes of the run carry the flag too
    envelope = _envelope(runtime, task_name, arguments, headers=flagged, properties=properties, **route)
    job_id = str(headers.get("id", run_key))
    delay = _seconds_until(headers.get("eta"))
    if record_at_publish(lambda: runtime.driver().store, run_key, job_id, envelope, delay_seconds=delay):
        headers[RECORDED_FLAG] = True


_RUN_KEY_WHERE = f"{RUN_KEY_HEADER} header"


def _seconds_until(eta: object) -> float:
    """Seconds from now to the message's ``eta`` header (an ISO 8601 time; a countdown becomes one), else 0."""
    if not isinstance(eta, str):
        return 0.0
    try:
        moment = datetime.fromisoformat(eta)
    except ValueError:
        return 0.0
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return max((moment - datetime.now(timezone.utc)).total_seconds(), 0.0)


def note_publishing_app(app: Any) -> None:
    """Make ``app.send_task`` (which ``apply_async`` and ``delay`` call) say which app publishes.

    Celery's tasks are shared between the apps of a process, so the task
    name alone does not tell which app (and store) a message belongs to.
    """
    send_task = app.send_task

    @functools.wraps(send_task)
    def send_task_noting_app(*args: Any, **kwargs: Any) -> Any:
        token = _publishing.set(app)
        try:
            return send_task(*args, **kwargs)
        finally:
            _publishing.reset(token)

    app.send_task = send_task_noting_app


def _owner(task_name: str) -> tuple[Runtime | None, Any]:
    """The runtime of the publishing app (else of the app that has ``task_name``, or the only one) and the task."""
    app = _publishing.get()
    runtime = runtime_of(app) if app is not None else None
    if runtime is not None:
        return runtime, app.tasks.get(task_name)
    runtimes = all_runtimes()
    for runtime in runtimes:
        task = runtime.app.tasks.get(task_name)
        if task is not None:
            return runtime, task
    return (runtimes[0], None) if len(runtimes) == 1 else (None, None)


def _arguments(body: Any) -> tuple[list[Any], dict[str, Any]] | None:
    """``(args, kwargs)`` of a protocol-2 body ``(args, kwargs, embed)``, else ``None``."""
    if isinstance(body, (tuple, list)) and len(body) == 3 and isinstance(body[1], dict):
        return list(body[0]), dict(body[1])
    return None


def _protocol_headers(app: Any) -> frozenset[str]:
    """The headers Celery's task protocol 2 sets itself (``id``, ``task``, ``eta`` …), read once."""
    global _PROTOCOL
    if _PROTOCOL is None:
        _PROTOCOL = frozenset(app.amqp.as_task_v2("x", "x").headers)
    return _PROTOCOL


def _envelope(
    runtime: Runtime,
    task_name: str,
    arguments: tuple[list[Any], dict[str, Any]],
    *,
    headers: Mapping[str, Any],
    properties: Mapping[str, Any],
    exchange: str | None,
    routing_key: str | None,
) -> JobEnvelope:
    """The envelope a worker would store for this message: the user's own headers and the route (C35)."""
    protocol = _protocol_headers(runtime.app)
    kept = {k: v for k, v in headers.items() if k not in protocol and k not in _NOT_ENVELOPE and is_json(v)}
    options: dict[str, Any] = {"headers": kept}
    if exchange:
        options.update(exchange=exchange, routing_key=routing_key)
    if properties.get("priority") is not None:
        options["priority"] = properties["priority"]
    args, kwargs = arguments
    return build_envelope(
        task_name,
        "celery",
        queue=routing_key,
        args=args,
        kwargs=kwargs,
        options=options,
        serializer=kombu_serializer(runtime.app.conf.task_serializer),
    )
