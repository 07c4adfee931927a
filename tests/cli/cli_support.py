"""What the CLI tests share: ``Runs`` makes runs of each state in a real SQLite store.

Imported by name (``from cli_support import Runs``): a conftest is not a module to import.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from flexiq_plugins import DurableConfig, JobEnvelope, current_job
from flexiq_plugins._attempt.decisions import PutBack, PutBackReason
from flexiq_plugins._store.sql import SqlStepStore
from flexiq_plugins._store.sql.tables import store_tables
from flexiq_plugins.integration import Attempt, AttemptDriver, JobInfo


class Runs:
    """Makes runs in ``store`` through the real attempt driver.

    Parameters:
      store(SqlStepStore): the store.
    """

    def __init__(self, store: SqlStepStore) -> None:
        self.store = store
        self.driver = AttemptDriver(store, DurableConfig(keep_succeeded_steps=True, lease_seconds=30))

    def job(self, run_key: str, task: str = "shop.checkout", framework: str = "celery", job_id: str = "") -> JobInfo:
        """A job of ``run_key``; the envelope is what a worker would store."""
        envelope = JobEnvelope(task, framework, "orders", [42], {"express": True})
        return JobInfo(run_key, job_id or f"job-{run_key}", envelope)

    def attempt(self, run_key: str, body: Callable[[], Any], **job: Any) -> Any:
        """Run one attempt of ``body`` for ``run_key``; return its decision."""
        attempt = self.driver.start(self.job(run_key, **job))
        assert isinstance(attempt, Attempt), attempt
        return attempt.run(body)

    def succeeded(self, run_key: str, **job: Any) -> None:
        """A run that charged and succeeded (its rows kept for inspection)."""
        self.attempt(run_key, lambda: current_job.step.run("charge", lambda: {"id": "ch_1", "amount": 1200}), **job)

    def sleeping(self, run_key: str, overdue: bool = False, **job: Any) -> None:
        """A run that charged and sleeps for an hour; ``overdue``: its wake time then moved 1 s into the past.

        The run sleeps for real (an hour cannot pass while the sleep commits,
        where a short pause could on a busy machine: the sleep would then
        return and the run succeed), and an overdue one has its recorded wake
        time moved back on the store's clock, so no test waits for a clock.
        """

        def body() -> None:
            step = current_job.step
            step.run("charge", lambda: {"id": "ch_1", "amount": 1200})
            step.sleep("1h")

        decision = self.attempt(run_key, body, **job)
        assert isinstance(decision, PutBack), (run_key, decision)
        assert decision.reason is PutBackReason.SLEEP, (run_key, decision)
        assert self.store.get_run(run_key).status == "sleeping", (run_key, self.store.get_run(run_key))
        if overdue:
            runs = store_tables(self.store.table_prefix).runs
            with self.store.engine.begin() as conn:
                conn.execute(sa.update(runs).where(runs.c.run_key == run_key).values(wake_at=self.store.now() - 1))

    def age(self, *run_keys: str, seconds: float) -> None:
        """Move the runs' last update ``seconds`` back on the store's clock, so no test waits for retention to pass."""
        runs = store_tables(self.store.table_prefix).runs
        with self.store.engine.begin() as conn:
            conn.execute(
                sa.update(runs).where(runs.c.run_key.in_(run_keys)).values(updated_at=runs.c.updated_at - seconds)
            )

    def dead(self, run_key: str, **job: Any) -> int:
        """A run dead-lettered by divergence (a step renamed between attempts); return the dead letter id."""
        self.attempt(run_key, _fails_after("reserve"), **job)
        self.attempt(run_key, _fails_after("hold"), job_id=f"job-{run_key}-2", **job)
        (dead,) = [d for d in self.store.list_dead_letters() if d.run_key == run_key]
        return dead.id

    def failed(self, run_key: str, status: str = "failed", **job: Any) -> None:
        """A run that ended ``failed`` (or ``cancelled``) with one step."""
        attempt = self.driver.start(self.job(run_key, **job))
        assert isinstance(attempt, Attempt)
        with attempt.activate():
            current_job.step.run("charge", lambda: 1)
        self.store.finish(attempt.claim, status)  # type: ignore[arg-type]


def _fails_after(first: str) -> Callable[[], None]:
    def body() -> None:
        step = current_job.step
        step.run(first, lambda: "held")
        step.run("charge", lambda: {"id": "ch_1"})
        raise ConnectionError("payment gateway timeout")

    return body
