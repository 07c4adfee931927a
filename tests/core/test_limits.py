"""Size limits, C22: enforced on the encoded bytes, refusing the commit and dead-lettering the job.

Small custom ``Limits`` keep the values tiny; the expected sizes are computed
with the same codec chain the driver uses, header included, because the stored
bytes are what the size limits measure.
"""

from __future__ import annotations

from unittest.mock import ANY

import pytest

from flexiq_plugins import CodecChain, DurableConfig, Limits, ZlibCodec, current_job
from flexiq_plugins._attempt import decisions
from flexiq_plugins.errors import StepLimitExceeded


def _size(value: object, chain: CodecChain | None = None) -> int:
    return len((chain or CodecChain()).encode(value))


def _dead(decision) -> decisions.DeadLetter:
    assert isinstance(decision, decisions.DeadLetter), decision
    assert decision.reason == "size_limit"
    assert isinstance(decision.error, StepLimitExceeded)
    return decision


def test_c22_step_bytes_limit_refuses_the_commit_with_the_exact_message(make_harness):
    """A value over the step bytes limit: ``step 'render#0' exceeds the step bytes limit: N > M``; no row."""
    limit = 64
    harness = make_harness(step_bytes=limit)
    value = "x" * 100
    calls: list[str] = []

    decision = _dead(harness.run(lambda: current_job.step.run("render", lambda: calls.append("r") or value)))
    assert decision.message == f"step 'render#0' exceeds the step bytes limit: {_size(value)} > {limit}"
    assert calls == ["r"]
    assert harness.store.get_steps(harness.run_key) == []
    assert harness.store.get_run(harness.run_key).status == "dead"


def test_c22_step_bytes_limit_is_inclusive(make_harness):
    """A value whose encoded size equals the limit is committed."""
    value = "x" * 100
    harness = make_harness(step_bytes=_size(value))
    assert harness.run(lambda: current_job.step.run("render", lambda: value)) == decisions.Completed(value)


def test_c22_size_limits_measure_the_bytes_after_the_codecs(make_harness):
    """With zlib, a value far larger than the limit before compression fits after it."""
    chain = CodecChain(codecs=[ZlibCodec()])
    value = "a" * 10_000
    assert _size(value, chain) < 100 < _size(value)
    harness = make_harness(serializer=chain.serializer, codecs=chain.codecs, step_bytes=100)
    assert harness.run(lambda: current_job.step.run("render", lambda: value)) == decisions.Completed(value)


def test_c22_run_bytes_limit_counts_every_step_of_the_run(make_harness):
    """Steps that fit alone are refused once their total, replays included, exceeds the run bytes limit."""
    one = _size("y" * 20)
    harness = make_harness(run_bytes=2 * one + 5)

    def first():
        current_job.step.run("a", lambda: "y" * 20)
        raise RuntimeError("retry")

    harness.run(first)

    def body():
        step = current_job.step
        step.run("a", lambda: "never")
        step.run("b", lambda: "y" * 20)
        step.run("c", lambda: "y" * 20)

    decision = _dead(harness.run(body))
    assert decision.message == f"step 'c#0' exceeds the run bytes limit: {3 * one} > {2 * one + 5}"
    assert [r.step_key for r in harness.store.get_steps(harness.run_key)] == ["a#0", "b#0"]


def test_c22_run_step_count_limit_counts_sleeps_too(make_harness, clock):
    """The number of steps in one run is capped; a sleep is a step; the refused step is not committed."""
    harness = make_harness(run_steps=2)

    def body():
        step = current_job.step
        step.run("a", lambda: 1)
        step.sleep("1s")
        step.run("b", lambda: 2)

    assert harness.run(body) == decisions.PutBack(decisions.PutBackReason.SLEEP, ANY, ANY, ANY)
    clock.advance(5)
    decision = _dead(harness.run(body))
    assert decision.message == "step 'b#0' exceeds the run step count limit: 3 > 2"
    assert [r.step_key for r in harness.store.get_steps(harness.run_key)] == ["a#0", "sleep#0"]


def test_c22_size_limit_caught_by_the_body_still_dead_letters(make_harness):
    """Catching ``StepLimitExceeded`` and returning does not turn the refusal into a success."""
    harness = make_harness(step_bytes=10)

    def body():
        try:
            current_job.step.run("render", lambda: "z" * 50)
        except StepLimitExceeded:
            return "handled"

    _dead(harness.run(body))


def test_c22_default_limits_are_the_documented_ones():
    """Defaults: 262,144 bytes per step, 4 MiB per run, 10,000 steps per run."""
    assert DurableConfig().limits == Limits(step_bytes=262_144, run_bytes=4 * 1024 * 1024, run_steps=10_000)


@pytest.mark.parametrize("size", [262_145, 1_468_006])
def test_c22_default_step_limit_message_matches_the_documented_form(harness, size):
    """Over the default limit the message reads ``... step bytes limit: N > 262144``."""
    value = "r" * (size - _size(""))
    assert _size(value) == size
    decision = _dead(harness.run(lambda: current_job.step.run("render", lambda: value)))
    assert decision.message == f"step 'render#0' exceeds the step bytes limit: {size} > 262144"
