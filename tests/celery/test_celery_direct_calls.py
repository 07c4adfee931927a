"""What a new Celery user meets in the first hour: messages that say what happened (issue 15)."""

from __future__ import annotations

import pytest
from celery import Celery

import celery_ext
from flexiq_plugins import MemoryStepStore, NoCurrentJob, current_job


def test_c10_a_durable_task_called_directly_says_it_was_called_directly() -> None:
    """``checkout(1)`` (not ``.delay``) has no current job: the error says so and how to send it, not "install"."""
    app = Celery("direct", broker="memory://", set_as_current=False)
    celery_ext.install(app, store=MemoryStepStore())

    @app.task(name="shop.checkout")
    def checkout(order: int) -> int:
        return int(current_job.step.run("charge", lambda: order))

    with pytest.raises(NoCurrentJob) as info:
        checkout(1)
    message = str(info.value)
    assert "the task 'shop.checkout' was called directly, as a plain function" in message
    assert "task.delay(...)" in message
    assert "celery_ext.install" not in message
