"""A duplicate of a finished run replays its outcome through Dramatiq's own path (C37).

A message whose run is already finished (a redelivery after the worker died
between the store's end of the run and Dramatiq's result, or a new message
published with a finished run's key) does not run the actor's body: the
actor call returns the stored value, so ``Results`` stores it and a
pipeline (``|``) goes on; or it raises the stored error, which ``Retries``
fails at once (no retry of a delivery that would only replay it again), so
``Results`` stores the error and the message goes to the dead-letter queue.
The next stage of a pipeline and a group's completion callback that Dramatiq
enqueues again for a replayed run are the same runs as the first time (C44).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from uuid import uuid4

import dramatiq
import pytest
from dq_support import Supervisor, dead_letter_count, status_of, wait_until
from dramatiq import group, pipeline
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import GroupCallbacks
from dramatiq.rate_limits.backends import RedisBackend as RedisRateLimiter
from dramatiq.results import ResultFailure, Results
from dramatiq.results.backends import RedisBackend

from dramatiq_ext import RUN_KEY_OPTION, DurableSteps
from flexiq_plugins import SqlStepStore, current_job
from flexiq_plugins._store.base import StepStore

REDIS = ("Redis", "127.0.0.1", 6379)
HERE = Path(__file__).parent

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]


@pytest.fixture
def results(broker: dramatiq.Broker, namespace: str, sqlite_store: StepStore, require_service: Any) -> RedisBackend:
    """A Redis ``Results`` backend and the durable-steps middleware on the test's broker."""
    require_service(*REDIS)
    backend = RedisBackend(host=REDIS[1], port=REDIS[2], namespace=f"{namespace}:results")
    broker.add_middleware(Results(backend=backend))
    broker.add_middleware(DurableSteps(store=sqlite_store))
    return backend


def test_c37_dramatiq_a_message_with_a_finished_runs_key_returns_its_value_to_results_and_the_pipeline(
    broker: dramatiq.Broker,
    queue: str,
    results: RedisBackend,
    sqlite_store: StepStore,
    start_worker: Callable[..., dramatiq.Worker],
) -> None:
    """C37: a second message with a succeeded run's key: ``get_result`` is the stored 21, and ``total | double`` is 42.

    The body ran once; before, the message was acknowledged without a
    result, so ``get_result(block=True)`` timed out and the pipeline stopped.
    """
    ran: list[int] = []

    @dramatiq.actor(broker=broker, queue_name=queue, store_results=True)
    def total(x: int) -> int:
        ran.append(x)
        return int(current_job.step.run("add", lambda: x + 1))

    @dramatiq.actor(broker=broker, queue_name=queue, store_results=True)
    def double(x: int) -> int:
        return x * 2

    start_worker(broker)
    first = total.send(20)
    run_key = first.options[RUN_KEY_OPTION]
    assert first.get_result(backend=results, block=True, timeout=20_000) == 21
    again = total.message_with_options(args=(99,), **{RUN_KEY_OPTION: run_key})
    broker.enqueue(again)
    assert again.get_result(backend=results, block=True, timeout=20_000) == 21
    piped = total.message_with_options(args=(99,), **{RUN_KEY_OPTION: run_key}) | double.message()
    piped.run()
    assert piped.get_result(block=True, timeout=20_000) == 42
    assert ran == [20]
    assert sqlite_store.get_run(run_key).attempt == 1


def test_c37_dramatiq_a_message_with_a_failed_runs_key_stores_its_error_and_is_not_retried(  # noqa: PLR0917
    broker: dramatiq.Broker,
    queue: str,
    namespace: str,
    results: RedisBackend,
    sqlite_store: StepStore,
    start_worker: Callable[..., dramatiq.Worker],
) -> None:
    """C37: a new message with a failed run's key: ``Results`` stores the same ``ValueError``; it is not retried.

    The message allows retries (``max_retries=3``), yet the replayed error
    is failed at once: the message is in the dead-letter queue beside the
    first one (a retry would have gone to the delay queue), and the body ran
    exactly once.
    """
    ran: list[str] = []

    @dramatiq.actor(broker=broker, queue_name=queue, store_results=True, max_retries=0)
    def declines(label: str) -> None:
        ran.append(label)
        current_job.step.run("reserve", lambda: "r-1")
        raise ValueError(f"card declined for {label}")

    start_worker(broker)
    first = declines.send("a-1")
    with pytest.raises(ResultFailure, match="card declined for a-1"):
        first.get_result(backend=results, block=True, timeout=20_000)
    run_key = first.options[RUN_KEY_OPTION]
    wait_until(lambda: dead_letter_count(broker, queue, namespace) == 1, what="the first message dead-lettered")
    again = declines.message_with_options(args=("a-2",), max_retries=3, **{RUN_KEY_OPTION: run_key})
    broker.enqueue(again)
    with pytest.raises(ResultFailure, match="card declined for a-1") as replayed:
        again.get_result(backend=results, block=True, timeout=20_000)
    assert replayed.value.orig_exc_type == "ValueError"
    wait_until(lambda: dead_letter_count(broker, queue, namespace) == 2, what="the replay failed, not retried")
    assert ran == ["a-1"]
    assert sqlite_store.get_run(run_key).status == "failed"


# ------------------------------------------------ C44: jobs dispatched on a run's behalf
class _Handled(dramatiq.Middleware):
    """Counts, by actor name, the messages a worker finished handling (processed or skipped)."""

    def __init__(self) -> None:
        self.done: Counter[str] = Counter()
        self.sent: list[dramatiq.Message[Any]] = []

    def after_enqueue(self, broker: dramatiq.Broker, message: Any, delay: int | None) -> None:
        """Keep every message enqueued, as it left."""
        self.sent.append(message.copy())

    def after_process_message(self, broker: dramatiq.Broker, message: Any, **_: Any) -> None:
        """Count a processed message."""
        self.done[message.actor_name] += 1

    def after_skip_message(self, broker: dramatiq.Broker, message: Any) -> None:
        """Count a skipped message."""
        self.done[message.actor_name] += 1


def _runs_of(store: StepStore, actor: str) -> list[tuple[str, str, int]]:
    """``(run key, status, attempt)`` of every run of ``actor`` in the store."""
    return sorted((r.run_key, r.status, r.attempt) for r in store.list_runs(task_name=actor))


def test_c44_dramatiq_a_replayed_stage_enqueues_the_next_stage_as_the_same_run(
    broker: dramatiq.Broker,
    queue: str,
    results: RedisBackend,
    sqlite_store: StepStore,
    start_worker: Callable[..., dramatiq.Worker],
) -> None:
    """C44, C37: ``total | double`` gives 42; a second pipeline whose first message has the finished run's key
    replays 21, and ``Pipelines`` enqueues its next stage under the key ``<run key>/pipe`` it had the first
    time: that stage replays 42 instead of running its step again. A next stage given its own key keeps it."""
    ran: list[tuple[str, int]] = []

    @dramatiq.actor(broker=broker, queue_name=queue, store_results=True)
    def total(x: int) -> int:
        return int(current_job.step.run("add", lambda: ran.append(("total", x)) or x + 1))

    @dramatiq.actor(broker=broker, queue_name=queue, store_results=True)
    def double(x: int) -> int:
        return int(current_job.step.run("double", lambda: ran.append(("double", x)) or x * 2))

    start_worker(broker)
    order = f"order-{uuid4().hex[:8]}"
    for _ in range(2):
        piped = total.message_with_options(args=(20,), **{RUN_KEY_OPTION: order}) | double.message()
        piped.run()
        assert piped.get_result(block=True, timeout=20_000) == 42
    mine = f"mine-{uuid4().hex[:8]}"
    own = total.message(1) | double.message_with_options(**{RUN_KEY_OPTION: mine})
    own.run()
    assert own.get_result(block=True, timeout=20_000) == 4
    assert ran.count(("total", 20)) == 1
    assert ran.count(("double", 21)) == 1
    assert (f"{order}/pipe", "succeeded", 1) in _runs_of(sqlite_store, "double")
    assert (mine, "succeeded", 1) in _runs_of(sqlite_store, "double")


def test_c44_dramatiq_a_group_completion_callback_is_one_run_whichever_member_enqueues_it(
    broker: dramatiq.Broker,
    queue: str,
    results: RedisBackend,
    sqlite_store: StepStore,
    start_worker: Callable[..., dramatiq.Worker],
) -> None:
    """C44: a group's completion callback has the key ``<group completion id>/group/0``; a member delivered
    again after the group completed (its barrier stays cleared) enqueues the callback again under that key,
    and it replays instead of running its step twice. The group's own callback list is left unstamped."""
    handled = _Handled()
    broker.add_middleware(handled)
    broker.add_middleware(GroupCallbacks(RedisRateLimiter(host=REDIS[1], port=REDIS[2])))
    noted: list[str] = []

    @dramatiq.actor(broker=broker, queue_name=queue)
    def part(x: int) -> None:
        current_job.step.run("work", lambda: x)

    @dramatiq.actor(broker=broker, queue_name=queue)
    def summary(label: str) -> None:
        current_job.step.run("note", lambda: noted.append(label))

    start_worker(broker)
    members = group([part.message(1), part.message(2)])
    members.add_completion_callback(summary.message("g"))
    members.run()
    wait_until(lambda: handled.done["summary"] == 1, what="the completion callback")
    ((key, status, attempt),) = _runs_of(sqlite_store, "summary")
    group_id = next(m.options["group_completion_uuid"] for m in handled.sent if m.actor_name == "part")
    assert (key, status, attempt) == (f"{group_id}/group/0", "succeeded", 1)
    assert RUN_KEY_OPTION not in members.completion_callbacks[0]["options"]
    duplicate = next(m for m in handled.sent if m.actor_name == "part")
    broker.enqueue(duplicate)
    wait_until(lambda: handled.done["summary"] == 2, what="the callback the duplicate enqueued")
    assert noted == ["g"]
    assert _runs_of(sqlite_store, "summary") == [(key, "succeeded", 1)]


def test_c44_dramatiq_a_message_the_body_sends_itself_stays_a_new_run(
    broker: dramatiq.Broker,
    queue: str,
    results: RedisBackend,
    sqlite_store: StepStore,
    start_worker: Callable[..., dramatiq.Worker],
) -> None:
    """C44, C11: ``send()`` inside a durable body is the user's own new job: a new run key, nothing derived."""

    @dramatiq.actor(broker=broker, queue_name=queue, store_results=True)
    def child(x: int) -> int:
        return int(current_job.step.run("child", lambda: x))

    @dramatiq.actor(broker=broker, queue_name=queue, store_results=True)
    def parent(x: int) -> str:
        current_job.step.run("charge", lambda: x)
        return str(child.send(x).options[RUN_KEY_OPTION])

    start_worker(broker)
    sent = parent.send(5)
    child_key = sent.get_result(backend=results, block=True, timeout=20_000)
    wait_until(lambda: _runs_of(sqlite_store, "child"), what="the child's run")
    assert _runs_of(sqlite_store, "child")[0][0] == child_key
    assert "/" not in child_key
    assert not child_key.startswith(sent.options[RUN_KEY_OPTION])


def _labelled_runs(store: StepStore, actor: str, label: str) -> list[tuple[str, str, int]]:
    """``(run key, status, attempt)`` of the runs of ``actor`` whose job's first argument is ``label``."""
    runs = store.list_runs(task_name=actor)
    return sorted((r.run_key, r.status, r.attempt) for r in runs if r.envelope.args[:1] == [label])


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory, require_service: Any) -> Iterator[dict[str, Any]]:
    """A supervised ``dramatiq dq_run_keys_app`` CLI on its own Redis namespace and SQLite store; a producer."""
    require_service(*REDIS)
    here = tmp_path_factory.mktemp("dramatiq-run-keys")
    queue, namespace = f"fq_{uuid4().hex[:10]}", f"flexiq-test-{uuid4().hex[:10]}"
    store_url = f"sqlite:///{here / 'steps.db'}"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE.parents[1]), str(HERE)]),
        "FLEXIQ_TEST_NAMESPACE": namespace,
        "FLEXIQ_TEST_QUEUE": queue,
        "FLEXIQ_TEST_STORE": store_url,
        "FLEXIQ_TEST_DIR": str(here),
    }
    producer = RedisBroker(host=REDIS[1], port=REDIS[2], namespace=namespace)
    producer.declare_queue(queue)
    store = SqlStepStore(store_url)
    supervisor = Supervisor("dq_run_keys_app", env, here / "worker.log")
    supervisor.start()
    try:
        yield {"producer": producer, "store": store, "dir": here, "queue": queue, "supervisor": supervisor}
    finally:
        supervisor.stop()
        keys = list(producer.client.scan_iter(f"{namespace}:*"))
        if keys:
            producer.client.delete(*keys)
        producer.close()
        store.close()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_c44_dramatiq_a_worker_killed_while_enqueueing_the_next_stage_leaves_it_one_run(
    cli: dict[str, Any],
) -> None:
    """C44, C37, C39: the first stage's run commits 21, then the worker process dies while ``Pipelines``
    enqueues the next stage, after that stage's run was recorded ``queued``. The first stage's message comes
    back, replays 21, and the next stage is enqueued again under the same key ``<run key>/pipe``: its step
    runs once, and the store holds one run of it, no orphan for recovery to publish again."""
    queue, store, here = cli["queue"], cli["store"], cli["dir"]
    label, order = uuid4().hex[:8], f"order-{uuid4().hex[:8]}"
    first = dramatiq.Message(queue_name=queue, actor_name="total", args=(label, 20), kwargs={}, options={})
    then = dramatiq.Message(queue_name=queue, actor_name="noted", args=(label,), kwargs={}, options={})
    pipeline([first.copy(options={RUN_KEY_OPTION: order}), then], broker=cli["producer"]).run()

    stage = f"{order}/pipe"
    wait_until(lambda: status_of(store, stage) == "succeeded", 180, "the next stage's run")
    assert (here / f"{label}.died").exists()
    assert cli["supervisor"].starts >= 2
    calls = (here / "calls").read_text().split()
    assert calls.count(f"{label}:total") == 1
    assert calls.count(f"{label}:noted:21") == 1
    assert _labelled_runs(store, "noted", label) == [(stage, "succeeded", 1)]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_c46_dramatiq_a_second_job_with_a_finished_runs_own_key_replays_on_a_real_worker(
    cli: dict[str, Any],
) -> None:
    """C46, C37: a ``dramatiq`` worker process runs a job published with the producer's own key; a second job
    with that key (other arguments) does not run the body: it replays 21, which the next stage it is piped
    into receives."""
    queue, store, here = cli["queue"], cli["store"], cli["dir"]
    label, order, after = uuid4().hex[:8], f"order-{uuid4().hex[:8]}", f"after-{uuid4().hex[:8]}"
    (here / f"{label}.died").write_text("")  # this test's stages never kill the worker
    own = {RUN_KEY_OPTION: order}
    first = dramatiq.Message(queue_name=queue, actor_name="total", args=(label, 20), kwargs={}, options=own)
    cli["producer"].enqueue(first)
    wait_until(lambda: status_of(store, order) == "succeeded", 120, "the first job's run")
    second = first.copy(args=(label, 99), message_id=uuid4().hex)
    then = dramatiq.Message(queue_name=queue, actor_name="noted", args=(label,), kwargs={}, options={})
    then = then.copy(options={RUN_KEY_OPTION: after})
    pipeline([second, then], broker=cli["producer"]).run()
    wait_until(lambda: status_of(store, after) == "succeeded", 120, "the stage the replay is piped into")
    calls = (here / "calls").read_text().split()
    assert calls.count(f"{label}:total") == 1
    assert calls.count(f"{label}:noted:21") == 1
    assert _labelled_runs(store, "total", label) == [(order, "succeeded", 1)]
