"""Steps run one at a time, C8: a second step while one is uncommitted fails the attempt.

The overlapping cases are forced with events, not timing: the first step's body
waits until the second step has been refused, so both really overlap.
"""

from __future__ import annotations

import asyncio
import threading

from flexiq_plugins import current_job
from flexiq_plugins._attempt import decisions
from flexiq_plugins.errors import ConcurrentStep


def _keys(harness) -> list[str]:
    return [row.step_key for row in harness.store.get_steps(harness.run_key)]


def test_c8_step_inside_a_step_body_is_concurrent(harness):
    """A step started inside another step's body raises ``ConcurrentStep``; the attempt is dead-lettered."""
    inner_calls: list[str] = []

    def outer():
        return current_job.step.run("inner", lambda: inner_calls.append("ran"))

    decision = harness.run(lambda: current_job.step.run("outer", outer))
    assert isinstance(decision, decisions.DeadLetter)
    assert decision.reason == "concurrent_step"
    assert isinstance(decision.error, ConcurrentStep)
    assert "'outer#0'" in decision.message
    assert inner_calls == []
    assert _keys(harness) == []


def test_c8_step_inside_a_step_body_caught_by_the_body_still_fails(harness):
    """Catching the nested step's ``ConcurrentStep`` does not let the attempt succeed."""

    def outer():
        try:  # noqa: SIM105 - a task body swallowing on purpose is the case under test
            current_job.step.run("inner", lambda: "x")
        except ConcurrentStep:
            pass
        return "outer-value"

    decision = harness.run(lambda: current_job.step.run("outer", outer))
    assert isinstance(decision, decisions.DeadLetter)
    assert isinstance(decision.error, ConcurrentStep)


def test_c8_sleep_inside_a_step_body_is_concurrent_not_a_sleep(harness):
    """A sleep inside a step body is refused like any nested step: no sleep row, no put-back for a sleep."""
    decision = harness.run(lambda: current_job.step.run("outer", lambda: current_job.step.sleep("1h")))
    assert isinstance(decision, decisions.DeadLetter)
    assert isinstance(decision.error, ConcurrentStep)
    assert _keys(harness) == []


def test_c8_steps_from_two_overlapping_threads_fail_the_attempt(harness):
    """Thread B's step while thread A's step body is running raises ``ConcurrentStep``; dead-lettered."""
    a_inside = threading.Event()
    b_done = threading.Event()
    results: dict[str, object] = {}

    def body():
        step = current_job.step

        def slow():
            a_inside.set()
            assert b_done.wait(5), "thread B never tried its step"
            return "a"

        def thread_a():
            results["a"] = step.run("a", slow)

        def thread_b():
            assert a_inside.wait(5), "thread A never entered its step"
            try:
                results["b"] = step.run("b", lambda: "b")
            except ConcurrentStep as exc:
                results["b"] = exc
            finally:
                b_done.set()

        threads = [threading.Thread(target=thread_a), threading.Thread(target=thread_b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        return "body returned"

    decision = harness.run(body)
    assert isinstance(results["b"], ConcurrentStep)
    assert "'a#0'" in str(results["b"])
    assert results["a"] == "a"
    assert isinstance(decision, decisions.DeadLetter)
    assert decision.reason == "concurrent_step"
    assert "b#0" not in _keys(harness)


def test_c8_asyncio_gather_over_two_arun_fails_the_attempt(harness):
    """``asyncio.gather`` over two ``arun`` steps raises ``ConcurrentStep`` for one; the attempt fails."""
    bodies_run: list[str] = []

    async def fetch(name: str) -> str:
        bodies_run.append(name)
        await asyncio.sleep(0)
        return name

    async def body():
        step = current_job.step
        results = await asyncio.gather(
            step.arun("one", lambda: fetch("one")),
            step.arun("two", lambda: fetch("two")),
            return_exceptions=True,
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        assert len(errors) == 1
        assert isinstance(errors[0], ConcurrentStep)
        return results

    decision = asyncio.run(harness.start().arun(body))
    assert isinstance(decision, decisions.DeadLetter)
    assert decision.reason == "concurrent_step"
    assert bodies_run == ["one"]


def test_c8_asyncio_gather_is_refused_even_when_the_step_bodies_never_yield(harness):
    """``gather`` over two ``arun`` fails even if neither body awaits anything: overlap is never by luck."""

    async def instant(name: str) -> str:
        return name

    async def body():
        step = current_job.step
        return await asyncio.gather(step.arun("one", lambda: instant("one")), step.arun("two", lambda: instant("two")))

    decision = asyncio.run(harness.start().arun(body))
    assert isinstance(decision, decisions.DeadLetter)
    assert isinstance(decision.error, ConcurrentStep)


def test_c8_sequential_arun_steps_are_fine(harness):
    """Awaiting ``arun`` steps one after the other is not concurrency: both commit, the attempt completes."""

    async def body():
        step = current_job.step
        first = await step.arun("one", lambda: asyncio.sleep(0, result=1))
        second = await step.arun("two", lambda: asyncio.sleep(0, result=2))
        return [first, second]

    decision = asyncio.run(harness.start().arun(body))
    assert decision == decisions.Completed([1, 2])
