"""Real workers for the suites: Celery in a thread of the test process, and worker subprocesses.

Shared by the Celery adapter tests and the adapter conformance suite, so both
start workers the same way (never a mock worker).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.polling import wait_for

ROOT = Path(__file__).resolve().parents[1]


@contextmanager
def celery_thread_worker(app: Any, pool: str = "solo", concurrency: int = 1) -> Iterator[Any]:
    """A real Celery worker consuming ``app``'s queues in a thread of this process.

    Parameters:
      app(celery.Celery): the application whose queues the worker consumes.
      pool(str): ``"solo"`` or ``"threads"``.
      concurrency(int): worker threads of the ``threads`` pool.
    """
    from celery.contrib.testing.worker import start_worker

    with start_worker(
        app, pool=pool, concurrency=concurrency, perform_ping_check=False, loglevel="WARNING", shutdown_timeout=15
    ) as worker:
        if worker.hub is not None:
            # The event loop polls with no timeout when no timer is due, so it would notice the
            # shutdown only at the next message (about 10 s on RabbitMQ): keep a timer ticking.
            worker.hub.call_repeatedly(0.25, _tick)
        yield worker


def _tick() -> None:
    """A no-op timer callback (see :func:`celery_thread_worker`)."""


def worker_env(env: Mapping[str, str], pythonpath: Path = ROOT) -> dict[str, str]:
    """This process's environment plus ``env``, with ``pythonpath`` and the project's root first on ``PYTHONPATH``."""
    paths = [str(pythonpath), str(ROOT), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, **env, "PYTHONPATH": os.pathsep.join(paths)}


def celery_worker_command(app_module: str, queue: str, concurrency: int) -> list[str]:
    """``celery -A <app_module> worker`` with the prefork pool on ``queue`` (also its node name)."""
    return [
        sys.executable, "-m", "celery", "-A", app_module, "worker",
        "-P", "prefork", "-c", str(concurrency), "-Q", queue, "--loglevel", "INFO",
        "--without-gossip", "--without-mingle", "--without-heartbeat", "-n", f"{queue}@%h",
    ]  # fmt: skip


@contextmanager
def celery_worker_process(
    app_module: str, queue: str, env: Mapping[str, str], log: Path, *, concurrency: int = 2, pythonpath: Path = ROOT
) -> Iterator[subprocess.Popen[bytes]]:
    """A real ``celery -A <app_module> worker`` subprocess (prefork pool) consuming ``queue``.

    Parameters:
      app_module(str): the module ``-A`` imports; it builds its app from ``env``.
      queue(str): the queue to consume (also the worker's node name).
      env(Mapping[str, str]): extra environment variables of the worker.
      log(Path): the file the worker's output goes to; its directory is the working directory.
      concurrency(int): prefork children.
      pythonpath(Path): a directory put first on the worker's ``PYTHONPATH`` (the project's root by default).
    """
    full_env = worker_env(env, pythonpath)
    command = celery_worker_command(app_module, queue, concurrency)
    with log.open("wb") as out:
        proc = subprocess.Popen(command, env=full_env, stdout=out, stderr=subprocess.STDOUT, cwd=str(log.parent))
    try:
        wait_for(lambda: b"ready." in log.read_bytes() or proc.poll() is not None, 60, "the worker to start")
        assert proc.poll() is None, log.read_text()
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
