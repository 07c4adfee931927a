"""C43: which tasks take steps, learned from their first step and read back at most every refresh interval.

`KnownTasks` is one process's view: a task is noted in the store the first time one of its attempts takes a
step (once per process), and read back at most every ``known_tasks_refresh_seconds``; a store error fails
nothing. ``durable_at_publish`` is the one rule both adapters follow at publish. A lazy attempt that a
worker shutdown interrupts before any step hands the framework its own exception back.
"""

from __future__ import annotations

from typing import Any

import pytest

from flexiq_plugins import ConfigurationError, DurableConfig, JobEnvelope, MemoryStepStore, current_job
from flexiq_plugins._attempt.decisions import Completed, Failure
from flexiq_plugins._attempt.known_tasks import KnownTasks
from flexiq_plugins.errors import StoreUnavailable, WorkerInterrupted
from flexiq_plugins.integration import AttemptDriver, JobInfo, durable_at_publish
from tests.core.conftest import FakeClock


class NotingStore(MemoryStepStore):
    """A memory store that counts the known-task reads and notes, and can be made unreachable."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock=clock)
        self.reads = 0
        self.notes: list[tuple[str, str]] = []
        self.down = False

    def durable_tasks(self) -> Any:
        self.reads += 1
        if self.down:
            raise StoreUnavailable("the store is down (test)")
        return super().durable_tasks()

    def note_durable_task(self, name: str, framework: str) -> None:
        if self.down:
            raise StoreUnavailable("the store is down (test)")
        self.notes.append((framework, name))
        super().note_durable_task(name, framework)


class Monotonic:
    """A monotonic clock that moves only when told to."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def store(clock: FakeClock) -> NotingStore:
    return NotingStore(clock)


def test_c43_known_tasks_are_read_once_per_interval_for_every_task_asked_about(store: NotingStore) -> None:
    """C43: the first question reads the store; until the interval has passed, none reads it again, whatever
    the task; after it, the next question does, and finds a task another process noted meanwhile."""
    tick = Monotonic()
    known = KnownTasks(store, 30.0, clock=tick)
    assert known.is_known("celery", "a") is False
    assert (known.is_known("celery", "b"), known.is_known("dramatiq", "a"), store.reads) == (False, False, 1)
    store.note_durable_task("b", "celery")  # another process's first step
    tick.t += 29
    assert (known.is_known("celery", "b"), store.reads) == (False, 1)
    tick.t += 1
    assert (known.is_known("celery", "b"), store.reads) == (True, 2)
    assert (known.is_known("celery", "b"), store.reads) == (True, 2)  # known: answered from memory


def test_c43_a_task_that_took_a_step_is_noted_once_and_known_at_once(store: NotingStore) -> None:
    """C43: the first step notes the task (one insert-if-absent) and this process knows it without a read;
    later steps of it note nothing."""
    known = KnownTasks(store, 30.0, clock=Monotonic())
    known.took_step("celery", "shop.charge")
    known.took_step("celery", "shop.charge")
    assert store.notes == [("celery", "shop.charge")]
    assert (known.is_known("celery", "shop.charge"), store.reads) == (True, 0)
    assert [(t.framework, t.name) for t in store.durable_tasks()] == [("celery", "shop.charge")]


def test_c43_a_store_error_fails_nothing_and_is_tried_again(store: NotingStore) -> None:
    """C43: an unreachable store answers "not known" (the job is then claimed at its first step); the read is
    tried again after the interval, and a note that failed is tried again at the task's next step."""
    tick = Monotonic()
    known = KnownTasks(store, 30.0, clock=tick)
    store.down = True
    assert known.is_known("celery", "a") is False
    known.took_step("celery", "a")
    assert store.notes == []
    store.down = False
    assert (known.is_known("celery", "a"), store.reads) == (False, 1)  # not before the interval
    known.took_step("celery", "a")
    assert store.notes == [("celery", "a")]
    assert known.is_known("celery", "a") is True


def _job(run_key: str, task: str = "shop.order", *, lazy: bool = True) -> JobInfo:
    return JobInfo(run_key, f"job-{run_key}", JobEnvelope(task, "celery"), lazy=lazy)


def _one_step() -> int:
    return int(current_job.step.run("one", lambda: 1))


def test_c43_the_driver_notes_a_task_at_its_first_step_whether_claimed_lazily_or_before_the_body(
    store: NotingStore,
) -> None:
    """C43: a lazy job's first step notes its task (once per process); a job claimed before its body (a
    redelivery, a producer's run key) notes it when it took a step; a step-less job, claimed or not, notes
    nothing."""
    driver = AttemptDriver(store, DurableConfig())
    assert driver.run_job(_job("r-1", "plain.ping"), lambda: "pong") == Completed("pong", claimed=False)
    assert driver.run_job(_job("r-2", "plain.claimed", lazy=False), lambda: "pong") == Completed("pong")
    assert store.notes == []
    assert driver.run_job(_job("r-3"), _one_step) == Completed(1)
    assert driver.run_job(_job("r-4"), _one_step) == Completed(1)
    assert driver.run_job(_job("r-5", "shop.eager", lazy=False), _one_step) == Completed(1)
    assert store.notes == [("celery", "shop.order"), ("celery", "shop.eager")]
    assert driver.known_tasks.is_known("celery", "shop.order")


def test_c43_a_shutdown_before_any_step_is_the_frameworks_own_exception_again(store: NotingStore) -> None:
    """C43: a worker shutdown that interrupts a body that took no step has no run at stake: the attempt fails
    unclaimed with the framework's own exception (the ``WorkerInterrupted``'s cause), no put-back, nothing
    written; the framework ends it as it would without the integration."""

    class FrameworkShutdown(BaseException):
        """Stands in for Dramatiq's ``Shutdown``."""

    def interrupted() -> None:
        try:
            raise FrameworkShutdown("stopping")
        except FrameworkShutdown as exc:
            raise WorkerInterrupted("the worker shut down") from exc

    decision = AttemptDriver(store, DurableConfig()).run_job(_job("r-1"), interrupted)
    assert isinstance(decision, Failure)
    assert (type(decision.error), decision.claimed) == (FrameworkShutdown, False)
    assert (store.list_runs(), store.notes) == ([], [])


def test_c43_durable_at_publish_declared_known_or_a_run_key_of_the_producers(store: NotingStore) -> None:
    """C43, C46: ``durable=False`` never; ``durable=True`` always, without a read; a producer's run key always;
    otherwise only a task known to take steps; a store that cannot be opened: not durable here."""
    known = KnownTasks(store, 30.0, clock=Monotonic())

    def decide(name: str, declared: object = None, *, given: bool = False) -> bool:
        return durable_at_publish(lambda: known, "celery", name, declared=declared, run_key_given=given)

    assert decide("a", declared=True) is True
    assert store.reads == 0
    assert decide("a", declared=False, given=True) is False
    assert decide("a", given=True) is True
    assert decide("a") is False
    known.took_step("celery", "a")
    assert decide("a") is True

    def unusable() -> KnownTasks:
        raise ConfigurationError("no driver for the store (test)")

    assert durable_at_publish(unusable, "celery", "a", declared=None) is False
