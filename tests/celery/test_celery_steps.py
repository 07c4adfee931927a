"""The Celery adapter on real brokers and stores: steps, sleeps, retries, duplicates, eager mode, options, run keys."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery_support import in_process_worker
from flexiq_celery_testapp import call_keys, count_calls, shared_double

import celery_ext
from flexiq_plugins import SqlStepStore, current_job
from flexiq_plugins.errors import ConfigurationError, InvalidDuration, UnsupportedInEagerMode

pytestmark = pytest.mark.timeout(120)


def test_c5_checkout_charges_once_and_retries_the_receipt(
    broker: str, store: Any, make_celery_app: Any, calls: str
) -> None:
    """The seed's checkout (C5, C11, C16, C28): one real charge across a sleep and an autoretry of the
    failing receipt, the receipt retried by Celery's own policy, the final value through ``AsyncResult``."""
    app = make_celery_app(broker, store)
    with in_process_worker(app):
        result = app.tasks[f"{app.main}.checkout"].delay(42, pause=0.5).get(timeout=30)
    assert result["charge"]["order"] == 42
    assert result["receipt"] == "receipt for 42"
    assert result["retries"] == 1  # the receipt's failure: one Celery retry; the sleep consumed none
    assert count_calls(calls, "charge") == 1
    assert count_calls(calls, "receipt") == 2
    keys = call_keys(calls, "receipt")
    assert keys[0] == keys[1]  # the same idempotency key across the retry (C11)
    assert keys[0].endswith(":receipt#0")
    assert [r.status for r in store.list_runs()] == ["succeeded"]


def test_c28_manual_self_retry_behaves_as_before(
    redis_broker: str, sqlite_store: Any, make_celery_app: Any, calls: str
) -> None:
    """A ``self.retry()`` in an ``except Exception`` block retries the failing receipt as plain Celery
    would (C28), the charge still runs once, and the final value comes back through ``AsyncResult``."""
    app = make_celery_app(redis_broker, sqlite_store)
    with in_process_worker(app):
        result = app.tasks[f"{app.main}.checkout_manual"].delay(7, pause=0.2).get(timeout=30)
    assert result["receipt"] == "receipt for 7"
    assert result["retries"] == 1
    assert count_calls(calls, "charge") == 1


def test_c18_sleep_of_three_seconds_in_one_second_hops(broker: str, sqlite_store: Any, make_celery_app: Any) -> None:
    """A 3 s sleep with a 1 s maximum hop (C18) wakes no earlier than 3 s, not after one hop, and
    touches no retry counter (C16): ``request.retries`` stays 0 although the task has
    ``autoretry_for=(Exception,)``; the job came back once per hop (attempts 1 + 3), no more."""
    app = make_celery_app(broker, sqlite_store, max_hop_seconds=1)
    with in_process_worker(app):
        result = app.tasks[f"{app.main}.sleeper"].delay(3.0).get(timeout=30)
        elapsed = time.time() - result["started"]
    assert elapsed >= 2.9, elapsed  # never early; how late is the machine's load, not the rule
    assert result["retries"] == 0
    assert result["attempt"] == 4
    (run,) = sqlite_store.list_runs()
    assert run.status == "succeeded"


def test_c15_a_sleep_outlives_the_messages_expires(
    redis_broker: str, sqlite_store: Any, make_celery_app: Any, in_process_worker: Callable[..., Any]
) -> None:
    """C15: a job published with ``expires=2`` s that started in time and sleeps 3 s in 1 s hops
    (C18) is not revoked as expired while it sleeps: the hops are re-published without ``expires``,
    so it wakes, completes, and its value comes back through ``AsyncResult``."""
    app = make_celery_app(redis_broker, sqlite_store, max_hop_seconds=1)
    with in_process_worker(app):
        sent = app.tasks[f"{app.main}.sleeper"].apply_async((3.0,), expires=2)
        result = sent.get(timeout=30)
    assert result["retries"] == 0
    assert result["attempt"] == 4  # the first attempt + three 1 s hops
    assert time.time() - result["started"] >= 2.9
    (run,) = sqlite_store.list_runs()
    assert run.status == "succeeded"


def test_c24_same_task_id_delivered_twice_at_once_runs_the_body_once(
    redis_broker: str, sqlite_store: Any, make_celery_app: Any, calls: str
) -> None:
    """One message delivered twice at once (same task id, same headers: what a broker redelivery
    looks like) to two worker threads (C24): the second finds the run claimed and is put back,
    then acknowledged without running once the run has succeeded (C26). The step body ran once
    and the result backend keeps the real value."""
    app = make_celery_app(redis_broker, sqlite_store)
    task = app.tasks[f"{app.main}.slow_once"]
    task_id, run_key = f"dup-{app.main}", f"rk-{app.main}"
    headers = {celery_ext.RUN_KEY_HEADER: run_key}
    with in_process_worker(app, pool="threads", concurrency=2):
        first = task.apply_async((1.5,), task_id=task_id, headers=headers)
        task.apply_async((1.5,), task_id=task_id, headers=headers)
        assert first.get(timeout=30) == "done"
        wait_queue_empty(app)  # the put-back copy was acknowledged without running
    assert count_calls(calls, "slow_once") == 1
    assert sqlite_store.get_run(run_key).attempt == 1
    assert app.AsyncResult(task_id).get(timeout=5) == "done"


def test_c11_a_run_key_header_that_is_not_a_str_is_refused() -> None:
    """C11: the run key header must be a str; anything else is refused, never coerced with ``str()``."""
    from celery.app.task import Context

    from celery_ext._envelope import run_key_of
    from flexiq_plugins import InvalidRunKey

    assert run_key_of(Context(id="task-1", headers={})) == "task-1"
    assert run_key_of(Context(id="task-1", headers={"flexiq_run_key": "rk-1"})) == "rk-1"
    with pytest.raises(InvalidRunKey, match="is not a str"):
        run_key_of(Context(id="task-1", headers={"flexiq_run_key": 42}))


def wait_queue_empty(app: Celery, timeout: float = 15) -> None:
    """Wait until ``app``'s worker holds no message of ``app`` (active, reserved or scheduled).

    ``inspect`` is a broadcast: every worker on the shared Redis answers, so
    only the tasks of this app (named ``<app>.…``) are looked at.
    """
    inspect = app.control.inspect(timeout=1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        replies = [inspect.active(), inspect.reserved(), inspect.scheduled()]
        held = [t for r in replies if r for tasks in r.values() for t in tasks if f"{app.main}." in repr(t)]
        if not held:
            return
        time.sleep(0.1)
    raise AssertionError("the worker still holds messages")


def test_c15_sleep_under_eager_mode_is_a_clear_error(
    sqlite_store: Any, make_celery_app: Any, redis_broker: str
) -> None:
    """Under ``task_always_eager`` a sleep cannot re-enqueue its job (C15): the call fails with
    :class:`UnsupportedInEagerMode` (a FlexiqError) at once, never by recursing, while steps that
    do not sleep work eagerly."""
    app = make_celery_app(redis_broker, sqlite_store)
    app.conf.task_always_eager = True
    app.conf.task_eager_propagates = True
    with pytest.raises(UnsupportedInEagerMode, match="eager mode"):
        app.tasks[f"{app.main}.sleeper"].delay(60)
    assert app.tasks[f"{app.main}.bulk"].delay(1).get() == 2


def test_c26_plain_tasks_behave_exactly_as_before(redis_broker: str, sqlite_store: Any, make_celery_app: Any) -> None:
    """Tasks that never touch ``current_job.step`` return, retry and fail exactly as on an app
    without the adapter (C26 aside: they are acknowledged late). Compared side by side."""
    durable = make_celery_app(redis_broker, sqlite_store, record_at_publish=False)
    plain = Celery(durable.main + "p", broker=redis_broker, backend=durable.conf.result_backend, set_as_current=False)
    plain.conf.task_default_queue = durable.main + "p"
    from flexiq_celery_testapp import register_tasks

    register_tasks(plain, "unused.db")
    seen: list[list[Any]] = []
    for app in (durable, plain):
        with in_process_worker(app):
            got: list[Any] = [app.tasks[f"{app.main}.plain"].delay(21).get(timeout=15)]
            got.append(app.tasks[f"{app.main}.plain_retries"].delay(2).get(timeout=15))
            failing = app.tasks[f"{app.main}.plain_fails"].delay(3)
            with pytest.raises(ValueError, match="bad 3") as info:
                failing.get(timeout=15)
            got += [failing.state, type(info.value), len(app.tasks[f"{app.main}.plain"].__class__.__mro__) > 0]
        seen.append(got)
    assert seen[0] == seen[1] == [42, 2, "FAILURE", ValueError, True]
    assert sqlite_store.list_runs() == []  # no step, no claim, not recorded at publish: no run at all (C23)


def test_c26_durable_tasks_ack_late_unless_they_say_otherwise(
    redis_broker: str, sqlite_store: Any, make_celery_app: Any
) -> None:
    """Durable tasks default to ``acks_late`` and ``reject_on_worker_lost`` (C26); a task that sets
    ``acks_late=False`` keeps it, and a ``durable=False`` task is left exactly as declared."""
    app = make_celery_app(redis_broker, sqlite_store)
    checkout = app.tasks[f"{app.main}.checkout"]
    assert checkout.acks_late is True
    assert checkout.reject_on_worker_lost is True
    assert app.tasks[f"{app.main}.not_late"].acks_late is False
    opted_out = app.tasks[f"{app.main}.opted_out"]
    assert not opted_out.acks_late
    assert not opted_out.reject_on_worker_lost
    with in_process_worker(app):
        assert opted_out.delay().get(timeout=15) == "no job"


def test_c1_shared_task_and_custom_base_are_durable(redis_broker: str, sqlite_store: Any, make_celery_app: Any) -> None:
    """A ``@shared_task`` declared at import time and a task with its own ``base=`` class (with a
    custom ``__call__``) both run as durable jobs; the shared task's run key is the stamped header."""
    app = make_celery_app(redis_broker, sqlite_store)
    with in_process_worker(app):
        shared = app.tasks[shared_double.name].delay(4)
        assert shared.get(timeout=15)["value"] == 8
        custom = app.tasks[f"{app.main}.custom_base"].delay(5).get(timeout=15)
    assert custom == {"wrapped": 10}
    run_key = shared.get()["run_key"]
    assert run_key != shared.id  # minted at publish, carried in the flexiq_run_key header
    assert sqlite_store.get_run(run_key).status == "succeeded"


def test_c1_tasks_declared_before_install_on_a_finalized_app(redis_broker: str, sqlite_store: Any, calls: str) -> None:
    """Tasks declared and finalized before ``install`` become durable too (eager run, C1/C5)."""
    app = Celery("fqt-before", broker=redis_broker, set_as_current=False)
    app.conf.task_always_eager = True

    @app.task(bind=True, durable=True)
    def early(self: Any) -> str:
        return current_job.step.run("x", lambda: f"ran as {current_job.run_key}")

    app.finalize()
    celery_ext.install(app, store=sqlite_store)
    assert early.delay().get().startswith("ran as ")
    assert app.tasks[early.name].acks_late is True


def test_c28_install_rejects_unknown_options_and_double_install(sqlite_store: Any) -> None:
    """``install`` checks its options at once (a typo is a ConfigurationError naming the accepted
    options) and refuses to install twice on one app."""
    app = Celery("fqt-options", set_as_current=False)
    with pytest.raises(ConfigurationError, match="max_hops"):
        celery_ext.install(app, store=sqlite_store, max_hops=3)
    with pytest.raises(ConfigurationError, match="option max_hop_seconds: invalid duration 'soon'"):
        celery_ext.install(app, store=sqlite_store, max_hop_seconds="soon")
    celery_ext.install(app, store=sqlite_store, max_hop_seconds="5m")
    assert celery_ext.runtime_of(app).config.max_hop_seconds == 300  # type: ignore[union-attr]
    with pytest.raises(ConfigurationError, match="already"):
        celery_ext.install(app, store=sqlite_store)


def test_c28_a_misspelt_option_gets_did_you_mean_and_a_bad_duration_names_its_option(sqlite_store: Any) -> None:
    """``install(app, leese_seconds=…)`` suggests ``lease_seconds`` and lists the names briefly (no rule ids);
    ``install(app, lease_seconds="abc")`` names the option and the accepted duration forms."""
    app = Celery("fqt-typo", set_as_current=False)
    with pytest.raises(ConfigurationError) as typo:
        celery_ext.install(app, store=sqlite_store, leese_seconds=10)
    message = str(typo.value)
    assert message.startswith("celery_ext.install: unknown option 'leese_seconds'; did you mean 'lease_seconds'? ")
    assert "Accepted options: max_hop_seconds, lease_seconds, " in message
    assert message.endswith("dead_letter_path (each described in docs/configuration.md, 'Integration options')")
    assert "C23" not in message
    with pytest.raises(InvalidDuration) as bad:
        celery_ext.install(app, store=sqlite_store, lease_seconds="abc")
    assert str(bad.value).startswith("option lease_seconds: invalid duration 'abc'; use a string of number+unit")
    assert celery_ext.runtime_of(app) is None  # nothing was installed


@pytest.mark.parametrize("store", ["postgresql//x", "mongodb://h/db", "", 12345, "postgress://u@h/db"], ids=repr)
def test_c41_install_refuses_a_store_setting_that_can_never_work(store: Any) -> None:
    """C41: ``install(app, store=…)`` with a malformed URL, an unknown scheme or a non-URL value fails at once.

    Before, the worker booted and every durable job failed with the
    configuration error and was acknowledged away; now ``install`` raises
    ``ConfigurationError`` naming the value, and the app is left untouched.
    """
    app = Celery("fqt-bad-store", set_as_current=False)
    with pytest.raises(ConfigurationError) as info:
        celery_ext.install(app, store=store)
    assert repr(store) in str(info.value)
    assert celery_ext.runtime_of(app) is None


def test_c7_the_serializer_option_takes_a_kombu_name(redis_broker: str, tmp_path: Path, make_celery_app: Any) -> None:
    """C7: ``serializer="pickle"`` (a kombu name, as in ``task_serializer``) is accepted for step values."""
    import celery_ext

    store = SqlStepStore(f"sqlite:///{tmp_path / 'ser.db'}")
    try:
        app = make_celery_app(redis_broker, store, serializer="pickle")
        runtime = celery_ext.runtime_of(app)
        assert runtime is not None
        assert runtime.config.serializer is not None
        assert "pickle" in runtime.config.serializer.name
    finally:
        store.close()


def test_celery_ext_exports() -> None:
    """The public names of ``celery_ext``, sorted."""
    assert celery_ext.__all__ == sorted(celery_ext.__all__)
    assert set(celery_ext.__all__) == {
        "CeleryAdapter", "CeleryConfig", "DEAD_LETTER_HEADER", "DEFAULT_DEAD_LETTER_QUEUE", "DeadLetterReject",
        "DurableTask", "RUN_KEY_HEADER", "adapter", "install", "publisher", "republish", "run_key_of", "runtime_of",
    }  # fmt: skip
