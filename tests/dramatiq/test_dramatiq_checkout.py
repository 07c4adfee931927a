"""The seed's checkout (charge, sleep, receipt) end to end on every broker and SQL store."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import dramatiq
from dq_support import Payments, Receipts, status_of, wait_until

from dramatiq_ext import RUN_KEY_OPTION, DurableSteps
from flexiq_plugins import current_job
from flexiq_plugins._store.base import StepStore


def declare_checkout(broker: dramatiq.Broker, queue: str, payments: Payments, receipts: Receipts) -> Any:
    """The seed's checkout actor: charge, sleep, receipt."""

    @dramatiq.actor(broker=broker, queue_name=queue, max_retries=5, min_backoff=50, max_backoff=100)
    def checkout(order_id: str) -> None:
        step = current_job.step
        charge = step.run("charge", lambda: payments.charge(order_id, 4200, key=step.idempotency_key))
        step.sleep("500ms")
        step.run("receipt", lambda: receipts.send(charge["id"]))

    return checkout


def test_c5_c6_checkout_charges_once_and_retries_the_receipt(
    broker: dramatiq.Broker,
    queue: str,
    step_store: StepStore,
    start_worker: Callable[..., dramatiq.Worker],
) -> None:
    """Charge, sleep, receipt failing once: one real charge, the receipt retried, the run succeeded.

    The charge is memoized (C5) across the sleep wake and the retry; the failed
    receipt committed nothing and runs again (C6); the idempotency key is
    ``<run key>:charge#0`` (C10).
    """
    payments, receipts = Payments(), Receipts(failures=1)
    broker.add_middleware(DurableSteps(store=step_store))
    checkout = declare_checkout(broker, queue, payments, receipts)
    start_worker(broker)

    message = checkout.send("order-1")
    run_key = message.options[RUN_KEY_OPTION]
    wait_until(lambda: status_of(step_store, run_key) == "succeeded", timeout=30, what="the checkout to succeed")

    assert payments.calls == [f"{run_key}:charge#0"]
    assert receipts.calls == 2
    assert receipts.sent == ["ch_1"]
    run = step_store.get_run(run_key)
    assert run.attempt == 3  # charge+sleep, receipt fails, receipt succeeds
    assert run.job_id == message.message_id
