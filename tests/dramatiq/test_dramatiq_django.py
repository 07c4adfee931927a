"""``"dramatiq_ext.DurableSteps"`` listed in django_dramatiq's settings runs durable actors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flexiq_plugins._store.sql import SqlStepStore

HERE = Path(__file__).parent
ROOT = HERE.parents[1]

SCRIPT = """
import json, django, dramatiq
django.setup()
import dq_django_tasks
broker = dramatiq.get_broker()
delays = []


class Delays(dramatiq.Middleware):
    def before_enqueue(self, broker, message, delay):
        delays.append(delay)


broker.add_middleware(Delays())
worker = dramatiq.Worker(broker, worker_timeout=100)
worker.start()
message = dq_django_tasks.welcome.send(42)
broker.join("django_q", fail_fast=True, timeout=20_000)
worker.stop()
result = {"run_key": message.options["flexiq_run_key"], "broker": type(broker).__name__, "delays": delays}
print(json.dumps(result))
"""


@pytest.mark.slow
def test_c15_c18_django_settings_only_setup_runs_a_durable_actor(sqlite_url: str) -> None:
    """Django settings alone configure the middleware: store URL and ``MAX_HOP_SECONDS`` from ``FLEXIQ``.

    ``DurableSteps`` is built by django_dramatiq with no arguments; the store
    and options are read from settings at the first message. The 500 ms sleep
    is cut into hops of at most 200 ms (C18: read from the delays the
    re-enqueues asked for, not from wall-clock gaps), and the run ends
    ``succeeded`` in the SQLite store named by ``FLEXIQ["STORE_URL"]``.
    """
    env = {k: v for k, v in os.environ.items() if k != "FLEXIQ_STORE_URL"}
    env.update(
        PYTHONPATH=os.pathsep.join([str(ROOT), str(HERE)]),
        DJANGO_SETTINGS_MODULE="dq_django_settings",
        FLEXIQ_TEST_STORE=sqlite_url,
    )
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, cwd=HERE, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])

    store = SqlStepStore(sqlite_url)
    run = store.get_run(result["run_key"])
    store.close()
    assert result["broker"] == "StubBroker"
    assert run.status == "succeeded"
    hops = [d for d in result["delays"] if d is not None]
    assert hops[0] == 200  # the first hop of the 500 ms sleep is cut to MAX_HOP_SECONDS (C18)
    assert all(0 < d <= 200 for d in hops)
    assert run.attempt == len(hops) + 1


OPTIONS_SCRIPT = """
import json, threading, django, dramatiq
django.setup()
import dq_django_tasks
from flexiq_plugins import SqlStepStore, UnknownRun
broker = dramatiq.get_broker()
message = dq_django_tasks.welcome.send(42)
store = SqlStepStore(django.conf.settings.FLEXIQ["STORE_URL"])
try:
    recorded = store.get_run(message.options["flexiq_run_key"]).status
except UnknownRun:
    recorded = None
worker = dramatiq.Worker(broker, worker_timeout=100)
worker.start()
sweeping = any(thread.name == "flexiq-sweeper" for thread in threading.enumerate())
worker.stop()
print(json.dumps({"recorded": recorded, "sweeping": sweeping}))
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({}, {"recorded": "queued", "sweeping": True}),
        ({"RECORD_AT_PUBLISH": False, "RECOVERY": False}, {"recorded": None, "sweeping": False}),
    ],
)
def test_c39_recording_at_publish_and_recovery_are_read_from_the_django_flexiq_dict(
    sqlite_url: str, options: dict[str, bool], expected: dict[str, object]
) -> None:
    """C39: ``FLEXIQ["RECORD_AT_PUBLISH"]`` and ``FLEXIQ["RECOVERY"]`` configure a middleware built with no arguments.

    By default a message enqueued through django_dramatiq's broker has its run
    recorded ``queued`` before it leaves, and a booted worker runs a recovery
    sweeper; with both set to ``False`` in the settings' ``FLEXIQ`` dict, the
    run is not recorded at enqueue and no sweeper thread starts.
    """
    env = {k: v for k, v in os.environ.items() if k != "FLEXIQ_STORE_URL"}
    env.update(
        PYTHONPATH=os.pathsep.join([str(ROOT), str(HERE)]),
        DJANGO_SETTINGS_MODULE="dq_django_settings",
        FLEXIQ_TEST_STORE=sqlite_url,
        FLEXIQ_TEST_OPTIONS=json.dumps(options),
    )
    done = subprocess.run(
        [sys.executable, "-c", OPTIONS_SCRIPT], env=env, cwd=HERE, capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == expected
