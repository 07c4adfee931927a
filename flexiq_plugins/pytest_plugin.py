"""pytest fixtures for testing durable task bodies (registered through the ``pytest11`` entry point).

- ``flexiq_clock``: a [`FakeClock`][flexiq_plugins.testing.FakeClock] at ``START``;
- ``flexiq_store``: an empty [`MemoryStepStore`][flexiq_plugins.MemoryStepStore] on that clock;
- ``durable_run``: a factory, ``durable_run(task, *args, **kwargs)`` gives a
  [`DurableRun`][flexiq_plugins.testing.DurableRun] on that store and clock (each
  call a new run key: ``run-1``, ``run-2`` …).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest

from ._store.memory import MemoryStepStore
from .testing import DurableRun, FakeClock

__all__ = ["durable_run", "flexiq_clock", "flexiq_store"]


@pytest.fixture
def flexiq_clock() -> FakeClock:
    """A store clock that moves only when the test says so."""
    return FakeClock()


@pytest.fixture
def flexiq_store(flexiq_clock: FakeClock) -> MemoryStepStore:
    """An empty in-memory step store on ``flexiq_clock``."""
    return MemoryStepStore(clock=flexiq_clock)


@pytest.fixture
def durable_run(flexiq_store: MemoryStepStore, flexiq_clock: FakeClock) -> Callable[..., DurableRun]:
    """``durable_run(task, *args, **kwargs)``: a [`DurableRun`][flexiq_plugins.testing.DurableRun] of ``task`` on the
    shared store."""
    numbers = itertools.count(1)

    def make(task: Callable[..., Any], *args: Any, **kwargs: Any) -> DurableRun:
        kwargs.setdefault("run_key", f"run-{next(numbers)}")
        return DurableRun(task, *args, store=flexiq_store, clock=flexiq_clock, **kwargs)

    return make
