"""Fixtures of the dashboard tests: stores filled through the real core, a real server, a real browser.

- ``Runs`` makes runs the way workers make them (``AttemptDriver`` on a real
  store), for the in-process tests that call the app through Starlette's
  ``TestClient``.
- ``DashboardServer`` is ``flexiq dashboard`` itself, a uvicorn subprocess on a
  free local port, over a store real Celery and Dramatiq workers fill (the
  conformance harnesses of ``tests/conformance``).
- ``browser`` is Debian's Chromium driven by Playwright (its driver ships in
  the ``playwright`` wheel; nothing is downloaded). Without Chromium the
  browser tests skip locally and fail in CI, like a missing service.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from flexiq_plugins import DurableConfig, JobEnvelope, StepStore, current_job
from flexiq_plugins.integration import Attempt, AttemptDriver, JobInfo
from tests.conftest import in_ci
from tests.polling import wait_for

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]
TOKEN = "test-token-7f3a"
SCREENSHOTS_ENV = "FLEXIQ_DASHBOARD_SCREENSHOTS"
"""Set to a directory (``docs/img``) to keep the screenshots the browser tests take."""


class Runs:
    """Makes runs in ``store`` through the real attempt driver (its rows kept after success).

    Parameters:
      store(StepStore): the store.
    """

    def __init__(self, store: StepStore) -> None:
        self.store = store
        self.driver = AttemptDriver(store, DurableConfig(keep_succeeded_steps=True, lease_seconds=30))

    def attempt(self, run_key: str, body: Callable[[], Any], *, task: str = "shop.checkout", **job: Any) -> Any:
        """Run one attempt of ``body`` for ``run_key``; return its outcome."""
        args = job.pop("args", [42])
        envelope = JobEnvelope(task, job.pop("framework", "celery"), "orders", args, {"express": True})
        attempt = self.driver.start(JobInfo(run_key, job.pop("job_id", f"job-{run_key}"), envelope))
        assert isinstance(attempt, Attempt), attempt
        return attempt.run(body)

    def succeeded(self, run_key: str, value: Any = None, **job: Any) -> None:
        """A run whose step ``charge`` returned ``value`` and that succeeded."""
        charge = value if value is not None else {"id": "ch_1", "amount": 1200}
        self.attempt(run_key, lambda: current_job.step.run("charge", lambda: charge), **job)

    def sleeping(self, run_key: str, **job: Any) -> None:
        """A run that charged and sleeps for an hour."""

        def body() -> None:
            current_job.step.run("charge", lambda: {"id": "ch_1"})
            current_job.step.sleep("1h")

        self.attempt(run_key, body, **job)
        assert self.store.get_run(run_key).status == "sleeping"

    def dead(self, run_key: str, **job: Any) -> int:
        """A run dead-lettered by divergence (``reserve`` renamed ``hold``); return the dead letter's id."""
        self.attempt(run_key, _fails_after("reserve"), **job)
        self.attempt(run_key, _fails_after("hold"), job_id=f"job-{run_key}-2", **job)
        (dead,) = self.store.find_dead_letters(run_key=run_key)
        return dead.id


def _fails_after(first: str) -> Callable[[], None]:
    def body() -> None:
        step = current_job.step
        step.run(first, lambda: "held")
        step.run("charge", lambda: {"id": "ch_1"})
        raise ConnectionError("payment gateway timeout")

    return body


# ------------------------------------------------------------ the real server
def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class DashboardServer:
    """``flexiq dashboard`` as a subprocess on a free port of 127.0.0.1.

    Parameters:
      store_url(str): ``--store``.
      directory(Path): where its log goes.
      env(dict[str, str]): extra environment (the harness's configuration for ``--app``).
      options(str): more command-line options (``--app …``, ``--allow-actions`` …).
    """

    def __init__(self, store_url: str, directory: Path, env: dict[str, str], *options: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = directory / f"dashboard-{self.port}.log"
        command = [
            sys.executable, "-c", "from flexiq_plugins.cli import main; main()", "--store", store_url, "dashboard",
            "--port", str(self.port), *options,
        ]  # fmt: skip
        full_env = {**os.environ, **env, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        full_env["FLEXIQ_TEST_TOKEN"] = TOKEN
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(command, env=full_env, stdout=out, stderr=subprocess.STDOUT, cwd=str(ROOT))
        wait_for(self._answers, 60, f"the dashboard on port {self.port} (log: {self.log})")

    def _answers(self) -> bool:
        assert self.proc.poll() is None, self.log.read_text()
        try:
            with urllib.request.urlopen(f"{self.url}/static/dashboard.css", timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def stop(self) -> None:
        """Stop the server."""
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# ------------------------------------------------------------ the real browser
def require_chromium() -> None:
    """Skip (locally) or fail (in CI) unless Playwright and Debian's Chromium are installed."""
    missing = []
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("the playwright package (pip install playwright; never `playwright install`)")
    if not os.access(CHROMIUM, os.X_OK):
        missing.append(f"{CHROMIUM} (apt-get install chromium)")
    if missing:
        message = "the dashboard's browser tests need " + " and ".join(missing)
        if in_ci():
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Debian's Chromium, headless, through Playwright; one per test module."""
    require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


def screenshot(page: Any, name: str) -> None:
    """Save a screenshot of ``page`` as ``dashboard-<name>.png`` in ``$FLEXIQ_DASHBOARD_SCREENSHOTS``, if set."""
    directory = os.environ.get(SCREENSHOTS_ENV)
    if directory:
        Path(directory).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(directory) / f"dashboard-{name}.png"), full_page=False)
