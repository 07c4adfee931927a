"""Celery: a new job's run is recorded ``queued`` when it is published, unless the task or the message opts out
(C39), whether the integration minted its run key or the producer chose it (C46). Published on a real broker;
no worker runs, so what the store holds is what the publish wrote.
Every task here declares ``durable=True`` (C43): only a task known to take steps is recorded; one not
known yet is not (the C43 tests).
"""

from __future__ import annotations

from collections.abc import Callable
from uuid import uuid4

from celery import Celery
from celery_support import in_process_worker, published_headers, wait_for

from celery_ext import RUN_KEY_HEADER
from celery_ext._options import RESUME_HEADER
from flexiq_plugins import SqlStepStore, UnknownRun, operations


def _run_status(store: SqlStepStore, run_key: str) -> str | None:
    try:
        return store.get_run(run_key).status
    except UnknownRun:
        return None


def test_c39_a_new_job_is_queued_before_a_worker_sees_it(
    redis_broker: str, sqlite_store: SqlStepStore, make_celery_app: Callable[..., Celery]
) -> None:
    """C39: ``delay`` records the run ``queued`` with the job's envelope and flags the message."""
    app = make_celery_app(redis_broker, sqlite_store)

    @app.task(durable=True, name=f"{app.main}.ship")
    def ship(order: str) -> str:
        return order

    headers = published_headers(lambda: ship.delay("A-1"))
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

    @app.task(durable=True, name=f"{app.main}.hot", record_at_publish=False)
    def hot() -> None: ...

    @app.task(durable=True, name=f"{app.main}.ship")
    def ship() -> None: ...

    for send in (
        hot.delay,
        lambda: ship.apply_async(headers={"flexiq_record": False}),
        lambda: ship.apply_async(headers={RUN_KEY_HEADER: f"order-{uuid4().hex}", "flexiq_record": False}),
        lambda: hot.apply_async(headers={RUN_KEY_HEADER: f"order-{uuid4().hex}"}),
        lambda: ship.apply_async(headers={RUN_KEY_HEADER: f"run-{uuid4().hex}", RESUME_HEADER: True}),
    ):
        headers = published_headers(send)
        assert _run_status(sqlite_store, headers[RUN_KEY_HEADER]) is None
        assert "flexiq_recorded" not in headers


def test_c46_a_job_with_its_own_run_key_is_queued_unless_its_run_exists(
    redis_broker: str, sqlite_store: SqlStepStore, make_celery_app: Callable[..., Celery]
) -> None:
    """C46: ``apply_async(headers={"flexiq_run_key": ...})`` records the run ``queued`` with the job's envelope and
    flags the message, as a minted key does; a second job with that key leaves the run as it is."""
    app = make_celery_app(redis_broker, sqlite_store)

    @app.task(durable=True, name=f"{app.main}.ship")
    def ship(order: str) -> str:
        return order

    order = f"order-{uuid4().hex}"
    headers = published_headers(lambda: ship.apply_async(("A-1",), headers={RUN_KEY_HEADER: order}))
    run = sqlite_store.get_run(order)
    assert (run.status, run.job_id, run.envelope.args) == ("queued", headers["id"], ["A-1"])
    assert headers["flexiq_recorded"] is True
    again = published_headers(lambda: ship.apply_async(("B-2",), headers={RUN_KEY_HEADER: order}))
    assert again[RUN_KEY_HEADER] == order
    assert sqlite_store.get_run(order) == run


def test_c39_a_countdown_is_recorded_as_the_runs_due_time(
    redis_broker: str, sqlite_store: SqlStepStore, make_celery_app: Callable[..., Celery]
) -> None:
    """C39: ``apply_async(countdown=...)`` records when the job is due, so recovery never runs it early."""
    app = make_celery_app(redis_broker, sqlite_store)

    @app.task(durable=True, name=f"{app.main}.later")
    def later() -> None: ...

    headers = published_headers(lambda: later.apply_async(countdown=3600))
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

    @app.task(
        durable=True, name=f"{app.main}.declines", autoretry_for=(ValueError,), max_retries=1, default_retry_delay=0.5
    )
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


def test_c47_a_job_a_worker_without_the_integration_failed_is_settled_not_re_published(
    redis_broker: str, sqlite_store: SqlStepStore, make_celery_app: Callable[..., Celery]
) -> None:
    """C47, C39: the producer has the integration and records the run; the worker that takes the job has
    no ``celery_ext.install`` (forgotten), runs the body, which fails, and Celery stores FAILURE. Recovery reads
    that from the result backend and settles the run ``failed``: the body is not run again under a new task."""
    from celery import Celery as PlainCelery

    app = make_celery_app(redis_broker, sqlite_store, recovery=False)
    ran: list[str] = []

    @app.task(durable=True, name=f"{app.main}.declines", shared=False)
    def declines(order: str) -> None:
        raise AssertionError("the producer never runs it")

    bare = PlainCelery(f"{app.main}-bare", broker=redis_broker, backend=app.conf.result_backend, set_as_current=False)
    bare.conf.update(task_default_queue=app.main, worker_hijack_root_logger=False)

    @bare.task(name=f"{app.main}.declines", shared=False)
    def bare_declines(order: str) -> None:
        ran.append(order)
        raise ValueError("card declined")

    sent = declines.delay("o-1")
    with in_process_worker(bare):
        wait_for(lambda: app.AsyncResult(sent.id).state == "FAILURE", 30, "the bare worker to fail the job")
    run_key = sqlite_store.list_runs(task_name=f"{app.main}.declines")[0].run_key
    assert sqlite_store.get_run(run_key).status == "queued"  # nothing told the store
    report = operations.recover(sqlite_store, operations.publishers_for(app), grace=0, queued_after=0)
    assert [(s.run.run_key, status) for s, status in report.settled] == [(run_key, "failed")]
    assert report.recovered == []
    assert sqlite_store.get_run(run_key).status == "failed"
    with in_process_worker(bare):  # nothing was re-published for a worker to run
        assert operations.recover(sqlite_store, operations.publishers_for(app), queued_after=0).recovered == []
    assert ran == ["o-1"]


def test_c39_a_lost_message_is_re_published_under_its_task_id_and_its_waiter_gets_the_result(
    redis_broker: str, sqlite_store: SqlStepStore, make_celery_app: Callable[..., Celery]
) -> None:
    """C39, C47: the queue is deleted before any worker takes the job; recovery re-publishes the run under its
    original task id, so the ``AsyncResult`` the producer holds gets the value; the body ran once."""
    app = make_celery_app(redis_broker, sqlite_store, recovery=False)
    ran: list[str] = []

    @app.task(durable=True, name=f"{app.main}.ship")
    def ship(order: str) -> str:
        ran.append(order)
        return f"shipped {order}"

    sent = ship.delay("A-1")
    _lose_queue(app)
    report = operations.recover(sqlite_store, operations.publishers_for(app), grace=0, queued_after=0)
    assert [job_id for _, job_id in report.recovered] == [sent.id]
    with in_process_worker(app):
        assert sent.get(timeout=30) == "shipped A-1"
    assert ran == ["A-1"]


def test_c39_a_copy_under_the_same_task_id_is_deduplicated_by_the_runs_claim(
    redis_broker: str, sqlite_store: SqlStepStore, make_celery_app: Callable[..., Celery]
) -> None:
    """C39, C24, C37: the original message was only late; recovery's copy carries the same task id. Both reach
    the worker: one runs the body, the other finds the run started or finished and does not run it again; the
    original waiter gets the value."""
    app = make_celery_app(redis_broker, sqlite_store, recovery=False)
    ran: list[str] = []

    @app.task(durable=True, name=f"{app.main}.ship")
    def ship(order: str) -> str:
        ran.append(order)
        return f"shipped {order}"

    sent = ship.delay("B-2")
    report = operations.recover(sqlite_store, operations.publishers_for(app), grace=0, queued_after=0)
    assert [job_id for _, job_id in report.recovered] == [sent.id]
    with in_process_worker(app):
        assert sent.get(timeout=30) == "shipped B-2"
        run_key = sqlite_store.list_runs(task_name=f"{app.main}.ship")[0].run_key
        wait_for(lambda: _queue_length(app) == 0, 30, "both messages to be taken")
    assert sqlite_store.get_run(run_key).status == "succeeded"
    assert ran == ["B-2"]


def _queue_length(app: Celery) -> int:
    with app.connection_for_write() as conn:
        return int(conn.default_channel.client.llen(app.main))


def _lose_queue(app: Celery) -> None:
    """Delete the app's queue from Redis, as a broker restarted without persistence would have lost it."""
    with app.connection_for_write() as conn:
        conn.default_channel.client.delete(app.main)
    assert _queue_length(app) == 0


def test_c39_a_worker_sweeps_when_its_consumer_reconnects_to_the_broker(
    redis_broker: str, sqlite_store: SqlStepStore, make_celery_app: Callable[..., Celery]
) -> None:
    """C39: the integration adds a step to the consumer's blueprint, which Celery starts again after a lost
    broker connection; that start (``restart_count`` past 1) wakes the worker's sweeper, so a job the restarted
    broker lost is re-published without waiting a whole ``recovery_interval_seconds`` (an hour here). The first
    connection, as the worker starts, does not. (The consumer is stood in for by its two attributes the step
    reads; ``start_worker`` cannot lose its broker connection on purpose.)"""
    from types import SimpleNamespace

    from celery_ext._adapter import publisher
    from celery_ext._recovery import ReconnectSweep
    from celery_ext._runtime import runtime_of
    from flexiq_plugins.operations import Sweeper

    app = make_celery_app(redis_broker, sqlite_store, recovery=False)
    assert ReconnectSweep in app.steps["consumer"]

    @app.task(durable=True, name=f"{app.main}.ship")
    def ship(order: str) -> str:
        return f"shipped {order}"

    ship.delay("C-3")
    _lose_queue(app)
    [run] = sqlite_store.list_runs(task_name=f"{app.main}.ship")
    wait_for(lambda: sqlite_store.now() > run.created_at, 5, "the store's clock to move on")
    runtime = runtime_of(app)
    assert runtime is not None
    sweeper = runtime.sweeper = Sweeper(sqlite_store, {"celery": publisher(app)}, interval=3600, queued_after=0)
    try:
        step = ReconnectSweep(SimpleNamespace())
        step.start(SimpleNamespace(app=app, restart_count=1))  # the first connection
        assert not sweeper._wake.is_set()
        step.start(SimpleNamespace(app=app, restart_count=2))  # a reconnection
        assert sweeper._wake.is_set()
        sweeper.start()  # its thread ticks at once, not in an hour
        wait_for(lambda: _queue_length(app) == 1, 10, "the woken sweeper to re-publish the lost job")
    finally:
        runtime.sweeper.stop(timeout=5)
        runtime.sweeper = None
    assert sqlite_store.get_run(run.run_key).recovered_at is not None
