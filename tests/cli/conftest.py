"""Fixtures of the ``flexiq`` CLI tests: stores filled through the real core, and the CLI runner.

Runs are made the way workers make them, through ``AttemptDriver`` against a
real ``SqlStepStore`` (a SQLite file; PostgreSQL where concurrency matters),
so the CLI reads exactly what production writes. Broker-backed tests use the
local Redis and RabbitMQ through the root ``require_service`` (skip locally,
fail in CI).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cli_support import Runs
from click.testing import CliRunner, Result

from flexiq_plugins._store.sql import SqlStepStore
from flexiq_plugins.cli import cli


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    """A SQLite store file in the test's directory."""
    return f"sqlite:///{tmp_path / 'steps.db'}"


@pytest.fixture
def store(store_url: str) -> Iterator[SqlStepStore]:
    """The SQLite store behind ``store_url`` (tables created)."""
    sql = SqlStepStore(store_url)
    yield sql
    sql.close()


@pytest.fixture
def runs(store: SqlStepStore) -> Runs:
    """A maker of runs in ``store``."""
    return Runs(store)


@pytest.fixture
def flexiq(store_url: str) -> Callable[..., Result]:
    """``flexiq(*args)``: invoke the CLI on ``store_url`` in-process; returns click's ``Result``."""
    runner = CliRunner()

    def invoke(*args: str) -> Result:
        return runner.invoke(cli, ["--store", store_url, *args], catch_exceptions=False)

    return invoke
