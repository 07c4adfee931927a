"""``flexiq store``: schema upgrades and retention."""

from __future__ import annotations

import click

from ..operations import clean_store, upgrade_schema
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
    url = upgrade_schema(state.open_store(create=True))
    if url is None:
        console().print("An in-memory store has no schema to upgrade.")
        return
    if as_json:
        emit_json({"upgraded": url})
    else:
        console().print(f"The store at {url} is at the newest schema.", markup=False)


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
    out = console()
    if as_json:
        cleaned = clean_store(state.store, older_than, events_older_than=events_older_than)
        cutoff = render.iso_time(cleaned.older_than)
        emit_json({"deleted": cleaned.runs, "older_than": cutoff, "events_deleted": cleaned.events})
        return
    with out.status("Deleting finished runs and old events…"):
        cleaned = clean_store(state.store, older_than, events_older_than=events_older_than)
    deleted, events = cleaned.runs, cleaned.events
    plural = "s" if deleted != 1 else ""
    out.print(f"deleted {deleted} finished run{plural} last updated before {render.human_time(cleaned.older_than)}")
    out.print(
        f"deleted {events} event{'s' if events != 1 else ''} sent before {render.human_time(cleaned.events_older_than)}"
    )
