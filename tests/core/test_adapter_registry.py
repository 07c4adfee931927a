"""The adapters' registry: an adapter's entry point is imported once, and every thread asking meanwhile gets it.

Recoverers, event senders and the CLI find the publisher of an app or broker
through it (C33, C35). Its state is per process, so the first load is
checked in a process of its own.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

_FIRST_LOAD = textwrap.dedent(
    """
    import threading
    from dramatiq.brokers.stub import StubBroker
    from flexiq_plugins._delivery.registry import publisher_for_target

    broker = StubBroker()
    barrier = threading.Barrier(8)
    found, errors = [], []

    def ask():
        barrier.wait()
        try:
            found.append(publisher_for_target(broker)[0])
        except Exception as exc:
            errors.append(repr(exc))

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(sorted(found), errors)
    """
)


def test_c35_threads_that_first_ask_for_an_adapter_at_once_all_get_it() -> None:
    """Eight threads of a new process ask for a broker's publisher together: each gets Dramatiq's (C35)."""
    pytest.importorskip("dramatiq")
    done = subprocess.run([sys.executable, "-c", _FIRST_LOAD], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == f"{['dramatiq'] * 8} []", done.stdout + done.stderr
