"""``benchmarks.bench_dashboard`` runs, on a few thousand SQLite runs (a smoke run: nothing here is timed)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks import bench_dashboard


def test_bench_dashboard_fills_the_store_and_prints_every_page(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """The fill writes the runs asked for; every page answers 200 and gets a line with its median and slowest time."""
    url = f"sqlite:///{tmp_path / 'bench.db'}"

    bench_dashboard.main(["--store", url, "--runs", "3000", "--rounds", "1"])

    out = capsys.readouterr().out
    assert "3,000 runs on sqlite" in out
    for page in bench_dashboard.pages(3000):
        assert re.search(rf"^{re.escape(page)}\s+[\d.]+\s+[\d.]+", out, re.MULTILINE), page
    assert out.count("target 150 ms:") == len(bench_dashboard.TARGET_PAGES)
