"""Divergence, C12–C14: when a replay's step sequence no longer matches the recorded one.

Each test records a sequence on a first attempt that fails at the end (so the
rows stay), then replays with changed code.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from unittest.mock import ANY

from flexiq_plugins import StepDivergence, current_job
from flexiq_plugins._attempt import decisions


class Stop(Exception):
    """Ends a recording attempt after its steps committed."""


def _record(harness, steps: Callable[[], None]) -> None:
    def body():
        steps()
        raise Stop("keep the rows for the replay")

    decision = harness.run(body)
    assert isinstance(decision, decisions.Failure), decision


def _run_all(names: list[str]) -> Callable[[], None]:
    def steps():
        for name in names:
            current_job.step.run(name, lambda n=name: f"{n}-value")

    return steps


def test_c12_changed_step_raises_divergence_naming_job_position_sequences_and_step(make_harness):
    """The message names the job, the position, both sequences and the step that changed, line by line."""
    harness = make_harness(run_key="018f-c2")
    _record(harness, _run_all(["charge", "notify", "receipt"]))

    decision = harness.run(_run_all(["charge", "notify", "audit"]), job_id="job-9")
    assert isinstance(decision, decisions.DeadLetter)
    assert isinstance(decision.error, StepDivergence)
    lines = str(decision.error).splitlines()
    assert lines[:4] == [
        "step sequence changed for job job-9 (run 018f-c2) at position 2",
        "  recorded: charge#0, notify#0, receipt#0",
        "  running:  charge#0, notify#0, audit#0",
        "  step 2 was 'receipt#0', now 'audit#0'",
    ]
    assert "Drain or dead-letter" in str(decision.error)


def test_c12_divergence_stops_before_the_changed_body_and_after_memo_hits(harness):
    """The changed step's body never runs; the steps before it were memo hits."""
    _record(harness, _run_all(["charge", "notify"]))
    calls: list[str] = []

    def body():
        step = current_job.step
        step.run("charge", lambda: calls.append("charge"))
        step.run("audit", lambda: calls.append("audit"))

    assert isinstance(harness.run(body), decisions.DeadLetter)
    assert calls == []


def test_c12_keyed_reorder_is_not_a_divergence(harness):
    """Keyed steps match by key anywhere: replaying them in another order is all memo hits."""
    calls: list[str] = []

    def record():
        for order_id in ["a", "b", "c"]:
            current_job.step.run("fetch", lambda i=order_id: f"order-{i}", key=order_id)
        current_job.step.run("total", lambda: "sum")

    _record(harness, record)

    def body():
        step = current_job.step
        got = [step.run("fetch", lambda i=i: calls.append(i), key=i) for i in ["c", "a", "b"]]
        got.append(step.run("total", lambda: calls.append("total")))
        return got

    decision = harness.run(body)
    assert decision == decisions.Completed(["order-c", "order-a", "order-b", "sum"])
    assert calls == []


def test_c12_adding_a_keyed_step_before_unkeyed_ones_is_not_a_divergence(harness):
    """A new keyed call does not shift unkeyed keys, so inserting one in the middle replays cleanly."""
    _record(harness, _run_all(["fetch", "fetch"]))
    calls: list[str] = []

    def body():
        step = current_job.step
        first = step.run("fetch", lambda: calls.append("fetch#0"))
        extra = step.run("fetch", lambda: calls.append("new") or "new-value", key="extra")
        second = step.run("fetch", lambda: calls.append("fetch#1"))
        return [first, extra, second]

    decision = harness.run(body)
    assert decision == decisions.Completed(["fetch-value", "new-value", "fetch-value"])
    assert calls == ["new"]


def test_c12_replacing_an_unkeyed_step_by_a_keyed_one_diverges_at_the_next_unkeyed(harness):
    """Unkeyed steps match by position among the unkeyed: a removed unkeyed step shifts the next one."""
    _record(harness, _run_all(["a", "b"]))

    def body():
        step = current_job.step
        step.run("a", lambda: "x", key="k")
        step.run("b", lambda: "y")

    decision = harness.run(body)
    assert isinstance(decision, decisions.DeadLetter)
    assert "step 0 was 'a#0', now 'b#0'" in str(decision.error)


def test_c12_sleep_replaced_by_run_at_a_position_diverges(harness, clock):
    """A sleep recorded where the code now runs a step of the same key is a kind change: divergence."""

    def record():
        current_job.step.sleep("1s", name="pause")

    assert harness.run(record) == decisions.PutBack(decisions.PutBackReason.SLEEP, ANY, ANY, ANY)
    clock.advance(5)
    decision = harness.run(lambda: current_job.step.run("pause", lambda: "ran"))
    assert isinstance(decision, decisions.DeadLetter)
    assert decision.reason == "divergence"
    assert "step 0 was 'pause#0 (sleep)', now 'pause#0 (run)'" in str(decision.error)


def test_c12_run_replaced_by_sleep_at_a_position_diverges(harness):
    """A run step recorded where the code now sleeps under the same key is a divergence, not a memo hit."""
    _record(harness, _run_all(["sleep"]))
    decision = harness.run(lambda: current_job.step.sleep("1h"))
    assert isinstance(decision, decisions.DeadLetter)
    assert isinstance(decision.error, StepDivergence)
    assert "step 0 was 'sleep#0 (run)', now 'sleep#0 (sleep)'" in str(decision.error)


def test_c13_divergence_is_dead_lettered_with_traceback_never_retried(harness):
    """A divergence ends as ``DeadLetter('divergence')``; the store records it with a traceback."""
    _record(harness, _run_all(["charge"]))
    decision = harness.run(_run_all(["refund"]))
    assert isinstance(decision, decisions.DeadLetter)
    assert decision.reason == "divergence"
    run = harness.store.get_run(harness.run_key)
    assert run.status == "dead"
    assert run.owner is None
    (letter,) = harness.store.list_dead_letters()
    assert letter.reason == "divergence"
    assert letter.run_key == harness.run_key
    assert letter.job_id == "job-1"
    assert letter.task_name == "task"
    assert "StepDivergence" in letter.traceback
    assert "step sequence changed" in letter.message
    assert [row.step_key for row in harness.store.get_steps(harness.run_key)] == ["charge#0"]


def test_c13_divergence_cannot_be_caught_by_except_exception(harness):
    """``except Exception`` around the changed step does not see the divergence; it propagates."""
    _record(harness, _run_all(["charge"]))
    caught: list[Exception] = []

    def body():
        try:
            current_job.step.run("refund", lambda: "r")
        except Exception as exc:
            caught.append(exc)
        return "swallowed"

    decision = harness.run(body)
    assert caught == []
    assert isinstance(decision, decisions.DeadLetter)
    assert decision.reason == "divergence"


def test_c14_steps_added_after_the_recorded_ones_run_and_commit(harness):
    """New steps past the end of the snapshot run and commit; the recorded ones are memo hits."""
    _record(harness, _run_all(["charge"]))
    calls: list[str] = []

    def body():
        step = current_job.step
        charge = step.run("charge", lambda: calls.append("charge"))
        receipt = step.run("receipt", lambda: calls.append("receipt") or "sent")
        raise Stop([charge, receipt])

    decision = harness.run(body)
    assert isinstance(decision, decisions.Failure)
    assert decision.error.args == (["charge-value", "sent"],)
    assert calls == ["receipt"]
    assert [r.step_key for r in harness.store.get_steps(harness.run_key)] == ["charge#0", "receipt#0"]


def test_c14_steps_removed_from_the_end_complete_with_one_warning(harness, caplog):
    """Fewer steps than recorded: ``Completed`` and exactly one WARNING naming both sequences."""
    _record(harness, _run_all(["charge", "notify", "receipt"]))
    caplog.set_level(logging.DEBUG, logger="flexiq_plugins")
    decision = harness.run(_run_all(["charge"]))
    assert decision == decisions.Completed(None)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    assert warnings[0].levelno == logging.WARNING
    assert "recorded: charge#0, notify#0, receipt#0" in message
    assert "running: charge#0;" in message or message.endswith("running: charge#0")
    assert "notify#0, receipt#0" in message
