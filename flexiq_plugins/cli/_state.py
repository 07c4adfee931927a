"""What every ``flexiq`` command shares: the store, the publishers, the console, the exit codes.

Exit codes are part of the interface scripts rely on, so they live here, in
one place, and every expected error is mapped to one of them with a message
and no traceback.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any, ClassVar, NoReturn

import click
from rich.console import Console

from .._store.base import StepStore
from .._store.factory import DEFAULT_STORE_URL, STORE_URL_ENV, open_store
from .._store.sql import normalize_url, sqlite_file
from ..operations import DEFAULT_TARGET_ATTRS, Publisher, load_object, publishers_for

__all__ = [
    "EXIT_FAILED",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_USAGE",
    "CliFailure",
    "CliState",
    "console",
    "emit_json",
    "fail",
    "failure",
    "pass_state",
    "store_env_help",
]

EXIT_OK = 0
"""The command did what was asked."""
EXIT_FAILED = 1
"""An operation failed: store unreachable or refusing its configuration, broker refused, some retries failed."""
EXIT_USAGE = 2
"""Bad command line: unknown option, bad duration, missing ``--app``/``--broker``."""
EXIT_NOT_FOUND = 3
"""An unknown run key or dead-letter id."""


class CliFailure(click.ClickException):
    """An expected failure: printed as ``Error: message`` on stderr; exits 1."""

    exit_code: ClassVar[int] = EXIT_FAILED


class UsageFailure(CliFailure):
    """A usage mistake the parser could not catch; exits 2."""

    exit_code: ClassVar[int] = EXIT_USAGE


class NotFoundFailure(CliFailure):
    """An unknown run key or dead-letter id; exits 3."""

    exit_code: ClassVar[int] = EXIT_NOT_FOUND


_FAILURES: dict[int, type[CliFailure]] = {
    EXIT_FAILED: CliFailure,
    EXIT_USAGE: UsageFailure,
    EXIT_NOT_FOUND: NotFoundFailure,
}


def failure(message: str, exit_code: int = EXIT_FAILED) -> CliFailure:
    """The exception that ends the command with ``message`` and ``exit_code`` (1, 2 or 3)."""
    return _FAILURES[exit_code](message)


def fail(message: str, exit_code: int = EXIT_FAILED) -> NoReturn:
    """Stop the command with ``message`` and ``exit_code`` (1, 2 or 3)."""
    raise failure(message, exit_code)


@dataclass
class CliState:
    """The global options, and the objects made from them on first use.

    Parameters:
      store_url (str | None): ``--store``; ``None`` reads ``FLEXIQ_STORE_URL``.
      app_ref (str | None): ``--app module:app`` (Celery).
      broker_ref (str | None): ``--broker module:broker`` (Dramatiq).
    """

    store_url: str | None = None
    app_ref: str | None = None
    broker_ref: str | None = None
    _store: StepStore | None = field(default=None, repr=False)

    @property
    def store(self) -> StepStore:
        """The step store, opened on first use without running migrations.

        A SQLite file that does not exist is an error naming the path (the
        usual cause is a missing ``--store``), not a new empty database.
        """
        if self._store is None:
            self._store = self.open_store(create=False)
        return self._store

    def open_store(self, *, create: bool) -> StepStore:
        """Open the store; with ``create`` a missing SQLite file is created (``store upgrade``)."""
        spec = self.store_url or os.environ.get(STORE_URL_ENV) or DEFAULT_STORE_URL
        if spec.strip().lower().startswith("memory:"):
            return open_store(spec)
        if not create:
            _require_sqlite_file(spec)
        return open_store(spec, auto_upgrade=False)

    def publishers(self, app_ref: str | None = None, broker_ref: str | None = None) -> dict[str, Publisher]:
        """A publisher per framework from ``--app`` / ``--broker`` (command options win over global ones).

        Each reference is imported (``module:attribute``) and handed to the
        installed integrations; the one that owns the object publishes with it.
        """
        refs = [ref for ref in (app_ref or self.app_ref, broker_ref or self.broker_ref) if ref]
        return publishers_for(*(load_object(ref, DEFAULT_TARGET_ATTRS) for ref in refs))

    def close(self) -> None:
        """Release the store's connections."""
        if self._store is not None:
            self._store.close()


pass_state = click.make_pass_decorator(CliState, ensure=True)


def console() -> Console:
    """A console on the current stdout: wide and plain when it is not a terminal."""
    return Console(file=sys.stdout, width=None if sys.stdout.isatty() else 200, highlight=False)


def emit_json(data: Any) -> None:
    """Print ``data`` as indented JSON on stdout."""
    click.echo(json.dumps(data, indent=2, sort_keys=False, default=str))


def _require_sqlite_file(spec: str) -> None:
    path = sqlite_file(normalize_url(spec))  # also out of an SQLite URI (file:/path?mode=ro&uri=true)
    if path is None:
        return
    if not os.path.exists(path):
        fail(
            f"no step store at {path}: pass --store URL (before or after the command) or set "
            f"{STORE_URL_ENV}; `flexiq store upgrade` creates a new one",
            EXIT_FAILED,
        )


def store_env_help() -> str:
    """The ``--store`` help text."""
    return f"Step store URL (default: ${STORE_URL_ENV}, else sqlite:///flexiq_steps.db)."
