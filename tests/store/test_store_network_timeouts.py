"""A silent network ends in an error, never a hang: the SQL store's connections time out (C28).

A black-holed database (packets dropped, no reset) makes a statement on an
established connection and a new connection each end in
:class:`StoreUnavailable`, and the store works again once the network is
back. What makes that so is checked on each server: TCP keepalives and a
user timeout on every connection unless the URL sets its own, and on
PostgreSQL a session timeout that ends a transaction a vanished client left
open. The same outage under load, with real workers, is
``tests/system/test_outage.py``.

The black hole (``benchmarks/netcut.py``: a network namespace whose link is
set down) needs ``ip netns`` (root); without it that test skips, and fails
in CI.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from flexiq_plugins import StoreUnavailable, UnknownRun
from flexiq_plugins._store.sql import SqlStepStore
from flexiq_plugins.errors import StoreMisconfigured
from tests.conftest import MYSQL, MYSQL_URL, POSTGRES, POSTGRES_URL, in_ci, require_service

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import netcut  # noqa: E402


@pytest.mark.parametrize(
    "backend", [pytest.param("postgres", marks=pytest.mark.postgres), pytest.param("mysql", marks=pytest.mark.mysql)]
)
def test_c28_a_black_holed_store_is_unavailable_not_hung_and_usable_again(
    backend: str, make_sql_store: Callable[..., SqlStepStore]
) -> None:
    """C28: a statement on an established connection and a new connection to a black-holed database each end
    in :class:`StoreUnavailable` (an outage, not a misconfiguration) instead of waiting forever; once the
    network is back the same store works again.

    The URL shortens the timeouts (``tcp_user_timeout`` 2 s, keepalives after
    1 s, ``connect_timeout`` 2 s); on MySQL/MariaDB these names are the
    store's own (set on PyMySQL's socket). The pytest timeout is the guard
    against a hang; no duration is asserted.
    """
    service, scheme, user = (POSTGRES, "postgresql", "postgres") if backend == "postgres" else (MYSQL, "mysql", "root")
    require_service(*service)
    direct = make_sql_store(f"{scheme}://{user}@127.0.0.1:{service[2]}/test")
    with pytest.raises(UnknownRun):
        direct.get_run("absent")  # creates the tables
    hole = _black_hole(service[2])
    try:
        query = "connect_timeout=2&tcp_user_timeout=2000&keepalives_idle=1&keepalives_interval=1"
        store = SqlStepStore(
            f"{scheme}://{user}@{hole.host}:{hole.port}/test?{query}", table_prefix=direct.table_prefix
        )
        with pytest.raises(UnknownRun):
            store.get_run("absent")  # a pooled connection, established
        hole.cut()
        with pytest.raises(StoreUnavailable) as in_flight:
            store.get_run("absent")
        store.engine.dispose()
        with pytest.raises(StoreUnavailable) as connecting:
            store.get_run("absent")
        hole.restore()
        with pytest.raises(UnknownRun):
            store.get_run("absent")
        store.close()
    finally:
        hole.close()
    assert not isinstance(in_flight.value, StoreMisconfigured), in_flight.value
    assert not isinstance(connecting.value, StoreMisconfigured), connecting.value


@pytest.mark.postgres
def test_c28_postgres_connections_carry_keepalives_and_a_user_timeout_unless_the_url_overrides_them(
    make_sql_store: Callable[..., SqlStepStore],
) -> None:
    """C28: the libpq parameters that turn a silent network into an error are on by default; the URL wins."""
    require_service(*POSTGRES)
    defaults = make_sql_store(POSTGRES_URL)
    overridden = make_sql_store(POSTGRES_URL + "?tcp_user_timeout=0&keepalives_idle=99")
    with defaults.engine.connect() as conn:
        params = conn.connection.dbapi_connection.info.get_parameters()  # type: ignore[union-attr]
    with overridden.engine.connect() as conn:
        changed = conn.connection.dbapi_connection.info.get_parameters()  # type: ignore[union-attr]
    expected = {
        "connect_timeout": "10",
        "keepalives": "1",
        "keepalives_idle": "10",
        "keepalives_interval": "5",
        "keepalives_count": "3",
        "tcp_user_timeout": "20000",
    }
    assert {name: params.get(name) for name in expected} == expected
    assert (changed.get("tcp_user_timeout"), changed.get("keepalives_idle")) == ("0", "99")


@pytest.mark.mysql
def test_c28_mysql_sockets_carry_keepalives_and_a_user_timeout_unless_the_url_overrides_them(
    make_sql_store: Callable[..., SqlStepStore],
) -> None:
    """C28: PyMySQL's socket gets TCP keepalives and ``TCP_USER_TIMEOUT`` by default; the URL's values win."""
    require_service(*MYSQL)
    defaults = make_sql_store(MYSQL_URL)
    overridden = make_sql_store(MYSQL_URL + "?keepalives=0&tcp_user_timeout=5000")

    def options(store: SqlStepStore) -> tuple[int, int, int, int]:
        with store.engine.connect() as conn:
            sock = conn.connection.dbapi_connection._sock  # type: ignore[union-attr]
            return (
                sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
                sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
                sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
                sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT),
            )

    assert options(defaults) == (1, 10, 5, 20_000)
    keepalive, _, _, user_timeout = options(overridden)
    assert (keepalive, user_timeout) == (0, 5000)


def _black_hole(port: int) -> Any:
    """A :class:`netcut.BlackHole` to 127.0.0.1:``port``; skips (fails in CI) where ``ip netns`` is not permitted."""
    try:
        return netcut.BlackHole(("127.0.0.1", port))
    except netcut.BlackHoleUnavailable as exc:
        message = f"no black hole on this machine: {exc}"
        if in_ci():
            pytest.fail(message)
        pytest.skip(message)


@pytest.mark.postgres
def test_c28_postgres_sessions_end_a_transaction_left_idle_by_a_vanished_client(
    make_sql_store: Callable[..., SqlStepStore],
) -> None:
    """C28: a client cut off mid-transaction by a silent network sends no reset; our sessions run with
    ``idle_in_transaction_session_timeout`` (one minute) so the server frees its locks, unless the URL sets
    ``options`` itself."""
    require_service(*POSTGRES)
    ours = make_sql_store(POSTGRES_URL)
    theirs = make_sql_store(POSTGRES_URL + "?options=-c%20statement_timeout%3D5000")
    with ours.engine.connect() as conn:
        ours_value = conn.exec_driver_sql("SHOW idle_in_transaction_session_timeout").scalar()
    with theirs.engine.connect() as conn:
        theirs_values = (
            conn.exec_driver_sql("SHOW idle_in_transaction_session_timeout").scalar(),
            conn.exec_driver_sql("SHOW statement_timeout").scalar(),
        )
    assert ours_value == "1min"
    assert theirs_values == ("0", "5s")
