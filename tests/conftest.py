"""Shared fixtures: the real services, and one step store per backend.

Tests that need PostgreSQL or MariaDB use the running servers, never a mock.
When a server is not reachable the test is skipped on a developer machine but
*fails* in CI (``CI=true``), so a broken service can never turn a red build
green by skipping. Server-backed stores get a unique table prefix per test and
drop their tables afterwards, so tests are isolated and can be re-run.
"""

from __future__ import annotations

import gc
import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
import sqlalchemy as sa

from benchmarks.schema import drop_prefixed_tables
from flexiq_plugins._store.base import StepStore
from flexiq_plugins._store.caller import CallerConnection
from flexiq_plugins._store.memory import MemoryStepStore
from flexiq_plugins._store.sql import SqlStepStore

POSTGRES = ("PostgreSQL", "127.0.0.1", 5432)
MYSQL = ("MariaDB", "127.0.0.1", 3306)
POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
PSYCOPG2_URL = "postgresql+psycopg2://postgres@127.0.0.1:5432/test"  # the same database through psycopg2
MYSQL_URL = "mysql+pymysql://root@127.0.0.1:3306/test"
MARIADB_URL = "mariadb://root@127.0.0.1:3306/test"  # SQLAlchemy's MariaDB dialect, which reads other table options


def in_ci() -> bool:
    """Whether the tests run in CI (``CI`` is ``true`` or ``1``)."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1")


def require_service(name: str, host: str, port: int) -> None:
    """Skip the test (locally) or fail it (in CI) unless ``host:port`` accepts TCP connections.

    Parameters:
      name(str): the service's name, for the message.
      host(str): its host.
      port(int): its TCP port.
    """
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return
    except OSError:
        message = f"{name} not reachable at {host}:{port}"
        if in_ci():
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(name="require_service", scope="session")
def require_service_fixture() -> Callable[[str, str, int], None]:
    """:func:`require_service` as a fixture, for tests that take it as an argument."""
    return require_service


@pytest.fixture
def postgres_url() -> str:
    """The URL of the test PostgreSQL database (skips or fails if it is down)."""
    require_service(*POSTGRES)
    return POSTGRES_URL


@pytest.fixture
def mysql_url() -> str:
    """The URL of the test MariaDB/MySQL database (skips or fails if it is down)."""
    require_service(*MYSQL)
    return MYSQL_URL


@pytest.fixture
def mariadb_url() -> str:
    """The same database through a ``mariadb://`` URL (SQLAlchemy's MariaDB dialect)."""
    require_service(*MYSQL)
    return MARIADB_URL


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """The URL of a fresh SQLite file in the test's temporary directory."""
    return f"sqlite:///{tmp_path / 'steps.db'}"


class PostgresCaller(CallerConnection):
    """A caller's SQLAlchemy connection to PostgreSQL inside its open transaction (a transactional step, C42)."""

    dialect_name = "postgresql"
    description = "the test's connection"

    def __init__(self, conn: sa.Connection) -> None:
        self.conn = conn

    def execute(self, statement: Any) -> Any:
        """Execute ``statement`` in the caller's transaction."""
        return self.conn.execute(statement)


def drop_store_tables(store: SqlStepStore) -> None:
    """Drop the tables of ``store``'s table prefix (server databases are shared between runs)."""
    drop_prefixed_tables(store.engine, store.table_prefix)


@pytest.fixture
def make_sql_store() -> Iterator[Callable[..., SqlStepStore]]:
    """A factory of :class:`SqlStepStore` objects with a unique table prefix, dropped afterwards."""
    made: list[SqlStepStore] = []

    def make(url: str, **kwargs: object) -> SqlStepStore:
        kwargs.setdefault("table_prefix", f"t{uuid4().hex[:8]}_")
        store = SqlStepStore(url, **kwargs)  # type: ignore[arg-type]
        made.append(store)
        return store

    yield make
    for store in made:
        if store.engine.dialect.name != "sqlite":
            drop_store_tables(store)
        store.close()


@pytest.fixture(
    params=[
        "memory",
        "sqlite",
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("mysql", marks=pytest.mark.mysql),
        pytest.param("mariadb", marks=pytest.mark.mysql),
    ]
)
def store(request: pytest.FixtureRequest, make_sql_store: Callable[..., SqlStepStore]) -> StepStore:
    """A fresh, empty step store: in memory, SQLite, PostgreSQL and MariaDB in turn."""
    if request.param == "memory":
        return MemoryStepStore()
    url = request.getfixturevalue(f"{request.param}_url")
    return make_sql_store(url)


@pytest.fixture
def collector_off() -> Iterator[None]:
    """The cyclic garbage collector off for the test: only reference counting frees objects (no-cycle tests)."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
