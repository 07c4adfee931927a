"""What a sender or a canceller finds in the process it runs in: the store, the codec chain, the publishers.

[`send_event`][flexiq_plugins.send_event] (C33) and [`cancel_run`][flexiq_plugins.cancel_run]
(C34) are meant to be called from wherever the outside world reaches your
code: a web request (a payment webhook), a script, another task. Each takes
``store=`` and ``publishers=``; what it is not given comes from here:

- **the store**: the ``store`` argument; else the store of the integration
  configured in this process (``celery_ext.install(app, ...)``, the
  ``DurableSteps`` middleware on a broker); else ``FLEXIQ_STORE_URL``, else the
  default SQLite file, as a worker would ([`flexiq_plugins.open_store`][flexiq_plugins.open_store]).
  A SQLite file that does not exist is refused (``ConfigurationError``), never
  created: no run waits in a new, empty store;
- **the codec chain and the size limits**: with no store given, those of the
  integration configured in this process; else the core's JSON and the
  default limits;
- **the publishers**: the ``publishers`` argument; else the app or broker of
  each integration configured in this process. A run that must be woken (an
  event arrived) or re-published (its undos must run) is published through
  it at once. Without one, recovery (``flexiq recover``, or the sweeper in
  the workers) picks it up within its interval: nothing is lost, only later.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from .._model.codec import CodecChain
from .._model.config import DurableConfig
from .._store.base import StepStore
from .._store.factory import DEFAULT_STORE_URL, STORE_URL_ENV, StoreSpec, open_store
from .._store.sql import normalize_url, sqlite_file
from ..errors import ConfigurationError
from .publishing import publishers_for
from .registry import Installation, Publisher, installations

__all__ = ["ThisProcess", "this_process"]

_opened: dict[str, StepStore] = {}
_lock = threading.Lock()


@dataclass(frozen=True)
class ThisProcess:
    """The store, options, codec chain and publishers a sender uses (see the module's description).

    Parameters:
      store (StepStore): the store.
      config (DurableConfig): the options of the integration whose store it is, else the defaults.
      codec (CodecChain | None): that integration's codec chain; ``None``: the core's JSON.
      publishers (Mapping[str, Publisher]): a publisher per framework name.
    """

    store: StepStore
    config: DurableConfig
    codec: CodecChain | None
    publishers: Mapping[str, Publisher]


def this_process(store: StoreSpec = None, publishers: Mapping[str, Publisher] | None = None) -> ThisProcess:
    """What a sender uses: ``store`` and ``publishers`` if given, else this process's integrations'.

    Raises:
      ConfigurationError: an unusable store setting, or a SQLite file that does not exist.
    """
    installed = installations()
    opened, config, codec = _store_of(store, installed)
    return ThisProcess(opened, config, codec, _publishers(installed) if publishers is None else publishers)


def _store_of(spec: StoreSpec, installed: list[Installation]) -> tuple[StepStore, DurableConfig, CodecChain | None]:
    """The store, the options and the codec chain (see the module's description)."""
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
    path = sqlite_file(normalize_url(setting))  # also out of an SQLite URI (file:/path?mode=ro&uri=true)
    if path is None:
        return
    if not os.path.exists(path):
        raise ConfigurationError(
            f"no step store at {os.path.abspath(path)}: pass store=URL (the store your workers use), "
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
