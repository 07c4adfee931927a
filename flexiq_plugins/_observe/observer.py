"""The observer interface: what the core reports, and to whom (C53).

Three small interfaces, one per scope:

- `Observer`: one per driver (process-wide facts: a recovery
  re-publish, a store outage, a store to sample for gauges), and the maker of
  one `AttemptObservation` per attempt, or ``None`` when nothing would be
  recorded (then the attempt reports nothing at all).
- `AttemptObservation`: one attempt of a run, from its start to its
  outcome: its claim, each executed step (a `StepObservation`), each
  memo hit, each store commit, the run's committed status.
- `StepObservation`: one executed step, from its start to its outcome.

Outcomes of an executed step: ``committed``, ``failed`` (the body raised; or
the step failed for good), ``retry_scheduled`` (its budget brings it back,
C31), ``exhausted`` (its budget is spent), ``refused`` (the journal refused
it: a cap, a concurrent step, an open transaction, a cancellation …) and
``suspended`` (a wait that found no event yet, C33). A memo hit is not an
executed step: it is counted as ``replayed``.

A step map (C51) is one executed step of kind ``map`` while any of its items
runs, and each item that runs is an executed step of its own (kind ``run``),
started without being made current in the calling thread: its body runs in a
thread or task of its own, where `StepObservation.activate` makes it current.
A patch marker (C49) a run commits is an executed step of kind ``patch``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Literal, Protocol

from .._model.identity import StepId

__all__ = ["AttemptObservation", "Attribute", "Observer", "StepKindName", "StepObservation", "StepOutcome"]

Attribute = str | bool | int | float
"""An attribute value of an event (OpenTelemetry's primitive types)."""

StepOutcome = Literal["committed", "failed", "retry_scheduled", "exhausted", "refused", "suspended"]
"""How an executed step ended; see the module docstring."""

StepKindName = Literal["run", "transaction", "sleep", "wait", "compensation", "map", "patch"]
"""The kind of a step as observers name it: ``step.run`` (and each item of a step map), ``step.transaction``,
``step.sleep``, ``step.wait_for_event`` (its start and what it received), an undo (C32), a step map as a whole
(C51) and the marker of ``step.patched`` (C49)."""

CountRuns = Callable[[Collection[str]], Mapping[str, int]]
"""How an observer reads the number of runs per status from a store (``StepStore.count_runs``)."""


class StepObservation(Protocol):
    """One executed step, started by `AttemptObservation.step`."""

    def event(self, name: str, attributes: Mapping[str, Attribute]) -> None:
        """Note something that happened in the step (a sleep's wake time, a wait's topic and key)."""

    def activate(self) -> object:
        """Make the step current in the calling context (a step map item's body, in its own thread or task)."""

    def deactivate(self, token: object) -> None:
        """Undo `activate`, in the same context."""

    def end(self, outcome: StepOutcome, *, size: int = 0, error: BaseException | None = None) -> None:
        """The step ended with ``outcome``; ``size`` is its committed value in bytes, ``error`` what failed it."""


class AttemptObservation(Protocol):
    """One attempt of a run, started by `Observer.attempt` and ended by `ended`.

    Attributes:
      trace_context (str | None): the W3C ``traceparent`` of the span the
        attempt runs under, to store with the run if it has none (C53);
        ``None`` when the attempt is not traced.
    """

    trace_context: str | None

    def activate(self) -> object:
        """Make the attempt's span current in the calling context while the body runs; return a token."""

    def deactivate(self, token: object) -> None:
        """Undo `activate`, in the same context."""

    def claimed(self, attempt: int, first_trace: str | None) -> None:
        """The run is claimed as attempt ``attempt``; ``first_trace`` is its stored first trace context, if any."""

    def step(self, step: StepId, kind: StepKindName, position: int, *, current: bool = True) -> StepObservation:
        """A new step starts executing at ``position`` (its body runs next, under it).

        With ``current=False`` (a step map's item, C51) it is not made current
        in the calling context: its body makes it current where it runs.
        """

    def replayed(self, step: StepId) -> None:
        """A step was answered from its memo (C9): no span, counted."""

    def committed(self, seconds: float) -> None:
        """One step row was committed in the store in ``seconds``."""

    def event(self, name: str, attributes: Mapping[str, Attribute]) -> None:
        """Note something that happened outside a step (a divergence, a compensation's start)."""

    def finished(self, status: str, *, reason: str | None = None, message: str | None = None) -> None:
        """The attempt committed the run's ``status``; ``reason`` and ``message`` of a dead letter or cancellation."""

    def ended(self, outcome: str, error: BaseException | None = None) -> None:
        """The attempt ended with ``outcome`` (e.g. ``completed``, ``put_back:sleep``); nothing is reported after."""


class Observer(Protocol):
    """What a driver's process reports to, and where each attempt's observation comes from."""

    def attempt(self, *, run_key: str, job_id: str, task: str, publish_trace: str | None) -> AttemptObservation | None:
        """Start observing one attempt, or ``None`` when nothing would be recorded (no cost then).

        ``publish_trace`` is the W3C ``traceparent`` of the span that published the job, if its message carries one.
        """

    def republished(self, why: str, task: str) -> None:
        """Recovery re-published a run of ``task`` for ``why`` (C35, C39)."""

    def store_unavailable(self) -> None:
        """An attempt met a store outage and was put back (C28, C41)."""

    def watch(self, count_runs: CountRuns) -> None:
        """Sample this store's sleeping and waiting runs for a gauge (at most every 30 s)."""
