"""A Celery task claims its run at its first step, so a task that takes no step needs no store (C23, C24, C39).

A first delivery claims at its first step; one that may continue a run (redelivered, put back, re-published,
retried) claims before its body, and so does a job recorded at publish. The core's part is
``tests/core/test_lazy_claims.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery
from celery_support import in_process_worker, wait_for

from flexiq_plugins import current_job

pytestmark = pytest.mark.timeout(120)


def test_c23_a_task_that_takes_no_step_runs_without_its_store(redis_broker: str, make_celery_app: Any) -> None:
    """C23: a task that takes no step never claims a run: it succeeds, and fails and is retried by Celery's own
    policy, as without the integration, even with its step store unreachable (a closed port)."""
    app: Celery = make_celery_app(redis_broker, "postgresql+psycopg://postgres@127.0.0.1:9/none")
    calls: list[int] = []

    @app.task(bind=True, name=f"{app.main}.flaky", autoretry_for=(ValueError,), max_retries=2, default_retry_delay=0)
    def flaky(self: Any, n: int) -> dict[str, int]:
        calls.append(n)
        if self.request.retries < 2:
            raise ValueError("not yet")
        return {"n": n, "retries": self.request.retries}

    @app.task(name=f"{app.main}.ok")
    def ok(x: int) -> int:
        return x + 1

    with in_process_worker(app):
        assert ok.delay(1).get(timeout=20) == 2
        assert flaky.delay(7).get(timeout=20) == {"n": 7, "retries": 2}
    assert calls == [7, 7, 7]


@pytest.mark.parametrize("recorded", [False, True], ids=["not_recorded", "recorded"])
def test_c23_only_a_task_that_took_a_step_has_a_run(
    redis_broker: str, sqlite_store: Any, make_celery_app: Any, recorded: bool
) -> None:
    """C23, C39: only a task that took a step claims its run. Without recording at publish a step-less
    task leaves no run (not even when it fails); with it, the task claims its recorded run before its
    body and ends it ``succeeded`` or ``failed``, so recovery never publishes it again."""
    app: Celery = make_celery_app(redis_broker, sqlite_store, record_at_publish=recorded)

    @app.task(name=f"{app.main}.no_step", durable=True if recorded else None)  # C43: recorded only if known
    def plain(fail: bool) -> str:
        if fail:
            raise ValueError("boom")
        return "plain"

    @app.task(name=f"{app.main}.stepping")
    def stepping() -> int:
        return current_job.step.run("one", lambda: 1)

    with in_process_worker(app):
        assert plain.delay(False).get(timeout=20) == "plain"
        with pytest.raises(ValueError, match="boom"):
            plain.delay(True).get(timeout=20)
        assert stepping.delay().get(timeout=20) == 1
        expected = [("stepping", "succeeded", 1)]
        if recorded:
            expected += [("no_step", "failed", 1), ("no_step", "succeeded", 1)]

        def runs() -> list[tuple[str, str, int]]:
            return sorted((r.task_name.rsplit(".", 1)[1], r.status, r.attempt) for r in sqlite_store.list_runs())

        wait_for(lambda: runs() == sorted(expected), timeout=20, what=f"the runs {sorted(expected)}")
    assert sqlite_store.list_dead_letters() == []


@pytest.mark.parametrize(
    ("delivery", "headers", "lazy"),
    [
        ({}, {}, True),
        ({"redelivered": True}, {}, False),
        ({}, {"flexiq_resume": True}, False),
    ],
    ids=["first", "redelivered", "resumed"],
)
def test_c24_a_delivery_that_may_continue_a_run_claims_before_its_body(  # noqa: PLR0917
    redis_broker: str,
    sqlite_store: Any,
    make_celery_app: Any,
    delivery: dict[str, Any],
    headers: dict[str, Any],
    lazy: bool,
) -> None:
    """C23, C24: a first delivery claims at its first step; a redelivered message (a worker died, a visibility
    timeout) or a put-back / re-published / retried one (``flexiq_resume``) claims before its body runs."""
    from celery.app.task import Context

    from celery_ext._envelope import job_info

    app: Celery = make_celery_app(redis_broker, sqlite_store)
    task = app.tasks[f"{app.main}.plain"]
    request = Context(id="t-1", task=task.name, args=[1], kwargs={}, delivery_info=delivery, headers=headers)
    assert job_info(task, request).lazy is lazy


def test_c35_a_delivered_jobs_envelope_keeps_its_json_headers_and_drops_the_rest(
    redis_broker: str, sqlite_store: Any, make_celery_app: Any
) -> None:
    """C35: the stored envelope re-publishes the job with its custom headers; one JSON cannot hold is left out,
    and the run key and resume headers are the run's, not the job's."""
    import datetime

    from celery.app.task import Context

    from celery_ext._envelope import job_info

    app: Celery = make_celery_app(redis_broker, sqlite_store)
    task = app.tasks[f"{app.main}.plain"]
    for headers, kept in (
        ({"tenant": "acme", "trace": {"id": 7}, "flexiq_resume": True}, {"tenant": "acme", "trace": {"id": 7}}),
        ({"tenant": "acme", "when": datetime.datetime(2026, 1, 1)}, {"tenant": "acme"}),
    ):
        request = Context(id="t-1", task=task.name, args=[1], kwargs={}, delivery_info={}, headers=headers)
        assert job_info(task, request).job_envelope.options["headers"] == kept
