"""``celery_ext.install``: three lines to give an existing Celery app durable steps."""

from __future__ import annotations

from typing import Any

from flexiq_plugins import ConfigurationError
from flexiq_plugins.integration import StoreSpec, check_store_spec, register_installation

from ._options import CeleryConfig
from ._prepare import prepare_app
from ._publish import note_publishing_app
from ._recovery import ReconnectSweep, RecoveryStep
from ._runtime import Runtime, runtime_of
from ._signals import connect_signals, on_app_finalized
from ._task import DurableTask
from ._verbs import install_quiet_ignored_filter

__all__ = ["install"]


def install(app: Any, store: StoreSpec = None, **options: Any) -> None:
    """Give the tasks of ``app`` durable steps (``current_job.step``).

    Works for ``@app.task`` and ``@shared_task`` tasks declared before or
    after the call, on a finalized app or not; ``celery.*`` built-ins and
    tasks declared with ``durable=False`` are left alone. A task that never
    takes a step is not touched (C43); a task declared ``durable=True``, or
    known to take steps when a worker starts, gets ``acks_late=True`` and
    ``reject_on_worker_lost=True`` unless it sets them (C26), and its new
    jobs are recorded at publish (C39). The store setting is checked here (scheme, driver: C41) but
    nothing connects: each process opens the store on first use, and a
    worker reaches it once as it starts, refusing to start on a store it
    cannot use.

    Parameters:
      app (celery.Celery): the application.
      store (str | sqlalchemy.Engine | StepStore | None): a SQLAlchemy URL
        (``"sqlite:///steps.db"``, ``"postgresql://…"``), an engine or a
        store. ``None``: the ``FLEXIQ_STORE_URL`` environment variable, then
        the app setting ``flexiq_store_url``, then ``sqlite:///flexiq_steps.db``.
      options: the fields of [`CeleryConfig`][celery_ext.CeleryConfig]: the shared ones of
        [`DurableConfig`][flexiq_plugins.DurableConfig] (``max_hop_seconds`` (seconds
        or ``"15m"``, C18), ``lease_seconds`` (C23), ``busy_retry_seconds``
        (C24), ``store_retry_seconds`` (C28), ``max_takeovers`` (C25),
        ``step_bytes`` / ``run_bytes`` (bytes) and ``run_steps`` (C22),
        ``serializer`` and ``codecs`` (C7), ``keep_succeeded_steps`` (C27),
        ``step_retry`` (C31), ``max_run_seconds`` / ``max_suspended_seconds`` (C34),
        ``record_at_publish``, ``recovery`` and the ``recovery_*_seconds`` (C39),
        ``known_tasks_refresh_seconds`` (C43))
        and the Celery ones: ``dead_letter_queue`` (default
        ``"flexiq.dead_letter"``) and ``dead_letter_path`` (``"auto"``,
        ``"reject"``, ``"queue"``, C30).

    Raises:
      ConfigurationError: an unknown option or unusable value, a store of an
        unknown scheme or type or without its driver, or ``install`` called
        twice on one app.
    """
    if runtime_of(app) is not None:
        raise ConfigurationError(f"celery_ext.install was already called on app {app.main!r}")
    check_store_spec(store)
    runtime = Runtime(app, store, CeleryConfig.from_options(options, where="celery_ext.install"))
    register_installation("celery", app, runtime.driver)  # send_event / cancel_run in this process (C33, C34)
    app.Task = type("DurableTask", (DurableTask, app.Task), {"__module__": __name__})
    connect_signals()
    note_publishing_app(app)
    app.steps["worker"].add(RecoveryStep)
    app.steps["consumer"].add(ReconnectSweep)
    install_quiet_ignored_filter()
    app.on_after_finalize.connect(on_app_finalized, weak=False)
    if app.finalized:
        prepare_app(app)
