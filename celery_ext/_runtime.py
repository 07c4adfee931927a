"""The per-application runtime: options, and the attempt driver each process opens on first use.

The store is opened on first use in each process, never at ``install`` time:
the app's configuration may not be loaded yet, and a prefork parent must not
hand its database connections to its children. ``worker_process_init`` drops
the driver in each child (see :mod:`celery_ext._signals`), and
:class:`~flexiq_plugins.integration.PerProcess` checks the process id for any
other fork, so a child always opens its own store.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from flexiq_plugins import StepStore
from flexiq_plugins.integration import (
    AttemptDriver,
    Decision,
    JobInfo,
    PerProcess,
    StoreSpec,
    Sweeper,
    driver_or_put_back,
    resolve_store,
)

from ._options import CeleryConfig, step_serializer

__all__ = ["Runtime", "all_runtimes", "runtime_of"]

_RUNTIMES: weakref.WeakKeyDictionary[Any, Runtime] = weakref.WeakKeyDictionary()


def runtime_of(app: Any) -> Runtime | None:
    """Return the runtime :func:`celery_ext.install` attached to ``app``, or ``None``."""
    return _RUNTIMES.get(app)


def all_runtimes() -> list[Runtime]:
    """Every runtime of this process (one per installed app)."""
    return list(_RUNTIMES.values())


class Runtime:
    """What ``install`` attached to one Celery app.

    Parameters:
      app(celery.Celery): the application.
      store(StoreSpec): the configured store, or ``None`` for the default chain
        (``FLEXIQ_STORE_URL``, then ``app.conf.flexiq_store_url``, then SQLite).
      config(CeleryConfig): the checked options.
    """

    def __init__(self, app: Any, store: StoreSpec, config: CeleryConfig) -> None:
        self._app = weakref.ref(app)
        self._store_spec = store
        self.config = config
        self._driver: PerProcess[AttemptDriver] = PerProcess(self._make_driver)
        self._native_dead_letter: bool | None = None
        self.sweeper: Sweeper | None = None
        """The worker's recovery sweeper (C39), in the worker's main process while it runs."""
        _RUNTIMES[app] = self

    @property
    def app(self) -> Any:
        """The Celery application."""
        app = self._app()
        if app is None:  # pragma: no cover - the app owns the runtime
            raise RuntimeError("the Celery app of this runtime is gone")
        return app

    def driver(self) -> AttemptDriver:
        """The attempt driver of this process, opening the store on first use.

        Raises:
          ConfigurationError: an unusable store URL or serializer.
        """
        return self._driver.get()

    def run_job(self, job: JobInfo, body: Callable[[], Any]) -> Decision:
        """Run one attempt of ``job`` with this process's driver; a store that cannot be opened puts it back (C41)."""
        driver = driver_or_put_back(self.driver, self.config)
        return driver.run_job(job, body) if isinstance(driver, AttemptDriver) else driver

    @property
    def store(self) -> StepStore:
        """The step store of this process (opened on first use)."""
        return self.driver().store

    def forget_process_state(self) -> None:
        """Drop this process's driver so the next job opens its own store (after a fork).

        A store the runtime opened from a URL is not closed: its pooled
        connections belong to the parent, and the store's own fork hook
        already released them without closing.
        """
        self._driver.forget()

    def native_dead_letter(self) -> bool:
        """Whether dead letters use ``Reject(requeue=False)`` (RabbitMQ) rather than the queue (C30)."""
        if self.config.dead_letter_path != "auto":
            return self.config.dead_letter_path == "reject"
        if self._native_dead_letter is None:
            with self.app.connection_for_write() as conn:
                self._native_dead_letter = conn.transport.driver_type == "amqp"
        return self._native_dead_letter

    def _make_driver(self) -> AttemptDriver:
        store = resolve_store(self._store_spec, lambda: self.app.conf.get("flexiq_store_url"))
        config = self.config.with_default_serializer(step_serializer(self.app.conf.task_serializer))
        return AttemptDriver(store, config)
