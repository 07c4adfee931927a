"""The checkout itself: charge, sleep, receipt, ship — the same body for Celery and Dramatiq.

Everything the demo prints about an attempt comes from here, written to the
journal as it happens: which attempt this is, whether each step ran or was a
memo hit, the idempotency key the payment API received, the sleep and its wake.

Shipping has a durable retry budget of three tries (C31), and the charge a
compensation, a refund (C32). In the ``--ship-fails`` variant the carrier
refuses every try: the budget runs out, the run fails for good and the charge
is refunded, once, with an idempotency key of its own.

In the ``--wait-payment`` variant the checkout waits, after the charge, for
the bank's "payment confirmed" event (C33): the attempt ends and frees the
worker; the demo's driver sends the event, which wakes the run at once.

``flexiq check --app examples.checkout.celery_app:app`` checks new code of
this task against the runs in flight (C48); the journal lines written between
steps are skipped then (``current_job.checking``). See ``docs/deploying.md``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

from flexiq_plugins import Compensation, RetryPolicy, StepRetryExhausted, current_job
from flexiq_plugins.errors import EventWaitSignal, SleepSignal

from .services import Carrier, Journal, Payments, ReceiptMailer

__all__ = ["LEASE_SECONDS", "PAYMENT_CONFIRMED", "SHIP_RETRY", "SLEEP_SECONDS", "WAITING_LINE", "checkout"]

T = TypeVar("T")
SLEEP_SECONDS = float(os.environ.get("FLEXIQ_DEMO_SLEEP", "3"))
LEASE_SECONDS = 4.0
"""The demo's claim lease (the default is 30 s): a killed worker's run is taken over seconds after its death."""
SHIP_RETRY = RetryPolicy(max_attempts=3, initial_delay=0.5, multiplier=2)
"""Three tries in all, 0.5 s then 1 s apart, counted in the step store whatever the broker says."""
PAYMENT_CONFIRMED = "payment_confirmed"
"""The topic of the bank's confirmation; its key is the order id."""
WAITING_LINE = "payment: waiting for the 'payment confirmed' event"
"""What the journal says when the checkout starts to wait (the driver sends the event when it reads it)."""
journal = Journal()


def checkout(order_id: str, amount_cents: int) -> str:
    """Charge the card once, wait, then send the receipt; return the charge id."""
    step = current_job.step
    _note(f"attempt {current_job.attempt} started (job id {current_job.job_id}, pid {os.getpid()})")

    def charge() -> dict[str, Any]:
        key = step.idempotency_key
        _note(f"  charge: calling the payment API with idempotency key {key}")
        return Payments().charge(order_id, amount_cents, idempotency_key=key)

    result = _tracked("charge", charge, compensate=Compensation(refund, name="refund"))
    if os.environ.get("FLEXIQ_DEMO_WAIT_PAYMENT"):
        _await_confirmation(order_id)
    _crash_point()
    _tracked_sleep(SLEEP_SECONDS)
    _tracked("receipt", lambda: ReceiptMailer().send(order_id, result))
    try:
        _tracked("ship", lambda: Carrier().ship(order_id)[1], retry=SHIP_RETRY)
    except StepRetryExhausted as exc:
        _note(f"  ship: budget spent after {exc.attempts} tries; the run fails for good, refunding")
        raise
    _note(f"attempt {current_job.attempt} finished: order {order_id} charged as {result['id']}")
    return str(result["id"])


def _note(line: str) -> None:
    """Write ``line`` to the demo's journal, unless a check of new code runs the body (``flexiq check``, C48).

    A check replays the recorded steps and runs the code between them: the
    journal is a side effect the check must not have.
    """
    if not current_job.checking:
        journal.write(line)


def refund(charge: dict[str, Any]) -> str:
    """The charge's compensation: refund it, with the undo's own idempotency key (C32)."""
    key = current_job.step.idempotency_key
    _note(f"  refund: undoing charge {charge['id']} with idempotency key {key}")
    return Payments().refund(str(charge["id"]), idempotency_key=key)


def _tracked(name: str, fn: Callable[[], T], **options: Any) -> T:
    ran = False

    def body() -> T:
        nonlocal ran
        ran = True
        try:
            return fn()
        except Exception as exc:
            retry = "the step's retry budget decides" if "retry" in options else "the task will retry"
            _note(f"  {name}: failed ({exc}); nothing committed, {retry}")
            raise

    value: T = current_job.step.run(name, body, **options)
    _note(f"  {name}: {'ran and committed' if ran else 'memo hit, body not called'}")
    return value


def _tracked_sleep(seconds: float) -> None:
    try:
        current_job.step.sleep(seconds, name="cool_off")
    except SleepSignal as signal:
        wait = signal.wake_at - time.time()
        _note(f"  cool_off: sleeping {wait:.1f}s; the attempt ends and the worker is free")
        raise
    _note("  cool_off: wake time reached, carrying on")


def _await_confirmation(order_id: str) -> None:
    """Wait for the bank's "payment confirmed" event of ``order_id`` (C33): the attempt ends until it is sent."""
    try:
        confirmed = current_job.step.wait_for_event(PAYMENT_CONFIRMED, key=order_id, timeout="10m")
    except EventWaitSignal:
        _note(f"  {WAITING_LINE}; the attempt ends and the worker is free")
        raise
    _note(f"  payment: confirmed by the bank ({confirmed})")


def _crash_point() -> None:
    """In ``--crash`` mode, stop here (after the charge commit) so the demo can SIGKILL the worker."""
    flag = os.environ.get("FLEXIQ_DEMO_DIR", ".") + "/crash-armed"
    if os.path.exists(flag) and not current_job.checking:
        os.remove(flag)
        _note(f"  CRASH POINT: charge committed; waiting to be killed (pid {os.getpid()})")
        time.sleep(120)
