"""Who may act, and proof that a form came from the dashboard's own page (C52).

**Read-only unless actions are allowed.** A read-only dashboard renders no
action and refuses every ``POST`` before looking at anything else.

**An action needs authorization.** Either the host application's
``authorize(request, action)`` returns true (a dashboard mounted in an app
with its own users), or the request proves it knows the dashboard's token:
an ``Authorization: Bearer <token>`` header (a script), or the session cookie
the sign-in form sets (a person). The cookie holds an HMAC of the token, not
the token; it is ``HttpOnly`` and ``SameSite=Strict``.

**Every POST carries a CSRF token.** Each browser gets a random id in a
cookie; each form carries ``HMAC(secret, id)`` in a hidden field (or the
``X-CSRF-Token`` header). Another site can make the browser send the cookie,
but cannot read it nor compute the field, so a forged form is refused.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field

from starlette.requests import Request

__all__ = ["CSRF_COOKIE", "SESSION_COOKIE", "Authorize", "Guard"]

CSRF_COOKIE = "flexiq_csrf"
"""The cookie holding the browser's random id, which a form's CSRF token is derived from."""

SESSION_COOKIE = "flexiq_session"
"""The cookie set by signing in with the token."""

Authorize = Callable[[Request, str], bool]
"""``authorize(request, action) -> bool``: the host application's decision (action names in `ACTIONS`)."""

ACTIONS = ("retry", "purge", "cancel", "send_event", "recover", "bulk_retry", "bulk_cancel")
"""The actions the dashboard performs, as ``authorize`` receives them."""


@dataclass
class Guard:
    """The dashboard's security settings and checks.

    Parameters:
      read_only (bool): render no action, refuse every ``POST``.
      token (str | None): the token that allows actions.
      authorize (Authorize | None): the host application's decision, tried first.
      secret (bytes): signs the CSRF tokens and the session cookie (random per app unless given).
    """

    read_only: bool = True
    token: str | None = None
    authorize: Authorize | None = None
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32))

    @property
    def uses_token(self) -> bool:
        """Whether a person signs in with the token (no ``authorize`` decides for them)."""
        return self.authorize is None and self.token is not None

    # ------------------------------------------------------------------ CSRF
    def csrf_id(self, request: Request) -> str | None:
        """The browser's CSRF id from its cookie, if it has a well-formed one."""
        value = request.cookies.get(CSRF_COOKIE)
        return value if value and len(value) <= 128 else None

    def csrf_token(self, csrf_id: str) -> str:
        """The token a form of the browser with ``csrf_id`` carries."""
        return hmac.new(self.secret, b"csrf:" + csrf_id.encode(), hashlib.sha256).hexdigest()

    def csrf_ok(self, request: Request, submitted: str | None) -> bool:
        """Whether ``submitted`` (the form field, or the ``X-CSRF-Token`` header) matches the browser's id."""
        csrf_id = self.csrf_id(request)
        given = submitted or request.headers.get("x-csrf-token")
        if csrf_id is None or not given:
            return False
        return hmac.compare_digest(self.csrf_token(csrf_id), given)

    # --------------------------------------------------------- authorization
    def session_value(self) -> str:
        """The session cookie's value: an HMAC of the token (never the token itself)."""
        assert self.token is not None
        return hmac.new(self.secret, b"session:" + self.token.encode(), hashlib.sha256).hexdigest()

    def token_ok(self, given: str) -> bool:
        """Whether ``given`` is the token (compared in constant time)."""
        return self.token is not None and hmac.compare_digest(self.token.encode(), given.encode())

    def signed_in(self, request: Request) -> bool:
        """Whether the request carries the token (Bearer header) or the session cookie made from it."""
        if self.token is None:
            return False
        header = request.headers.get("authorization", "")
        if header.lower().startswith("bearer ") and self.token_ok(header[7:].strip()):
            return True
        cookie = request.cookies.get(SESSION_COOKIE, "")
        return bool(cookie) and hmac.compare_digest(cookie, self.session_value())

    def may(self, request: Request, action: str) -> bool:
        """Whether ``request`` may perform ``action``: never when read-only; else ``authorize``, or the token."""
        if self.read_only:
            return False
        if self.authorize is not None:
            return bool(self.authorize(request, action))
        return self.signed_in(request)
