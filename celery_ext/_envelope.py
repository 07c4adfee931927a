"""From a Celery request to the core's :class:`JobInfo`, and back to a message (C35).

The envelope stored with each run is what an operator needs to publish the job
again (a dead-letter retry, a recovery of a lost sleeper): the task name, its
arguments, the queue and the routing options. It must be JSON: arguments a
JSON encoder cannot take (``pickle`` apps) are kept encoded with the app's
task serializer under ``options["payload"]`` and decoded by :func:`republish`.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

from flexiq_plugins._store.base import JobEnvelope
from flexiq_plugins.attempt import JobInfo
from flexiq_plugins.errors import InvalidRunKey

from ._options import RUN_KEY_HEADER
from ._runtime import kombu_codec

__all__ = ["job_info", "republish", "run_key_of"]


def run_key_of(request: Any) -> str:
    """The run key of a Celery request: the ``flexiq_run_key`` header, else the task id (C1 words)."""
    headers = request.headers or {}
    key = getattr(request, RUN_KEY_HEADER, None) or headers.get(RUN_KEY_HEADER)
    if not key:
        return str(request.id)
    if not isinstance(key, str):  # a repr() would not be a stable identity across producers (C11)
        raise InvalidRunKey(f"the {RUN_KEY_HEADER} header {key!r} is not a str")
    return key


def job_info(task: Any, request: Any) -> JobInfo:
    """The core's view of the message ``request`` of ``task``."""
    return JobInfo(run_key=run_key_of(request), job_id=str(request.id), envelope=_envelope(task, request))


def _envelope(task: Any, request: Any) -> JobEnvelope:
    delivery = request.delivery_info or {}
    exchange = delivery.get("exchange") or ""
    routing_key = delivery.get("routing_key")
    options: dict[str, Any] = {"headers": _json_headers(request.headers or {})}
    if exchange:
        options.update(exchange=exchange, routing_key=routing_key)
    if delivery.get("priority") is not None:
        options["priority"] = delivery["priority"]
    args, kwargs = list(request.args or ()), dict(request.kwargs or {})
    if not _is_json(args, kwargs):
        options["payload"] = _encode_payload(task.app, args, kwargs)
        args, kwargs = [], {}
    return JobEnvelope(
        task_name=str(request.task or task.name),
        framework="celery",
        queue=routing_key,
        args=args,
        kwargs=kwargs,
        options=options,
    )


def _json_headers(headers: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in headers.items() if k != RUN_KEY_HEADER and _is_json(v)}


def _is_json(*values: Any) -> bool:
    try:
        json.dumps(values)
    except (TypeError, ValueError):
        return False
    return True


def _encode_payload(app: Any, args: list[Any], kwargs: dict[str, Any]) -> dict[str, str]:
    dumps, _ = kombu_codec()
    content_type, encoding, data = dumps([args, kwargs], serializer=app.conf.task_serializer)
    raw = data if isinstance(data, bytes) else str(data).encode(encoding or "utf-8")
    return {"content_type": content_type, "encoding": encoding, "data": base64.b64encode(raw).decode()}


def _decode_payload(payload: Mapping[str, str]) -> tuple[list[Any], dict[str, Any]]:
    _, loads = kombu_codec()
    content_type = payload["content_type"]
    raw = base64.b64decode(payload["data"])
    args, kwargs = loads(raw, content_type, payload["encoding"], accept={content_type})
    return list(args), dict(kwargs)


def republish(
    app: Any,
    envelope: JobEnvelope,
    run_key: str,
    *,
    task_id: str | None = None,
    countdown: float | None = None,
) -> Any:
    """Publish a stored job again with the run key ``run_key`` (C11, C30, C35).

    Used for dead-letter retries and recovery: the new message carries the run
    key, so the run replays its committed steps and its idempotency keys stay
    the same. It goes to the queue (or exchange and routing key) the job was
    first delivered from.

    Parameters:
      app(celery.Celery): the application to publish with.
      envelope(JobEnvelope): the stored envelope of the run.
      run_key(str): the run key to carry.
      task_id(str | None): the new job's task id (a fresh UUID when ``None``).
      countdown(float | None): delay before the job runs, seconds.

    Returns:
      celery.result.AsyncResult: the new job's result handle.

    Raises:
      kombu.exceptions.OperationalError: the broker refused or could not be reached.
    """
    from celery.utils import uuid

    options = dict(envelope.options)
    args, kwargs = list(envelope.args), dict(envelope.kwargs)
    if "payload" in options:
        args, kwargs = _decode_payload(options["payload"])
    headers = {**dict(options.get("headers") or {}), RUN_KEY_HEADER: run_key}
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
