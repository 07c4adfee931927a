"""Invisible until used: Celery's own behaviour is unchanged by the integration (issue 16).

A failed attempt frees its exception at once (no reference cycle left for the
cyclic collector); eager, frozen chains run every task; a durable task called
as a plain function inside a durable task is a plain call; a task that takes
no step does no store I/O; canvas features keep working for durable tasks.
"""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery, chain, chord, group
from celery.signals import task_failure
from conftest import in_process_worker, wait_for

from flexiq_plugins import current_job
from flexiq_plugins._attempt.decisions import Failure
from flexiq_plugins._model.records import TERMINAL_STATUSES

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


@pytest.mark.parametrize("how", ["apply", "task_always_eager"])
@pytest.mark.parametrize("steps", [False, True], ids=["no_step", "step"])
def test_c1_an_eager_frozen_chain_runs_every_task_as_plain_celery(
    redis_broker: str, sqlite_store: Any, make_celery_app: Any, how: str, steps: bool
) -> None:
    """C1: Celery runs every task of an eagerly applied, frozen chain under the chain's task id; each one is
    still a job of its own task (never taken for a duplicate of the one before): the chain returns the value
    plain Celery returns, the same task twice in a row included."""
    app: Celery = make_celery_app(redis_broker, sqlite_store)
    app.conf.task_always_eager = how == "task_always_eager"
    app.conf.task_eager_propagates = True

    @app.task(name=f"{app.main}.add")
    def add(x: int, y: int) -> int:
        return current_job.step.run("add", lambda: x + y) if steps else x + y

    @app.task(name=f"{app.main}.double")
    def double(x: int) -> int:
        return current_job.step.run("double", lambda: 2 * x) if steps else 2 * x

    @app.task(name=f"{app.main}.plain_add", durable=False)
    def plain_add(x: int, y: int) -> int:
        return x + y

    @app.task(name=f"{app.main}.plain_double", durable=False)
    def plain_double(x: int) -> int:
        return 2 * x

    for plus, times in ((add, double), (plain_add, plain_double)):
        sig = chain(plus.s(1, 2), plus.s(3), times.s())
        sig.freeze()
        result = sig.apply() if how == "apply" else sig.apply_async()
        assert result.get(timeout=10) == 12, plus.name


def test_c11_an_eager_retry_replays_the_steps_of_the_run_it_retries(
    redis_broker: str, sqlite_store: Any, make_celery_app: Any
) -> None:
    """C11: ``self.retry()`` under ``Task.apply()`` runs the retry eagerly in the same run: the step that
    committed before the retry is replayed, not run again."""
    app: Celery = make_celery_app(redis_broker, sqlite_store)
    charges: list[int] = []

    @app.task(bind=True, name=f"{app.main}.flaky", max_retries=2)
    def flaky(self: Any) -> int:
        charge = current_job.step.run("charge", lambda: charges.append(1) or len(charges))
        if self.request.retries == 0:
            raise self.retry(countdown=0, exc=ConnectionError("down"))
        return charge

    assert flaky.apply().get() == 1
    assert charges == [1]


@pytest.mark.parametrize("steps", [False, True], ids=["no_step", "step"])
def test_c10_a_durable_task_calling_itself_directly_is_a_plain_call(
    redis_broker: str, sqlite_store: Any, make_celery_app: Any, steps: bool
) -> None:
    """C10: calling a durable task object as a function inside its own body runs the body in-process, as in
    plain Celery: no second attempt, the outer attempt's claim and decision untouched; the inner call has no
    ``current_job`` of its own. ``countdown.delay(3).get()`` is 3, and the run is ``succeeded``."""
    app: Celery = make_celery_app(redis_broker, sqlite_store)
    inner_jobs: list[bool] = []

    @app.task(name=f"{app.main}.countdown")
    def countdown(n: int) -> int:
        if n == 0:
            inner_jobs.append(bool(current_job))
            return 0
        if steps and not inner_jobs and bool(current_job):
            current_job.step.run("outer", lambda: n)
        return 1 + countdown(n - 1)

    with in_process_worker(app):
        result = countdown.delay(3)
        assert result.get(timeout=20) == 3
    assert result.state == "SUCCESS"
    assert inner_jobs == [False]
    if steps:
        assert [r.status for r in sqlite_store.list_runs()] == ["succeeded"]


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

    @app.task(name=f"{app.main}.no_step")
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


@pytest.mark.parametrize("steps", [False, True], ids=["no_step", "step"])
def test_c26_celery_canvas_works_for_durable_tasks(
    redis_broker: str, sqlite_store: Any, make_celery_app: Any, steps: bool
) -> None:
    """C26: chains, groups, chords, ``link`` and ``link_error``, ``retry`` with a countdown, ``replace``,
    ``revoke`` and result states behave for durable tasks, with and without steps, as in plain Celery."""
    app: Celery = make_celery_app(redis_broker, sqlite_store)
    errors: list[str] = []

    def stepped(name: str, value: Any) -> Any:
        return current_job.step.run(name, lambda: value) if steps else value

    @app.task(name=f"{app.main}.add")
    def add(x: int, y: int) -> int:
        return int(stepped("add", x + y))

    @app.task(name=f"{app.main}.double")
    def double(x: int) -> int:
        return int(stepped("double", 2 * x))

    @app.task(name=f"{app.main}.total")
    def total(values: list[int]) -> int:
        return int(stepped("total", sum(values)))

    @app.task(name=f"{app.main}.fails")
    def fails() -> None:
        stepped("before", 1)
        raise KeyError("nope")

    @app.task(name=f"{app.main}.on_error")
    def on_error(what: str) -> None:
        errors.append(what)

    @app.task(bind=True, name=f"{app.main}.retrying", max_retries=3)
    def retrying(self: Any) -> int:
        stepped("before", 1)
        if self.request.retries < 2:
            raise self.retry(countdown=0.1)
        return int(self.request.retries)

    @app.task(bind=True, name=f"{app.main}.replaced")
    def replaced(self: Any, x: int) -> Any:
        stepped("before", 1)
        raise self.replace(double.s(x))

    with in_process_worker(app, pool="threads", concurrency=2):
        assert chain(add.s(1, 2), add.s(3), double.s()).delay().get(timeout=20) == 12
        assert group(add.s(i, i) for i in range(3)).delay().get(timeout=20) == [0, 2, 4]
        assert chord(add.s(i, i) for i in range(3))(total.s()).get(timeout=20) == 6
        linked = double.s()
        linked.freeze()
        add.apply_async((1, 1), link=linked)
        assert app.AsyncResult(linked.id).get(timeout=20) == 4
        failed = fails.apply_async(link_error=on_error.si("fails"))
        with pytest.raises(KeyError):
            failed.get(timeout=20)
        assert failed.state == "FAILURE"
        wait_for(lambda: errors == ["fails"], timeout=20, what="the link_error callback")
        assert retrying.delay().get(timeout=20) == 2
        assert replaced.delay(5).get(timeout=20) == 10
        later = add.apply_async((1, 1), countdown=30)
        later.revoke()
        wait_for(lambda: later.state == "REVOKED", timeout=20, what="the revoke")
    runs = {r.task_name.rsplit(".", 1)[1]: r.status for r in sqlite_store.list_runs()}
    assert runs["replaced"] == "succeeded"  # recorded at publish (C39)
    assert runs["fails"] == "failed"
    left = {name: status for name, status in runs.items() if status not in TERMINAL_STATUSES}
    assert left == {}  # nothing left for recovery to publish again (C39)


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
