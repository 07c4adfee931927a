"""A store outage under load, shortened: the database cut through a TCP proxy loses no job (C28, C39, C41).

``benchmarks/outage.py`` runs the chaos jobs on two workers that reach
PostgreSQL through a small TCP proxy in the benchmark's process; once the
jobs run, the proxy drops every connection and refuses new ones for a few
seconds, then lets them through again. Every job must finish with no
operator action, and the workers' log must not grow with the number of
queued jobs (a few lines per process, not a WARNING per job). How fast the
backlog drains is printed by the benchmark, never asserted here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
JOBS = 40

pytestmark = [pytest.mark.slow, pytest.mark.redis, pytest.mark.postgres, pytest.mark.timeout(420)]


@pytest.mark.parametrize("framework", ["celery", "dramatiq"])
def test_c28_a_store_outage_under_load_loses_no_job_and_logs_per_process_not_per_job(
    framework: str, require_service: Callable[[str, str, int], None]
) -> None:
    """C28, C39: with the store cut for 5 s while 40 jobs run, all 40 finish by themselves; fewer WARNING
    lines than jobs are logged during the outage, and at most two after the store is back."""
    require_service("Redis", "127.0.0.1", 6379)
    require_service("PostgreSQL", "127.0.0.1", 5432)
    command = [
        sys.executable, str(ROOT / "benchmarks" / "outage.py"), "--framework", framework, "--broker", "redis",
        "--outage", "5", "--jobs", str(JOBS), "--drain", "240",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, timeout=400, check=False, cwd=ROOT)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
    result = json.loads(done.stdout.decode().strip().splitlines()[-1])
    assert (result["finished"], result["lost"]) == (JOBS, 0), result
    assert result["warning_lines_during_outage"] < JOBS, result
    assert result["warning_lines_after_return"] <= 2, result
