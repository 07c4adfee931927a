"""The ``flexiq`` root command: global options, and expected errors turned into exit codes.

Every expected error ends the command with one line on stderr and a
documented exit code, never a traceback: an unknown run key, step key or dead-letter id
exits 3, a usage mistake 2, a store or broker failure 1 (a store that refuses
its configuration, ``StoreMisconfigured``, included: the command line was fine). Anything else is a
bug and keeps its traceback.
"""

from __future__ import annotations

from typing import Any

import click

from .. import __version__
from ..errors import (
    ConfigurationError,
    StoreError,
    StoreMisconfigured,
    StoreUnavailable,
    UnknownDeadLetter,
    UnknownRun,
    UnknownStep,
)
from ..operations import NoPublisher, OperationError
from ._check import check_command, export_command
from ._dashboard import dashboard_command
from ._dlq import dlq
from ._events import events
from ._fork import fork_command
from ._recover import recover_command
from ._runs import runs
from ._state import EXIT_FAILED, EXIT_NOT_FOUND, EXIT_USAGE, CliState, failure, store_env_help
from ._store import store
from ._tasks import tasks_command

__all__ = ["cli", "main"]

_EXIT_CODES: tuple[tuple[type[Exception], int], ...] = (
    (UnknownRun, EXIT_NOT_FOUND),
    (UnknownDeadLetter, EXIT_NOT_FOUND),
    (UnknownStep, EXIT_NOT_FOUND),
    (NoPublisher, EXIT_USAGE),
    (StoreMisconfigured, EXIT_FAILED),  # a ConfigurationError too, but of the store, not of the command line
    (ConfigurationError, EXIT_USAGE),
    (ValueError, EXIT_USAGE),
    (StoreUnavailable, EXIT_FAILED),
    (StoreError, EXIT_FAILED),
    (OperationError, EXIT_FAILED),
)


class _Flexiq(click.Group):
    """The root group: maps the library's expected errors to messages and exit codes.

    ``--store URL`` is accepted after the command too (``flexiq runs list
    --store URL``): it is moved in front before parsing.
    """

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, _store_option_first(args))

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except tuple(error for error, _ in _EXIT_CODES) as exc:
            code = next(code for error, code in _EXIT_CODES if isinstance(exc, error))
            raise failure(str(exc), code) from exc


@click.group(cls=_Flexiq, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--store", "store_url", metavar="URL", envvar="FLEXIQ_STORE_URL", help=store_env_help())
@click.option("--app", "app_ref", metavar="MODULE:APP", help="Celery app for re-publishing (like celery -A).")
@click.option("--broker", "broker_ref", metavar="MODULE:BROKER", help="Dramatiq broker for re-publishing.")
@click.version_option(version=__version__, prog_name="flexiq")
@click.pass_context
def cli(ctx: click.Context, store_url: str | None, app_ref: str | None, broker_ref: str | None) -> None:
    """Operate durable runs: inspect, cancel and fork runs, send events, retry dead letters, recover jobs, check
    new code against the runs in flight, maintain the store, serve the dashboard.

    Exit codes: 0 ok, 1 operation failed (or: flexiq check found runs the new code would break), 2 usage error,
    3 not found.
    """
    state = ctx.ensure_object(CliState)
    state.store_url, state.app_ref, state.broker_ref = store_url, app_ref, broker_ref
    ctx.call_on_close(state.close)


runs.add_command(export_command)
runs.add_command(fork_command)
cli.add_command(runs)
cli.add_command(check_command)
cli.add_command(dlq)
cli.add_command(events)
cli.add_command(recover_command)
cli.add_command(store)
cli.add_command(tasks_command)
cli.add_command(dashboard_command)


def _store_option_first(args: list[str]) -> list[str]:
    """Move ``--store URL`` / ``--store=URL`` found anywhere (before ``--``) to the front."""
    moved: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            rest.extend(args[i:])
            break
        if arg == "--store":
            if i + 1 >= len(args) or args[i + 1].startswith("-"):
                raise _store_needs_a_url()
            moved += args[i : i + 2]
            i += 2
            continue
        if arg.startswith("--store="):
            if arg == "--store=":
                raise _store_needs_a_url()
            moved.append(arg)
        else:
            rest.append(arg)
        i += 1
    return moved + rest


def _store_needs_a_url() -> click.UsageError:
    return click.UsageError(
        "--store needs a URL, e.g. --store sqlite:///flexiq_steps.db or --store postgresql://user@host/db "
        "(before or after the command)"
    )


def main() -> None:
    """Run the ``flexiq`` console script."""
    cli(prog_name="flexiq")
