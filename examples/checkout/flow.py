"""The checkout itself: charge, sleep, receipt — the same body for Celery and Dramatiq.

Everything the demo prints about an attempt comes from here, written to the
journal as it happens: which attempt this is, whether each step ran or was a
memo hit, the idempotency key the payment API received, the sleep and its wake.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

from flexiq_plugins import SleepSignal, current_job

from .services import Journal, Payments, ReceiptMailer

__all__ = ["SLEEP_SECONDS", "checkout"]

T = TypeVar("T")
SLEEP_SECONDS = float(os.environ.get("FLEXIQ_DEMO_SLEEP", "3"))
journal = Journal()


def checkout(order_id: str, amount_cents: int) -> str:
    """Charge the card once, wait, then send the receipt; return the charge id."""
    step = current_job.step
    journal.write(f"attempt {current_job.attempt} started (job id {current_job.job_id}, pid {os.getpid()})")

    def charge() -> dict[str, Any]:
        key = step.idempotency_key
        journal.write(f"  charge: calling the payment API with idempotency key {key}")
        return Payments().charge(order_id, amount_cents, idempotency_key=key)

    result = _tracked("charge", charge)
    _crash_point()
    _tracked_sleep(SLEEP_SECONDS)
    _tracked("receipt", lambda: ReceiptMailer().send(order_id, result))
    journal.write(f"attempt {current_job.attempt} finished: order {order_id} charged as {result['id']}")
    return str(result["id"])


def _tracked(name: str, fn: Callable[[], T]) -> T:
    ran = False

    def body() -> T:
        nonlocal ran
        ran = True
        try:
            return fn()
        except Exception as exc:
            journal.write(f"  {name}: failed ({exc}); nothing committed, the task will retry")
            raise

    value = current_job.step.run(name, body)
    journal.write(f"  {name}: {'ran and committed' if ran else 'memo hit, body not called'}")
    return value


def _tracked_sleep(seconds: float) -> None:
    try:
        current_job.step.sleep(seconds, name="cool_off")
    except SleepSignal as signal:
        wait = signal.wake_at - time.time()
        journal.write(f"  cool_off: sleeping {wait:.1f}s; the attempt ends and the worker is free")
        raise
    journal.write("  cool_off: wake time reached, carrying on")


def _crash_point() -> None:
    """In ``--crash`` mode, stop here (after the charge commit) so the demo can SIGKILL the worker."""
    flag = os.environ.get("FLEXIQ_DEMO_DIR", ".") + "/crash-armed"
    if os.path.exists(flag):
        os.remove(flag)
        journal.write(f"  CRASH POINT: charge committed; waiting to be killed (pid {os.getpid()})")
        time.sleep(120)
