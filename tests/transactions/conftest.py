"""Fixtures of the C42 tests: a SQL store and a business table in one real database, reached three ways.

A task body writes its business rows through Django (``tx_django_settings``:
PostgreSQL as ``default``, MariaDB as ``maria``), an SQLAlchemy ``Session`` or
an SQLAlchemy ``Connection``, on an engine of its own: never the store's. One
store (and one table prefix) per backend serves the whole module; every test
has its own run key and its own business table, dropped afterwards.

Django is configured in this process with ``settings.configure`` (not the
``DJANGO_SETTINGS_MODULE`` variable, which Celery worker subprocesses of other
tests would inherit and act on).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any
from uuid import uuid4

import pytest
import sqlalchemy as sa

from flexiq_plugins import DurableConfig, JobEnvelope, SqlStepStore
from flexiq_plugins.integration import AttemptDriver, JobInfo
from tests.conftest import MARIADB_URL, MYSQL, POSTGRES, POSTGRES_URL, drop_store_tables, require_service
from tests.transactions.tx_support import Api, Orders

BACKENDS = [pytest.param("postgres", marks=pytest.mark.postgres), pytest.param("mariadb", marks=pytest.mark.mysql)]
APIS = ["django", "session", "connection"]
URLS = {"postgres": POSTGRES_URL, "mariadb": MARIADB_URL}
SERVICES = {"postgres": POSTGRES, "mariadb": MYSQL}


@pytest.fixture(scope="session")
def django_configured() -> Iterator[None]:
    """Django set up in this process with the test databases of ``tx_django_settings``."""
    import django
    from django.conf import settings
    from django.db import connections

    from tests.transactions import tx_django_settings

    if not settings.configured:
        settings.configure(**{k: v for k, v in vars(tx_django_settings).items() if k.isupper()})
        django.setup()
    yield
    connections.close_all()


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """``postgres`` and ``mariadb`` in turn (skipped locally, failed in CI, when the server is down)."""
    require_service(*SERVICES[request.param])
    return str(request.param)


@pytest.fixture(scope="module")
def tx_store(backend: str) -> Iterator[SqlStepStore]:
    """The module's store on ``backend``, its tables created, dropped afterwards."""
    store = SqlStepStore(URLS[backend], table_prefix=f"x{uuid4().hex[:8]}_")
    store.now()
    yield store
    drop_store_tables(store)
    store.close()


@pytest.fixture(scope="module")
def user_engine(tx_store: SqlStepStore) -> Iterator[sa.Engine]:
    """The application's own engine on the store's database (not the store's engine)."""
    engine = sa.create_engine(tx_store.engine.url)
    yield engine
    engine.dispose()


@pytest.fixture
def orders(tx_store: SqlStepStore) -> Iterator[Orders]:
    """A fresh business table in the store's database."""
    table = Orders(f"orders_{uuid4().hex[:10]}", tx_store.engine)
    with tx_store.engine.begin() as conn:
        conn.execute(sa.text(f"CREATE TABLE {table.name} (id INTEGER PRIMARY KEY)"))
    yield table
    with tx_store.engine.begin() as conn:
        conn.execute(sa.text(f"DROP TABLE {table.name}"))


@pytest.fixture(params=APIS)
def api(request: pytest.FixtureRequest, backend: str, user_engine: sa.Engine, orders: Orders) -> Api:
    """Django, an SQLAlchemy Session and an SQLAlchemy Connection in turn."""
    if request.param == "django":
        request.getfixturevalue("django_configured")
    return Api(request.param, backend, user_engine, orders.name)


@pytest.fixture
def attempt(tx_store: SqlStepStore) -> Callable[..., Any]:
    """``attempt(body, run_key=…)``: run one attempt of a job on the store; return its decision."""
    driver = AttemptDriver(tx_store, DurableConfig(keep_succeeded_steps=True))

    def run(body: Callable[[], Any], run_key: str) -> Any:
        started = driver.start(JobInfo(run_key, uuid4().hex, JobEnvelope("shop.checkout", "test")))
        return started if not hasattr(started, "run") else started.run(body)

    return run


@pytest.fixture
def run_key() -> str:
    """A run key of this test only."""
    return f"tx-{uuid4().hex}"
