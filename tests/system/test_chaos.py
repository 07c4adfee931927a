"""The chaos run, shortened: real workers SIGKILLed at random lose no job (C39, C5, C6, C25, C26); a broker that
loses its queue mid-run loses no job either, and every original result waiter gets its result (C39, C47).

``benchmarks/chaos.py`` publishes five-step jobs (a 1 s sleep between the
second and the third step), kills a whole worker or one pool child every
few seconds while they run, restarts the workers and drains. Here it runs
with 25 jobs and 15 s of kills on one combination per framework; the full
matrix (200 jobs, a minute of kills) is in ``docs/guarantees.md``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import POSTGRES_URL

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]


def _chaos(tmp_path: Path, *args: str) -> dict[str, object]:
    return _run(
        tmp_path, *args, "--jobs", "25", "--duration", "15", "--kill-every", "3", "--drain", "240", "--seed", "7"
    )


def _run(tmp_path: Path, *args: str) -> dict[str, object]:
    command = [sys.executable, str(ROOT / "benchmarks" / "chaos.py"), *args, "--directory", str(tmp_path), "--json"]
    done = subprocess.run(command, capture_output=True, timeout=400, check=False, cwd=ROOT)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
    result: dict[str, object] = json.loads(done.stdout.decode().strip().splitlines()[-1])
    return result


@pytest.mark.redis
def test_c39_chaos_celery_redis_sqlite_loses_no_job(
    tmp_path: Path, require_service: Callable[[str, str, int], None]
) -> None:
    """C39: Celery on Redis with the embedded SQLite store: every job finishes; a body re-ran only when the kill
    landed between its return and its commit."""
    require_service("Redis", "127.0.0.1", 6379)
    result = _chaos(tmp_path, "--framework", "celery", "--broker", "redis")
    assert (result["recorded"], result["lost"], result["finished"]) == (25, 0, 25), result
    assert result["bodies_re_run"] == result["re_runs_inside_commit_window"], result


@pytest.mark.redis
@pytest.mark.postgres
def test_c39_chaos_dramatiq_redis_postgres_loses_no_job(
    tmp_path: Path, require_service: Callable[[str, str, int], None], postgres_url: str
) -> None:
    """C39: Dramatiq on Redis with PostgreSQL: every job finishes; a body re-ran only when the kill landed
    between its return and its commit."""
    require_service("Redis", "127.0.0.1", 6379)
    result = _chaos(tmp_path, "--framework", "dramatiq", "--broker", "redis", "--store", POSTGRES_URL)
    assert (result["recorded"], result["lost"], result["finished"]) == (25, 0, 25), result
    assert result["bodies_re_run"] == result["re_runs_inside_commit_window"], result


@pytest.mark.redis
@pytest.mark.parametrize(
    ("framework", "store"),
    [("celery", None), pytest.param("dramatiq", POSTGRES_URL, marks=pytest.mark.postgres)],
    ids=["celery-redis-sqlite", "dramatiq-redis-postgres"],
)
def test_c39_a_queue_the_broker_lost_mid_run_finishes_with_the_default_limits(
    framework: str, store: str | None, tmp_path: Path, require_service: Callable[[str, str, int], None]
) -> None:
    """C39, C47: 60 jobs; 2 s after they are published every Redis key of their queue is deleted (queued,
    delayed and unacknowledged messages: a broker restarted without persistence). The workers run the library's
    default recovery limits and lease; every job finishes, its body ran once, and the result waiter the producer
    holds for each job (Celery ``AsyncResult``, Dramatiq ``Results``) gets its result. The drain is given two
    minutes after the loss: the bound docs/guarantees.md states."""
    require_service("Redis", "127.0.0.1", 6379)
    jobs = ["--jobs", "60", "--duration", "0", "--lose-broker-at", "2", "--defaults", "--drain", "120"]
    result = _run(
        tmp_path, "--framework", framework, "--broker", "redis", *(["--store", store] if store else []), *jobs
    )
    assert result["broker_keys_lost"] > 0, result  # type: ignore[operator]
    assert result["recovered_by_workers"] > 0, result  # type: ignore[operator]
    assert (result["recorded"], result["lost"], result["finished"]) == (60, 0, 60), result
    assert result["original_waiters_with_result"] == 60, result
    assert result["bodies_re_run"] == 0, result
