"""The one error boundary of the SQL store.

Nothing from SQLAlchemy, a driver or Alembic leaves a public method of the
store: connection failures, timeouts and other operational errors become
[`StoreUnavailable`][flexiq_plugins.errors.StoreUnavailable] (retryable, C28), everything
else [`StoreError`][flexiq_plugins.errors.StoreError], each raised ``from`` the
original and naming the URL with its password hidden. A missing table is a
[`StoreError`][flexiq_plugins.errors.StoreError] that names the fix.

A deadlock or serialization failure the server reports is unavailable too (the
server rolled the whole transaction back); `is_deadlock` lets the store
retry it a few times first.

A refusal that will not pass by itself (authentication, an unknown database,
an SSL mode the server cannot meet, a SQLite file in a missing directory, a
read-only SQLite database) is
[`StoreMisconfigured`][flexiq_plugins.errors.StoreMisconfigured]: still an unavailability,
so a job that meets it is put back, but a worker refuses to start on it (C41).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, Engine

from ...errors import StoreError, StoreMisconfigured, StoreUnavailable
from .engine import safe_url, sqlite_file, sqlite_read_only

__all__ = ["describe", "is_deadlock", "is_missing_table", "read_only_message", "sqlite_refusal", "translated"]

_DRIVER_MODULES = frozenset({"psycopg", "psycopg2", "pymysql", "MySQLdb", "sqlite3", "alembic"})
_MYSQL_REFUSALS = frozenset({1044, 1045, 1049, 1698})
"""MySQL/MariaDB: access denied (to the database, for the user), unknown database."""
_POSTGRES_REFUSALS = (
    "password authentication failed",
    "does not exist",
    "no pg_hba.conf entry",
    "server does not support SSL, but SSL was required",
)
"""libpq's words for a refused login, an unknown role or database, or an SSL mode the server cannot meet
(``sslmode=require`` against a server without SSL), at connection time."""
_POSTGRES_CONNECTING = ("connection failed", "connection to server")
"""How a connection failure's message starts: psycopg 3 prefixes libpq's ``connection to server … failed:``
with ``connection failed:``, psycopg2 passes libpq's text as it is."""
_UNAVAILABLE = (
    sa_exc.OperationalError,
    sa_exc.InterfaceError,
    sa_exc.DisconnectionError,
    sa_exc.TimeoutError,
    OSError,
)


@contextmanager
def translated(engine: Engine) -> Iterator[None]:
    """Turn SQLAlchemy, driver and Alembic errors into [`StoreError`][flexiq_plugins.errors.StoreError] types.

    Parameters:
      engine (Engine): the store's engine, named (password hidden) in messages.

    Raises:
      StoreUnavailable: a connection failure, timeout or other operational error.
      StoreError: any other database error, or missing tables.
    """
    try:
        yield
    except Exception as exc:
        error = translation(exc, engine)
        if error is None:
            raise
        raise error from exc


def translation(exc: Exception, engine: Engine) -> StoreError | None:
    """The [`StoreError`][flexiq_plugins.errors.StoreError] `translated` raises for ``exc``, if any.

    Parameters:
      exc (Exception): what a store call raised.
      engine (Engine): the store's engine, named (password hidden) in messages.

    Returns:
      StoreError | None: a `StoreUnavailable`, `StoreMisconfigured` or other
      `StoreError`; ``None`` when ``exc`` is not a database error (it goes through as it is).
    """
    if isinstance(exc, (sa_exc.SQLAlchemyError, OSError)) or type(exc).__module__.split(".")[0] in _DRIVER_MODULES:
        return _translate(exc, engine)
    return None


def _translate(exc: BaseException, engine: Engine) -> StoreError:
    where = safe_url(engine.url)
    detail = describe(exc)
    if is_missing_table(exc):
        return StoreError(
            f"the step store at {where} has no tables ({detail}): run `flexiq store upgrade` "
            "or open the store with auto_upgrade=True"
        )
    if engine.url.get_backend_name() == "sqlite":
        refusal = sqlite_refusal(exc, engine.url)
        if refusal is not None:
            return StoreMisconfigured(f"the step store at {where} cannot be used: {refusal}")
    elif _is_refusal(exc, engine):
        return StoreMisconfigured(f"the step store at {where} cannot be used: {detail}")
    unavailable = isinstance(exc, _UNAVAILABLE) or (isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated)
    if unavailable:
        return StoreUnavailable(f"the step store at {where} is unavailable: {detail}")
    return StoreError(f"the step store at {where} failed: {detail}")


def describe(exc: BaseException) -> str:
    """The first line of the driver's message for ``exc`` (at most 300 characters), without the SQL."""
    origin = exc.orig if isinstance(exc, sa_exc.DBAPIError) and exc.orig is not None else exc
    lines = str(origin).strip().splitlines()
    text = lines[0] if lines else type(origin).__name__
    return text[:300]


def _is_refusal(exc: BaseException, engine: Engine) -> bool:
    """A configuration the server refuses for good: login, unknown database, SSL (C41).

    SQLite's refusals are `sqlite_refusal`'s.
    """
    if not isinstance(exc, sa_exc.OperationalError):
        return False
    origin = exc.orig
    args: tuple[Any, ...] = getattr(origin, "args", ())
    backend = engine.url.get_backend_name()
    if backend in ("mysql", "mariadb"):
        return bool(args) and args[0] in _MYSQL_REFUSALS
    if backend == "postgresql":
        text = str(origin)
        return text.startswith(_POSTGRES_CONNECTING) and any(words in text for words in _POSTGRES_REFUSALS)
    return False


def sqlite_refusal(exc: BaseException, url: URL) -> str | None:
    """Why a SQLite store refuses for good, or ``None``: a missing directory, a read-only database (C41).

    The file is read out of an SQLite URI (``sqlite:///file:/path/x.db?mode=ro&uri=true``) too.

    Parameters:
      exc (BaseException): the error a store call met.
      url (URL): the store's URL.
    """
    path = sqlite_file(url)
    if path is None or not isinstance(exc, sa_exc.OperationalError):
        return None
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        return f"its directory {directory!r} does not exist"
    read_only = sqlite_read_only(url)
    if read_only == "mode=ro" and not os.path.exists(path):
        return f"its file {path!r} does not exist, and mode=ro does not create it"
    if "readonly" in str(exc.orig):  # SQLITE_READONLY: "attempt to write a readonly database"
        return read_only_message(read_only, path)
    return None


def read_only_message(read_only: str | None, path: str) -> str:
    """The cause of a read-only SQLite store: the URL's option, else the file's permissions."""
    why = f"the URL opens it read-only ({read_only})" if read_only else f"{path!r} or its directory is not writable"
    return f"{why}, and workers write their steps to it"


def is_missing_table(exc: BaseException) -> bool:
    """An undefined table: SQLite's wording, PostgreSQL's SQLSTATE 42P01, MySQL's error 1146.

    The driver's error may be wrapped once more (Django's ``ProgrammingError``
    around psycopg's): its cause is looked at too.
    """
    if not isinstance(exc, sa_exc.DBAPIError):
        return False
    origin = exc.orig
    return any(_undefined_table(e) for e in (origin, getattr(origin, "__cause__", None)) if e is not None)


def _undefined_table(origin: BaseException) -> bool:
    args: tuple[Any, ...] = getattr(origin, "args", ())
    return _sqlstate(origin) == "42P01" or (bool(args) and args[0] == 1146) or "no such table" in str(origin)


def _sqlstate(origin: BaseException | None) -> str | None:
    """A PostgreSQL driver error's SQLSTATE: psycopg 3 names it ``sqlstate``, psycopg2 ``pgcode``."""
    return getattr(origin, "sqlstate", None) or getattr(origin, "pgcode", None)


def is_lock_unavailable(exc: BaseException | None) -> bool:
    """Whether ``exc`` says a row lock was not granted at once (``NOWAIT``) or in time.

    Parameters:
      exc (BaseException | None): typically the ``__cause__`` of a translated error.

    Returns:
      bool: PostgreSQL SQLSTATE 55P03 (``lock_not_available``), MySQL error
      3572 (``NOWAIT``) or 1205 (a lock wait timeout: MariaDB's answer to ``NOWAIT``).
    """
    if not isinstance(exc, sa_exc.DBAPIError):
        return False
    origin = exc.orig
    if _sqlstate(origin) == "55P03":
        return True
    args: tuple[Any, ...] = getattr(origin, "args", ())
    return bool(args) and args[0] in (1205, 3572)


def is_deadlock(exc: BaseException | None) -> bool:
    """Whether ``exc`` is a deadlock or serialization failure: the server rolled the transaction back.

    Parameters:
      exc (BaseException | None): typically the ``__cause__`` of a translated error.

    Returns:
      bool: PostgreSQL SQLSTATE 40P01/40001 or MySQL error 1213.
    """
    if not isinstance(exc, sa_exc.DBAPIError):
        return False
    origin = exc.orig
    if _sqlstate(origin) in ("40P01", "40001"):
        return True
    args: tuple[Any, ...] = getattr(origin, "args", ())
    return bool(args) and args[0] == 1213
