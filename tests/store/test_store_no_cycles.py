"""A store error leaves no reference cycle: what its traceback references (a task body's locals) goes with it.

As in ``tests/core/test_no_cycles.py``, with the cyclic collector off only
reference counting frees anything: a store frame that kept the error it
raises would keep the error, its traceback and every frame it passed
through. Real PostgreSQL; a backend is terminated with ``pg_terminate_backend``.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from flexiq_plugins import DurableConfig, current_job
from flexiq_plugins._attempt.decisions import PutBack
from flexiq_plugins._model.records import JobEnvelope
from flexiq_plugins._store.sql import SqlStepStore
from flexiq_plugins.errors import StoreUnavailable
from flexiq_plugins.integration import AttemptDriver, JobInfo


class Big:
    """A large local of a task body (weakly referenceable)."""

    def __init__(self) -> None:
        self.payload = bytearray(1_000_000)


@pytest.fixture
def no_gc(monkeypatch: pytest.MonkeyPatch, collector_off: None) -> None:
    """The cyclic collector off; the library's log records kept out of pytest's capture (which keeps exc_info)."""
    monkeypatch.setattr(logging.getLogger("flexiq_plugins"), "disabled", True)


def test_c28_a_store_error_is_freed_once_dropped(no_gc: None) -> None:
    """The StoreUnavailable of a store call that cannot connect is freed once the caller drops it."""
    store = SqlStepStore("postgresql+psycopg://postgres@127.0.0.1:9/none", auto_upgrade=False)
    refs: list[weakref.ref[Any]] = []
    try:
        store.get_run("run-x")
    except StoreUnavailable as exc:
        refs.append(weakref.ref(exc))
    assert len(refs) == 1
    assert refs[0]() is None, gc.get_referrers(refs[0]())
    store.close()


@pytest.mark.postgres
@pytest.mark.parametrize("lazy", [False, True])
def test_c28_a_store_outage_at_a_step_frees_the_body_locals(
    postgres_url: str, make_sql_store: Callable[..., SqlStepStore], no_gc: None, lazy: bool
) -> None:
    """A step's commit that meets a dropped connection (its backend terminated) puts the job back; the body's
    1 MB local is freed by reference counting once the decision is dropped (C26, C28)."""
    store = make_sql_store(postgres_url)
    store.now()
    killer = sa.create_engine(postgres_url.replace("postgresql://", "postgresql+psycopg://"))
    driver = AttemptDriver(store, DurableConfig(lease_seconds=600))
    refs: list[weakref.ref[Any]] = []

    run_key = f"run-outage-{lazy}"

    def kill_when_waiting(pid: int, locker: sa.Connection, killed: threading.Event) -> None:
        with killer.connect() as conn:
            for _ in range(500):  # until the held connection waits for the run's row lock
                waiting = conn.execute(
                    sa.text("select wait_event_type from pg_stat_activity where pid = :pid"), {"pid": pid}
                ).scalar()
                if waiting == "Lock":
                    break
                time.sleep(0.01)
            conn.execute(sa.text("select pg_terminate_backend(:pid)"), {"pid": pid})
        killed.set()
        locker.rollback()

    def body() -> str:
        big = Big()
        refs.append(weakref.ref(big))
        current_job.step.run("a", lambda: 1)
        pid = store._holds.hold.conn.connection.dbapi_connection.info.backend_pid  # this attempt's connection
        locker = killer.connect()
        runs = store._t.runs  # the run's row, locked by another transaction: the next step's commit waits
        locker.execute(sa.select(runs.c.run_key).where(runs.c.run_key == run_key).with_for_update())
        killed = threading.Event()
        threading.Thread(target=kill_when_waiting, args=(pid, locker, killed), daemon=True).start()
        try:
            current_job.step.run("b", lambda: 2)  # its backend is terminated while it waits: StoreUnavailable
        finally:
            killed.wait(10)
            locker.close()
        return "done"

    decision = driver.run_job(JobInfo(run_key, "job-1", JobEnvelope("t", "test", []), lazy=lazy), body)
    killer.dispose()
    assert isinstance(decision, PutBack), decision
    del decision
    assert [r() for r in refs] == [None]
