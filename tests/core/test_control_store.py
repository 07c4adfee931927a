"""``send_event`` and ``cancel_run`` from a process without an integration refuse a store that is not there (C33, C41).

A webhook that sends an event with no ``store=`` and no ``FLEXIQ_STORE_URL``
used to create ``./flexiq_steps.db`` and put the event in it, where no worker
looks: the waiting run never woke, and nothing said so.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from flexiq_plugins import ConfigurationError, SqlStepStore, cancel_run, send_event


def test_c41_send_event_refuses_a_sqlite_store_that_does_not_exist(tmp_path: Path) -> None:
    """C33, C41: the error names the missing file and the ways out; no file is created."""
    missing = tmp_path / "steps.db"
    with pytest.raises(ConfigurationError, match=r"no step store at .*steps\.db: pass store=URL") as refused:
        send_event("payment", "o-1", {"ok": True}, store=f"sqlite:///{missing}")
    assert "FLEXIQ_STORE_URL" in str(refused.value)
    assert not missing.exists()


def test_c41_cancel_run_refuses_a_sqlite_store_that_does_not_exist(tmp_path: Path) -> None:
    """C34, C41: a cancellation is never written to a new, empty store either."""
    missing = tmp_path / "elsewhere.db"
    with pytest.raises(ConfigurationError, match="no step store at"):
        cancel_run("run-1", reason="customer asked", store=f"sqlite:///{missing}")
    assert not missing.exists()


def test_c33_send_event_uses_an_existing_sqlite_store(tmp_path: Path) -> None:
    """C33: an existing store file is used as given: the event is stored there."""
    path = tmp_path / "steps.db"
    worker_store = SqlStepStore(f"sqlite:///{path}")
    worker_store.list_runs()  # what a worker creates at its first use
    worker_store.close()
    sent = send_event("payment", "o-2", "paid", store=f"sqlite:///{path}")
    assert sent.event.topic == "payment"
    assert sent.event.key == "o-2"
