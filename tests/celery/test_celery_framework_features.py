"""Celery's own features work for durable tasks as in plain Celery: canvas, eager chains and retries (C1, C11, C26).

Chains, groups, chords, links, ``retry``, ``replace``, ``revoke`` and result
states behave for durable tasks, with and without steps, as without the
integration; an eager, frozen chain runs every task, and an eager retry
replays the steps of the run it retries.
"""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery, chain, chord, group
from celery_support import in_process_worker, wait_for

from flexiq_plugins import current_job
from flexiq_plugins._model.records import TERMINAL_STATUSES

pytestmark = pytest.mark.timeout(120)


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


def test_c43_an_eager_retry_of_a_task_that_takes_no_step_writes_no_run(
    redis_broker: str, sqlite_store: Any, make_celery_app: Any
) -> None:
    """C43: ``self.retry()`` under ``Task.apply()`` of a task that takes no step retries as Celery does and leaves
    no run row; a retry that then takes a step claims its run at that step, under the retried job's key (C11)."""
    app: Celery = make_celery_app(redis_broker, sqlite_store)
    keys: list[str] = []

    @app.task(bind=True, name=f"{app.main}.retry_once", max_retries=1)
    def retry_once(self: Any) -> str:
        if self.request.retries == 0:
            raise self.retry(countdown=0, exc=ConnectionError("down"))
        return "done"

    @app.task(bind=True, name=f"{app.main}.steps_on_retry", max_retries=1)
    def steps_on_retry(self: Any) -> str:
        job = current_job.get()
        assert job is not None
        keys.append(job.run_key)
        if self.request.retries == 0:
            raise self.retry(countdown=0, exc=ConnectionError("down"))
        return str(current_job.step.run("charge", lambda: "charged"))

    assert retry_once.apply().get() == "done"
    assert sqlite_store.list_runs() == []
    assert steps_on_retry.apply().get() == "charged"
    assert len(set(keys)) == 1
    assert [(run.run_key, run.status) for run in sqlite_store.list_runs()] == [(keys[0], "succeeded")]


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
    if not steps:
        assert runs == {}  # C43: tasks that take no step are not touched: no run
        return
    assert runs["replaced"] == "succeeded"  # claimed at its first step (C23)
    assert runs["fails"] == "failed"
    left = {name: status for name, status in runs.items() if status not in TERMINAL_STATUSES}
    assert left == {}  # nothing left for recovery to publish again (C39)
