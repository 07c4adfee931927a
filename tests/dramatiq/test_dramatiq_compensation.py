"""How the Dramatiq middleware hands step retries and compensations to Dramatiq (C31, C32), on the stub broker.

The real-process proofs (crashes, SIGKILL between undos) are in
``test_dramatiq_step_retries.py``; these check the middleware's own wiring:
the ``step_retry`` actor option, and a run that the Retries middleware gives
up on being compensated by one more delivery of the same message.
"""

from __future__ import annotations

from collections.abc import Callable

import dramatiq
import pytest
from dq_support import status_of

from dramatiq_ext import RUN_KEY_OPTION, DurableSteps
from flexiq_plugins import ConfigurationError, RetryPolicy, current_job
from flexiq_plugins._store.base import StepStore


def test_c31_the_step_retry_actor_option_budgets_its_steps(
    stub_broker: dramatiq.Broker, queue: str, sqlite_store: StepStore, start_worker: Callable[..., dramatiq.Worker]
) -> None:
    """``@dramatiq.actor(step_retry=RetryPolicy(max_attempts=2))`` gives every step of the actor that budget,
    whatever ``max_retries`` says; a bad value is refused when the actor is declared."""
    stub_broker.add_middleware(DurableSteps(store=sqlite_store))
    calls: list[int] = []

    @dramatiq.actor(
        broker=stub_broker, queue_name=queue, max_retries=0, step_retry=RetryPolicy(max_attempts=2, initial_delay=0)
    )
    def ship() -> None:
        def body() -> None:
            calls.append(1)
            raise ConnectionError("carrier down")

        current_job.step.run("ship", body)

    start_worker(stub_broker)
    run_key = ship.send().options[RUN_KEY_OPTION]
    stub_broker.join(queue, fail_fast=False, timeout=10_000)
    assert len(calls) == 2
    assert status_of(sqlite_store, run_key) == "dead"

    with pytest.raises(ConfigurationError, match="step_retry=3 must be a RetryPolicy"):
        dramatiq.actor(broker=stub_broker, queue_name=queue, step_retry=3)(lambda: None)


def test_c32_when_retries_give_up_the_message_comes_back_to_compensate(
    stub_broker: dramatiq.Broker, queue: str, sqlite_store: StepStore, start_worker: Callable[..., dramatiq.Worker]
) -> None:
    """Retries gives up on the third step (``max_retries=1``): the message fails to ``.XQ`` as usual, and one
    more delivery replays the body (the failing step is not called again) and undoes the two committed steps
    in reverse order; the run is ``compensated`` with no dead letter of its own."""
    stub_broker.add_middleware(DurableSteps(store=sqlite_store))
    log: list[str] = []

    @dramatiq.actor(broker=stub_broker, queue_name=queue, max_retries=1, min_backoff=10, max_backoff=20)
    def checkout() -> None:
        step = current_job.step
        step.run("reserve", lambda: "r-1", compensate=lambda r: log.append(f"undo {r}"))
        step.run("charge", lambda: "c-1", compensate=lambda c: log.append(f"undo {c}"))

        def ship() -> None:
            log.append("ship")
            raise ValueError("no carrier for this address")

        step.run("ship", ship)

    start_worker(stub_broker)
    run_key = checkout.send().options[RUN_KEY_OPTION]
    stub_broker.join(queue, fail_fast=False, timeout=10_000)

    assert log == ["ship", "ship", "undo c-1", "undo r-1"]
    assert status_of(sqlite_store, run_key) == "compensated"
    assert len(stub_broker.dead_letters_by_queue[queue]) == 1  # Dramatiq's own failure of the message
    assert sqlite_store.list_dead_letters() == []
