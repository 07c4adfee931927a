"""The operator's window as a Python API (C52): pages, the overview, a run's timeline, a divergence, bulk plans.

Runs are driven through the real core on an in-memory store with a fake
clock (``flexiq_plugins.testing.DurableRun``); what the dashboard renders is
what these functions return.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest

from flexiq_plugins import (
    DeadLetterRecord,
    DurableConfig,
    JobEnvelope,
    MemoryStepStore,
    NonRetryableError,
    current_job,
    operations,
)
from flexiq_plugins.operations import RunFilter
from flexiq_plugins.testing import DurableRun, FakeClock

KEEP = DurableConfig(keep_succeeded_steps=True)


def _runs(store: MemoryStepStore, clock: FakeClock, count: int) -> list[str]:
    keys = []
    for i in range(count):
        run = DurableRun(lambda: current_job.step.run("work", lambda: 1), run_key=f"run-{i}", store=store, config=KEEP)
        run.attempt()
        clock.advance(1)
        keys.append(run.run_key)
    return keys


def test_c52_browse_runs_pages_with_an_opaque_cursor_until_the_last_page() -> None:
    """C52: each page's ``next_cursor`` continues the listing; the last page has none; a forged cursor is refused."""
    clock = FakeClock()
    store = MemoryStepStore(clock=clock)
    keys = _runs(store, clock, 5)

    seen: list[str] = []
    cursor = None
    for _ in range(5):
        page = operations.browse_runs(store, cursor=cursor, limit=2)
        seen += [r.run_key for r in page.runs]
        cursor = page.next_cursor
        if cursor is None:
            break

    assert seen == list(reversed(keys))
    with pytest.raises(ValueError, match="is not a page cursor"):
        operations.browse_runs(store, cursor="garbage")
    with pytest.raises(ValueError, match="1 to 500"):
        operations.browse_runs(store, limit=0)


def test_c52_parse_moment_reads_a_date_time_or_a_duration_ago() -> None:
    """C52: ``2025-01-02T03:04`` is UTC unless it has an offset; ``1h`` is an hour before now; junk names both."""
    now = 1_800_000_000.0
    utc = datetime(2025, 1, 2, 3, 4, tzinfo=timezone.utc).timestamp()

    assert operations.parse_moment("2025-01-02T03:04", now) == utc
    assert operations.parse_moment("2025-01-02T04:04+01:00", now) == utc
    assert operations.parse_moment("1h", now) == now - 3600
    with pytest.raises(ValueError, match="neither a date-time"):
        operations.parse_moment("soonish", now)


def test_c12_c52_divergence_of_lays_the_sequences_out_position_by_position() -> None:
    """C12, C52: unchanged positions are ``same``, the changed one ``changed``, recorded ones not reached follow."""
    message = (
        "step sequence changed for job j (run r) at position 1\n"
        "  recorded: charge#0, reserve#0, audit:order-7\n"
        "  running:  charge#0, allocate#0\n"
        "  step 1 was 'reserve#0', now 'allocate#0'\n"
    )
    dead = DeadLetterRecord(1, "r", "j", "t", "divergence", message, "", JobEnvelope("t", "test"), 0.0, None)

    found = operations.divergence_of(dead)

    assert found is not None
    assert found.changed_at == 1
    assert [(ln.recorded, ln.running, ln.change) for ln in found.lines] == [
        ("charge#0", "charge#0", "same"),
        ("reserve#0", "allocate#0", "changed"),
        ("audit:order-7", None, "not reached"),
    ]
    other = DeadLetterRecord(2, "r", "j", "t", "worker_lost", message, "", JobEnvelope("t", "test"), 0.0, None)
    assert operations.divergence_of(other) is None


def _saga(log: list[str]) -> Any:
    def body() -> None:
        step = current_job.step
        step.run("charge", lambda: {"id": "ch_1"}, compensate=lambda charge: log.append("refund"))
        paid = step.wait_for_event("payment", key="o-1")
        step.run("ship", lambda: (_ for _ in ()).throw(NonRetryableError(f"carrier refused {paid}")))

    return body


def test_c32_c33_c52_run_timeline_gathers_keys_undos_waits_events_and_the_outcome() -> None:
    """C10, C32, C33, C37, C52: each step has its idempotency key; the undo that ran, the wait's topic and key,
    the event received, the run's dead letter and outcome are all there; values only when asked for."""
    log: list[str] = []
    run = DurableRun(_saga(log), config=KEEP)
    run.attempt()
    waiting = operations.run_timeline(run.store, "run-1")
    run.send_event("payment", "o-1", "paid")
    run.until_done()

    timeline = operations.run_timeline(run.store, "run-1", values=True)
    by_key = {s.row.step_key: s for s in timeline.steps}

    assert waiting.note == "event ('payment', 'o-1')"
    assert [s.awaits for s in waiting.steps if s.row.kind == "wait"] == [("payment", "o-1")]
    assert by_key["charge#0"].idempotency_key == "run-1:charge#0"
    assert by_key["charge#0"].undo is not None
    assert by_key["charge#0"].undo.step_key == "compensate:charge#0"
    assert by_key["payment#0"].awaits == ("payment", "o-1")
    assert by_key["event:payment#0"].event is not None
    assert by_key["event:payment#0"].value is not None
    assert by_key["event:payment#0"].value.value == "paid"
    assert log == ["refund"]
    assert timeline.run.status == "compensated"
    assert [d.reason for d in timeline.dead_letters] == ["non_retryable"]
    assert timeline.outcome is not None
    assert timeline.outcome.kind == "dead_letter"
    assert timeline.arguments is not None
    assert waiting.arguments is None


def test_c52_overview_counts_and_lists_what_may_be_stuck() -> None:
    """C52: runs per status and task (capped), overdue sleepers, waiting runs, the last day's dead letters."""
    clock = FakeClock()
    store = MemoryStepStore(clock=clock)
    _runs(store, clock, 3)

    def nap() -> None:
        current_job.step.sleep("1m")

    sleeper = DurableRun(nap, run_key="run-nap", store=store)
    sleeper.attempt()
    clock.advance("2m")

    view = operations.overview(store, cap=2)

    assert view.by_status == {"sleeping": 1, "succeeded": 3}
    assert view.by_status["succeeded"] > view.cap  # read "more than 2"
    assert [r.run_key for r in view.overdue_sleepers] == ["run-nap"]
    assert view.oldest_waiting == []
    assert view.dead_letters_by_reason == {}


def test_c52_a_bulk_action_over_more_runs_than_its_cap_is_refused_before_anything_changes() -> None:
    """C34, C52: the plan counts the selection; over the cap the bulk cancel raises and cancels nothing."""
    clock = FakeClock()
    store = MemoryStepStore(clock=clock)
    for i in range(3):
        DurableRun(lambda: current_job.step.sleep("1h"), run_key=f"nap-{i}", store=store).attempt()

    plan = operations.plan_bulk(store, "cancel", RunFilter(status="sleeping"), cap=2)

    assert plan.too_many
    with pytest.raises(ValueError, match="selects more than 2 runs"):
        operations.bulk_cancel(store, RunFilter(status="sleeping"), {}, cap=2)
    assert {r.status for r in store.list_runs()} == {"sleeping"}
    done = operations.bulk_cancel(store, RunFilter(status="sleeping"), {}, cap=3)
    assert sorted(k for k, _ in done.done) == ["nap-0", "nap-1", "nap-2"]
    assert {r.status for r in store.list_runs()} == {"cancelled"}
