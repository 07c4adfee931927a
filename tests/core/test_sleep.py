"""Sleeps, C15–C19: a sleep commits its wake time and ends the attempt; it is not a failure.

Time is the fake store clock (``clock``). ``Attempt.now()`` estimates the store
clock from the offset read at claim time, so it runs a few microseconds ahead
of the frozen fake clock: wake times are compared with ``approx``, and a sleep
is made due by advancing a second past it.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone

import pytest

from flexiq_plugins import current_job, parse_duration
from flexiq_plugins._attempt import decisions
from flexiq_plugins._model.durations import ACCEPTED_FORMS

START = 1_700_000_000.0
"""Where the ``clock`` fixture starts (checked by ``_at_start``)."""


@pytest.fixture(autouse=True)
def _at_start(clock):
    """Every test here starts with the store clock at ``START``."""
    assert clock() == START


def _sleeping(decision) -> decisions.PutBack:
    assert isinstance(decision, decisions.PutBack), decision
    assert decision.reason is decisions.PutBackReason.SLEEP
    return decision


def test_c15_sleep_commits_a_row_releases_the_claim_and_ends_the_attempt(harness):
    """``sleep("1h")`` commits a ``sleep`` row with the wake time, releases the claim, returns Sleeping."""
    after: list[str] = []

    def body():
        current_job.step.run("charge", lambda: "c")
        current_job.step.sleep("1h")
        after.append("ran past the sleep")

    slept = _sleeping(harness.run(body))
    assert after == []
    assert slept.detail == "sleep#0"
    assert slept.wake_at == pytest.approx(START + 3600, abs=1)
    assert slept.delay == pytest.approx(900, abs=1)  # capped at the default 15-minute hop (C18)
    run = harness.store.get_run(harness.run_key)
    assert run.status == "sleeping"
    assert run.owner is None
    assert run.lease_until is None
    row = harness.store.get_steps(harness.run_key)[1]
    assert (row.step_key, row.kind, row.value) == ("sleep#0", "sleep", None)
    assert row.wake_at == slept.wake_at


def test_c15_woken_job_replays_and_carries_on_after_the_sleep(harness, clock):
    """After the wake time the replay skips the done steps and the sleep, and runs what follows."""
    calls: list[str] = []

    def body():
        step = current_job.step
        step.run("welcome", lambda: calls.append("welcome"))
        step.sleep("3d", name="cool_off")
        return step.run("nudge", lambda: calls.append("nudge") or "nudged")

    _sleeping(harness.run(body))
    clock.advance(3 * 86400 + 1)
    assert harness.run(body) == decisions.Completed("nudged")
    assert calls == ["welcome", "nudge"]


def test_c16_sleep_is_not_a_failure_no_retry_no_warning_no_error(harness, caplog):
    """A sleep yields Sleeping (not Retry), run status ``sleeping``, and no WARNING or ERROR log."""
    caplog.set_level(logging.DEBUG)
    decision = harness.run(lambda: current_job.step.sleep("30s"))
    assert isinstance(decision, decisions.PutBack)
    assert decision.reason is decisions.PutBackReason.SLEEP
    assert not isinstance(decision, decisions.Failure)
    assert harness.store.get_run(harness.run_key).status == "sleeping"
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert harness.store.list_dead_letters(include_retried=True) == []


def test_c17_wake_time_is_fixed_by_the_first_commit(make_harness, clock):
    """A replay before the wake time keeps the original wake time and sleeps only the remainder."""
    harness = make_harness(max_hop_seconds=10**6)

    def body():
        current_job.step.sleep("1h")
        return "woke"

    first = _sleeping(harness.run(body))
    clock.advance(1800)
    early = _sleeping(harness.run(body))  # duplicate delivery half-way through
    assert early.wake_at == first.wake_at
    assert early.delay == pytest.approx(1800, abs=1)
    clock.advance(1200)
    later = _sleeping(harness.run(body))
    assert later.wake_at == first.wake_at
    assert later.delay == pytest.approx(600, abs=1)
    assert len(harness.store.get_steps(harness.run_key)) == 1
    clock.advance(601)
    assert harness.run(body) == decisions.Completed("woke")


def test_c17_due_sleep_returns_at_once_on_replay(harness, clock):
    """Once the wake time passed, the replayed sleep returns immediately, however late the wake is."""
    _sleeping(harness.run(lambda: current_job.step.sleep(5)))
    clock.advance(10 * 86400)
    assert harness.run(lambda: current_job.step.sleep(5) or "past") == decisions.Completed("past")


def test_c18_long_sleep_is_cut_into_hops_of_max_delay(make_harness, clock):
    """A 1-hour sleep with a 15-minute hop re-enqueues for 900 s each time until it is due."""
    harness = make_harness(max_hop_seconds=900)

    def body():
        current_job.step.sleep("1h")
        return "woke"

    delays = []
    for _ in range(4):
        hop = _sleeping(harness.run(body))
        delays.append(round(hop.delay))
        clock.advance(hop.delay)
    assert delays == [900, 900, 900, 900]
    clock.advance(1)
    assert harness.run(body) == decisions.Completed("woke")


def test_c18_default_max_hop_is_15_minutes(harness):
    """Without configuration, a 3-day sleep's first hop is 900 seconds."""
    assert _sleeping(harness.run(lambda: current_job.step.sleep("3d"))).delay == pytest.approx(900, abs=1)


def test_c18_the_longest_sleep_is_366_days_and_travels_in_hops(make_harness):
    """A sleep of exactly 366 days is accepted and cut into hops; ``timedelta.max`` is refused before any commit."""
    harness = make_harness()
    slept = _sleeping(harness.run(lambda: current_job.step.sleep(timedelta(days=366))))
    assert slept.delay == pytest.approx(900, abs=1)
    assert slept.wake_at == pytest.approx(START + 366 * 86400, abs=1)

    longest = make_harness("run-2").run(lambda: current_job.step.sleep(timedelta.max))
    assert isinstance(longest, decisions.DeadLetter)
    assert longest.reason == "invalid_duration"
    assert "longer than the longest sleep" in longest.message
    assert harness.store.get_steps("run-2") == []


def test_c19_unnamed_sleeps_are_numbered_and_named_ones_use_their_name(harness, clock):
    """Unnamed sleeps are ``sleep#0``, ``sleep#1``; ``name="cool_off"`` gives ``cool_off#0``."""

    def body():
        step = current_job.step
        step.sleep("1s")
        step.sleep("1s")
        step.sleep("1s", name="cool_off")
        return "done"

    seen = []
    for _ in range(3):
        seen.append(_sleeping(harness.run(body)).detail)
        clock.advance(2)
    assert seen == ["sleep#0", "sleep#1", "cool_off#0"]
    assert harness.run(body) == decisions.Completed("done")


def test_c19_sleep_until_an_aware_datetime_wakes_at_that_instant(harness, clock):
    """``sleep_until`` of an aware datetime sleeps until exactly its timestamp, any timezone."""
    when = datetime.fromtimestamp(START + 7200, tz=timezone(timedelta(hours=5, minutes=30)))
    slept = _sleeping(harness.run(lambda: current_job.step.sleep_until(when, name="billing")))
    assert slept.wake_at == START + 7200
    assert slept.detail == "billing#0"


def test_c19_sleep_until_a_past_instant_does_not_sleep(harness):
    """A ``sleep_until`` whose instant already passed returns at once."""
    past = datetime.fromtimestamp(START - 60, tz=timezone.utc)
    assert harness.run(lambda: current_job.step.sleep_until(past) or "on") == decisions.Completed("on")


@pytest.mark.parametrize(
    "when",
    [
        pytest.param(datetime(2030, 1, 1), id="naive"),  # naive on purpose
        pytest.param("2030-01-01T00:00:00+00:00", id="iso-string"),
        pytest.param(START + 10, id="epoch-float"),
    ],
)
def test_c19_sleep_until_needs_an_aware_datetime(harness, when):
    """A naive datetime (or anything else) raises ValueError naming what is accepted; nothing committed."""
    errors: list[BaseException] = []

    def body():
        with pytest.raises(ValueError, match="timezone-aware datetime") as info:
            current_job.step.sleep_until(when)
        errors.append(info.value)
        return "checked"

    assert harness.run(body) == decisions.Completed("checked")
    assert len(errors) == 1
    assert harness.store.get_steps(harness.run_key) == []


@pytest.mark.parametrize(
    "duration",
    [
        pytest.param(-1, id="negative-int"),
        pytest.param(-0.5, id="negative-float"),
        pytest.param(timedelta(seconds=-1), id="negative-timedelta"),
        pytest.param("-5s", id="negative-string"),
        pytest.param("1 hour", id="words"),
        pytest.param("1h 30m", id="space"),
        pytest.param("", id="empty"),
        pytest.param("30", id="no-unit"),
        pytest.param("5y", id="unknown-unit"),
        pytest.param(float("nan"), id="nan"),
        pytest.param(float("inf"), id="inf"),
        pytest.param(True, id="bool"),
        pytest.param(None, id="none"),
    ],
)
def test_c19_bad_duration_raises_value_error_listing_accepted_forms(harness, duration):
    """A negative or unparsable duration raises ValueError with the accepted forms; nothing is committed."""
    errors: list[BaseException] = []

    def body():
        try:
            current_job.step.sleep(duration)
        except ValueError as exc:
            errors.append(exc)
        return "checked"

    assert harness.run(body) == decisions.Completed("checked")
    (error,) = errors
    assert ACCEPTED_FORMS in str(error)
    assert "'1h30m'" in str(error)
    assert harness.store.get_steps(harness.run_key) == []


@pytest.mark.parametrize(
    ("duration", "seconds"),
    [
        ("500ms", 0.5),
        ("30s", 30.0),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("3d", 259200.0),
        ("1w", 604800.0),
        ("1.5h", 5400.0),
        (" 2H ", 7200.0),
        (timedelta(minutes=2, seconds=3), 123.0),
        (45, 45.0),
        (2.5, 2.5),
        (0, 0.0),
    ],
)
def test_c19_accepted_durations(duration, seconds):
    """The documented forms parse to seconds: strings with units, timedelta, int and float."""
    assert parse_duration(duration) == seconds


def test_c19_sleep_duration_sets_the_wake_time(make_harness):
    """``sleep("1h30m")`` wakes 5400 s after the store clock at commit."""
    harness = make_harness(max_hop_seconds=10**6)
    slept = _sleeping(harness.run(lambda: current_job.step.sleep("1h30m")))
    assert slept.wake_at == pytest.approx(START + 5400, abs=1)
    assert slept.delay == pytest.approx(5400, abs=1)
