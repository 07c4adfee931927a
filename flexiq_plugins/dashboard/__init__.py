"""The operator's window: a web dashboard for runs, steps, dead letters and events (C52).

``pip install 'flexiq-plugins[dashboard]'``, then ``flexiq dashboard --store URL``,
or mount [`create_app`][flexiq_plugins.dashboard.create_app] in your own ASGI
application. It reads the store, so it shows everything the store keeps, and
it acts only through [`flexiq_plugins.operations`][flexiq_plugins.operations],
the functions the ``flexiq`` command calls.

Read-only unless actions are allowed; an action needs authorization (a token,
or the host application's ``authorize``) and a CSRF token; every stored value,
key, name and error is escaped; values are decoded only on request; a store's
password is never shown.
"""

from ._app import create_app

__all__ = ["create_app"]
