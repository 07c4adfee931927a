"""A worker whose step store cannot be used refuses to start, and no job is lost to it (C41).

Real worker processes (``celery worker``, the ``dramatiq`` CLI) are started
with a store setting that is well formed but refused for good: a SQLite file
in a directory that does not exist, a PostgreSQL database that does not
exist, a SQLite store opened read-only, ``sslmode=require`` against a
PostgreSQL server without SSL. Each
must stop at once with one CRITICAL line naming the cause, before it takes
any job; the job published before it stays in the broker and runs, once,
when a worker with a usable store comes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from tests.conformance.harness import Harness, HarnessConfig
from tests.conftest import POSTGRES, require_service

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

BAD_STORES: dict[str, tuple[Callable[[HarnessConfig], str], str]] = {
    "missing-directory": (
        lambda config: f"sqlite:///{config.directory}/no-such-directory/steps.db",
        "no-such-directory' does not exist",
    ),
    "unknown-database": (
        lambda _config: "postgresql://postgres@127.0.0.1:5432/flexiq_no_such_database",
        'database "flexiq_no_such_database" does not exist',
    ),
    "read-only": (
        lambda config: f"sqlite:///file:{config.directory}/steps.db?mode=ro&uri=true",
        "the URL opens it read-only (mode=ro)",
    ),
    "ssl-required": (  # the test server runs without SSL: sslmode=require can never connect
        lambda _config: "postgresql://postgres@127.0.0.1:5432/test?sslmode=require",
        "server does not support SSL, but SSL was required",
    ),
}


@pytest.fixture(scope="module")
def harness(make_harness: Callable[..., Harness]) -> Harness:
    """The module's harness, without an in-thread worker."""
    return make_harness()


@pytest.mark.parametrize("bad_store", list(BAD_STORES))
def test_c41_a_worker_refuses_to_start_on_a_store_it_cannot_use_and_the_job_waits_in_the_broker(
    harness: Harness, bad_store: str
) -> None:
    """C41: a worker whose store refuses its configuration exits with status 78 and one CRITICAL line.

    The line names the worker and the cause; there is no traceback. The job
    published before it was not taken: its run, recorded at publish (C46), is
    still ``queued`` with no attempt, and a worker with a usable store then
    runs it to success with its step body called once.
    """
    if bad_store in ("unknown-database", "ssl-required"):
        require_service(*POSTGRES)
    url, cause = BAD_STORES[bad_store]
    job = harness.publish("once")
    stopped = harness.worker_exit(dataclasses.replace(harness.config, store_url=url(harness.config)))

    assert stopped.returncode == 78, stopped.output[-3000:]
    refusals = [line for line in stopped.output.splitlines() if "cannot start" in line]
    assert len(refusals) == 1, stopped.output[-3000:]
    assert cause in refusals[0]
    assert "CRITICAL" in refusals[0]  # with its level, also before the framework set logging up (Celery)
    assert "Traceback" not in stopped.output
    run = harness.run(job.run_key)
    assert (run.status, run.attempt) == ("queued", 0)

    with harness.thread_worker():
        harness.wait_status(job.run_key, "succeeded")
    assert harness.ledger.count(job.run_key, "work") == 1
