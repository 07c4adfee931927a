"""``flexiq dashboard``: serve the web dashboard over the store (C52).

The dashboard needs the ``dashboard`` extra (Starlette, Jinja2, uvicorn); it
is imported only when this command runs, so the rest of ``flexiq`` works
without it.
"""

from __future__ import annotations

import os

import click

from ..operations import DEFAULT_TARGET_ATTRS, Publisher, load_object, publishers_for
from ._runs import codec_option
from ._state import EXIT_USAGE, CliState, fail, pass_state

__all__ = ["dashboard_command"]

DEFAULT_PORT = 8421


@click.command("dashboard")
@click.option(
    "--app",
    "app_refs",
    metavar="MODULE:APP",
    multiple=True,
    help="A Celery app or Dramatiq broker to publish with (retry, recover, a cancel's undos); repeatable.",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="The address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=DEFAULT_PORT, show_default=True, help="The port.")
@click.option(
    "--read-only/--allow-actions",
    "read_only",
    default=True,
    show_default=True,
    help="Show no action and refuse every POST (the default), or allow actions to those with the token.",
)
@click.option(
    "--token-env",
    metavar="VAR",
    help="The environment variable holding the token that allows actions (needed with --allow-actions).",
)
@click.option("--codec", "codec_ref", metavar="MODULE:CHAIN", help="The CodecChain the workers use, to show values.")
@pass_state
def dashboard_command(
    state: CliState,
    *,
    app_refs: tuple[str, ...],
    host: str,
    port: int,
    read_only: bool,
    token_env: str | None,
    codec_ref: str | None,
) -> None:
    """Serve the dashboard: runs, steps, dead letters and events, read from the store.

    Read-only unless --allow-actions; then an action needs the token (from
    --token-env) and a CSRF token. Listens on 127.0.0.1 unless --host says otherwise.
    """
    token = _token(token_env, read_only)
    try:
        import uvicorn

        from ..dashboard import create_app
    except ImportError as exc:
        fail(f"the dashboard needs its extra: pip install 'flexiq-plugins[dashboard]' ({exc})", EXIT_USAGE)
    publishers = _publishers(state, app_refs)
    app = create_app(state.store, publishers, read_only=read_only, token=token, codec=codec_option(codec_ref))
    mode = "read-only" if read_only else "actions allowed with the token"
    click.echo(f"flexiq dashboard on http://{host}:{port}/ ({mode}); store: {state.store.describe()}", err=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")


def _token(token_env: str | None, read_only: bool) -> str | None:
    if token_env is None:
        if not read_only:
            fail("--allow-actions needs --token-env VAR: the environment variable holding the token", EXIT_USAGE)
        return None
    token = os.environ.get(token_env, "")
    if not token:
        fail(f"--token-env {token_env}: the environment variable {token_env} is not set or empty", EXIT_USAGE)
    return token


def _publishers(state: CliState, app_refs: tuple[str, ...]) -> dict[str, Publisher]:
    refs = app_refs or tuple(ref for ref in (state.app_ref, state.broker_ref) if ref)
    return publishers_for(*(load_object(ref, DEFAULT_TARGET_ATTRS) for ref in refs))
