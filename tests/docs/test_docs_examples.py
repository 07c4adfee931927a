"""Every runnable example in the docs runs, as a program of its own, and exits 0.

A code block is runnable when the line directly before its opening
```` ```python ```` fence is ``<!-- runnable -->``. Each one is a complete
program that asserts what it shows (``assert calls == 1``), so a page that
drifts from the code fails here instead of misleading a reader. Each runs in a
fresh interpreter, in an empty temporary directory, with ``FLEXIQ_STORE_URL``
pointing at a SQLite file there, so no example can lean on another's state.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
MARKER = "<!-- runnable -->"
FENCE_OPEN = re.compile(r"^(`{3,}|~{3,})python\b")
TIMEOUT_SECONDS = 120


@dataclass(frozen=True)
class Example:
    """One runnable code block: where it is and its source."""

    page: str
    line: int
    source: str

    @property
    def id(self) -> str:
        """A test id such as ``concepts/steps.md:42``."""
        return f"{self.page}:{self.line}"


def _blocks(page: Path) -> list[Example]:
    lines = page.read_text(encoding="utf-8").splitlines()
    found: list[Example] = []
    for i, line in enumerate(lines):
        opening = FENCE_OPEN.match(line.strip())
        if opening is None or i == 0 or lines[i - 1].strip() != MARKER:
            continue
        fence = opening.group(1)
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == fence), None)
        if end is None:
            raise AssertionError(f"{page}:{i + 1}: runnable block has no closing fence")
        indent = len(line) - len(line.lstrip())
        body = [text[indent:] if text[:indent].isspace() else text for text in lines[i + 1 : end]]
        found.append(Example(str(page.relative_to(DOCS)), i + 2, "\n".join(body) + "\n"))
    return found


def collect_examples() -> list[Example]:
    """Every runnable block of every page under ``docs/``, in path order."""
    return [example for page in sorted(DOCS.rglob("*.md")) for example in _blocks(page)]


EXAMPLES = collect_examples()


def test_docs_have_runnable_examples() -> None:
    """The collection is not empty: a broken marker must not make the suite vacuously green."""
    assert len(EXAMPLES) >= 10, [e.id for e in EXAMPLES]


def test_every_concept_page_has_a_runnable_example() -> None:
    """Each concept page shows its behaviour in at least one example that runs."""
    pages = {e.page for e in EXAMPLES}
    concepts = {str(p.relative_to(DOCS)) for p in (DOCS / "concepts").glob("*.md")}
    assert concepts, "no concept pages found"
    assert concepts <= pages, sorted(concepts - pages)


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.id for e in EXAMPLES])
def test_runnable_example(example: Example, tmp_path: Path) -> None:
    """The example runs in a fresh interpreter and exits 0 (its own asserts hold)."""
    script = tmp_path / "example.py"
    script.write_text(example.source, encoding="utf-8")
    env = dict(os.environ)
    env["FLEXIQ_STORE_URL"] = f"sqlite:///{tmp_path / 'steps.db'}"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    result = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_SECONDS,
        check=False,
    )
    assert result.returncode == 0, (
        f"{example.id} exited {result.returncode}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    )
