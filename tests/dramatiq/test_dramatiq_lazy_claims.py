"""A Dramatiq actor claims its run at its first step, so an actor that takes no step needs no store (C23, C39).

An actor that takes no step runs, fails and is retried by Dramatiq's own ``Retries`` as without the
middleware, even with its store unreachable; only a job that took a step, or one recorded at publish, has a
run. The core's part is ``tests/core/test_lazy_claims.py``.
"""

from __future__ import annotations

from collections.abc import Callable

import dramatiq
import pytest
from dramatiq.middleware import Retries

from dramatiq_ext import DurableSteps
from flexiq_plugins import current_job
from flexiq_plugins._store.base import StepStore
from tests.dramatiq.dq_support import wait_until


def test_c23_an_actor_that_takes_no_step_runs_without_its_store(
    broker: dramatiq.Broker, queue: str, start_worker: Callable[..., dramatiq.Worker]
) -> None:
    """C23: an actor that takes no step never claims a run: it runs, fails and is retried by Dramatiq's own
    Retries exactly as without the middleware, even with its step store unreachable (a closed port)."""
    broker.add_middleware(DurableSteps(store="postgresql+psycopg://postgres@127.0.0.1:9/none"), before=Retries)
    calls: list[int] = []

    @dramatiq.actor(broker=broker, queue_name=queue, max_retries=2, min_backoff=1, max_backoff=1)
    def flaky(n: int) -> None:
        calls.append(n)
        if len(calls) < 3:
            raise ValueError("not yet")

    start_worker(broker)
    flaky.send(7)
    wait_until(lambda: len(calls) == 3, timeout=15, what="two retries by Dramatiq's Retries")
    assert calls == [7, 7, 7]


@pytest.mark.parametrize("recorded", [False, True], ids=["not_recorded", "recorded"])
def test_c23_a_step_less_actor_leaves_no_run_and_a_stepping_one_does(
    broker: dramatiq.Broker,
    queue: str,
    sqlite_store: StepStore,
    start_worker: Callable[..., dramatiq.Worker],
    recorded: bool,
) -> None:
    """C23, C39: only a job that took a step claims a run; a failure of a step-less job is Dramatiq's:
    dead-lettered by the broker when its retries are spent, no dead letter of the library's. Without
    recording at publish a step-less job leaves no run at all; with it, the job claims its recorded run
    before its body and ends it ``succeeded`` or, once Retries gives up, ``failed``, so recovery never
    publishes it again."""
    broker.add_middleware(DurableSteps(store=sqlite_store, record_at_publish=recorded), before=Retries)
    done: list[str] = []

    @dramatiq.actor(broker=broker, queue_name=queue, max_retries=0, durable=True if recorded else None)  # C43
    def plain(fail: bool) -> None:
        done.append("plain")
        if fail:
            raise ValueError("boom")

    @dramatiq.actor(broker=broker, queue_name=queue, max_retries=0)
    def stepping() -> None:
        current_job.step.run("one", lambda: 1)
        done.append("stepping")

    start_worker(broker)
    plain.send(False)
    plain.send(True)
    stepping.send()
    wait_until(lambda: len(done) == 3, timeout=15, what="the three jobs")
    if recorded:
        expected = [("plain", "failed", 1), ("plain", "succeeded", 1), ("stepping", "succeeded", 1)]
    else:
        expected = [("stepping", "succeeded", 1)]

    def runs() -> list[tuple[str, str, int]]:
        return sorted((r.task_name, r.status, r.attempt) for r in sqlite_store.list_runs())

    wait_until(lambda: runs() == expected, what=f"the runs {expected}")
    assert sqlite_store.list_dead_letters() == []
