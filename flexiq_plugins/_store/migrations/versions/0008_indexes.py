"""Indexes so a listing's cost does not grow with the history (issue 14).

Revision ID: 0008
Revises: 0005
Create Date: 2026-12-01

- ``<prefix>runs (task_name, updated_at)`` replaces ``(task_name)``:
  ``flexiq runs list --task NAME`` reads a task's newest runs from the index
  in order, instead of sorting every run the task ever had.

What was already indexed, and stays: ``runs (status, updated_at)`` (the
recovery sweep, ``flexiq runs list --status``, ``store cleanup``), ``runs
(updated_at)`` (``flexiq runs list``; on MySQL/MariaDB a secondary index
carries the primary key, so ``ORDER BY updated_at, run_key`` reads it in
order too), ``runs (wait_topic, wait_key)``, ``steps (run_key, position)``,
``events (topic, event_key)`` and ``events (created_at)``. Dead letters are
listed by id (their primary key) and found by run key and task name, all
indexed. A run's current job id stays unindexed on purpose: only an
operator's ``flexiq runs show <job id>`` reads it, while every attempt start
writes it.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import context, op

# revision identifiers, used by Alembic.
revision: str = "0008"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def table_prefix() -> str:
    """The prefix of the store's table names, set by ``upgrade_store``."""
    return str(context.config.attributes.get("table_prefix", "flexiq_"))


def upgrade() -> None:
    """Index runs by ``(task_name, updated_at)`` instead of ``task_name`` alone."""
    p = table_prefix()
    op.create_index(f"ix_{p}runs_task_updated", f"{p}runs", ["task_name", "updated_at"])
    op.drop_index(f"ix_{p}runs_task_name", table_name=f"{p}runs")


def downgrade() -> None:
    """Back to the ``task_name`` index."""
    p = table_prefix()
    op.create_index(f"ix_{p}runs_task_name", f"{p}runs", ["task_name"])
    op.drop_index(f"ix_{p}runs_task_updated", table_name=f"{p}runs")
