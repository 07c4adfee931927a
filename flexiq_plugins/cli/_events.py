"""``flexiq events send``: send an event to the runs that wait for it (C33)."""

from __future__ import annotations

import json
from typing import Any

import click

from ..operations import send_event
from . import _render as render
from ._dlq import publisher_options
from ._state import EXIT_USAGE, CliState, console, emit_json, fail, pass_state

__all__ = ["events"]


@click.group()
def events() -> None:
    """Events for runs that wait for them (step.wait_for_event)."""


@events.command("send")
@click.argument("topic")
@click.argument("key")
@click.option("--data", "data", metavar="JSON", help="The payload, as JSON (default: none, null).")
@click.option("--run", "run_key", metavar="RUN_KEY", help="Send it to this run only.")
@publisher_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_state
def send_command(
    state: CliState,
    *,
    topic: str,
    key: str,
    data: str | None,
    run_key: str | None,
    app_ref: str | None,
    broker_ref: str | None,
    as_json: bool,
) -> None:
    """Send the event TOPIC KEY; runs waiting on it are woken through --app/--broker (else by `flexiq recover`).

    The event is stored first: a run that reaches its wait later receives it too.
    """
    payload = _payload(data)  # a usage mistake is reported before anything is opened
    publishers = state.publishers(app_ref, broker_ref)
    sent = send_event(topic, key, payload, run_key=run_key, store=state.store, publishers=publishers)
    if as_json:
        emit_json(
            {
                "event_id": sent.event.id,
                "topic": topic,
                "key": key,
                "run_key": run_key,
                "sent_at": render.iso_time(sent.event.created_at),
                "woken": [{"run_key": r, "job_id": j} for r, j in sent.woken],
                "left_to_recovery": [{"run_key": r, "why": why} for r, why in sent.left],
            }
        )
        return
    out = console()
    out.print(f"event {sent.event.id} ({topic!r}, {key!r}) sent", markup=False)
    for run, job in sent.woken:
        out.print(f"woke run {run} as job {job}", markup=False)
    for run, why in sent.left:
        out.print(f"run {run} waits for it: left to `flexiq recover` ({why})", markup=False)


def _payload(data: str | None) -> Any:
    if data is None:
        return None
    try:
        return json.loads(data)
    except ValueError as exc:
        fail(f"--data is not JSON: {exc}", EXIT_USAGE)
