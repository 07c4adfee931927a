"""Unit-testing durable task bodies without a broker or a worker.

A [`DurableRun`][flexiq_plugins.testing.DurableRun] runs a task body the way a worker would, one attempt at
a time, against an in-memory store on a [`FakeClock`][flexiq_plugins.testing.FakeClock]: the body sees
``current_job`` and its steps are memoized, replayed and checked exactly as
in production. A test can then simulate what happens between attempts:

    from flexiq_plugins.testing import DurableRun

    def test_checkout_charges_once_across_a_crash():
        run = DurableRun(checkout, "order-1")          # the task function and its arguments
        crashed = run.attempt(crash_after_steps=1)     # the worker dies right after "charge" commits
        assert crashed.crashed and run.step_keys == ["charge#0"]
        slept = run.attempt()                          # a redelivery takes the run over, replays "charge"
        assert slept.sleeping
        run.wake()                                     # the sleep elapses on the fake clock
        done = run.attempt()
        assert done.completed and done.value == "receipt sent"
        assert payments.calls == 1

Step retries (C31) and compensations (C32) are driven the same way: an
attempt whose step failed with budget left is
[`AttemptResult.step_retrying`][flexiq_plugins.testing.AttemptResult.step_retrying]
([`DurableRun.wake`][flexiq_plugins.testing.DurableRun.wake] lets its backoff pass), a body that raises
[`SimulatedCrash`][flexiq_plugins.testing.SimulatedCrash] inside a step dies there like a killed worker, and
[`DurableRun.give_up`][flexiq_plugins.testing.DurableRun.give_up] plays a framework that stops retrying.

Events (C33) and cancellation (C34) too: an attempt that waits for an event
is [`AttemptResult.waiting`][flexiq_plugins.testing.AttemptResult.waiting];
[`DurableRun.send_event`][flexiq_plugins.testing.DurableRun.send_event] sends one (the next
[`attempt`][flexiq_plugins.testing.DurableRun.attempt] receives it),
[`DurableRun.wake`][flexiq_plugins.testing.DurableRun.wake] lets a wait's timeout pass, and
[`DurableRun.cancel`][flexiq_plugins.testing.DurableRun.cancel] cancels the run as ``flexiq runs cancel`` does (the next
attempt then runs the undos).

Before a deploy, [`check_runs`][flexiq_plugins.testing.check_runs] checks new code against the runs in
flight (C48), from the store or from a file ``flexiq runs export`` wrote; a CI test:

    from flexiq_plugins.testing import check_runs

    def test_new_code_replays_the_runs_in_flight():
        report = check_runs("tests/data/runs.json", app)   # or a store; app: a Celery app or Dramatiq broker
        assert report.ok, [c.message for c in report.failed]

The pytest plugin ([`flexiq_plugins.pytest_plugin`][flexiq_plugins.pytest_plugin], loaded through the
``pytest11`` entry point) gives the fixtures ``flexiq_clock``,
``flexiq_store`` and ``durable_run``. Nothing here imports a framework: a
Celery task or a Dramatiq actor is turned into its plain function by its
installed adapter ([`task_body`][flexiq_plugins.integration.Adapter.task_body]).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ._attempt import decisions
from ._attempt.attempt import Attempt
from ._attempt.cancellation import CancelResult
from ._attempt.check import RunCheck
from ._attempt.driver import AttemptDriver
from ._attempt.job import JobInfo
from ._delivery.cancel import cancel_run
from ._delivery.deploys import CheckReport, check_runs
from ._delivery.events import EventSent, send_event
from ._delivery.tasks import task_body
from ._model.config import DurableConfig
from ._model.durations import parse_duration
from ._model.policies import CancellationPolicy, RetryPolicy, cancellation_option, retry_policy_option
from ._model.records import DeadLetterRecord, JobEnvelope, RunRecord, StepAttempt, StepRow
from ._store.base import StepStore
from ._store.memory import MemoryStepStore

__all__ = [
    "START",
    "AttemptResult",
    "CheckReport",
    "DurableRun",
    "FakeClock",
    "RunCheck",
    "SimulatedCrash",
    "check_runs",
    "task_body",
]

START = 1_700_000_000.0
"""Where a [`FakeClock`][flexiq_plugins.testing.FakeClock] starts, epoch seconds (2023-11-14 22:13:20 UTC)."""

_job_ids = itertools.count(1)


class FakeClock:
    """A store clock that moves only when told to (epoch seconds).

    Parameters:
      start (float): the initial time, epoch seconds.
    """

    def __init__(self, start: float = START) -> None:
        self.t = float(start)

    def __call__(self) -> float:
        """The current time, epoch seconds."""
        return self.t

    def advance(self, duration: str | float) -> None:
        """Move the clock forward by ``duration`` (seconds, ``"1h"``, a ``timedelta``)."""
        self.t += parse_duration(duration)


class SimulatedCrash(BaseException):
    """Raised inside an attempt to stop it the way a killed worker stops: nothing more is recorded."""


@dataclass(frozen=True)
class AttemptResult:
    """What one attempt did.

    Parameters:
      number (int | None): the attempt's number (``None`` if it never started: busy, duplicate …).
      decision (Decision | None): what the core decided; ``None`` for a simulated crash.
    """

    number: int | None
    decision: decisions.Decision | None

    @property
    def crashed(self) -> bool:
        """The attempt was stopped by [`SimulatedCrash`][flexiq_plugins.testing.SimulatedCrash]; its claim is still
        held."""
        return self.decision is None and self.number is not None

    @property
    def completed(self) -> bool:
        """The body returned and the run succeeded."""
        return isinstance(self.decision, decisions.Completed)

    @property
    def sleeping(self) -> bool:
        """The body slept (``step.sleep``); [`DurableRun.wake`][flexiq_plugins.testing.DurableRun.wake] lets the time
        pass."""
        return isinstance(self.decision, decisions.PutBack) and self.decision.reason is decisions.PutBackReason.SLEEP

    @property
    def step_retrying(self) -> bool:
        """A step with a retry budget failed with attempts left (C31);
        [`DurableRun.wake`][flexiq_plugins.testing.DurableRun.wake] lets its backoff pass."""
        return (
            isinstance(self.decision, decisions.PutBack) and self.decision.reason is decisions.PutBackReason.STEP_RETRY
        )

    @property
    def waiting(self) -> bool:
        """The body waits for an event (C33): [`DurableRun.send_event`][flexiq_plugins.testing.DurableRun.send_event]
        sends it, [`DurableRun.wake`][flexiq_plugins.testing.DurableRun.wake] lets its timeout pass."""
        decision = self.decision
        if isinstance(decision, decisions.PutBack):
            return decision.reason is decisions.PutBackReason.WAIT
        return isinstance(decision, decisions.Ack) and decision.reason is decisions.AckReason.WAITING

    @property
    def cancelled(self) -> bool:
        """The run was cancelled (C34): on request or over a run cap; its undos ran."""
        return isinstance(self.decision, decisions.Ack) and self.decision.reason is decisions.AckReason.CANCELLED

    @property
    def failed(self) -> bool:
        """The body raised a retryable error (the framework's retry policy would decide)."""
        return isinstance(self.decision, decisions.Failure)

    @property
    def dead_lettered(self) -> bool:
        """The job went to the dead letters (divergence, size limit …)."""
        return isinstance(self.decision, decisions.DeadLetter)

    @property
    def value(self) -> Any:
        """The body's return value (``None`` unless [`completed`][flexiq_plugins.testing.AttemptResult.completed])."""
        return self.decision.value if isinstance(self.decision, decisions.Completed) else None

    @property
    def error(self) -> BaseException | None:
        """What the body raised, for a failed or dead-lettered attempt."""
        if isinstance(self.decision, (decisions.Failure, decisions.DeadLetter)):
            return self.decision.error
        return None


def _option_of(task: object, name: str) -> object:
    """A Celery task's attribute ``name`` or a Dramatiq actor's option ``name``, if any."""
    options = getattr(task, "options", None)
    return options.get(name) if isinstance(options, dict) else getattr(task, name, None)


def _step_retry_of(task: object) -> RetryPolicy | None:
    """A Celery task's ``step_retry`` attribute or a Dramatiq actor's ``step_retry`` option, if any."""
    return retry_policy_option(_option_of(task, "step_retry"), where=f"{task!r} step_retry")


def _cancellation_of(task: object) -> CancellationPolicy | None:
    """A Celery task's or a Dramatiq actor's ``max_run_seconds`` / ``max_suspended_seconds`` (C34), if any."""
    caps = (_option_of(task, "max_run_seconds"), _option_of(task, "max_suspended_seconds"))
    return cancellation_option(*caps, where=repr(task))


class DurableRun:
    """One run of a task body, driven attempt by attempt against an in-memory store.

    Parameters:
      task (Callable[..., Any]): the task function, a Celery task or a Dramatiq actor.
      *args (Any): the job's positional arguments.
      **kwargs (Any): the job's keyword arguments.
      run_key (str): the run's key (default ``"run-1"``); steps' idempotency keys start with it.
      store (StepStore | None): where the run lives; a [`MemoryStepStore`][flexiq_plugins.MemoryStepStore] on ``clock``
        by default.
      clock (FakeClock | None): the store's clock when the store is made here.
      config (DurableConfig | None): the options (size limits, run caps, lease, ``step_retry`` …); defaults otherwise.
      task_name (str | None): the name recorded with the run (default: the function's name).

    A Celery task's or Dramatiq actor's own ``step_retry`` option (C31) and
    run caps (``max_run_seconds``, ``max_suspended_seconds``, C34) are used as its
    workers would use them.
    """

    def __init__(
        self,
        task: Callable[..., Any],
        *args: Any,
        run_key: str = "run-1",
        store: StepStore | None = None,
        clock: FakeClock | None = None,
        config: DurableConfig | None = None,
        task_name: str | None = None,
        **kwargs: Any,
    ) -> None:
        self.body = task_body(task)
        self.step_retry = _step_retry_of(task)
        self.cancellation = _cancellation_of(task)
        self.args, self.kwargs = args, kwargs
        self.run_key = run_key
        self.clock = clock or FakeClock()
        self.store = store if store is not None else MemoryStepStore(clock=self.clock)
        self.driver = AttemptDriver(self.store, config)
        name = task_name or getattr(self.body, "__qualname__", None) or repr(self.body)
        self.envelope = JobEnvelope(name, "test", None, list(args), dict(kwargs))
        self.results: list[AttemptResult] = []

    # -------------------------------------------------------------- attempts
    def attempt(self, *, crash_after_steps: int | None = None) -> AttemptResult:
        """Run the body once more, as the next delivery of the job would.

        If the previous attempt crashed, its claim is taken over first (the
        clock moves past its lease, as a redelivery after a dead worker does).
        A body (or a step body, or an undo) that raises [`SimulatedCrash`][flexiq_plugins.testing.SimulatedCrash]
        crashes the attempt there.

        Parameters:
          crash_after_steps (int | None): stop this attempt right after it has
            committed that many *new* steps (``0``: before the first one), as
            if the worker were killed there; nothing else is recorded.
        """
        if self.results and self.results[-1].crashed:
            self.clock.advance(self.driver.config.lease_seconds + 1)
        job = JobInfo(self.run_key, f"job-{next(_job_ids)}", self.envelope, self.step_retry, self.cancellation)
        started = self.driver.start(job)
        if not isinstance(started, Attempt):
            return self._record(AttemptResult(None, started))
        if crash_after_steps is not None:
            self._crash_after(started, crash_after_steps)
        try:
            with started.activate():
                if crash_after_steps == 0:
                    raise SimulatedCrash("simulated crash before the first step")
                value = self.body(*self.args, **self.kwargs)
        except SimulatedCrash:
            return self._record(AttemptResult(started.number, None))
        except BaseException as exc:
            return self._record(self._conclude(started, error=exc))
        return self._record(self._conclude(started, value=value))

    @staticmethod
    def _conclude(attempt: Attempt, **how: Any) -> AttemptResult:
        try:
            return AttemptResult(attempt.number, attempt.conclude(**how))
        except SimulatedCrash:  # inside an undo (C32)
            return AttemptResult(attempt.number, None)

    @staticmethod
    def _crash_after(attempt: Attempt, steps: int) -> None:
        commits = [0]
        record = attempt.journal.record  # called once a step's row is committed (a transactional one's too)

        def record_then_maybe_crash(stored: StepRow) -> None:
            record(stored)
            commits[0] += 1
            if commits[0] >= steps:
                raise SimulatedCrash(f"simulated crash after step {stored.step_key!r}")

        attempt.journal.record = record_then_maybe_crash  # type: ignore[method-assign]

    def _record(self, result: AttemptResult) -> AttemptResult:
        self.results.append(result)
        return result

    def wake(self) -> None:
        """Move the clock to the wake time of the last sleep, step retry (C31) or wait's deadline (C33)."""
        last = self.results[-1].decision if self.results else None
        if not isinstance(last, decisions.PutBack) or last.wake_at is None:
            raise RuntimeError("the last attempt did not sleep or wait with a deadline; nothing to wake from")
        self.clock.advance(max(last.wake_at - self.clock(), 0.0))

    def send_event(self, topic: str, key: str, payload: Any = None, *, to_this_run: bool = False) -> EventSent:
        """Send the event ``(topic, key)`` as [`flexiq_plugins.send_event`][flexiq_plugins.send_event] does, into this
        run's store (C33).

        No worker is woken here: the next [`attempt`][flexiq_plugins.testing.DurableRun.attempt] is the delivery that
        receives it.

        Parameters:
          topic (str): the topic.
          key (str): the key.
          payload (Any): what the wait returns.
          to_this_run (bool): send it to this run only (by its run key).
        """
        run_key = self.run_key if to_this_run else None
        return send_event(
            topic, key, payload, run_key=run_key, store=self.store, publishers={}, codec=self.driver.codec
        )

    def cancel(self, reason: str = "") -> CancelResult:
        """Cancel the run as ``flexiq runs cancel`` does (C34); its undos, if any, run at the next
        [`attempt`][flexiq_plugins.testing.DurableRun.attempt]."""
        return cancel_run(self.run_key, reason=reason, store=self.store, publishers={})

    def give_up(self) -> decisions.PutBack | None:
        """Play a framework that will not retry the last attempt's failure (C26, C32).

        The run is settled ``failed``; or, if it has committed steps with
        undos, it waits for its compensation and the returned ``PutBack`` says
        so: the next [`attempt`][flexiq_plugins.testing.DurableRun.attempt] runs the undos.

        Raises:
          RuntimeError: the last attempt did not fail with a retryable error.
        """
        last = self.results[-1].decision if self.results else None
        if not isinstance(last, decisions.Failure):
            raise RuntimeError("the last attempt did not fail with a retryable error; nothing to give up on")
        return self.driver.give_up(last)

    def until_done(self, *, max_attempts: int = 100) -> AttemptResult:
        """Run attempts, letting every sleep and step backoff elapse, until the run is done or dead-lettered.

        A [`Failure`][flexiq_plugins.integration.Failure] is retried (as a framework
        with retries left would); a crashed attempt is followed by a takeover.
        Returns the last attempt's result.

        Raises:
          RuntimeError: still not done after ``max_attempts`` attempts.
        """
        for _ in range(max_attempts):
            result = self.attempt()
            if (
                result.sleeping
                or result.step_retrying
                or (result.waiting and isinstance(result.decision, decisions.PutBack))
            ):
                self.wake()
            elif not (result.failed or result.crashed or isinstance(result.decision, decisions.PutBack)):
                return result
        raise RuntimeError(f"run {self.run_key!r} not done after {max_attempts} attempts")

    # ------------------------------------------------------------ inspection
    @property
    def record(self) -> RunRecord:
        """The run as stored."""
        return self.store.get_run(self.run_key)

    @property
    def status(self) -> str:
        """The run's status: ``running``, ``sleeping``, ``retrying``, ``succeeded``, ``dead`` …"""
        return self.record.status

    @property
    def steps(self) -> list[StepRow]:
        """The run's committed step rows, by position (dropped once the run succeeds, unless kept)."""
        return self.store.get_steps(self.run_key)

    @property
    def step_keys(self) -> list[str]:
        """The committed steps' keys, e.g. ``["charge#0", "sleep#0"]``."""
        return [row.step_key for row in self.steps]

    def value_of(self, step_key: str) -> Any:
        """The decoded value a committed ``run`` step stored.

        Raises:
          KeyError: no committed step has that key.
        """
        for row in self.steps:
            if row.step_key == step_key and row.value is not None:
                return self.driver.codec.decode(row.value, step_key=step_key)
        raise KeyError(f"run {self.run_key!r} has no committed step {step_key!r}; it has {self.step_keys}")

    @property
    def step_attempts(self) -> list[StepAttempt]:
        """The run's recorded step attempts (C31): each with its number, how it ended and its error."""
        return self.store.get_step_attempts(self.run_key)

    @property
    def dead_letters(self) -> list[DeadLetterRecord]:
        """The run's dead letters (reason, message, traceback …), oldest first."""
        return [d for d in self.store.list_dead_letters(include_retried=True) if d.run_key == self.run_key]
