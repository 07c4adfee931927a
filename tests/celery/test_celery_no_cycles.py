"""A failed attempt leaves no reference cycle on Celery: no frame of the integration holds its exception (C26).

The core's part (the outcome drops its error) is ``tests/core/test_no_cycles.py``; Dramatiq's is
``tests/dramatiq/test_dramatiq_no_cycles.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery
from celery.signals import task_failure
from celery_support import in_process_worker, wait_for

from flexiq_plugins import current_job
from flexiq_plugins._attempt.decisions import Failure

pytestmark = pytest.mark.timeout(120)


class Boom(RuntimeError):
    """The task's error."""


def _holders(error: BaseException) -> list[str]:
    """The frames of this integration in ``error``'s traceback whose locals hold ``error`` or its decision."""
    found = []
    tb = error.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        ours = any(part in frame.f_code.co_filename for part in ("celery_ext", "flexiq_plugins"))
        for name, value in frame.f_locals.items():
            if ours and (value is error or isinstance(value, Failure)):
                found.append(f"{frame.f_code.co_name}:{name}")
        tb = tb.tb_next
    return found


@pytest.mark.parametrize("steps", [False, True], ids=["no_step", "step"])
def test_c26_a_failed_attempt_leaves_no_frame_of_the_integration_holding_its_exception(
    redis_broker: str, sqlite_store: Any, make_celery_app: Any, steps: bool
) -> None:
    """C26: the exception a durable task raised reaches Celery's tracer with no frame of the integration
    holding it (or the decision that carried it) in its locals: the integration adds no reference cycle
    (plain Celery's tracer keeps its own until the cyclic collector runs; a worker's next task replaces it)."""
    app: Celery = make_celery_app(redis_broker, sqlite_store)
    seen: list[list[str]] = []

    @app.task(name=f"{app.main}.fails")
    def fails() -> None:
        if steps:
            current_job.step.run("one", lambda: 1)
        raise Boom("boom")

    def failed(sender: Any = None, exception: BaseException | None = None, **_: Any) -> None:
        if getattr(sender, "name", None) == fails.name and exception is not None:
            seen.append(_holders(exception))  # now: Celery clears the traceback's frames afterwards

    task_failure.connect(failed, weak=False)
    try:
        with in_process_worker(app):
            result = fails.delay()
            wait_for(lambda: result.state == "FAILURE", timeout=30, what="the task to fail")
    finally:
        task_failure.disconnect(failed)
    assert seen == [[]]
