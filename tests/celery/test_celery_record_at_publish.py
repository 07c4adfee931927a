"""Celery: a new job's run is recorded ``queued`` when it is published, unless the task or the message opts out
(C39), whether the integration minted its run key or the producer chose it (C46). Published on a real broker;
no worker runs, so what the store holds is what the publish wrote."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from uuid import uuid4

from celery import Celery
from celery_support import in_process_worker, wait_for

from celery_ext import RUN_KEY_HEADER
from celery_ext._options import RESUME_HEADER
from flexiq_plugins import SqlStepStore, UnknownRun, operations


def _run_status(store: SqlStepStore, run_key: str) -> str | None:
    try:
        return store.get_run(run_key).status
    except UnknownRun:
        return None


def _published(app: Celery, send: Callable[[], Any]) -> dict[str, Any]:
    """Publish with ``send`` and return the headers of the message that left."""
    seen: dict[str, Any] = {}

    def note(headers: dict[str, Any] | None = None, **_: Any) -> None:
        seen.update(headers or {})

    from celery import signals

    signals.after_task_publish.connect(note, weak=False)
    try:
        send()
    finally:
        signals.after_task_publish.disconnect(note)
    return seen


def test_c39_a_new_job_is_queued_before_a_worker_sees_it(
    redis_broker: str, sqlite_store: SqlStepStore, make_celery_app: Callable[..., Celery]
) -> None:
    """C39: ``delay`` records the run ``queued`` with the job's envelope and flags the message."""
    app = make_celery_app(redis_broker, sqlite_store)

    @app.task(name=f"{app.main}.ship")
    def ship(order: str) -> str:
        return order

    headers = _published(app, lambda: ship.delay("A-1"))
    run = sqlite_store.get_run(headers[RUN_KEY_HEADER])
    assert (run.status, run.job_id, run.envelope.args) == ("queued", headers["id"], ["A-1"])
    assert run.envelope.task_name == f"{app.main}.ship"
    assert headers["flexiq_recorded"] is True


def test_c39_a_task_or_a_message_opts_out(
    redis_broker: str, sqlite_store: SqlStepStore, make_celery_app: Callable[..., Celery]
) -> None:
    """C39: ``record_at_publish=False`` on the task, or the header ``flexiq_record=False``, records nothing
    (C46: not even with a run key of its own); the library's own re-publish (a run key and the resume mark)
    is not recorded either."""
    app = make_celery_app(redis_broker, sqlite_store)

    @app.task(name=f"{app.main}.hot", record_at_publish=False)
    def hot() -> None: ...

    @app.task(name=f"{app.main}.ship")
    def ship() -> None: ...

    for send in (
        hot.delay,
        lambda: ship.apply_async(headers={"flexiq_record": False}),
        lambda: ship.apply_async(headers={RUN_KEY_HEADER: f"order-{uuid4().hex}", "flexiq_record": False}),
        lambda: hot.apply_async(headers={RUN_KEY_HEADER: f"order-{uuid4().hex}"}),
        lambda: ship.apply_async(headers={RUN_KEY_HEADER: f"run-{uuid4().hex}", RESUME_HEADER: True}),
    ):
        headers = _published(app, send)
        assert _run_status(sqlite_store, headers[RUN_KEY_HEADER]) is None
        assert "flexiq_recorded" not in headers


def test_c46_a_job_with_its_own_run_key_is_queued_unless_its_run_exists(
    redis_broker: str, sqlite_store: SqlStepStore, make_celery_app: Callable[..., Celery]
) -> None:
    """C46: ``apply_async(headers={"flexiq_run_key": ...})`` records the run ``queued`` with the job's envelope and
    flags the message, as a minted key does; a second job with that key leaves the run as it is."""
    app = make_celery_app(redis_broker, sqlite_store)

    @app.task(name=f"{app.main}.ship")
    def ship(order: str) -> str:
        return order

    order = f"order-{uuid4().hex}"
    headers = _published(app, lambda: ship.apply_async(("A-1",), headers={RUN_KEY_HEADER: order}))
    run = sqlite_store.get_run(order)
    assert (run.status, run.job_id, run.envelope.args) == ("queued", headers["id"], ["A-1"])
    assert headers["flexiq_recorded"] is True
    again = _published(app, lambda: ship.apply_async(("B-2",), headers={RUN_KEY_HEADER: order}))
    assert again[RUN_KEY_HEADER] == order
    assert sqlite_store.get_run(order) == run


def test_c39_a_countdown_is_recorded_as_the_runs_due_time(
    redis_broker: str, sqlite_store: SqlStepStore, make_celery_app: Callable[..., Celery]
) -> None:
    """C39: ``apply_async(countdown=...)`` records when the job is due, so recovery never runs it early."""
    app = make_celery_app(redis_broker, sqlite_store)

    @app.task(name=f"{app.main}.later")
    def later() -> None: ...

    headers = _published(app, lambda: later.apply_async(countdown=3600))
    run = sqlite_store.get_run(headers[RUN_KEY_HEADER])
    assert run.status == "queued"
    assert run.wake_at is not None
    assert run.wake_at - run.created_at > 3500


def test_c39_a_recovery_copy_does_not_run_a_job_its_original_handed_to_a_retry(
    redis_broker: str, sqlite_store: SqlStepStore, make_celery_app: Callable[..., Celery]
) -> None:
    """C39: the job waits past ``recovery_queued_seconds`` and recovery publishes a copy; the original runs
    first, fails, and Celery schedules its one retry. The copy (``flexiq_unstarted_only``) is dropped: the body
    runs twice, the original and its retry, and the run ends ``failed``."""
    app = make_celery_app(redis_broker, sqlite_store, recovery=False)
    ran: list[str] = []

    @app.task(name=f"{app.main}.declines", autoretry_for=(ValueError,), max_retries=1, default_retry_delay=0.5)
    def declines(order: str) -> None:
        ran.append(order)
        raise ValueError("card declined")

    declines.delay("o-1")
    declines.delay("o-2")
    report = operations.recover(sqlite_store, operations.publishers_for(app), grace=0, queued_after=0)
    assert [stranded.why for stranded, _ in report.recovered] == ["never_started", "never_started"]
    with in_process_worker(app):
        wait_for(
            lambda: [r.status for r in sqlite_store.list_runs()] == ["failed", "failed"],
            30,
            "both runs to fail for good",
        )
    assert sorted(ran) == ["o-1", "o-1", "o-2", "o-2"]


def test_c39_an_embedded_worker_stops_its_sweeper_when_it_stops(
    redis_broker: str, sqlite_store: SqlStepStore, make_celery_app: Callable[..., Celery]
) -> None:
    """C39: a worker embedded with ``celery.contrib.testing`` (as in a user's own tests) runs the recovery
    sweeper while it runs and stops it when it stops (it ends through the bootstep's ``terminate``)."""
    import threading

    app = make_celery_app(redis_broker, sqlite_store)

    def sweepers() -> int:
        return sum(t.name == "flexiq-sweeper" and t.is_alive() for t in threading.enumerate())

    before = sweepers()
    with in_process_worker(app):
        assert sweepers() == before + 1
    wait_for(lambda: sweepers() == before, 10, "the sweeper to stop with its worker")
