"""Fixtures for the core's rule tests: a controllable store clock and a harness per run.

The core is driven directly, the way an adapter drives it: ``AttemptDriver.start``
gives an ``Attempt`` (or a decision at once), ``Attempt.run(body)`` gives the
decision. No Celery, no Dramatiq. Time is the store's clock, which these tests
move by hand, so a sleep "passes" without anyone waiting for it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from flexiq_plugins import DurableConfig, JobEnvelope, MemoryStepStore, StepStore
from flexiq_plugins.integration import Attempt, AttemptDriver, JobInfo

START = 1_700_000_000.0
"""The fake store clock's start, epoch seconds (2023-11-14, a plain UTC instant)."""


class FakeClock:
    """A store clock that moves only when told to (epoch seconds)."""

    def __init__(self, start: float = START) -> None:
        self.t = start

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds``."""
        self.t += seconds


class Harness:
    """One run of one task against one store and driver.

    Parameters:
      store(StepStore): where the run lives.
      config(DurableConfig): the driver's options.
      run_key(str): the run under test.
    """

    def __init__(self, store: StepStore, config: DurableConfig, run_key: str = "run-1") -> None:
        self.store = store
        self.driver = AttemptDriver(store, config)
        self.run_key = run_key

    def job(self, job_id: str = "job-1", run_key: str | None = None) -> JobInfo:
        """A ``JobInfo`` of this run (or of ``run_key``) with task name ``task``."""
        return JobInfo(run_key or self.run_key, job_id, JobEnvelope("task", "test"))

    def start(self, job_id: str = "job-1", owner: str | None = None) -> Attempt:
        """Start an attempt; fails the test if the driver answered with a decision instead."""
        attempt = self.driver.start(self.job(job_id), owner=owner)
        assert isinstance(attempt, Attempt), f"expected an Attempt, got {attempt!r}"
        return attempt

    def run(self, body: Callable[[], Any], job_id: str = "job-1", owner: str | None = None) -> Any:
        """Start an attempt and run ``body`` as its task body; return the decision."""
        return self.start(job_id, owner).run(body)


@pytest.fixture
def clock() -> FakeClock:
    """A store clock frozen at ``START`` until a test advances it."""
    return FakeClock()


@pytest.fixture
def memory_store(clock: FakeClock) -> MemoryStepStore:
    """An empty in-memory store on the fake clock."""
    return MemoryStepStore(clock=clock)


@pytest.fixture
def make_harness(memory_store: MemoryStepStore) -> Callable[..., Harness]:
    """A factory of harnesses sharing ``memory_store``; keyword arguments go to ``DurableConfig``."""

    def make(run_key: str = "run-1", **config: Any) -> Harness:
        return Harness(memory_store, DurableConfig(**config), run_key)

    return make


@pytest.fixture
def harness(make_harness: Callable[..., Harness]) -> Harness:
    """A harness with the default configuration on the fake clock."""
    return make_harness()
