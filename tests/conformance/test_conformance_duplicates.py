"""Duplicate deliveries: never two bodies at once, never a body after the run ended (C24, C26, C46).

A duplicate is the same message published again: the same job id and run
key, which is what a broker's redelivery (a Redis visibility timeout, a
requeue) looks like to a worker.
"""

from __future__ import annotations

from uuid import uuid4

import pytest

from tests.conformance.harness import Harness, Publish
from tests.polling import wait_for

pytestmark = pytest.mark.timeout(120)


def test_c26_a_duplicate_of_a_finished_run_is_acknowledged_without_running_the_body(harness: Harness) -> None:
    """C26: once the run succeeded, a duplicate delivery is handled without calling the body.

    The worker finishes handling the duplicate; the body ran once, the store
    still says ``succeeded`` at attempt 1, and nothing was re-published.
    """
    job = harness.publish("once")
    harness.wait_status(job.run_key, "succeeded")
    harness.publish_duplicate(job)
    wait_for(lambda: len(harness.deliveries(job.run_key)) == 2, 20, "the duplicate to be handled")

    assert harness.deliveries(job.run_key) == [job.job_id, job.job_id]
    assert len(harness.ledger.attempts(job.run_key)) == 1
    assert harness.ledger.count(job.run_key, "work") == 1
    run = harness.run(job.run_key)
    assert (run.status, run.attempt) == ("succeeded", 1)
    assert harness.published(job.run_key) == []


def test_c46_a_new_job_with_a_finished_runs_own_key_is_handled_without_running_the_body(harness: Harness) -> None:
    """C46, C37: a job published with a run key the producer chose finishes; a second job (a new job id) with
    that key is handled as the run's replay: the body does not run again, the run stays ``succeeded`` at
    attempt 1, and nothing is re-published.
    """
    first = harness.publish("once", run_key=f"order-{uuid4().hex}")
    harness.wait_status(first.run_key, "succeeded")
    second = harness.publish("once", run_key=first.run_key)
    assert second.job_id != first.job_id
    wait_for(lambda: second.job_id in harness.deliveries(first.run_key), 20, "the second job to be handled")

    assert harness.deliveries(first.run_key) == [first.job_id, second.job_id]
    assert harness.ledger.count(first.run_key, "work") == 1
    run = harness.run(first.run_key)
    assert (run.status, run.attempt, run.job_id) == ("succeeded", 1, first.job_id)
    assert harness.published(first.run_key) == []


def test_c24_a_duplicate_delivered_while_the_run_is_live_never_runs_the_body_concurrently(harness: Harness) -> None:
    """C24, C26: a duplicate arriving while the first delivery holds the claim is put back, then acknowledged.

    The first delivery blocks inside its step body until the duplicate has
    been put back with a short delay (at most ``busy_retry_seconds``); then it
    finishes. Every put-back copy is handled, the last ones after the run
    succeeded, and the body ran exactly once: one execution, one call of
    ``work``, attempt 1 in the store.
    """
    job = harness.publish("hold")
    wait_for(lambda: harness.ledger.count(job.run_key, "work") == 1, 20, "the first delivery to start working")
    harness.publish_duplicate(job)
    wait_for(lambda: _put_backs(harness, job.run_key), 20, "the duplicate to be put back")
    harness.ledger.set_flag(job.run_key, "release")
    harness.wait_status(job.run_key, "succeeded")
    wait_for(
        lambda: len(harness.deliveries(job.run_key)) == len(_put_backs(harness, job.run_key)) + 2,
        20,
        "every put-back copy to be handled",
    )

    assert set(harness.deliveries(job.run_key)) == {job.job_id}
    assert len(harness.ledger.attempts(job.run_key)) == 1
    assert harness.ledger.count(job.run_key, "work") == 1
    assert harness.run(job.run_key).attempt == 1
    delays = [p.delay for p in _put_backs(harness, job.run_key)]
    assert all(d is not None and 0 < d <= harness.config.busy_retry_seconds for d in delays), delays


def _put_backs(harness: Harness, run_key: str) -> list[Publish]:
    """The run's messages published with a delay: put-backs of a busy delivery."""
    return [p for p in harness.published(run_key) if p.delay is not None]
