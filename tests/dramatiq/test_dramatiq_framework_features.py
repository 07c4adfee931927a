"""Dramatiq's own features work for durable actors as in plain Dramatiq (C26).

Pipelines, groups, ``on_success`` / ``on_failure`` callbacks, ``Retries``
counts, ``Results``, ``TimeLimit`` and ``AgeLimit`` behave for durable actors,
with and without steps, on a real Redis broker; every run recorded at publish
ends, so recovery has nothing to publish again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import dramatiq
import pytest
from dramatiq.middleware import Retries

from dramatiq_ext import DurableSteps
from flexiq_plugins import current_job
from flexiq_plugins._model.records import TERMINAL_STATUSES
from flexiq_plugins._store.base import StepStore
from tests.dramatiq.dq_support import wait_until


@pytest.mark.parametrize("broker_kind", [pytest.param("redis", marks=pytest.mark.redis)], indirect=True)
@pytest.mark.parametrize("steps", [False, True], ids=["no_step", "step"])
def test_c26_dramatiq_features_work_for_durable_actors(  # noqa: PLR0917
    broker: dramatiq.Broker,
    queue: str,
    namespace: str,
    sqlite_store: StepStore,
    start_worker: Callable[..., dramatiq.Worker],
    steps: bool,
) -> None:
    """C26: pipelines, groups, ``on_success`` / ``on_failure`` callbacks, ``Retries`` counts, ``Results``,
    ``TimeLimit`` and ``AgeLimit`` behave for durable actors, with and without steps, as in plain Dramatiq."""
    from dramatiq import group, pipeline
    from dramatiq.middleware import CurrentMessage
    from dramatiq.results import ResultFailure, Results
    from dramatiq.results.backends import RedisBackend

    broker.add_middleware(Results(backend=RedisBackend(client=broker.client, namespace=f"{namespace}-r")))
    broker.add_middleware(CurrentMessage())
    broker.add_middleware(DurableSteps(store=sqlite_store), before=Retries)
    seen: list[Any] = []

    def stepped(name: str, value: Any) -> Any:
        return current_job.step.run(name, lambda: value) if steps else value

    @dramatiq.actor(broker=broker, queue_name=queue, store_results=True)
    def add(x: int, y: int) -> int:
        return int(stepped("add", x + y))

    @dramatiq.actor(broker=broker, queue_name=queue, store_results=True, max_retries=3, min_backoff=10, max_backoff=10)
    def flaky() -> int:
        stepped("before", 1)
        retries = CurrentMessage.get_current_message().options.get("retries", 0)
        if retries < 2:
            raise ValueError("not yet")
        return int(retries)

    @dramatiq.actor(broker=broker, queue_name=queue, max_retries=0)
    def fails() -> None:
        stepped("before", 1)
        raise KeyError("nope")

    @dramatiq.actor(broker=broker, queue_name=queue)
    def succeeded(message: dict[str, Any], result: Any) -> None:
        seen.append(("success", result))

    @dramatiq.actor(broker=broker, queue_name=queue)
    def failed(message: dict[str, Any], exception: dict[str, Any]) -> None:
        seen.append(("failure", exception["type"]))

    @dramatiq.actor(broker=broker, queue_name=queue, time_limit=300, max_retries=0, store_results=True)
    def slow() -> None:
        stepped("before", 1)
        for _ in range(100):  # TimeLimit interrupts between bytecodes
            time.sleep(0.05)
        seen.append("slow finished")

    @dramatiq.actor(broker=broker, queue_name=queue, max_retries=0, store_results=True)
    def aged() -> None:
        seen.append("aged ran")

    start_worker(broker)
    assert pipeline([add.message(1, 2), add.message(3)]).run().get_result(block=True, timeout=20_000) == 6
    assert list(group([add.message(i, i) for i in range(3)]).run().get_results(block=True, timeout=20_000)) == [0, 2, 4]
    add.send_with_options(args=(2, 2), on_success=succeeded)
    fails.send_with_options(on_failure=failed)
    wait_until(lambda: len(seen) == 2, timeout=20, what="the callbacks")
    assert sorted(seen) == [("failure", "KeyError"), ("success", 4)]
    assert flaky.send().get_result(block=True, timeout=20_000) == 2
    with pytest.raises(ResultFailure) as limited:
        slow.send().get_result(block=True, timeout=20_000)
    assert limited.value.orig_exc_type == "TimeLimitExceeded"
    with pytest.raises(ResultFailure):
        aged.send_with_options(max_age=1, delay=200).get_result(block=True, timeout=20_000)
    assert "slow finished" not in seen
    assert "aged ran" not in seen
    # every run was recorded at publish (C39); each one ends, none is left for recovery to publish again
    wait_until(
        lambda: all(r.status in TERMINAL_STATUSES for r in sqlite_store.list_runs()),
        what="every recorded run to end",
    )
