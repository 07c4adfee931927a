"""A worker's side of the store: checked when it starts, one driver per process, hand-offs that must not fail.

A store setting is reached once when a worker starts
([`check_store_at_start`][flexiq_plugins.integration.check_store_at_start]), so a misconfiguration stops the worker with
one line instead of failing jobs (C41); a job that cannot open its store is put back
([`driver_or_put_back`][flexiq_plugins.integration.driver_or_put_back]), never acknowledged away.
[`PerProcess`][flexiq_plugins.integration.PerProcess] keeps one driver per process and opens it again after a fork
(Celery prefork, Dramatiq worker processes); [`hand_off`][flexiq_plugins.integration.hand_off] retries a publish the
library must not lose (a put-back).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Generic, NoReturn, TypeVar

from .._attempt.decisions import (
    PutBack,
    PutBackReason,
)
from .._attempt.driver import AttemptDriver
from .._attempt.store_health import store_health
from .._model.config import DurableConfig
from ..errors import (
    ConfigurationError,
    FlexiqError,
    StoreError,
    StoreUnavailable,
)

logger = logging.getLogger("flexiq_plugins.integration")

__all__ = [
    "EXIT_CONFIGURATION",
    "HAND_OFF_PAUSES",
    "PerProcess",
    "check_store_at_start",
    "driver_or_put_back",
    "hand_off",
    "log_worker_start",
]


T = TypeVar("T")


HAND_OFF_PAUSES = (0.2, 0.5, 1.0)
"""Seconds between the tries of a failing hand-off before [`hand_off`][flexiq_plugins.integration.hand_off] gives up."""


_HAND_OFF_STEADY_PAUSE = 5.0


EXIT_CONFIGURATION = 78
"""The exit status of a worker that refuses to start on an unusable store (sysexits' ``EX_CONFIG``, C41)."""


# ------------------------------------------------------------------- stores
def check_store_at_start(open_driver: Callable[[], AttemptDriver], *, worker: str) -> None:
    """Open this process's store and reach it once, as a worker starts (C41).

    A store that cannot be used (an unknown scheme or a missing driver in a
    setting read only now, a login the database refuses, an unknown
    database, a SQLite file in a missing directory, a store configured
    read-only, a migration that fails)
    is logged as one CRITICAL line naming the cause (``CRITICAL:flexiq_plugins.integration:…``
    on stderr when logging is not set up yet, as in Celery's ``worker_init``), and the worker stops
    with [`EXIT_CONFIGURATION`][flexiq_plugins.integration.EXIT_CONFIGURATION]. A store that is only unreachable
    (connection refused, a timeout) is logged as one WARNING line: the worker
    starts, and its jobs are put back until the store returns (C28).

    Parameters:
      open_driver (Callable[[], AttemptDriver]): the adapter's per-process driver.
      worker (str): names the worker in the log line, e.g. ``"celery worker"``.

    Raises:
      SystemExit: with [`EXIT_CONFIGURATION`][flexiq_plugins.integration.EXIT_CONFIGURATION], the store cannot be used.
    """
    store: object = open_driver
    try:
        store = open_driver().store
        store.check_writable()  # a read-only store (a SQLite URL with mode=ro) can run no job
        store.now()
    except ConfigurationError as exc:  # StoreMisconfigured included
        _refuse_to_start(worker, exc)
    except StoreUnavailable as exc:  # the outage's one WARNING in this process (C41)
        store_health(store).failed(
            "%s starts without its step store: %s; jobs are put back until it is reachable", worker, exc
        )
    except StoreError as exc:
        _refuse_to_start(worker, exc)


def _refuse_to_start(worker: str, exc: Exception) -> NoReturn:
    """Log the one CRITICAL line, with its level even before the framework set logging up, and exit."""
    if logger.hasHandlers():
        logger.critical("%s cannot start: %s", worker, exc)
    else:  # Celery sends worker_init before it configures logging: Python's last resort would drop the level
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(logging.BASIC_FORMAT))
        logger.addHandler(handler)
        try:
            logger.critical("%s cannot start: %s", worker, exc)
        finally:
            logger.removeHandler(handler)
    raise SystemExit(EXIT_CONFIGURATION) from None


def driver_or_put_back(
    open_driver: Callable[[], AttemptDriver], config: DurableConfig | Callable[[], DurableConfig]
) -> AttemptDriver | PutBack:
    """This process's driver, or the put-back of a job whose store cannot be opened (C41).

    A job never meets a [`ConfigurationError`][flexiq_plugins.errors.ConfigurationError] that
    would fail it and let the framework acknowledge it away: it goes back to
    the broker for ``store_retry_max_seconds``, with an ERROR line, until the
    configuration is fixed.

    Parameters:
      open_driver (Callable[[], AttemptDriver]): the adapter's per-process driver.
      config (DurableConfig | Callable[[], DurableConfig]): the adapter's options, or what reads them (only
        when the store cannot be opened).
    """
    try:
        return open_driver()
    except ConfigurationError as exc:
        logger.error("the step store cannot be opened: %s; the job goes back to its queue", exc)
        options = config if isinstance(config, DurableConfig) else config()
        return PutBack(PutBackReason.STORE_UNAVAILABLE, options.store_retry_max_seconds, str(exc))


# --------------------------------------------------------------- hand-offs
def hand_off(publish: Callable[[], T], *, what: str, forever: bool = False) -> T:
    """Publish a put-back (sleep, busy, outage), trying again through a broker blip (C15).

    Tries again after 0.2, 0.5 and 1 s; then raises the last error, or with
    ``forever`` keeps trying every 5 s (an adapter whose framework has no way
    to leave the current message in the broker holds it unacknowledged until
    the broker accepts, as the framework does for its own acknowledgements).
    A sleep's hand-off is never a retry (C16).

    Parameters:
      publish (Callable[[], T]): enqueues the job again.
      what (str): names the job in log lines.
      forever (bool): never give up.
    """
    for pause in HAND_OFF_PAUSES:
        try:
            return publish()
        except Exception as exc:
            logger.warning("re-enqueue of %s failed (%s); trying again in %.1f s", what, exc, pause)
            time.sleep(pause)
    while forever:
        try:
            return publish()
        except Exception as exc:
            logger.debug("re-enqueue of %s still failing (%s)", what, exc)
            time.sleep(_HAND_OFF_STEADY_PAUSE)
    return publish()


# ------------------------------------------------------------ worker start
def log_worker_start(make_driver: Callable[[], AttemptDriver], who: str) -> None:
    """Log the one line a worker starts with: its step store (password hidden) and schema revision.

    The store is opened (and its tables created or upgraded, quietly) now
    rather than at the first job. A store that cannot be used is one WARNING
    line instead; jobs then meet it as usual (put back while it is unavailable).

    Parameters:
      make_driver (Callable[[], AttemptDriver]): the process's driver (e.g. ``PerProcess.get``).
      who (str): names the worker, e.g. ``"celery worker"``.
    """
    try:
        described = make_driver().store.describe()
    except FlexiqError as exc:
        logger.warning("flexiq-plugins %s: the step store cannot be used yet: %s", who, exc)
        return
    logger.info("flexiq-plugins %s: durable steps in %s", who, described)


# ------------------------------------------------------------- per process
class PerProcess(Generic[T]):
    """A value made on first use in each process: a forked worker child makes its own.

    Celery prefork and Dramatiq fork worker processes; a store opened before a
    fork must not hand its connections to the children. Thread-safe.

    Parameters:
      factory (Callable[[], T]): makes the value (e.g. opens the store and builds an
        [`AttemptDriver`][flexiq_plugins.integration.AttemptDriver]).
    """

    def __init__(self, factory: Callable[[], T]) -> None:
        self._factory = factory
        self._lock = threading.Lock()
        self._value: T | None = None
        self._pid = -1

    def get(self) -> T:
        """The value of this process, made now if needed (the factory's errors propagate)."""
        value = self._value
        if value is not None and self._pid == os.getpid():
            return value
        with self._lock:
            if self._value is None or self._pid != os.getpid():
                self._value = self._factory()
                self._pid = os.getpid()
            return self._value

    def forget(self) -> None:
        """Drop this process's value; the next [`get`][flexiq_plugins.integration.PerProcess.get] makes a new one."""
        with self._lock:
            self._value = None
            self._pid = -1
