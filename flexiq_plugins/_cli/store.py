"""``flexiq store``: schema upgrades and retention."""

from __future__ import annotations

import click

from .._store.sql import SqlStepStore, upgrade_store
from . import render
from .state import CliState, console, emit_json, pass_state
from .types import DURATION

__all__ = ["store"]


@click.group()
def store() -> None:
    """The step store: upgrade its schema, clean up old runs."""


@store.command("upgrade")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_state
def upgrade_command(state: CliState, *, as_json: bool) -> None:
    """Create or migrate the store's tables to the newest schema (idempotent)."""
    opened = state.open_store(create=True)
    if not isinstance(opened, SqlStepStore):
        console().print("An in-memory store has no schema to upgrade.")
        return
    upgrade_store(opened.engine, table_prefix=opened.table_prefix)
    if as_json:
        emit_json({"upgraded": opened.url})
    else:
        console().print(f"The store at {opened.url} is at the newest schema.", markup=False)


@store.command("cleanup")
@click.option(
    "--older-than", type=DURATION, required=True, metavar="DURATION", help="Retention, e.g. 7d: older runs go."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_state
def cleanup_command(state: CliState, *, older_than: float, as_json: bool) -> None:
    """Delete succeeded, failed and cancelled runs not updated for --older-than (dead-lettered runs stay)."""
    opened = state.store
    cutoff = opened.now() - older_than
    out = console()
    if as_json:
        deleted = opened.cleanup(older_than=cutoff)
        emit_json({"deleted": deleted, "older_than": render.iso_time(cutoff)})
        return
    with out.status("Deleting finished runs (one transaction)…"):
        deleted = opened.cleanup(older_than=cutoff)
    plural = "s" if deleted != 1 else ""
    out.print(f"deleted {deleted} finished run{plural} last updated before {render.human_time(cutoff)}")
