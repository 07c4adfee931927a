"""The README's demo command, run as a newcomer runs it, on every transport (C5, C15, C26, C31, C32).

Each case runs ``python -m examples.checkout`` in a subprocess with a real
worker process and checks the story it prints: one charge for several
attempts, the receipt retried, the sleep survived, the run succeeded. The
``--ship-fails`` variant checks the other ending: shipping's retry budget
runs out and the charge is refunded once.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REDIS = "redis://127.0.0.1:6379/0"
AMQP = "amqp://guest:guest@127.0.0.1:5672//"


def _demo(tmp_path: Path, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "examples.checkout", "--dir", str(tmp_path / "demo"), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out + _worker_log(tmp_path)
    return out


def _worker_log(tmp_path: Path) -> str:
    log = tmp_path / "demo" / "worker.log"
    return "\n--- worker.log ---\n" + log.read_text() if log.exists() else ""


def _check_story(out: str) -> None:
    assert re.search(r"payment API called 1 time for [3-9] attempts; 1 charge made", out), out
    assert "charge: memo hit, body not called" in out, out
    assert "receipt: failed" in out, out
    assert "receipt: ran and committed" in out, out
    assert "cool_off: sleeping" in out, out
    assert "cool_off: wake time reached" in out, out
    assert re.search(r"idempotency key [0-9a-f-]{36}:charge#0", out), out
    assert "OK: one charge, receipt retried, sleep survived" in out, out


def test_c5_demo_embedded_default(tmp_path: Path) -> None:
    """C5/C15: on embedded defaults (SQLite transport and store) the demo charges once and succeeds."""
    out = _demo(tmp_path)
    _check_story(out)
    assert "AsyncResult(" in out
    assert (
        "demo timings: a 4 s claim lease (default 30 s), so that a killed worker's job is taken over within "
        "seconds (keep the defaults in production)"
    ) in out  # what the demo changes is said, never silent


@pytest.mark.slow
def test_c25_demo_crash_embedded(tmp_path: Path) -> None:
    """C25/C6: SIGKILL after the charge commit; a new pool process finishes with one charge."""
    out = _demo(tmp_path, "--crash")
    assert "SIGKILL to pool process" in out, out
    _check_story(out)


@pytest.mark.redis
def test_c5_demo_celery_redis(tmp_path: Path, require_service) -> None:
    """The demo on Celery with a real Redis broker."""
    require_service("redis", "127.0.0.1", 6379)
    out = _demo(tmp_path, "--broker", REDIS)
    _check_story(out)
    assert "Redis redelivering an unacknowledged job after 10 s (visibility_timeout, default 1 h)" in out


@pytest.mark.rabbitmq
@pytest.mark.slow
def test_c26_demo_celery_rabbitmq_crash(tmp_path: Path, require_service) -> None:
    """C26: on RabbitMQ the whole worker is SIGKILLed after the charge; the broker redelivers; one charge."""
    require_service("rabbitmq", "127.0.0.1", 5672)
    out = _demo(tmp_path, "--broker", AMQP, "--crash")
    assert "SIGKILL to the whole worker" in out, out
    _check_story(out)


@pytest.mark.redis
@pytest.mark.slow
@pytest.mark.parametrize("framework", ["celery", "dramatiq"])
def test_c25_demo_redis_crash(tmp_path: Path, require_service, framework: str) -> None:
    """C25/C26 on Redis: the whole worker is SIGKILLed after the charge commits; Redis redelivers the
    unacknowledged job to a new worker, which takes the expired claim over and finishes with one charge."""
    require_service("redis", "127.0.0.1", 6379)
    out = _demo(tmp_path, "--framework", framework, "--broker", REDIS, "--crash")
    assert "SIGKILL to the whole worker" in out, out
    assert "demo timings: a 4 s claim lease (default 30 s), Redis redelivering" in out, out
    assert "taken over 1 time" in out, out
    _check_story(out)


@pytest.mark.rabbitmq
@pytest.mark.slow
def test_c25_demo_dramatiq_rabbitmq_crash(tmp_path: Path, require_service) -> None:
    """C25 on Dramatiq + RabbitMQ: whole worker SIGKILLed after the charge; redelivered; one charge."""
    require_service("rabbitmq", "127.0.0.1", 5672)
    out = _demo(tmp_path, "--framework", "dramatiq", "--broker", AMQP, "--crash")
    assert "SIGKILL to the whole worker" in out, out
    _check_story(out)


def test_c5_demo_dramatiq_stub(tmp_path: Path) -> None:
    """The demo on Dramatiq with no server (in-process StubBroker worker)."""
    _check_story(_demo(tmp_path, "--framework", "dramatiq"))


@pytest.mark.rabbitmq
def test_c5_demo_dramatiq_rabbitmq(tmp_path: Path, require_service) -> None:
    """The demo on Dramatiq with a real RabbitMQ broker and a worker process."""
    require_service("rabbitmq", "127.0.0.1", 5672)
    out = _demo(tmp_path, "--framework", "dramatiq", "--broker", AMQP)
    _check_story(out)
    assert (
        "broker URL: amqp://guest:guest@127.0.0.1:5672// is given to Dramatiq as amqp://guest:guest@127.0.0.1:5672/%2F"
    ) in out  # the rewrite of kombu's spelling is said, never silent


@pytest.mark.redis
def test_c5_demo_dramatiq_redis(tmp_path: Path, require_service) -> None:
    """The demo on Dramatiq with a real Redis broker and a worker process."""
    require_service("redis", "127.0.0.1", 6379)
    _check_story(_demo(tmp_path, "--framework", "dramatiq", "--broker", REDIS))


def _check_compensation_story(out: str) -> None:
    assert re.search(r"1 charge made, 1 refund; carrier tried 3 times", out), out
    assert out.count("ship: failed (the carrier refused the parcel") == 3, out
    assert "ship: budget spent after 3 tries" in out, out
    assert re.search(r"refund: undoing charge ch_\w+ with idempotency key [0-9a-f-]{36}:compensate:charge#0", out), out
    assert re.search(r"run [0-9a-f-]{36}: compensated", out), out
    assert "OK: one charge, shipping failed for good, the charge refunded once" in out, out


@pytest.mark.parametrize("framework", ["celery", "dramatiq"])
def test_c32_demo_ship_fails_refunds_the_charge(tmp_path: Path, framework: str) -> None:
    """C31/C32 on embedded defaults: shipping fails on all three tries of its budget, the run fails for good
    and the charge's compensation refunds it once, with its own idempotency key; the run is ``compensated``."""
    out = _demo(tmp_path, "--framework", framework, "--ship-fails")
    _check_compensation_story(out)
    if framework == "celery":
        assert "get() -> raised DeadLetterReject: step_retry_exhausted" in out, out


def test_demo_crash_refused_without_redelivering_transport(tmp_path: Path) -> None:
    """On a transport that cannot redeliver, the demo says so plainly instead of pretending."""
    proc = subprocess.run(
        [sys.executable, "-m", "examples.checkout", "--framework", "dramatiq", "--crash", "--dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert "cannot redeliver" in proc.stderr


@pytest.mark.parametrize("framework", ["celery", "dramatiq"])
def test_c33_demo_waits_for_the_payment_confirmation_sent_by_its_driver(tmp_path: Path, framework: str) -> None:
    """C33 on embedded defaults: after the charge the checkout waits for the bank's "payment confirmed" event and
    frees its worker; the demo's driver, a process with the integration, sends the event and wakes the run at
    once; the wait's payload replays on later attempts and the run succeeds with one charge."""
    out = _demo(tmp_path, "--framework", framework, "--wait-payment")
    assert "payment: waiting for the 'payment confirmed' event; the attempt ends and the worker is free" in out, out
    sent = r"the driver sent the 'payment confirmed' event \(event id \d+; woke run: [0-9a-f-]{36}\)"
    assert re.search(sent, out), out
    assert out.count("payment: confirmed by the bank ({'status': 'confirmed', 'bank_ref': 'bk_77'})") >= 2, out
    assert "payment API called 1 time" in out, out
    assert "OK: one charge, waited for the payment confirmation, shipped" in out, out


@pytest.mark.parametrize("framework", ["celery", "dramatiq"])
@pytest.mark.parametrize("broker", ["redis://127.0.0.1:1/0", "amqp://guest:guest@127.0.0.1:1//"])
def test_demo_unreachable_broker_is_one_line(tmp_path: Path, framework: str, broker: str) -> None:
    """A broker nobody listens on: one line naming the URL and the cause, exit 1, no traceback, no worker."""
    proc = subprocess.run(
        [sys.executable, "-m", "examples.checkout", "--framework", framework, "--broker", broker],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert proc.stderr.startswith(f"Error: cannot reach the broker at {broker}: ")
    assert "refused" in proc.stderr.lower()
