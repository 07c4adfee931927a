"""The business side of the C42 tests: an orders table, and the three ways a body writes to it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

DJANGO_ALIAS = {"postgres": "default", "mariadb": "maria"}


@dataclass
class Orders:
    """The business table ``name`` (``id`` primary key), read through the store's engine."""

    name: str
    engine: sa.Engine

    def ids(self) -> list[int]:
        """The committed order ids."""
        with self.engine.connect() as conn:
            return [r[0] for r in conn.execute(sa.text(f"SELECT id FROM {self.name} ORDER BY id"))]


@dataclass
class Api:
    """How a task body reaches the business database: ``django``, ``session`` or ``connection``."""

    kind: str
    backend: str
    engine: sa.Engine
    table: str

    @contextlib.contextmanager
    def handle(self) -> Iterator[Any]:
        """What the body passes as ``using=``, with no transaction open yet."""
        if self.kind == "django":
            yield DJANGO_ALIAS[self.backend]
        elif self.kind == "session":
            with Session(self.engine) as session:
                yield session
        else:
            with self.engine.connect() as conn:
                yield conn

    def outer(self, using: Any) -> contextlib.AbstractContextManager[Any]:
        """Open the caller's own transaction on ``using`` (``atomic()``, ``begin()``)."""
        if self.kind == "django":
            from django.db import transaction

            return transaction.atomic(using=using)
        return using.begin()  # type: ignore[no-any-return]

    def insert(self, using: Any, order_id: int) -> int:
        """Write one order through ``using``; return its id."""
        if self.kind == "django":
            from django.db import connections

            with connections[using].cursor() as cursor:
                cursor.execute(f"INSERT INTO {self.table} (id) VALUES (%s)", [order_id])
        else:
            using.execute(sa.text(f"INSERT INTO {self.table} (id) VALUES (:id)"), {"id": order_id})
        return order_id
