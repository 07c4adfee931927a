"""Steering runs from any process: :func:`send_event` (C33) and :func:`cancel_run` (C34).

Both are meant to be called from wherever the outside world reaches your
code: a web request (a payment webhook), a script, another task. They find
what they need in the process they run in:

- **the store**: the ``store`` argument; else the store of the integration
  configured in this process (``celery_ext.install(app, ...)``, the
  ``DurableSteps`` middleware on a broker); else ``FLEXIQ_STORE_URL``, else the
  default SQLite file, as a worker would (:func:`flexiq_plugins.open_store`).
  A SQLite file that does not exist is refused (``ConfigurationError``), never
  created: no run waits in a new, empty store;
- **the publishers**: the app or broker of each integration configured in this
  process. A run that must be woken (an event arrived) or re-published (its
  undos must run) is published through it at once. A process with no
  integration leaves that to recovery (``flexiq recover``, or a
  :class:`~flexiq_plugins.operations.Sweeper` in the workers), which picks it
  up within its interval: nothing is lost, only later.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from ._store.base import StepStore
from ._store.factory import DEFAULT_STORE_URL, STORE_URL_ENV, StoreSpec, open_store
from ._store.sql import normalize_url
from .codec import CodecChain
from .config import DurableConfig
from .errors import ConfigurationError
from .operations import CancelResult, EventSent, Publisher, publishers_for
from .operations import cancel_run as _cancel_run
from .operations import send_event as _send_event
from .registry import Installation, installations

__all__ = ["cancel_run", "send_event"]

_opened: dict[str, StepStore] = {}
_lock = threading.Lock()


def send_event(
    topic: str, key: str, payload: Any = None, *, run_key: str | None = None, store: StoreSpec = None
) -> EventSent:
    """Send the event ``(topic, key)`` with ``payload`` to the runs that wait for it (C33).

    The event is committed to the store first; then every run waiting on
    ``(topic, key)`` is woken by re-publishing its job through its
    integration, if one is configured in this process (else by recovery). A
    run that reaches its ``step.wait_for_event`` later still receives it, if
    the run was created before the event was sent or ``run_key`` names it.

    Parameters:
      topic(str): the topic, e.g. ``"payment"`` (1–255 characters, no control characters).
      key(str): the key, e.g. an order id (same rules).
      payload(Any): what the wait returns; JSON-compatible values (and
        ``datetime``, ``Decimal``, ``UUID`` …), or what the integration's
        serializer takes; at most the step size cap once encoded.
      run_key(str | None): send it to that run only.
      store(str | Engine | StepStore | None): where the runs are; see the module's description.

    Returns:
      EventSent: the stored event, the runs woken now and those left to recovery.

    Raises:
      InvalidEvent: a bad topic, key or payload; nothing is stored.
      ConfigurationError: an unusable store setting, or a SQLite file that does not exist.
      StoreUnavailable: the store cannot be reached.
    """
    installed = installations()
    opened, driver_config, codec = _store_of(store, installed)
    return _send_event(
        opened,
        topic,
        key,
        payload,
        run_key=run_key,
        publishers=_publishers(installed),
        codec=codec,
        max_bytes=driver_config.step_bytes,
    )


def cancel_run(run_key: str, *, reason: str = "", store: StoreSpec = None) -> CancelResult:
    """Cancel the run ``run_key`` (C34): at once if no attempt runs it, at its next step boundary if one does.

    Its compensations run (C32) and it ends ``cancelled`` with ``reason``; a
    wake-up message of a sleeping or waiting run is dropped when it arrives.

    Parameters:
      run_key(str): the run.
      reason(str): why, as ``flexiq runs list`` shows it (default ``"cancelled on request"``).
      store(str | Engine | StepStore | None): where the run is; see the module's description.

    Returns:
      CancelResult: ``cancelled``, ``compensating``, ``requested`` or ``finished``, and the run's status.

    Raises:
      UnknownRun: no run has ``run_key``.
      ConfigurationError: an unusable store setting, or a SQLite file that does not exist.
      StoreUnavailable: the store cannot be reached.
    """
    installed = installations()
    opened, _, _ = _store_of(store, installed)
    return _cancel_run(opened, run_key, reason=reason, publishers=_publishers(installed))


def _store_of(spec: StoreSpec, installed: list[Installation]) -> tuple[StepStore, DurableConfig, CodecChain | None]:
    """The store, the options and the codec chain of this process (see the module's description)."""
    if spec is None and installed:
        driver = installed[0].driver()
        return driver.store, driver.config, driver.codec
    if isinstance(spec, StepStore):
        return spec, DurableConfig(), None
    setting = spec if spec is not None else os.environ.get(STORE_URL_ENV) or DEFAULT_STORE_URL
    if isinstance(setting, str):
        _require_existing_sqlite_file(setting)
    key = repr(setting)
    with _lock:
        if key not in _opened:  # one store (one connection pool) per setting and process
            _opened[key] = open_store(setting)
        return _opened[key], DurableConfig(), None


def _require_existing_sqlite_file(setting: str) -> None:
    """Refuse a SQLite store whose file does not exist: no run can be waiting there (C41).

    A sender that opened it would create an empty store beside the real one
    and put the event (or the cancellation) where no worker ever looks.

    Raises:
      ConfigurationError: naming the missing file and the ways to point at the real store.
    """
    url = normalize_url(setting)
    if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
        return
    if not os.path.exists(url.database):
        raise ConfigurationError(
            f"no step store at {os.path.abspath(url.database)}: pass store=URL (the store your workers use), "
            f"set {STORE_URL_ENV}, or configure the integration in this process first "
            "(celery_ext.install(app, ...) or the DurableSteps middleware)"
        )


def _publishers(installed: list[Installation]) -> dict[str, Publisher]:
    """A publisher per framework: the most recently configured app or broker of each."""
    found: dict[str, Publisher] = {}
    for installation in reversed(installed):  # the most recent one wins
        target = installation.target()
        if target is not None:
            found.update(publishers_for(target))
    return found
