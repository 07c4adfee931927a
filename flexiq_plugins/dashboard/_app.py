"""The dashboard as an ASGI application: `create_app` (C52).

A Starlette application over one store, its routes in `_views`, its
rendering in `_render`, its security checks in `_security`. Every response
carries a strict Content-Security-Policy (scripts only from the dashboard
itself: the vendored htmx), and no page may be framed.
"""

from __future__ import annotations

from collections.abc import Mapping

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .. import CodecChain, ConfigurationError, StepStore, open_store
from ..operations import Publisher
from ._render import Dashboard, render
from ._security import Authorize, Guard
from ._views import routes

__all__ = ["create_app"]

_SECURITY_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        b"frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
]


class _SecurityHeaders:
    """Add the security headers (a strict Content-Security-Policy, no sniffing, no framing) to every response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *_SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, sending)


def create_app(
    store: StepStore | str,
    publishers: Mapping[str, Publisher] | None = None,
    read_only: bool = True,
    authorize: Authorize | None = None,
    *,
    token: str | None = None,
    codec: CodecChain | None = None,
    secret: bytes | None = None,
) -> Starlette:
    """Build the dashboard: an ASGI application over ``store`` (C52).

    Serve it with any ASGI server (``uvicorn``), or mount it in an ASGI app
    (Starlette, FastAPI, Django's ASGI handler); links follow the mount path.

    Parameters:
      store (StepStore | str): the store, or its URL (opened without running migrations).
      publishers (Mapping[str, Publisher] | None): a publisher per framework
        (``operations.publishers_for(app, broker)``) for the actions that publish
        (retry, recover, a cancel's undos, an event's wake-ups); ``None``: none.
      read_only (bool): show no action and refuse every ``POST`` (the default).
      authorize (Callable[[Request, str], bool] | None): the host application's
        decision for each action (``retry``, ``purge``, ``cancel``, ``fork``, ``send_event``,
        ``recover``, ``bulk_retry``, ``bulk_cancel``); used instead of the token.
      token (str | None): the secret an operator signs in with (or sends as
        ``Authorization: Bearer``) to act.
      codec (CodecChain | None): the workers' codec chain, to decode values
        when asked ("show values"); without it, encrypted values show as encrypted.
      secret (bytes | None): signs CSRF tokens and sessions; random per
        application unless given (give one when several processes serve it).

    Returns:
      Starlette: the application.

    Raises:
      ConfigurationError: actions are allowed (``read_only=False``) with
        neither ``authorize`` nor ``token``: nobody could be told apart.
    """
    if not read_only and authorize is None and not token:
        raise ConfigurationError(
            "the dashboard's actions need authorization: give token= (flexiq dashboard --token-env VAR) "
            "or authorize=(request, action) -> bool, or keep it read-only"
        )
    opened = open_store(store, auto_upgrade=False) if isinstance(store, str) else store
    guard = Guard(read_only=read_only, token=token or None, authorize=authorize)
    if secret is not None:
        guard.secret = secret
    static = StaticFiles(packages=[("flexiq_plugins.dashboard", "static")])
    handlers = {404: _no_such_page, 405: _no_such_page}
    app = Starlette(
        exception_handlers=handlers,  # type: ignore[arg-type]
        routes=[*routes(), Mount("/static", static, name="static")],
        middleware=[Middleware(_SecurityHeaders)],
    )
    app.state.dashboard = Dashboard(opened, dict(publishers or {}), guard, codec)
    return app


async def _no_such_page(request: Request, exc: HTTPException) -> Response:
    """An unknown path or method: the dashboard's own error page, not a bare text."""
    if exc.status_code == 405:
        return render(request, "error.html", 405, title="Not allowed", message="this page takes no such request")
    return render(request, "error.html", 404, title="Not found", message="the dashboard has no such page")
