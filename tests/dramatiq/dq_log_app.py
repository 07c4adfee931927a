"""A one-actor app for a real ``dramatiq`` worker process whose log is checked.

``FLEXIQ_TEST_NAMESPACE`` and ``FLEXIQ_TEST_QUEUE`` name the Redis namespace
and queue, ``FLEXIQ_TEST_STORE`` the store URL, ``FLEXIQ_TEST_TABLE_PREFIX``
its table prefix.
"""

from __future__ import annotations

import os

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from dramatiq_ext import DurableSteps
from flexiq_plugins import SqlStepStore, current_job

broker = RedisBroker(host="127.0.0.1", namespace=os.environ["FLEXIQ_TEST_NAMESPACE"])
store = SqlStepStore(os.environ["FLEXIQ_TEST_STORE"], table_prefix=os.environ["FLEXIQ_TEST_TABLE_PREFIX"])
broker.add_middleware(DurableSteps(store=store))
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name=os.environ["FLEXIQ_TEST_QUEUE"])
def nap() -> None:
    """One step, a 300 ms sleep (one hop), one more step."""
    step = current_job.step
    step.run("before", lambda: "a")
    step.sleep("300ms")
    step.run("after", lambda: "b")
