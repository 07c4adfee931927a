"""What every page of the dashboard shares: its settings, the rendering of a page, its error pages (C52).

Pages are rendered on the server from Jinja2 templates with autoescaping on
for every template, so every stored value, key, name and error is
HTML-escaped (no template marks stored data safe). Failures render a page:
an expected error (an unknown run, a refused publish) names itself; anything
else is logged with its traceback and the page says only that the dashboard
failed.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from .. import CodecChain, ConfigurationError, StepStore
from ..errors import InvalidRunKey, StoreError, StoreUnavailable, UnknownDeadLetter, UnknownRun, UnknownStep
from ..operations import (
    DEFAULT_COUNT_CAP,
    NoPublisher,
    OperationError,
    Publisher,
    human_time,
    retried_note,
    run_note,
)
from ._security import CSRF_COOKIE, Guard

__all__ = ["HTMX_VERSION", "Dashboard", "page", "render"]

logger = logging.getLogger("flexiq_plugins.dashboard")

HTMX_VERSION = "2.0.11"
"""The vendored htmx (``static/htmx.min.js``, from the npm package ``htmx.org``)."""


@dataclass
class Dashboard:
    """What every page of one dashboard shares.

    Parameters:
      store (StepStore): the store it reads and acts on.
      publishers (dict[str, Publisher]): a publisher per framework, for actions that publish.
      guard (Guard): read-only mode, authorization and CSRF.
      codec (CodecChain | None): the workers' codec chain, to decode values on request.
      count_cap (int): counts above this read "more than".
    """

    store: StepStore
    publishers: dict[str, Publisher]
    guard: Guard
    codec: CodecChain | None = None
    count_cap: int = DEFAULT_COUNT_CAP
    templates: Environment = field(default_factory=lambda: _environment())  # noqa: PLW0108 - defined below
    _described: str | None = None

    def describe_store(self) -> str:
        """The store's description (its URL without a password), read once."""
        if self._described is None:
            try:
                self._described = self.store.describe()
            except StoreError as exc:
                return f"{type(self.store).__name__} (not reachable: {self.scrub(str(exc))})"
        return self._described

    def scrub(self, text: str) -> str:
        """``text`` with the store's password and the token replaced by ``***`` (C52)."""
        for secret in self._secrets():
            text = text.replace(secret, "***")
        return text

    def _secrets(self) -> list[str]:
        found = [self.guard.token] if self.guard.token else []
        engine = getattr(self.store, "engine", None)
        password = getattr(getattr(engine, "url", None), "password", None)
        if isinstance(password, str) and password:
            found.append(password)
        return found


def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader("flexiq_plugins.dashboard", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["t"] = human_time
    env.filters["note"] = run_note
    env.filters["retried"] = retried_note
    env.filters["seg"] = lambda text: quote(str(text), safe="")
    env.filters["count"] = _count
    env.filters["pretty"] = lambda value: json.dumps(value, indent=2, ensure_ascii=False, default=repr, sort_keys=True)
    env.filters["first_line"] = lambda text: (str(text).splitlines() or [""])[0][:120]
    return env


def _count(n: int, cap: int) -> str:
    return f"more than {cap:,}" if n > cap else f"{n:,}"


def render(request: Request, template: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    """Render ``template`` with the context every page has, setting the browser's CSRF id if it has none.

    Every page gets: ``root`` (the mount path, for links), ``csrf`` (the
    token its forms carry), ``actions`` (whether to render actions at all),
    ``may_act`` (whether this request may act), ``signed_in``, ``store``
    (the store's description) and ``path``.
    """
    board: Dashboard = request.app.state.dashboard
    guard = board.guard
    csrf_id = guard.csrf_id(request)
    fresh = csrf_id is None
    if csrf_id is None:
        csrf_id = secrets.token_urlsafe(32)
    root = request.scope.get("root_path", "")
    page = board.templates.get_template(template).render(
        request=request,
        root=root,
        path=request.url.path,
        csrf=guard.csrf_token(csrf_id),
        actions=not guard.read_only,
        may_act=not guard.read_only and (guard.authorize is not None or guard.signed_in(request)),
        uses_token=guard.uses_token,
        signed_in=guard.signed_in(request),
        store=board.describe_store(),
        htmx_version=HTMX_VERSION,
        cap=board.count_cap,
        **context,
    )
    response = HTMLResponse(page, status_code=status_code)
    if fresh:
        response.set_cookie(CSRF_COOKIE, csrf_id, httponly=True, samesite="strict", path=root or "/")
    return response


Handler = Callable[[Request], Awaitable[Response]]

_EXPECTED: tuple[tuple[type[Exception], int, str], ...] = (
    (UnknownRun, 404, "Not found"),
    (UnknownDeadLetter, 404, "Not found"),
    (UnknownStep, 404, "Not found"),
    (InvalidRunKey, 404, "Not found"),
    (NoPublisher, 409, "No publisher"),
    (ConfigurationError, 400, "Cannot do that"),
    (ValueError, 400, "Cannot do that"),
    (StoreUnavailable, 503, "The store cannot be reached"),
    (StoreError, 500, "The store failed"),
    (OperationError, 409, "The operation failed"),
)


def page(handler: Handler) -> Handler:
    """Wrap a page or action: an expected error renders a page naming it; anything else is logged, never shown."""

    async def wrapped(request: Request) -> Response:
        board: Dashboard = request.app.state.dashboard
        try:
            return await handler(request)
        except tuple(error for error, _, _ in _EXPECTED) as exc:
            status, title = next((s, t) for error, s, t in _EXPECTED if isinstance(exc, error))
            return render(request, "error.html", status, title=title, message=board.scrub(str(exc)))
        except Exception:
            logger.exception("the dashboard failed on %s %s", request.method, request.url.path)
            message = "The dashboard failed on this page; the server's log has the details."
            return render(request, "error.html", 500, title="Dashboard error", message=message)

    wrapped.__name__ = handler.__name__
    wrapped.__doc__ = handler.__doc__
    return wrapped
