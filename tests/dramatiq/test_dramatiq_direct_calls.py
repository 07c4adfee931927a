"""What a new Dramatiq user meets in the first hour: messages that say what happened (issue 15)."""

from __future__ import annotations

import dramatiq
import pytest

from dramatiq_ext import DurableSteps
from flexiq_plugins import MemoryStepStore, NoCurrentJob, current_job


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
