"""Durable steps for Dramatiq actors.

Add the middleware, then use ``current_job.step`` in any actor::

    import dramatiq
    from dramatiq_ext import DurableSteps
    from flexiq_plugins import current_job

    broker.add_middleware(DurableSteps(store="sqlite:///steps.db"))

    @dramatiq.actor(max_retries=5)
    def checkout(order_id):
        step = current_job.step
        charge = step.run("charge", lambda: pay(order_id, key=step.idempotency_key))
        step.sleep("1h")
        step.run("receipt", lambda: send_receipt(charge))

Or list ``"dramatiq_ext.DurableSteps"`` in django_dramatiq's
``DRAMATIQ_BROKER["MIDDLEWARE"]``. See ``docs/dramatiq.md``.
"""

from ._adapter import DramatiqAdapter, adapter, publisher
from ._envelope import RUN_KEY_OPTION, republish
from ._middleware import DurableSteps, InvalidActorOption

__all__ = [
    "DramatiqAdapter",
    "DurableSteps",
    "InvalidActorOption",
    "RUN_KEY_OPTION",
    "adapter",
    "publisher",
    "republish",
]
