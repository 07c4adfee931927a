"""An actor called as a plain function, not sent, is a plain call with no current job (C10).

Outside a job the error says the actor was called directly and how to send it
(or the function runs as Dramatiq would, when it takes no step). Inside another
actor's body, or inside its own, the call runs in-process as in plain
Dramatiq: ``current_job`` is falsy in it and it records no step in the outer run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import dramatiq
import pytest
from dq_support import status_of, wait_until
from dramatiq.middleware import Retries

from dramatiq_ext import RUN_KEY_OPTION, DurableSteps
from flexiq_plugins import MemoryStepStore, NoCurrentJob, current_job
from flexiq_plugins._store.base import StepStore


def test_c10_an_actor_called_directly_says_it_was_called_directly(stub_broker: dramatiq.Broker, queue: str) -> None:
    """``checkout(1)`` (not ``.send``) has no current job: the error says so and how to send it."""
    stub_broker.add_middleware(DurableSteps(store=MemoryStepStore()))

    @dramatiq.actor(broker=stub_broker, queue_name=queue, actor_name="checkout_direct")
    def checkout(order: int) -> int:
        return int(current_job.step.run("charge", lambda: order))

    with pytest.raises(NoCurrentJob) as info:
        checkout(1)
    message = str(info.value)
    assert "the task 'checkout_direct' was called directly, as a plain function" in message
    assert "actor.send(...)" in message


def test_direct_call_runs_the_function_without_durable_steps(stub_broker: dramatiq.Broker, queue: str) -> None:
    """Calling an actor directly (not through a worker) runs its function as Dramatiq would."""
    stub_broker.add_middleware(DurableSteps(store="memory://"))

    @dramatiq.actor(broker=stub_broker, queue_name=queue)
    def add(x: int, y: int) -> tuple[int, bool]:
        return x + y, bool(current_job)

    assert add(1, 2) == (3, False)


def test_c10_an_actor_called_as_a_function_inside_a_job_has_no_current_job(
    stub_broker: dramatiq.Broker,
    queue: str,
    sqlite_store: StepStore,
    start_worker: Callable[..., dramatiq.Worker],
) -> None:
    """C10: calling an actor directly (``inner(1)``, not ``.send``) inside another actor's body is a
    plain function call.

    ``current_job`` is falsy in it and it records no step in the outer run:
    the outer run's step rows (kept with ``keep_succeeded_steps=True``) are
    only its own.
    """
    stub_broker.add_middleware(DurableSteps(store=sqlite_store, keep_succeeded_steps=True))
    inside: list[bool] = []
    results: list[int] = []

    @dramatiq.actor(broker=stub_broker, queue_name=queue, max_retries=0)
    def inner(x: int) -> int:
        inside.append(bool(current_job))
        if current_job:  # the old behaviour: the outer job leaked into the direct call
            return current_job.step.run("inner", lambda: x + 100)  # type: ignore[no-any-return]
        return x + 100

    @dramatiq.actor(broker=stub_broker, queue_name=queue, max_retries=0)
    def outer(x: int) -> None:
        step = current_job.step
        before = step.run("before", lambda: x)
        middle = inner(before)
        results.append(step.run("after", lambda: middle + 1))

    start_worker(stub_broker)
    message = outer.send(1)
    stub_broker.join(queue, fail_fast=True, timeout=10_000)

    run_key = message.options[RUN_KEY_OPTION]
    assert results == [102]
    assert inside == [False]
    assert status_of(sqlite_store, run_key) == "succeeded"
    assert [row.step_key for row in sqlite_store.get_steps(run_key)] == ["before#0", "after#0"]


@pytest.mark.parametrize("steps", [False, True], ids=["no_step", "step"])
def test_c10_a_durable_actor_calling_itself_directly_is_a_plain_call(
    broker: dramatiq.Broker,
    queue: str,
    sqlite_store: StepStore,
    start_worker: Callable[..., dramatiq.Worker],
    steps: bool,
) -> None:
    """C10: an actor calling itself as a function inside its body runs the body in-process, as plain Dramatiq
    does: the inner call has no ``current_job``, the outer attempt completes with the value."""
    broker.add_middleware(DurableSteps(store=sqlite_store), before=Retries)
    seen: list[Any] = []

    @dramatiq.actor(broker=broker, queue_name=queue, max_retries=0, durable=True)  # recorded from its first job (C43)
    def countdown(n: int, outer: bool = True) -> int:
        if n == 0:
            seen.append(("inner job", bool(current_job)))
            return 0
        if steps and outer:
            current_job.step.run("outer", lambda: n)
        value = 1 + countdown(n - 1, outer=False)
        if outer:
            seen.append(("value", value))
        return value

    start_worker(broker)
    countdown.send(3)
    wait_until(lambda: ("value", 3) in seen, timeout=15, what="the outer call to return 3")
    assert seen == [("inner job", False), ("value", 3)]
    if steps:
        wait_until(lambda: [r.status for r in sqlite_store.list_runs()] == ["succeeded"], what="the run to succeed")
    else:  # recorded at publish (C39), so claimed before the body (C23): one attempt, no second for the inner call
        wait_until(
            lambda: [(r.status, r.attempt) for r in sqlite_store.list_runs()] == [("succeeded", 1)],
            what="the recorded run to succeed",
        )
