"""The per-application runtime: options, the lazily opened store, the attempt driver.

The store is opened on first use in each process, never at ``install`` time:
the app's configuration may not be loaded yet, and a prefork parent must not
hand its database connections to its children. ``worker_process_init`` drops
the driver in each child (see :mod:`celery_ext._signals`), and a process id
check covers any other fork, so a child always opens its own store.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

from flexiq_plugins import StepStore, open_store
from flexiq_plugins._store.factory import DEFAULT_STORE_URL, STORE_URL_ENV
from flexiq_plugins.attempt import AttemptDriver
from flexiq_plugins.codec import FunctionSerializer
from flexiq_plugins.errors import ConfigurationError

from ._options import CeleryOptions

__all__ = ["Runtime", "StoreSpec", "all_runtimes", "kombu_codec", "kombu_serializer", "runtime_of"]

StoreSpec = Any
"""A store URL (``str``), a SQLAlchemy engine or URL, a :class:`StepStore`, or ``None``."""

_RUNTIMES: weakref.WeakKeyDictionary[Any, Runtime] = weakref.WeakKeyDictionary()


def runtime_of(app: Any) -> Runtime | None:
    """Return the runtime :func:`celery_ext.install` attached to ``app``, or ``None``."""
    return _RUNTIMES.get(app)


def all_runtimes() -> list[Runtime]:
    """Every runtime of this process (one per installed app)."""
    return list(_RUNTIMES.values())


def kombu_codec() -> tuple[Any, Any]:
    """kombu's registry ``dumps`` and ``loads`` (untyped, hence ``Any``)."""
    from kombu import serialization

    module: Any = serialization
    return module.dumps, module.loads


def kombu_serializer(name: str) -> FunctionSerializer:
    """A step-value serializer backed by kombu's registry entry ``name`` (C7).

    Raises:
      ConfigurationError: ``name`` is not registered with kombu.
    """
    from kombu.exceptions import SerializerNotInstalled

    dumps, loads = kombu_codec()
    try:
        content_type, encoding, _ = dumps(None, serializer=name)
    except SerializerNotInstalled as exc:
        raise ConfigurationError(f"task_serializer {name!r} is not registered with kombu: {exc}") from exc

    def dump(value: Any) -> bytes:
        _, _, data = dumps(value, serializer=name)
        return data if isinstance(data, bytes) else str(data).encode(encoding or "utf-8")

    def load(data: bytes) -> Any:
        return loads(data, content_type, encoding, accept={content_type})

    return FunctionSerializer(f"kombu:{name}", dump, load)


class Runtime:
    """What ``install`` attached to one Celery app.

    Parameters:
      app(celery.Celery): the application.
      store(StoreSpec): the configured store, or ``None`` for the default chain
        (``FLEXIQ_STORE_URL``, then ``app.conf.flexiq_store_url``, then SQLite).
      options(CeleryOptions): the checked options.
    """

    def __init__(self, app: Any, store: StoreSpec, options: CeleryOptions) -> None:
        self._app = weakref.ref(app)
        self._store_spec = store
        self.options = options
        self._lock = threading.Lock()
        self._driver: AttemptDriver | None = None
        self._pid = -1
        self._native_dead_letter: bool | None = None
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
        driver = self._driver
        if driver is not None and self._pid == os.getpid():
            return driver
        with self._lock:
            if self._driver is None or self._pid != os.getpid():
                self._driver = AttemptDriver(self._open_store(), self._config())
                self._pid = os.getpid()
            return self._driver

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
        with self._lock:
            self._driver = None
            self._pid = -1

    def native_dead_letter(self) -> bool:
        """Whether dead letters use ``Reject(requeue=False)`` (RabbitMQ) rather than the queue (C30)."""
        if self.options.dead_letter_path != "auto":
            return self.options.dead_letter_path == "reject"
        if self._native_dead_letter is None:
            with self.app.connection_for_write() as conn:
                self._native_dead_letter = conn.transport.driver_type == "amqp"
        return self._native_dead_letter

    def _open_store(self) -> StepStore:
        spec = self._store_spec
        if spec is None:
            spec = os.environ.get(STORE_URL_ENV) or self.app.conf.get("flexiq_store_url") or DEFAULT_STORE_URL
        return open_store(spec)

    def _config(self) -> Any:
        serializer = kombu_serializer(self.app.conf.task_serializer)
        return self.options.durable_config(serializer)
