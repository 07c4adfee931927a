"""A failed attempt leaves no reference cycle: its exception goes when its decision goes.

The adapters re-raise the error a :class:`~flexiq_plugins._attempt.decisions.Failure`
holds; the traceback then references every frame the error passed through.
If a frame of the core kept the error (or the decision) it would form a cycle
the cyclic collector alone frees: the exception, its traceback and the task
body's locals would stay in memory after every failed attempt. These tests
run with the collector disabled, so only reference counting frees anything.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

import pytest

from flexiq_plugins import current_job
from flexiq_plugins._attempt.decisions import Failure
from tests.core.conftest import Harness


class Big:
    """A large local of a task body (weakly referenceable)."""

    def __init__(self) -> None:
        self.payload = bytearray(1_000_000)


class Boom(RuntimeError):
    """The body's error (a subclass: built-in exceptions take no weak reference)."""


@pytest.fixture
def no_gc(collector_off: None) -> None:
    """The cyclic garbage collector off for the test."""


def _boom(refs: list[weakref.ref[Any]]) -> Boom:
    error = Boom("boom")
    refs.append(weakref.ref(error))
    return error


@pytest.mark.parametrize("steps", [0, 2])
def test_c26_a_failed_attempt_frees_its_error_once_its_decision_is_dropped(
    harness: Harness, no_gc: None, steps: int
) -> None:
    """C26: the error of a failed attempt, and the body's 1 MB local, are freed by reference counting as soon as
    the adapter drops the ``Failure``: no frame of the core keeps them in a cycle."""
    refs: list[weakref.ref[Any]] = []

    def body() -> None:
        big = Big()
        refs.append(weakref.ref(big))
        for n in range(steps):
            current_job.step.run(f"s{n}", lambda n=n: n)
        raise _boom(refs)

    decision = harness.run(body)
    assert isinstance(decision, Failure)
    assert refs[1]() is decision.error
    del decision
    assert [r() for r in refs] == [None, None]


def test_c26_a_failed_async_attempt_frees_its_error_once_its_decision_is_dropped(harness: Harness, no_gc: None) -> None:
    """C26: the same for an ``async def`` body (``Attempt.arun``)."""
    refs: list[weakref.ref[Any]] = []

    async def body() -> None:
        big = Big()
        refs.append(weakref.ref(big))
        raise _boom(refs)

    decision = asyncio.run(harness.start().arun(body))
    assert isinstance(decision, Failure)
    del decision
    assert [r() for r in refs] == [None, None]
