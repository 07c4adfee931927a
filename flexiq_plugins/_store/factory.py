"""Turn whatever the user configured into a [`StepStore`][flexiq_plugins.StepStore].

Adapters accept a store in several shapes (``install(app, store=...)``,
``DurableSteps(store=...)``): a ready store, a SQLAlchemy engine, a URL, or
nothing at all. This is the one place that decides what each shape means, so
Celery and Dramatiq users get the same answer and the same error for a typo.
With nothing configured the store is the SQLite file ``flexiq_steps.db`` in
the working directory: durable, and needing no server.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from sqlalchemy.engine import URL, Engine

from ..errors import ConfigurationError
from .base import StepStore
from .memory import MemoryStepStore
from .sql import ACCEPTED_STORE_FORMS, SqlStepStore
from .sql.engine import create_engine, normalize_url

__all__ = [
    "DEFAULT_STORE_URL",
    "STORE_URL_ENV",
    "StoreSpec",
    "check_store_spec",
    "open_store",
    "resolve_store",
    "resolve_store_spec",
]

StoreSpec = StepStore | URL | Engine | str | None
"""What an integration accepts as ``store=``: a store, a SQLAlchemy engine or URL, or ``None``."""

DEFAULT_STORE_URL = "sqlite:///flexiq_steps.db"
"""The store used when nothing is configured: a SQLite file in the working directory."""

STORE_URL_ENV = "FLEXIQ_STORE_URL"
"""The environment variable read when no store is given."""

_MEMORY_URLS = frozenset({"memory://", "memory:"})


def open_store(spec: StoreSpec = None, **kwargs: Any) -> StepStore:
    """Return the step store that ``spec`` describes.

    - a [`StepStore`][flexiq_plugins.StepStore] is returned as is (``kwargs`` are ignored);
    - ``"memory://"`` gives a [`MemoryStepStore`][flexiq_plugins.MemoryStepStore] (``kwargs`` go to it);
    - a SQLAlchemy `Engine` or URL (``sqlite:///path``,
      ``postgresql://…``, ``mysql://…``, ``mariadb://…``) gives a
      [`SqlStepStore`][flexiq_plugins.SqlStepStore] (``kwargs``: ``auto_upgrade``, ``table_prefix``);
    - ``None`` reads the ``FLEXIQ_STORE_URL`` environment variable, else uses
      `DEFAULT_STORE_URL`.

    Parameters:
      spec (str | URL | Engine | StepStore | None): the store, or where it is.
      kwargs: passed to the store's constructor.

    Raises:
      ConfigurationError: an unknown scheme or type, naming the value and the
        accepted forms, or a missing database driver.
    """
    if spec is None:
        spec = os.environ.get(STORE_URL_ENV) or DEFAULT_STORE_URL
    if isinstance(spec, StepStore):
        return spec
    if isinstance(spec, str) and spec.strip().lower() in _MEMORY_URLS:
        return MemoryStepStore(**kwargs)
    if isinstance(spec, (str, URL, Engine)):
        return SqlStepStore(spec, **kwargs)
    raise ConfigurationError(f"cannot use {spec!r} as a step store; accepted forms: {ACCEPTED_STORE_FORMS}")


def check_store_spec(spec: StoreSpec) -> None:
    """Check that [`open_store`][flexiq_plugins.open_store] can use ``spec``, without connecting (C41).

    What an integration calls when it is configured, so that a typo in the
    scheme or a missing driver shows at once, never at the first job. A URL
    is parsed, given its driver and made into an engine (the driver imported,
    nothing connected); ``None`` (resolved later) and ready stores or engines
    pass.

    Raises:
      ConfigurationError: an unknown scheme or type, an unparsable URL or a
        missing driver, naming the value and the accepted forms.
    """
    if spec is None or isinstance(spec, (StepStore, Engine)):
        return
    if isinstance(spec, str) and spec.strip().lower() in _MEMORY_URLS:
        return
    if not isinstance(spec, (str, URL)):
        raise ConfigurationError(f"cannot use {spec!r} as a step store; accepted forms: {ACCEPTED_STORE_FORMS}")
    create_engine(normalize_url(spec)).dispose()


def resolve_store_spec(explicit: StoreSpec, framework_setting: Callable[[], StoreSpec] | None = None) -> StoreSpec:
    """Where the store is: the argument, ``FLEXIQ_STORE_URL``, the framework's setting, the default.

    Parameters:
      explicit (StoreSpec): what the integration was given (``store=``), or ``None``.
      framework_setting (Callable[[], StoreSpec] | None): reads the framework's own
        setting (Celery's ``flexiq_store_url``, Django's ``FLEXIQ_STORE_URL``);
        called only when needed.

    Returns:
      StoreSpec: a store, engine or URL; never ``None``.
    """
    if explicit is not None:
        return explicit
    from_env = os.environ.get(STORE_URL_ENV)
    if from_env:
        return from_env
    setting = framework_setting() if framework_setting is not None else None
    return setting if setting else DEFAULT_STORE_URL


def resolve_store(explicit: StoreSpec, framework_setting: Callable[[], StoreSpec] | None = None) -> StepStore:
    """Open the store [`resolve_store_spec`][flexiq_plugins.integration.resolve_store_spec] names.

    Raises:
      ConfigurationError: an unknown scheme or type, or a missing database driver.
    """
    return open_store(resolve_store_spec(explicit, framework_setting))
