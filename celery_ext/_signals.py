"""Celery signal receivers: the run key (and the run) at publish, fresh stores after fork, tasks made durable,
the start line, revokes, jobs of tasks the worker does not have.

They are connected once per process (``dispatch_uid``), whatever the number
of apps, and do nothing for an app that [`celery_ext.install`][celery_ext.install] was not
called on. ``celery.*`` built-in tasks are never touched.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import signals

from flexiq_plugins import FlexiqError, InvalidRunKey
from flexiq_plugins.integration import (
    RECORDED_FLAG,
    Ended,
    check_store_at_start,
    dead_letter_unregistered,
    log_worker_start,
    settle_unclaimed_run,
)

from ._adapter import publisher
from ._envelope import run_key_of
from ._options import RUN_KEY_HEADER
from ._prepare import prepare_app, prepare_known_tasks
from ._publish import stamp_new_job
from ._request import driver_for
from ._runtime import all_runtimes, runtime_of

logger = logging.getLogger("flexiq_plugins.celery")

__all__ = [
    "announce_store",
    "connect_signals",
    "dead_letter_unknown_task",
    "on_app_finalized",
    "settle_plain_task",
    "settle_revoked",
]


def stamp_run_key(
    sender: Any = None,
    *,
    body: Any = None,
    exchange: str | None = None,
    routing_key: str | None = None,
    headers: dict[str, Any] | None = None,
    properties: dict[str, Any] | None = None,
    **_: Any,
) -> None:
    """``before_task_publish``: a new job gets a ``flexiq_run_key`` header and its run recorded (C11, C39)."""
    if headers is None or str(sender or "").startswith("celery."):
        return
    stamp_new_job(str(sender), body, headers, properties or {}, exchange=exchange, routing_key=routing_key)


def forget_parent_stores(**_: Any) -> None:
    """``worker_process_init``: a prefork child opens its own store, never its parent's connections."""
    for runtime in all_runtimes():
        runtime.forget_process_state()


def prepare_worker_app(sender: Any = None, **_: Any) -> None:
    """``worker_init``: make every task durable before its tracers are built; reach the store once (C41).

    A store the worker cannot use stops it with one line naming the cause
    (``SystemExit``, which Celery's signal dispatch lets through). Then the
    tasks known to take steps are read once and acknowledged late (C26,
    C43): this runs before the consumer builds each task's request class,
    which keeps ``acks_late`` for the worker's life.
    """
    app: Any = getattr(sender, "app", None)
    runtime = runtime_of(app) if app is not None else None
    if runtime is not None:
        prepare_app(app)
        check_store_at_start(runtime.driver, worker=f"celery worker of app {app.main!r}")
        try:
            known = runtime.driver().known_tasks.refresh(force=True)
        except FlexiqError:  # the store check above already said why; the tasks keep Celery's acknowledgement
            return
        late = prepare_known_tasks(app, known)
        if late:
            logger.info("celery worker: tasks known to take steps, acknowledged late: %s", ", ".join(sorted(late)))


def announce_store(sender: Any = None, **_: Any) -> None:
    """``worker_ready``: log the step store the worker's app uses, once per worker."""
    app: Any = getattr(sender, "app", None)
    runtime = runtime_of(app) if app is not None else None
    if runtime is None:
        return
    log_worker_start(runtime.driver, "celery worker")


def settle_plain_task(sender: Any = None, task_id: str | None = None, state: str | None = None, **_: Any) -> None:
    """``task_postrun``: a job recorded at publish whose task turned out not durable ends its run (C39).

    The producer recorded the run ``queued`` (it could not tell that the
    worker runs the task with ``durable=False``); no attempt will ever claim
    it, so it is settled here, or recovery would re-publish it.
    """
    request = getattr(sender, "request", None)
    runtime = runtime_of(sender.app) if sender is not None else None
    if runtime is None or request is None or getattr(sender, "durable", True) is not False:
        return
    if not ((request.headers or {}).get(RECORDED_FLAG) or getattr(request, RECORDED_FLAG, None)):
        return
    try:
        settle_unclaimed_run(runtime.store, run_key_of(request), "succeeded" if state == "SUCCESS" else "failed")
    except FlexiqError:
        logger.exception("could not settle the run of job %s", task_id)


def on_app_finalized(sender: Any = None, **_: Any) -> None:
    """``app.on_after_finalize``: make the tasks created at finalization durable."""
    if sender is not None and runtime_of(sender) is not None:
        prepare_app(sender)


def settle_revoked(sender: Any = None, request: Any = None, expired: bool = False, **_: Any) -> None:
    """``task_revoked``: Celery revoked (or expired) a durable job; its run is cancelled (C34, C38).

    Sent in the worker's main process when Celery discards a revoked or
    expired message (a sleeping or waiting job's next hop included) or
    terminates a running one, after Celery stored ``REVOKED`` for the task's
    result waiter. The core settles it as every ending
    ([`framework_ended`][flexiq_plugins.integration.AttemptDriver.framework_ended]), the one
    cancellation: a run no attempt holds ends ``cancelled``, its undos run
    first in a new job published through the app (the revoked task id would
    be discarded again); a run an attempt still holds
    (``revoke(terminate=True)``) is cancelled by its next delivery, which
    recovery makes once the killed attempt's lease has expired. Recovery
    never re-publishes a cancelled run. A store error is logged.
    """
    driver = driver_for(sender) if sender is not None else None
    runtime = runtime_of(sender.app) if driver is not None else None
    if driver is None or runtime is None or request is None:
        return
    try:
        run_key = run_key_of(request)
    except InvalidRunKey:
        return
    how, reason = (Ended.EXPIRED, "expired (Celery)") if expired else (Ended.REVOKED, "revoked (Celery)")
    status = driver.framework_ended(run_key, how, reason=reason, publisher=publisher(runtime.app))
    logger.info("run %s of revoked job %s: %s", run_key, getattr(request, "id", "?"), status or "unchanged")


def dead_letter_unknown_task(
    sender: Any = None, message: Any = None, name: str | None = None, id: str | None = None, **_: Any
) -> None:
    """``task_unknown``: the worker does not have the job's task and Celery discarded it; its run is dead-lettered.

    Sent by the worker's consumer (main process) after it logged ``Received
    unregistered task of type …``, rejected the message and marked the result
    ``NotRegistered``; none of that changes. A run recorded at publish that no
    attempt started (C39), or a retried dead letter no attempt started since
    its retry, would otherwise stay ``queued`` or ``pending`` and be
    re-published by recovery forever: the core dead-letters it with the reason
    ``unregistered_task`` ([`dead_letter_unregistered`][flexiq_plugins.integration.dead_letter_unregistered]),
    to be retried with ``flexiq dlq retry`` once the workers have the task. The
    run key is read from the message's headers (task protocol 2).
    """
    app: Any = getattr(sender, "app", None)
    runtime = runtime_of(app) if app is not None else None
    if runtime is None or message is None or not name or str(name).startswith("celery."):
        return
    headers = getattr(message, "headers", None) or {}
    dead_letter_unregistered(
        lambda: runtime.store,
        headers.get(RUN_KEY_HEADER),
        str(id or headers.get("id") or ""),
        str(name),
        known=[task for task in app.tasks if not task.startswith("celery.")],
        worker=f"celery worker {getattr(sender, 'hostname', '')}".rstrip(),
    )


def connect_signals() -> None:
    """Connect the process-wide receivers (idempotent)."""
    signals.before_task_publish.connect(stamp_run_key, weak=False, dispatch_uid="flexiq.stamp_run_key")
    signals.worker_process_init.connect(forget_parent_stores, weak=False, dispatch_uid="flexiq.fork")
    signals.worker_init.connect(prepare_worker_app, weak=False, dispatch_uid="flexiq.worker_init")
    signals.worker_ready.connect(announce_store, weak=False, dispatch_uid="flexiq.worker_ready")
    signals.task_revoked.connect(settle_revoked, weak=False, dispatch_uid="flexiq.task_revoked")
    signals.task_postrun.connect(settle_plain_task, weak=False, dispatch_uid="flexiq.task_postrun")
    signals.task_unknown.connect(dead_letter_unknown_task, weak=False, dispatch_uid="flexiq.task_unknown")
