"""An actor of a Django project, declared on the broker django_dramatiq built from settings."""

from __future__ import annotations

import dramatiq

from flexiq_plugins import current_job


@dramatiq.actor(
    queue_name="django_q", min_backoff=10, max_backoff=20, durable=True
)  # recorded from its first job (C43)
def welcome(user_id: int) -> None:
    """Send a welcome mail, wait, then a tip: two steps around a 500 ms sleep."""
    step = current_job.step
    step.run("welcome", lambda: f"welcome {user_id}")
    step.sleep("500ms")
    step.run("tip", lambda: f"tip {user_id}")
