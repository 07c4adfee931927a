"""How the Dramatiq middleware takes events and caps (C33, C34), on the stub broker.

The behaviour on real brokers is proven by the conformance suite
(``tests/conformance/test_conformance_events.py``); these check the
middleware's own wiring: the run caps as actor options, and ``send_event`` in a
process whose broker has the middleware waking a waiting run through it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import dramatiq
import pytest
from dq_support import status_of

from dramatiq_ext import RUN_KEY_OPTION, DurableSteps, InvalidActorOption
from flexiq_plugins import current_job, send_event
from flexiq_plugins._store.base import StepStore
from tests.polling import wait_for


def test_c34_the_cap_actor_options_are_checked_where_the_actor_is_declared(
    stub_broker: dramatiq.Broker, queue: str, sqlite_store: StepStore
) -> None:
    """``max_run_seconds`` / ``max_suspended_seconds`` are actor options; a value that is not a positive
    duration is refused with ``InvalidActorOption`` naming the actor and the option (C34)."""
    stub_broker.add_middleware(DurableSteps(store=sqlite_store))
    with pytest.raises(InvalidActorOption, match=r"actor 'capped'.*max_suspended_seconds=-1"):
        dramatiq.actor(broker=stub_broker, queue_name=queue, actor_name="capped", max_suspended_seconds=-1)(
            lambda: None
        )


def test_c33_send_event_in_the_brokers_process_wakes_the_waiting_run(
    stub_broker: dramatiq.Broker, queue: str, sqlite_store: StepStore, start_worker: Callable[..., dramatiq.Worker]
) -> None:
    """A run waiting for ``("payment", "o-1")`` acknowledges its message and holds no worker; ``send_event``
    with no store or publisher named finds this process's middleware, stores the event in its store and
    enqueues the run again: the wait returns the payload (C33)."""
    stub_broker.add_middleware(DurableSteps(store=sqlite_store))
    received: list[Any] = []

    @dramatiq.actor(broker=stub_broker, queue_name=queue)
    def checkout() -> None:
        received.append(current_job.step.wait_for_event("payment", key="o-1"))

    start_worker(stub_broker)
    run_key = checkout.send().options[RUN_KEY_OPTION]
    wait_for(lambda: status_of(sqlite_store, run_key) == "waiting", 10, "the run to wait")
    sent = send_event("payment", "o-1", {"amount": 1200})
    assert [key for key, _ in sent.woken] == [run_key]
    wait_for(lambda: status_of(sqlite_store, run_key) == "succeeded", 10, "the run to finish")
    assert received == [{"amount": 1200}]
