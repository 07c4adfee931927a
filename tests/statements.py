"""Count what a SQL store's engine sends: shared by the tests that prove a step-less job sends nothing (C43).

A listener on ``before_cursor_execute`` also makes the store keep SQLAlchemy's
own execution path, so every statement passes through it.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine


class Statements:
    """Every statement and transaction ``engine`` sends while `on` is set (SQLAlchemy's event listeners)."""

    def __init__(self, engine: Engine) -> None:
        self.on = False
        self.seen: list[str] = []
        event.listen(engine, "before_cursor_execute", self._statement)
        event.listen(engine, "begin", self._begin)

    def _statement(self, _conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if self.on:
            self.seen.append(statement)

    def _begin(self, _conn: Any) -> None:
        if self.on:
            self.seen.append("BEGIN")
