"""Dead letters, dead-letter retries and recovery of lost messages: one behaviour for every adapter.

The divergence scenario (``deploy_between_attempts``) fails its first attempt
after committing ``charge`` and ``reserve``; the retry runs a "new deploy"
whose second step is ``allocate``, which the recorded sequence does not
allow.
"""

from __future__ import annotations

import pytest

from flexiq_plugins import new_run_key, operations
from tests.conformance.harness import Harness, Job
from tests.polling import wait_for

pytestmark = pytest.mark.timeout(120)


def _diverged(harness: Harness) -> Job:
    """Publish the divergence scenario and wait until its message is on the broker's dead-letter path."""
    job = harness.publish("deploy_between_attempts")
    harness.wait_status(job.run_key, "dead")
    wait_for(lambda: harness.broker_dead_letters(job.run_key), 20, "the broker's dead-letter path")
    return job


def test_c13_c29_c30_a_divergence_is_dead_lettered_in_the_store_and_the_broker_never_retried(
    harness: Harness,
) -> None:
    """C12, C13, C29, C30: the step sequence changed between attempts; the job is dead-lettered, not retried.

    The task allows three retries for any exception, and its first failure is
    retried; the divergence is not. The store records one dead letter
    (reason ``divergence``, naming the recorded and the running step, the
    job's id) and keeps the run ``dead``; the broker's dead-letter path (RabbitMQ's
    dead-letter exchange, Redis's dead-letter queue, Dramatiq's ``.XQ``) holds
    the job once. The body ran twice and never a third time; no message
    carrying a second retry was published; ``allocate`` never ran.
    """
    job = _diverged(harness)

    (dead,) = harness.dead_letters(job.run_key)
    assert (dead.reason, dead.job_id, dead.task_name) == (
        "divergence",
        job.job_id,
        harness.task_name("deploy_between_attempts"),
    )
    assert "reserve#0" in dead.message
    assert "allocate#0" in dead.message
    assert harness.broker_dead_letters(job.run_key) == [job.job_id]
    ledger = harness.ledger
    assert [a["retries"] for a in ledger.attempts(job.run_key)] == [0, 1]
    assert max(p.retries for p in harness.published(job.run_key)) == 1
    assert [ledger.count(job.run_key, s) for s in ("charge", "reserve", "allocate", "ship")] == [1, 1, 0, 0]
    assert [r.step_key for r in harness.steps(job.run_key)] == ["charge#0", "reserve#0"]  # kept for a retry (C27)


def test_c11_c30_a_dead_letter_retry_keeps_the_run_key_and_replays_committed_steps(harness: Harness) -> None:
    """C11, C30: an operator resets the changed step and retries the dead letter with the adapter's publisher.

    ``operations.retry_dead_letter`` re-publishes the stored envelope as a new
    job (a new job id) carrying the same run key: ``charge`` replays from the
    store (its body does not run again and its idempotency key is unchanged),
    ``allocate`` and ``ship`` run once under the run's key, and the run
    succeeds.
    """
    job = _diverged(harness)
    (dead,) = harness.dead_letters(job.run_key)

    retried = operations.retry_dead_letter(harness.store, dead.id, harness.publishers(), reset_from="reserve#0")
    harness.wait_status(job.run_key, "succeeded")

    assert (retried.run_key, retried.framework) == (job.run_key, harness.framework)
    assert retried.job_id != job.job_id
    ledger = harness.ledger
    assert [a["job"] for a in ledger.attempts(job.run_key)] == [job.job_id, job.job_id, retried.job_id]
    assert ledger.keys(job.run_key, "charge") == [f"{job.run_key}:charge#0"]
    assert ledger.keys(job.run_key, "allocate") == [f"{job.run_key}:allocate#0"]
    assert ledger.keys(job.run_key, "ship") == [f"{job.run_key}:ship#0"]
    assert harness.store.get_dead_letter(dead.id).retried_at is not None


def test_c35_a_sleeping_run_whose_message_was_lost_is_recovered_with_the_adapters_publisher(
    harness: Harness,
) -> None:
    """C35, C11: the broker loses a sleeping job's wake-up; ``operations.recover`` re-publishes the run.

    The run stays ``sleeping`` past its wake time with nothing in the broker to
    wake it. One recovery with the adapter's publisher finds it
    (``sleep_overdue``) and publishes its stored envelope under the run's own
    job id (C39: its result waiter gets the outcome) with the same run key;
    that job replays ``before`` from the store and finishes.
    """
    run_key = new_run_key()
    lost = harness.lose_publishes(run_key)
    job = harness.publish("nap", 0.2, run_key=run_key)
    wait_for(lambda: lost.used == 1, 20, "the wake-up to be lost")
    assert lost.statuses == ["sleeping"]
    wake_at = operations.show_run(harness.store, run_key).wake_at
    assert wake_at is not None
    wait_for(lambda: harness.store.now() > wake_at, 10, "the wake time to pass")
    assert harness.status(run_key) == "sleeping"  # nothing will wake it

    report = operations.recover(harness.store, harness.publishers(), grace=0)
    harness.wait_status(run_key, "succeeded")

    ((stranded, job_id),) = report.recovered
    assert (stranded.run.run_key, stranded.why) == (run_key, "sleep_overdue")
    assert job_id == job.job_id
    ledger = harness.ledger
    assert [a["job"] for a in ledger.attempts(run_key)] == [job.job_id, job.job_id]
    assert ledger.keys(run_key, "before") == [f"{run_key}:before#0"]
    assert ledger.keys(run_key, "after") == [f"{run_key}:after#0"]
