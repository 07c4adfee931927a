"""``flexiq store``: schema upgrades and retention."""

from __future__ import annotations

import click

from .._store.sql import SqlStepStore, upgrade_store
from . import _render as render
from ._state import CliState, console, emit_json, pass_state
from ._types import DURATION

__all__ = ["store"]


@click.group()
def store() -> None:
    """The step store: upgrade its schema, clean up old runs and events."""


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
@click.option(
    "--events-older-than",
    type=DURATION,
    metavar="DURATION",
    help="Retention of events (default: --older-than); a run that has not received one by then never will.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_state
def cleanup_command(state: CliState, *, older_than: float, events_older_than: float | None, as_json: bool) -> None:
    """Delete finished runs not updated for --older-than (dead letters' runs stay until purged), and older events."""
    opened = state.store
    now = opened.now()
    cutoff, events_cutoff = now - older_than, now - (older_than if events_older_than is None else events_older_than)
    out = console()
    if as_json:
        deleted = opened.cleanup(older_than=cutoff)
        events = opened.cleanup_events(older_than=events_cutoff)
        emit_json({"deleted": deleted, "older_than": render.iso_time(cutoff), "events_deleted": events})
        return
    with out.status("Deleting finished runs and old events…"):
        deleted = opened.cleanup(older_than=cutoff)
        events = opened.cleanup_events(older_than=events_cutoff)
    plural = "s" if deleted != 1 else ""
    out.print(f"deleted {deleted} finished run{plural} last updated before {render.human_time(cutoff)}")
    out.print(f"deleted {events} event{'s' if events != 1 else ''} sent before {render.human_time(events_cutoff)}")
