"""``flexiq dlq``: list, show, purge and the retry rules that need no worker (C11, C30).

Re-publishing here goes through Dramatiq's own ``StubBroker`` (its in-memory
transport, real enqueue code) or a Redis broker on a closed port (a real
connection refusal); the end-to-end retries on Redis and RabbitMQ with real
workers are in ``test_cli_divergence.py``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import fq_cli_apps
import pytest
from cli_support import Runs
from click.testing import Result
from dramatiq import Message
from dramatiq.brokers.redis import RedisBroker
from dramatiq.brokers.stub import StubBroker

from dramatiq_ext import RUN_KEY_OPTION
from flexiq_plugins import operations
from flexiq_plugins._store.sql import SqlStepStore

DEAD_KEYS = {"id", "run_key", "job_id", "task_name", "framework", "reason", "message", "created_at", "retried_at"}


@pytest.fixture
def stub_broker() -> Iterator[StubBroker]:
    """A Dramatiq stub broker reachable as ``fq_cli_apps:dramatiq_broker``."""
    broker = StubBroker()
    fq_cli_apps.dramatiq_broker = broker
    yield broker
    fq_cli_apps.dramatiq_broker = None
    broker.close()


def test_c30_dlq_list_and_show(runs: Runs, flexiq: Callable[..., Result]) -> None:
    """``dlq list`` shows id, task, framework, run key and reason; ``show`` adds message, traceback, envelope (C30)."""
    dead_id = runs.dead("run-d", framework="dramatiq", task="ship")
    table = flexiq("dlq", "list").stdout
    assert table.splitlines()[0].split() == ["ID", "TASK", "FRAMEWORK", "RUN", "KEY", "REASON", "CREATED", "MESSAGE"]
    row = next(ln.split() for ln in table.splitlines() if "run-d" in ln)
    assert row[:5] == [str(dead_id), "ship", "dramatiq", "run-d", "divergence"]
    (listed,) = json.loads(flexiq("dlq", "list", "--json").stdout)
    assert set(listed) == DEAD_KEYS
    assert (listed["id"], listed["reason"], listed["retried_at"]) == (dead_id, "divergence", None)
    full = json.loads(flexiq("dlq", "show", str(dead_id), "--json").stdout)
    assert set(full) == DEAD_KEYS | {"traceback", "envelope"}
    assert full["envelope"] == {
        "task_name": "ship", "framework": "dramatiq", "queue": "orders",
        "args": [42], "kwargs": {"express": True}, "options": {},
    }  # fmt: skip
    assert "StepDivergence" in full["traceback"]
    human = flexiq("dlq", "show", str(dead_id)).stdout
    assert "reason: divergence" in human
    assert "step 0 was 'reserve#0', now 'hold#0'" in human


def test_c30_unknown_dead_letter_exits_3(runs: Runs, flexiq: Callable[..., Result], stub_broker: StubBroker) -> None:
    """An unknown dead-letter id is exit 3 for show, retry and purge, and purges nothing."""
    dead_id = runs.dead("run-d")
    for args in (["show", "999"], ["retry", "999", "--broker", "fq_cli_apps:dramatiq_broker"], ["purge", "999"]):
        result = flexiq("dlq", *args)
        assert result.exit_code == 3, (args, result.output)
        assert result.stderr.strip() == "Error: no dead letter has the id 999"
    assert flexiq("dlq", "purge", str(dead_id), "999").exit_code == 3
    assert [d["id"] for d in json.loads(flexiq("dlq", "list", "--json").stdout)] == [dead_id]


def test_c30_purge_by_id_and_all(runs: Runs, flexiq: Callable[..., Result], store: SqlStepStore) -> None:
    """``purge ID`` deletes that dead letter, ``purge --all`` the rest; the runs stay (C30)."""
    first, *_ = [runs.dead(f"run-{i}") for i in range(3)]
    assert json.loads(flexiq("dlq", "purge", str(first), "--json").stdout) == {"purged": 1}
    assert flexiq("dlq", "purge", "--all").stdout.strip() == "purged 2 dead letters"
    assert store.list_dead_letters(include_retried=True) == []
    assert store.get_run("run-0").status == "dead"
    assert flexiq("dlq", "purge").exit_code == 2  # neither IDs nor --all


def test_c30_retry_without_a_publisher_changes_nothing(
    runs: Runs, flexiq: Callable[..., Result], store: SqlStepStore
) -> None:
    """A Celery dead letter retried with only ``--broker`` (or nothing) is a usage error; the run stays dead (C30)."""
    dead_id = runs.dead("run-c", framework="celery")
    nothing = flexiq("dlq", "retry", str(dead_id))
    assert nothing.exit_code == 2
    assert "pass --app module:app" in nothing.stderr
    fq_cli_apps.dramatiq_broker = StubBroker()
    try:
        wrong = flexiq("dlq", "retry", str(dead_id), "--broker", "fq_cli_apps:dramatiq_broker")
    finally:
        fq_cli_apps.dramatiq_broker = None
    assert wrong.exit_code == 2
    assert "is a celery job: pass --app module:app" in wrong.stderr
    assert store.get_run("run-c").status == "dead"
    assert store.get_dead_letter(dead_id).retried_at is None


def test_c30_retry_all_with_a_publisher_missing_for_one_framework_changes_nothing(
    runs: Runs, flexiq: Callable[..., Result], store: SqlStepStore, stub_broker: StubBroker
) -> None:
    """``dlq retry --all`` over Celery and Dramatiq dead letters with only ``--broker`` exits 2 and
    retries none of them, not even the Dramatiq ones it could publish (C30, docs/operations.md)."""
    celery_id = runs.dead("run-all-c", framework="celery")
    dramatiq_id = runs.dead("run-all-d", framework="dramatiq", task="ship")
    result = flexiq("dlq", "retry", "--all", "--broker", "fq_cli_apps:dramatiq_broker")
    assert result.exit_code == 2, result.output
    assert "pass --app module:app" in result.stderr
    for dead_id, run_key in ((celery_id, "run-all-c"), (dramatiq_id, "run-all-d")):
        assert store.get_dead_letter(dead_id).retried_at is None
        assert store.get_run(run_key).status == "dead"
    assert stub_broker.queues.get("orders") is None or stub_broker.queues["orders"].qsize() == 0


def test_c11_retry_publishes_a_new_job_with_the_same_run_key(
    runs: Runs, flexiq: Callable[..., Result], store: SqlStepStore, stub_broker: StubBroker
) -> None:
    """``dlq retry ID --broker`` enqueues the stored job with a new message id carrying the run key (C11, C30)."""
    dead_id = runs.dead("run-r", framework="dramatiq", task="ship")
    result = flexiq("dlq", "retry", str(dead_id), "--broker", "fq_cli_apps:dramatiq_broker", "--json")
    assert result.exit_code == 0, result.output
    (retried,) = json.loads(result.stdout)["retried"]
    assert set(retried) == {"id", "run_key", "framework", "job_id"}
    (message,) = [stub_broker.queues["orders"].get_nowait()]
    decoded = Message.decode(message).asdict()
    assert decoded["message_id"] == retried["job_id"] != "job-run-r"
    assert decoded["options"][RUN_KEY_OPTION] == "run-r"
    assert (decoded["actor_name"], list(decoded["args"]), decoded["kwargs"]) == ("ship", [42], {"express": True})
    assert store.get_run("run-r").status == "pending"
    assert len(store.get_steps("run-r")) == 2  # the memo is kept
    assert flexiq("dlq", "list", "--json").stdout.strip() == "[]"
    again = flexiq("dlq", "retry", str(dead_id), "--broker", "fq_cli_apps:dramatiq_broker")
    assert again.exit_code == 0  # still pending (not picked up): re-publishing is allowed


def test_c30_reset_from_drops_that_step_and_later_ones(
    runs: Runs, flexiq: Callable[..., Result], store: SqlStepStore, stub_broker: StubBroker
) -> None:
    """``--reset-from charge#0`` keeps ``reserve#0`` and drops ``charge#0`` (C30); an unknown step is exit 3."""
    dead_id = runs.dead("run-x", framework="dramatiq")
    bad = flexiq("dlq", "retry", str(dead_id), "--broker", "fq_cli_apps:dramatiq_broker", "--reset-from", "nope#0")
    assert bad.exit_code == 3
    assert "has no step 'nope#0'; its steps are: reserve#0, charge#0" in bad.stderr
    assert store.get_run("run-x").status == "dead"
    ok = flexiq("dlq", "retry", str(dead_id), "--broker", "fq_cli_apps:dramatiq_broker", "--reset-from", "charge#0")
    assert ok.exit_code == 0, ok.output
    assert [s.step_key for s in store.get_steps("run-x")] == ["reserve#0"]


def test_c30_retry_of_a_run_that_moved_on_is_refused(runs: Runs, store: SqlStepStore, stub_broker: StubBroker) -> None:
    """A dead letter whose retried run is running again is not retried twice (``AlreadyRetried``, nothing changed)."""
    dead_id = runs.dead("run-m", framework="dramatiq")
    publishers = operations.publishers_for(stub_broker)
    operations.retry_dead_letter(store, dead_id, publishers)
    runs.driver.start(runs.job("run-m", framework="dramatiq"))  # a worker picked it up
    with pytest.raises(operations.AlreadyRetried, match="its run is now 'running'"):
        operations.retry_dead_letter(store, dead_id, publishers)
    assert store.get_run("run-m").status == "running"


def test_c30_retry_all_with_task_filter(runs: Runs, flexiq: Callable[..., Result], stub_broker: StubBroker) -> None:
    """``retry --all --task T`` retries only T's dead letters."""
    runs.dead("run-1", framework="dramatiq", task="ship")
    runs.dead("run-2", framework="dramatiq", task="bill")
    result = flexiq("dlq", "retry", "--all", "--task", "ship", "--broker", "fq_cli_apps:dramatiq_broker", "--json")
    assert [r["run_key"] for r in json.loads(result.stdout)["retried"]] == ["run-1"]
    assert [d["run_key"] for d in json.loads(flexiq("dlq", "list", "--json").stdout)] == ["run-2"]


def test_c35_failed_publish_leaves_the_run_pending_for_recover(
    runs: Runs, flexiq: Callable[..., Result], store: SqlStepStore
) -> None:
    """A broker that refuses the publish: exit 1, the run stays ``pending``, and ``recover`` re-publishes it (C35)."""
    dead_id = runs.dead("run-p", framework="dramatiq")
    fq_cli_apps.dramatiq_broker = RedisBroker(host="127.0.0.1", port=9)
    try:
        result = flexiq("dlq", "retry", str(dead_id), "--broker", "fq_cli_apps:dramatiq_broker")
    finally:
        fq_cli_apps.dramatiq_broker = None
    assert result.exit_code == 1
    assert "could not re-publish" in result.stderr
    assert "Traceback" not in result.output
    assert store.get_run("run-p").status == "pending"
    stub = StubBroker()
    report = operations.recover(store, operations.publishers_for(stub), grace=0, stale_after=0)
    assert [(s.run.run_key, s.why) for s, _ in report.recovered] == [("run-p", "stale")]
    assert stub.queues["orders"].qsize() == 1
