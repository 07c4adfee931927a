"""The SQL store's ``Table`` definitions and its Alembic migrations describe one schema.

The migrations create the tables; the queries are built on the ``Table``
objects of ``flexiq_plugins._store.sql.tables``. Were the two to drift, a query
could bind a type the column does not have, or a new column could exist on
one side only. Here the migrations run to head on every backend and Alembic's
autogenerate compares the database with the ``Table`` objects: types, server
defaults, nullability, keys and indexes must all agree.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from flexiq_plugins._store.sql import SqlStepStore, upgrade_store
from flexiq_plugins._store.sql.tables import store_tables

BACKENDS = [
    "sqlite",
    pytest.param("postgres", marks=pytest.mark.postgres),
    pytest.param("mysql", marks=pytest.mark.mysql),
    pytest.param("mariadb", marks=pytest.mark.mysql),
]


@pytest.fixture(params=BACKENDS)
def migrated_store(request: pytest.FixtureRequest, make_sql_store: Callable[..., SqlStepStore]) -> SqlStepStore:
    """A store on each backend in turn whose tables were made by running the migrations to head."""
    store = make_sql_store(request.getfixturevalue(f"{request.param}_url"), auto_upgrade=False)
    upgrade_store(store.engine, "head", table_prefix=store.table_prefix)
    return store


def schema_diff(store: SqlStepStore, metadata: sa.MetaData) -> list[Any]:
    """Alembic's autogenerate diff between ``store``'s tables and ``metadata``, types and defaults compared.

    Only the tables of the store's prefix are looked at (the server databases
    are shared), its Alembic version table excepted; a table of that prefix
    missing from ``metadata`` still shows as a difference.
    """
    prefix = store.table_prefix

    def ours(name: str | None, type_: str, _parents: object) -> bool:
        return type_ != "table" or (name is not None and name.startswith(prefix) and name != f"{prefix}alembic_version")

    with store.engine.connect() as conn:
        options = {"compare_type": True, "compare_server_default": True, "include_name": ours}
        return list(compare_metadata(MigrationContext.configure(conn, opts=options), metadata))


def diff_kinds(diff: list[Any]) -> set[str]:
    """The kinds of change in an autogenerate diff (``add_column``, ``modify_type`` …)."""
    return {entry[0] if isinstance(entry, tuple) else entry[0][0] for entry in diff}


def test_tables_match_the_migrations_head(migrated_store: SqlStepStore) -> None:
    """The ``Table`` definitions are exactly what the migrations create, on every backend."""
    assert schema_diff(migrated_store, store_tables(migrated_store.table_prefix).metadata) == []


def test_the_comparison_sees_a_column_or_a_type_on_one_side_only(migrated_store: SqlStepStore) -> None:
    """The check is not vacuous: a column declared only in the tables, or a changed type, is a difference."""
    tables = store_tables(migrated_store.table_prefix)
    tables.runs.append_column(sa.Column("priority", sa.Integer, nullable=True))
    tables.steps.c.kind.type = sa.String(32)

    assert diff_kinds(schema_diff(migrated_store, tables.metadata)) == {"add_column", "modify_type"}


@pytest.mark.mysql
@pytest.mark.parametrize("backend", ["mysql", "mariadb"])
def test_mysql_table_options_match_the_migrations(
    backend: str, request: pytest.FixtureRequest, make_sql_store: Callable[..., SqlStepStore]
) -> None:
    """On MySQL/MariaDB each table's engine, character set and binary collation are what the ``Table`` declares.

    Autogenerate does not compare table options, and the ``utf8mb4_bin``
    collation is what makes ``charge#0`` and ``Charge#0`` two step keys.
    """
    store = make_sql_store(request.getfixturevalue(f"{backend}_url"))
    store.now()
    dialect = store.engine.dialect.name
    inspector = sa.inspect(store.engine)
    tables = store_tables(store.table_prefix)
    for table in (tables.runs, tables.steps, tables.dead):
        reported = inspector.get_table_options(table.name)
        declared = {option: table.kwargs[f"{dialect}_{option}"] for option in ("engine", "charset", "collate")}
        assert declared == {"engine": "InnoDB", "charset": "utf8mb4", "collate": "utf8mb4_bin"}
        assert reported[f"{dialect}_engine"] == declared["engine"], table.name
        assert reported[f"{dialect}_default charset"] == declared["charset"], table.name
        assert reported[f"{dialect}_collate"] == declared["collate"], table.name
