"""Indexes that give every runs listing its order, so its cost does not grow with the history.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01

``list_runs`` (``flexiq runs list``, and the recovery sweep, per status)
returns the newest runs first: ``ORDER BY updated_at DESC, run_key DESC``
with a ``LIMIT``. An index on ``updated_at`` alone gives that order only
where a secondary index carries the primary key (InnoDB); SQLite then sorts
every row (about 40 ms at 100,000 finished runs, growing with the history).
Each of the three runs indexes now ends with ``run_key``:

- ``runs (updated_at, run_key)`` replaces ``(updated_at)``: ``flexiq runs list``;
- ``runs (status, updated_at, run_key)`` replaces ``(status, updated_at)``:
  the recovery sweep, ``flexiq runs list --status``, ``store cleanup``;
- ``runs (task_name, updated_at, run_key)`` replaces ``(task_name)``:
  ``flexiq runs list --task NAME``.

The number of indexes a step's run update maintains is unchanged. Already
indexed and kept: ``runs (wait_topic, wait_key)``, ``steps (run_key,
position)``, ``events (topic, event_key)``, ``events (created_at)``; dead
letters are listed by id (their primary key) and found by run key and task
name. A run's current job id stays unindexed on purpose: only an operator's
``flexiq runs show <job id>`` reads it, while every attempt start writes it.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import context, op

# revision identifiers, used by Alembic.
revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_NEW = {
    "runs_updated_key": ["updated_at", "run_key"],
    "runs_status_updated_key": ["status", "updated_at", "run_key"],
    "runs_task_updated_key": ["task_name", "updated_at", "run_key"],
}
_OLD = {
    "runs_updated": ["updated_at"],
    "runs_status_updated": ["status", "updated_at"],
    "runs_task_name": ["task_name"],
}


def table_prefix() -> str:
    """The prefix of the store's table names, set by ``upgrade_store``."""
    return str(context.config.attributes.get("table_prefix", "flexiq_"))


def _swap(create: dict[str, list[str]], drop: dict[str, list[str]]) -> None:
    p = table_prefix()
    for name, columns in create.items():
        op.create_index(f"ix_{p}{name}", f"{p}runs", columns)
    for name in drop:
        op.drop_index(f"ix_{p}{name}", table_name=f"{p}runs")


def upgrade() -> None:
    """Replace the three runs indexes by ones ending with ``run_key``."""
    _swap(_NEW, _OLD)


def downgrade() -> None:
    """Back to the indexes of revision 0007 (the same as 0005)."""
    _swap(_OLD, _NEW)
