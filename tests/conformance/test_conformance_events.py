"""Waiting for events and cancelling runs on real workers: one behaviour for every adapter on every broker (C33, C34).

Each test runs against ``celery-redis``, ``celery-rabbitmq``, ``dramatiq-redis``
and ``dramatiq-rabbitmq`` through the module's harness and its in-thread
worker; the task bodies are ``scenarios.py``'s. The replay after a SIGKILL is
in ``test_conformance_crash.py`` (real worker processes).
"""

from __future__ import annotations

import time

import pytest
from click.testing import CliRunner

import flexiq_plugins
from flexiq_plugins import operations
from flexiq_plugins.cli import cli
from tests.conformance.harness import Harness
from tests.polling import wait_for

pytestmark = pytest.mark.timeout(120)


def _paid(harness: Harness, run_key: str) -> dict[str, object]:
    """The ``paid`` note of ``run_key`` (what its wait returned, and when), once written."""
    notes: list[dict[str, object]] = wait_for(
        lambda: harness.ledger.entries(run_key, "paid"), 30, f"run {run_key} to receive its event"
    )
    return notes[0]


def test_c33_a_waiting_run_is_woken_at_once_by_a_sender_with_the_integration(harness: Harness) -> None:
    """C33: a run waiting on ``("payment", key)`` holds no worker; ``flexiq_plugins.send_event`` in a process that
    has the integration (this one: the harness's app or broker) commits the event and re-publishes the run at
    once (the sender itself publishes it, not a later recovery sweep): the body continues with the payload,
    and ships."""
    order = f"o-{time.monotonic_ns()}"
    job = harness.publish("await_payment", order, None)
    waiting = harness.wait_status(job.run_key, "waiting")
    assert (waiting.wait_topic, waiting.wait_key, waiting.wake_at) == ("payment", order, None)
    assert harness.ledger.count(job.run_key, "charge") == 1

    sent = flexiq_plugins.send_event("payment", order, {"amount": 1200}, store=harness.store)
    assert [run_key for run_key, _ in sent.woken] == [job.run_key]
    paid = _paid(harness, job.run_key)
    assert paid["payload"] == {"amount": 1200}
    harness.wait_status(job.run_key, "succeeded")
    assert harness.ledger.count(job.run_key, "charge") == 1
    assert harness.ledger.count(job.run_key, "ship") == 1


def test_c33_a_bare_senders_event_is_picked_up_by_recovery(harness: Harness) -> None:
    """C33, C35: a sender without the integration only stores the event; recovery (one sweep, as the workers'
    Sweeper does every interval) sees the waiting run whose event has arrived and re-publishes it."""
    order = f"o-{time.monotonic_ns()}"
    job = harness.publish("await_payment", order, None)
    harness.wait_status(job.run_key, "waiting")
    sent = operations.send_event("payment", order, "paid", store=harness.store, publishers={})  # a bare sender
    assert sent.left == [(job.run_key, "no publisher")]
    assert harness.status(job.run_key) == "waiting"

    report = operations.recover(harness.store, harness.publishers(), grace=60)
    assert [(s.run.run_key, s.why) for s, _ in report.recovered] == [(job.run_key, "event_arrived")]
    assert _paid(harness, job.run_key)["payload"] == "paid"
    harness.wait_status(job.run_key, "succeeded")


def test_c33_an_event_sent_before_the_wait_starts_is_received_without_suspending(harness: Harness) -> None:
    """C33: the event is sent while the body is still in an earlier step; the wait finds it at once: the body
    runs once, and the run is never ``waiting``."""
    order = f"o-{time.monotonic_ns()}"
    job = harness.publish("prepare_then_await", order)
    wait_for(lambda: harness.ledger.count(job.run_key, "prepare"), 30, "the prepare step to run")
    flexiq_plugins.send_event("payment", order, "early", store=harness.store)
    harness.ledger.set_flag(job.run_key, "release")
    harness.wait_status(job.run_key, "succeeded")
    assert _paid(harness, job.run_key)["payload"] == "early"
    assert len(harness.ledger.attempts(job.run_key)) == 1


def test_c33_a_wait_times_out_at_its_deadline_and_returns_none(harness: Harness) -> None:
    """C33: with ``timeout=1.5`` and no event the wait returns ``None`` at the deadline (±1 s), and the body goes
    on; the job came back through the broker, not a blocked worker."""
    job = harness.publish("await_payment", f"o-{time.monotonic_ns()}", 1.5)
    harness.wait_status(job.run_key, "succeeded")
    paid = _paid(harness, job.run_key)
    assert paid["payload"] is None
    (wait_row,) = [r for r in harness.steps(job.run_key) if r.kind == "wait"]
    assert wait_row.committed_at is not None
    assert wait_row.wake_at == pytest.approx(wait_row.committed_at + 1.5)
    assert abs(float(paid["at"]) - wait_row.wake_at) <= 1.0  # type: ignore[arg-type]
    assert len(harness.ledger.attempts(job.run_key)) >= 2


def test_c34_a_run_over_its_suspension_cap_ends_cancelled_and_its_undo_runs(harness: Harness) -> None:
    """C34, C32: ``capped_nap`` may spend one second suspended; its 30-second sleep is cut at the cap: the run ends
    ``cancelled`` with the cap as reason, ``charge`` is undone once, ``ship`` never runs."""
    job = harness.publish("capped_nap", 30)
    run = harness.wait_status(job.run_key, "cancelled")
    assert run.cancel_reason is not None
    assert "max_suspended_seconds" in run.cancel_reason
    ledger = harness.ledger
    assert (ledger.count(job.run_key, "charge"), ledger.count(job.run_key, "undo charge")) == (1, 1)
    assert ledger.count(job.run_key, "ship") == 0


def test_c34_flexiq_runs_cancel_stops_a_sleeping_run_and_its_next_step_never_runs(harness: Harness) -> None:
    """C34, C26: ``flexiq runs cancel`` on a sleeping run whose undo must run: the compensation runs in the job
    re-published through the integration (``charge`` undone once) and the run ends ``cancelled``; the sleep's own
    wake-up, when it arrives, finds a finished run: ``ship`` never runs."""
    job = harness.publish("charge_nap_ship", 1.0)
    harness.wait_status(job.run_key, "sleeping")
    done = operations.cancel_run(
        job.run_key, reason="order abandoned", store=harness.store, publishers=harness.publishers()
    )
    assert done.effect == "compensating"
    run = harness.wait_status(job.run_key, "cancelled")
    assert run.cancel_reason == "order abandoned"
    first_sleep = harness.steps(job.run_key)[1]
    assert first_sleep.wake_at is not None
    wait_for(lambda: time.time() > first_sleep.wake_at + 1.0, 10, "the sleep's wake time to pass")  # type: ignore[operator]
    wait_for(lambda: len(harness.deliveries(job.run_key)) >= 3, 30, "the sleep's wake-up to be delivered")
    ledger = harness.ledger
    assert (ledger.count(job.run_key, "undo charge"), ledger.count(job.run_key, "ship")) == (1, 0)
    assert harness.status(job.run_key) == "cancelled"


def test_c34_the_cli_cancels_a_sleeping_run_without_undos_at_once(harness: Harness) -> None:
    """C34: ``flexiq runs cancel RUN_KEY --reason`` on a sleeping run with nothing to undo ends it at once; its
    wake-up is dropped when it arrives and ``after`` never runs."""
    job = harness.publish("nap", 5.0)  # the CLI's start must come first: on a loaded 2-core machine it took over 1 s
    harness.wait_status(job.run_key, "sleeping")
    result = CliRunner().invoke(
        cli, ["--store", harness.config.store_url, "runs", "cancel", job.run_key, "--reason", "duplicate"]
    )
    assert result.exit_code == 0, result.output
    assert f"run {job.run_key}: cancelled" in result.output
    wait_for(lambda: len(harness.deliveries(job.run_key)) >= 2, 30, "the sleep's wake-up to be delivered")
    assert harness.status(job.run_key) == "cancelled"
    assert harness.ledger.count(job.run_key, "after") == 0


def test_c34_a_running_run_is_cancelled_at_its_next_step_boundary(harness: Harness) -> None:
    """C34: cancelled while its ``work`` step runs, the attempt commits ``work``, sees the cancellation with that
    commit, and unwinds: no code after it runs, ``ship`` never runs, both undos run, the run is ``cancelled``."""
    job = harness.publish("charge_hold_ship")
    wait_for(lambda: harness.ledger.count(job.run_key, "work"), 30, "the work step to run")
    done = operations.cancel_run(job.run_key, reason="stop", store=harness.store, publishers=harness.publishers())
    assert (done.effect, done.status) == ("requested", "running")
    harness.ledger.set_flag(job.run_key, "release")
    run = harness.wait_status(job.run_key, "cancelled")
    assert run.cancel_reason == "stop"
    ledger = harness.ledger
    assert [e["what"] for e in ledger.entries(job.run_key) if e["what"] != "attempt"] == [
        "charge",
        "work",
        "undo work",
        "undo charge",
    ]
