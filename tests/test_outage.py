"""A store outage under load, shortened: the database cut or black-holed loses no job (C28, C39, C41).

``benchmarks/outage.py`` runs the chaos jobs on two workers that reach
PostgreSQL through a small TCP proxy in the benchmark's process; once the
jobs run, the proxy drops every connection and refuses new ones for a few
seconds, then lets them through again. Every job must finish with no
operator action, and the workers' log must not grow with the number of
queued jobs (a few lines per process, not a WARNING per job). How fast the
backlog drains is printed by the benchmark, never asserted here.

The black-holed store (``benchmarks/netcut.py``: a network namespace whose
link is set down, so packets vanish without a reset) needs ``ip netns``
(root); without it those tests skip, and fail in CI.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from flexiq_plugins import StoreUnavailable, UnknownRun
from flexiq_plugins._store.sql import SqlStepStore
from flexiq_plugins.errors import StoreMisconfigured
from tests.conftest import MYSQL, MYSQL_URL, POSTGRES, POSTGRES_URL, in_ci, require_service

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import netcut  # noqa: E402

JOBS = 40
PROCESSES = {"celery": 6, "dramatiq": 4}  # benchmarks/chaos.py: two workers, their processes in all
UNAVAILABLE_EXIT = 77  # benchmarks/outage.py: no network namespace on this machine

pytestmark = [pytest.mark.slow, pytest.mark.redis, pytest.mark.postgres, pytest.mark.timeout(420)]


@pytest.mark.parametrize("framework", ["celery", "dramatiq"])
def test_c28_a_store_outage_under_load_loses_no_job_and_logs_per_process_not_per_job(
    framework: str, require_service: Callable[[str, str, int], None]
) -> None:
    """C28, C39, C41: with the store cut for 5 s while 40 jobs run, all 40 finish by themselves; at most one
    WARNING line per worker process is logged during the outage, and at most two after the store is back."""
    require_service("Redis", "127.0.0.1", 6379)
    require_service("PostgreSQL", "127.0.0.1", 5432)
    command = [
        sys.executable, str(ROOT / "benchmarks" / "outage.py"), "--framework", framework, "--broker", "redis",
        "--outage", "5", "--jobs", str(JOBS), "--drain", "240",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, timeout=400, check=False, cwd=ROOT)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
    result = json.loads(done.stdout.decode().strip().splitlines()[-1])
    assert (result["finished"], result["lost"]) == (JOBS, 0), result
    # One WARNING per process per outage (C41): two workers of 2 Dramatiq processes, or of a Celery main
    # process and 2 pool children.
    assert result["warning_lines_during_outage"] <= PROCESSES[framework], result
    assert result["warning_lines_after_return"] <= 2, result


@pytest.mark.parametrize("framework", ["celery", "dramatiq"])
def test_c28_a_black_holed_store_under_load_loses_no_job_and_logs_per_process_not_per_job(
    framework: str, require_service: Callable[[str, str, int], None]
) -> None:
    """C28, C39: with the store black-holed for 8 s (every packet dropped, no reset) while 40 jobs run, all 40
    finish by themselves, and fewer WARNING lines than jobs are logged.

    The workers' URL shortens the network timeouts (``tcp_user_timeout=3000``,
    ``connect_timeout=2``, keepalives after 1 s) so the shortened outage
    outlasts them: the hung statements and connection attempts end in
    :class:`StoreUnavailable` and put their jobs back, as after a refused
    connection. Skipped (failed in CI) where ``ip netns`` is not permitted.
    """
    require_service("Redis", "127.0.0.1", 6379)
    require_service("PostgreSQL", "127.0.0.1", 5432)
    command = [
        sys.executable, str(ROOT / "benchmarks" / "outage.py"), "--framework", framework, "--broker", "redis",
        "--mode", "blackhole", "--outage", "8", "--jobs", str(JOBS), "--drain", "240",
        "--url-query", "tcp_user_timeout=3000&connect_timeout=2&keepalives_idle=1&keepalives_interval=1",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, timeout=400, check=False, cwd=ROOT)
    stderr = done.stderr.decode(errors="replace")
    if done.returncode == UNAVAILABLE_EXIT:
        message = stderr.strip().splitlines()[-1]
        if in_ci():
            pytest.fail(message)
        pytest.skip(message)
    assert done.returncode == 0, stderr[-3000:]
    result = json.loads(done.stdout.decode().strip().splitlines()[-1])
    assert (result["finished"], result["lost"]) == (JOBS, 0), result
    # The black hole was met and treated as an outage: a process reported it, and its end.
    assert result["reachable_again_lines"] >= 1, result
    assert result["warning_lines_during_outage"] + result["warning_lines_after_return"] <= PROCESSES[framework], result


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
