"""Property tests of step identity and replay, C1, C5, C12 and C14.

Hypothesis draws any interleaving of keyed and unkeyed steps over a small
alphabet (so names and keys repeat a lot). A first attempt runs them all and
fails at the end, leaving every row; the replay must then be memo hits only,
with no divergence, whether it runs the steps in the same order or with the
keyed steps moved around (the unkeyed order kept).

Each step's body returns its own idempotency key, so the replayed values also
check that each key was derived as C1 says and matched to the right row.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from flexiq_plugins import DurableConfig, JobEnvelope, MemoryStepStore, current_job
from flexiq_plugins._attempt import decisions
from flexiq_plugins.integration import AttemptDriver, JobInfo

Op = tuple[str, "str | int | None"]

NAMES = st.sampled_from(["a", "b", "ch"])
KEYS = st.one_of(st.none(), st.none(), st.sampled_from(["x", "y", "é"]), st.integers(min_value=0, max_value=3))


def _distinct_keyed(ops: list[Op]) -> list[Op]:
    """Drop keyed calls that would repeat a key (C3 refuses those; they are not what is tested here)."""
    seen: set[tuple[str, str]] = set()
    kept: list[Op] = []
    for name, key in ops:
        if key is not None:
            if (name, str(key)) in seen:
                continue
            seen.add((name, str(key)))
        kept.append((name, key))
    return kept


OPS = st.lists(st.tuples(NAMES, KEYS), max_size=25).map(_distinct_keyed)


def _expected_keys(ops: list[Op]) -> list[str]:
    """C1 by hand: ``name#n`` counting earlier unkeyed calls of the name, ``name:key`` for keyed ones."""
    counts: dict[str, int] = {}
    keys = []
    for name, key in ops:
        if key is None:
            keys.append(f"{name}#{counts.get(name, 0)}")
            counts[name] = counts.get(name, 0) + 1
        else:
            keys.append(f"{name}:{key}")
    return keys


class Stop(Exception):
    """Ends the recording attempt after all its steps committed."""


def _record_then_replay(ops: list[Op], replay: list[Op]) -> tuple[decisions.Decision, list[str]]:
    store = MemoryStepStore()
    driver = AttemptDriver(store, DurableConfig())
    job = JobInfo("run-p", "job-p", JobEnvelope("task", "test"))

    def record():
        for name, key in ops:
            current_job.step.run(name, lambda: current_job.step.idempotency_key, key=key)
        raise Stop

    first = driver.start(job).run(record)
    assert isinstance(first, decisions.Failure)
    assert isinstance(first.error, Stop)
    assert len(store.get_steps("run-p")) == len(ops)

    calls: list[str] = []

    def body():
        return [
            current_job.step.run(name, lambda: calls.append(current_job.step.idempotency_key), key=key)
            for name, key in replay
        ]

    return driver.start(job).run(body), calls


@settings(max_examples=200, deadline=None)
@given(OPS)
def test_c12_replay_in_the_same_order_is_all_memo_hits(ops):
    """Any interleaving of keyed and unkeyed steps, replayed as recorded: memo hits only, no divergence."""
    decision, calls = _record_then_replay(ops, ops)
    assert calls == []
    assert decision == decisions.Completed([f"run-p:{k}" for k in _expected_keys(ops)])


@settings(max_examples=200, deadline=None)
@given(OPS, st.randoms(use_true_random=False))
def test_c12_replay_with_keyed_steps_moved_is_all_memo_hits(ops, rnd: random.Random):
    """Keyed steps replayed in another order and at other places among the unkeyed: no divergence."""
    unkeyed = [op for op in ops if op[1] is None]
    keyed = [op for op in ops if op[1] is not None]
    rnd.shuffle(keyed)
    replay: list[Op] = []
    while unkeyed or keyed:
        source = keyed if keyed and (not unkeyed or rnd.random() < 0.5) else unkeyed
        replay.append(source.pop(0))
    assert [op for op in replay if op[1] is None] == [op for op in ops if op[1] is None]

    decision, calls = _record_then_replay(ops, replay)
    assert calls == []
    assert isinstance(decision, decisions.Completed)
    recorded = dict(zip(_expected_keys(ops), ops, strict=True))
    for op, value in zip(replay, decision.value, strict=True):
        step_key = value.removeprefix("run-p:")
        assert recorded[step_key] == op, f"{op} got the value of {recorded[step_key]}"


@settings(max_examples=100, deadline=None)
@given(OPS, st.integers(min_value=0, max_value=25))
def test_c14_replaying_a_prefix_completes(ops, cut):
    """Replaying only the first steps (the rest removed from the end) completes with memo hits only."""
    decision, calls = _record_then_replay(ops, ops[:cut])
    assert calls == []
    assert decision == decisions.Completed([f"run-p:{k}" for k in _expected_keys(ops)[:cut]])
