"""``flexiq events send``, ``flexiq runs cancel``, and how ``runs list`` shows waiting and cancelled runs (C33, C34).

The runs are made through the real core against a SQLite store; the CLI is
invoked in-process. Waking through a real app is proven in
``tests/conformance/test_conformance_events.py``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from cli_support import Runs
from click.testing import Result

from flexiq_plugins import current_job
from flexiq_plugins._store.sql import SqlStepStore


def waiting(runs: Runs, run_key: str, key: str = "o-1", timeout: Any = None) -> Callable[[], Any]:
    """A run that charged (with an undo) and waits for ``("payment", key)``; return its body."""

    def body() -> Any:
        step = current_job.step
        step.run("charge", lambda: {"id": "ch_1"}, compensate=lambda charge: None)
        return step.wait_for_event("payment", key=key, timeout=timeout)

    runs.attempt(run_key, body)
    return body


def test_c33_events_send_stores_the_event_and_leaves_the_waiting_run_to_recovery_without_an_app(
    flexiq: Callable[..., Result], runs: Runs, store: SqlStepStore
) -> None:
    """``flexiq events send TOPIC KEY --data JSON`` stores the event; with no ``--app``/``--broker`` the waiting
    run is reported as left to recovery, and it receives the payload at its next delivery (C33)."""
    body = waiting(runs, "r-1")
    result = flexiq("events", "send", "payment", "o-1", "--data", '{"amount": 1200}', "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["woken"] == []
    assert data["left_to_recovery"] == [{"run_key": "r-1", "why": "no publisher"}]
    event = store.next_event("r-1", "payment", "o-1")
    assert event is not None
    assert event.id == data["event_id"]
    decision = runs.attempt("r-1", body)
    assert decision.value == {"amount": 1200}


def test_c33_events_send_refuses_bad_json_and_a_bad_topic_with_a_usage_error(
    flexiq: Callable[..., Result], store: SqlStepStore
) -> None:
    """Bad ``--data`` JSON and an empty topic exit 2 with one line naming the problem; nothing is stored (C33)."""
    store.now()  # the store file exists
    bad_json = flexiq("events", "send", "payment", "o-1", "--data", "{nope")
    assert bad_json.exit_code == 2, bad_json.output
    assert "--data is not JSON" in bad_json.output
    bad_topic = flexiq("events", "send", "", "o-1")
    assert bad_topic.exit_code == 2
    assert "event topic '' is not" in bad_topic.output
    assert store.cleanup_events(older_than=store.now() + 1) == 0


def test_c33_c34_runs_list_shows_what_a_run_waits_for_and_why_a_run_was_cancelled(
    flexiq: Callable[..., Result], runs: Runs
) -> None:
    """The DETAIL column (and the JSON keys) name a waiting run's topic and key and a cancelled run's reason."""
    waiting(runs, "r-wait", key="order-7", timeout="1h")
    waiting(runs, "r-gone")
    assert flexiq("runs", "cancel", "r-gone", "--reason", "order abandoned").exit_code == 0
    listed = flexiq("runs", "list")
    assert listed.exit_code == 0, listed.output
    (wait_line,) = [ln for ln in listed.output.splitlines() if "r-wait" in ln]
    assert "waiting" in wait_line
    assert "event ('payment', 'order-7') until" in wait_line
    (gone_line,) = [ln for ln in listed.output.splitlines() if "r-gone" in ln]
    assert "pending" in gone_line  # its undo runs at its next delivery
    assert "cancel requested: order abandoned" in gone_line
    data = {r["run_key"]: r for r in json.loads(flexiq("runs", "list", "--json").output)}
    assert (data["r-wait"]["wait_topic"], data["r-wait"]["wait_key"]) == ("payment", "order-7")
    assert data["r-gone"]["cancel_reason"] == "order abandoned"


def test_c34_runs_cancel_ends_a_run_without_undos_at_once_and_says_what_happened(
    flexiq: Callable[..., Result], runs: Runs, store: SqlStepStore
) -> None:
    """``flexiq runs cancel`` on a sleeping run with nothing to undo ends it ``cancelled``; cancelling it again
    says it is finished; an unknown run exits 3 (C34)."""
    runs.sleeping("r-1")
    done = flexiq("runs", "cancel", "r-1", "--reason", "duplicate order", "--json")
    assert done.exit_code == 0, done.output
    assert json.loads(done.output) == {"run_key": "r-1", "effect": "cancelled", "status": "cancelled", "job_id": None}
    assert store.get_run("r-1").cancel_reason == "duplicate order"
    again = flexiq("runs", "cancel", "r-1")
    assert "already cancelled: nothing to cancel" in again.output
    listed = flexiq("runs", "list", "--status", "cancelled")
    assert "cancelled: duplicate order" in listed.output
    assert flexiq("runs", "cancel", "nope").exit_code == 3


def test_c33_store_cleanup_removes_events_older_than_their_retention(
    flexiq: Callable[..., Result], store: SqlStepStore
) -> None:
    """``flexiq store cleanup`` deletes events sent before ``--events-older-than`` (default ``--older-than``)."""
    store.add_event("payment", "o-1", None)
    kept = flexiq("store", "cleanup", "--older-than", "1h", "--json")
    assert json.loads(kept.output)["events_deleted"] == 0
    gone = flexiq("store", "cleanup", "--older-than", "1h", "--events-older-than", "0s", "--json")
    assert json.loads(gone.output)["events_deleted"] == 1
