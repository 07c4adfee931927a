"""The documentation site builds with ``mkdocs build --strict``, and its API reference reads.

Strict mode turns every warning into a failure: a broken link between pages,
a link to an anchor a page does not have (``validation`` in ``mkdocs.yml``),
a nav entry without its file, or an API reference (mkdocstrings) that no longer
matches the code. Locally the tests skip when mkdocs is not installed; in CI
(``CI`` set to ``true`` or ``1``) a missing mkdocs is a failure, so the docs
build can never be skipped green.

The site is built once for the module; each test reads what it needs from it.
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# reST that mkdocstrings' Markdown prints as text: a Sphinx role (``:class:`X```,
# which Markdown renders ``:class:<code>X</code>``) or a literal-block marker
# (``Three lines::`` before an indented block).
RAW_ROLE = re.compile(r":(?:py:)?(?:meth|class|func|mod|attr|data|exc|obj|const):(?:`|<code>)")
RAW_LITERAL_MARKER = re.compile(r"\w::</p>")

# Public names deliberately left out of the API reference: the adapters' own
# registration plumbing (found through the entry point, never called by a user)
# and the classification helpers the core applies for the adapters.
NOT_DOCUMENTED = {
    "flexiq_plugins": {"__version__"},
    "flexiq_plugins.errors": {"compensates", "final_reason", "mark_final", "reason_of"},
    "celery_ext": {"CeleryAdapter", "adapter", "republish", "runtime_of"},
    "dramatiq_ext": {"DramatiqAdapter", "adapter", "republish"},
}
PUBLIC_MODULES = (
    "flexiq_plugins",
    "flexiq_plugins.errors",
    "flexiq_plugins.integration",
    "flexiq_plugins.operations",
    "flexiq_plugins.dashboard",
    "flexiq_plugins.testing",
    "flexiq_plugins.pytest_plugin",
    "celery_ext",
    "dramatiq_ext",
)


@dataclass(frozen=True)
class Build:
    """One ``mkdocs build --strict``: its exit status, its output and the site it wrote."""

    returncode: int
    output: str
    site: Path


def _mkdocs() -> str | None:
    beside = Path(sys.executable).with_name("mkdocs")
    if beside.exists():
        return str(beside)
    return shutil.which("mkdocs")


def _build(config: Path, site: Path) -> Build:
    mkdocs = _mkdocs()
    if mkdocs is None:
        message = "mkdocs is not installed (pip install 'flexiq-plugins[docs]')"
        if os.environ.get("CI", "").strip().lower() in ("true", "1"):
            pytest.fail(message)
        pytest.skip(message)
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    result = subprocess.run(
        [mkdocs, "build", "--strict", "--config-file", str(config), "--site-dir", str(site)],
        cwd=config.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    return Build(result.returncode, f"{result.stdout}\n{result.stderr}", site)


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Build:
    """The project's site, built once for this module."""
    return _build(ROOT / "mkdocs.yml", tmp_path_factory.mktemp("docs") / "site")


def _pages(site: Path, under: str = "") -> list[Path]:
    return sorted((site / under).rglob("*.html"))


def _documented(site: Path) -> set[str]:
    """The identifiers the API reference documents (primary entries of ``objects.inv``)."""
    data = (site / "objects.inv").read_bytes().split(b"\n", 4)
    names = set()
    for line in zlib.decompress(data[4]).decode().splitlines():
        name, domain_role, _priority, uri, *_ = line.split(" ")
        if domain_role.startswith("py:") and uri.endswith(("#$", f"#{name}")):
            names.add(name)
    return names


def _object(identifier: str) -> object:
    """The Python object an identifier such as ``flexiq_plugins.operations.list_runs`` names."""
    parts = identifier.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise LookupError(identifier)


def test_mkdocs_build_strict(build: Build) -> None:
    """``mkdocs build --strict`` exits 0 and writes the home page, every concept page and every API page."""
    assert build.returncode == 0, f"mkdocs build --strict failed\n{build.output}"
    assert (build.site / "index.html").exists()
    for page in (ROOT / "docs" / "concepts").glob("*.md"):
        assert (build.site / "concepts" / page.stem / "index.html").exists(), page.name
    for page in (ROOT / "docs" / "api").glob("*.md"):
        name = "" if page.stem == "index" else page.stem
        assert (build.site / "api" / name / "index.html").exists(), page.name


def test_no_restructuredtext_shows_as_text_on_any_page(build: Build) -> None:
    """No page shows a raw Sphinx role (``:class:`X```) or reST's ``::`` literal-block marker.

    The docstrings are rendered by mkdocstrings as Markdown (Google style):
    a Sphinx role is not a cross-reference there but literal text, so a reader
    of the API reference would see ``:meth:`run``` instead of a link. Cross-references
    are written ``[`run`][flexiq_plugins.StepContext.run]`` (checked by the strict
    build: an unknown identifier fails it), other names as code spans.
    """
    assert build.returncode == 0, build.output
    pages = _pages(build.site)
    assert any("/api/" in str(page) for page in pages)
    leftovers = []
    for page in pages:
        html = page.read_text(encoding="utf-8")
        for pattern in (RAW_ROLE, RAW_LITERAL_MARKER):
            for match in pattern.finditer(html):
                context = html[max(0, match.start() - 60) : match.end() + 40].replace("\n", " ")
                leftovers.append(f"{page.relative_to(build.site)}: …{context}…")
    assert not leftovers, "reST left in the rendered site:\n" + "\n".join(leftovers[:30])


def test_api_reference_documents_objects_under_their_public_paths(build: Build) -> None:
    """The entry points are documented, under the paths users import, and no private path is.

    ``flexiq_plugins.StepContext``, not ``flexiq_plugins._steps.context.StepContext``:
    the private layer packages may be reorganized at any time.
    """
    assert build.returncode == 0, build.output
    documented = _documented(build.site)
    for identifier in (
        "flexiq_plugins.current_job",
        "flexiq_plugins.StepContext.run",
        "flexiq_plugins.JobContext",
        "celery_ext.install",
        "celery_ext.DurableTask",
        "dramatiq_ext.DurableSteps",
        "flexiq_plugins.RetryPolicy",
        "flexiq_plugins.send_event",
        "flexiq_plugins.cancel_run",
        "flexiq_plugins.operations.list_runs",
        "flexiq_plugins.testing.DurableRun",
        "flexiq_plugins.pytest_plugin.durable_run",
        "flexiq_plugins.errors.StepDivergence",
        "flexiq_plugins.DurableConfig",
        "flexiq_plugins.integration.AttemptDriver",
    ):
        assert identifier in documented, identifier
    private = sorted(i for i in documented if any(part.startswith("_") for part in i.split(".")))
    assert not private, private


def test_every_public_name_is_in_the_api_reference(build: Build) -> None:
    """Each name a public module exports (``__all__``) is documented under some public path.

    A new public function then cannot be missing from the reference; the few
    names left out on purpose are listed in ``NOT_DOCUMENTED``.
    """
    assert build.returncode == 0, build.output
    documented_objects = [_object(identifier) for identifier in _documented(build.site)]
    missing = []
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            if name in NOT_DOCUMENTED.get(module_name, set()):
                continue
            obj = getattr(module, name)
            if not any(obj is documented for documented in documented_objects):
                missing.append(f"{module_name}.{name}")
    assert not missing, missing


def test_a_link_to_a_missing_anchor_fails_the_strict_build(tmp_path: Path) -> None:
    """With the project's ``validation`` settings, ``page.md#no-such-heading`` fails ``--strict``.

    mkdocs only logs broken anchors at INFO level by default, so a renamed
    heading would silently break every link to it. The control build with the
    right anchor passes, so the failure is the anchor's.
    """
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\nSee [recovery](other.md#recovery-c35).\n")
    (docs / "other.md").write_text("# Other\n\n## Recovery (C35, C39)\n\nText.\n")
    config = tmp_path / "mkdocs.yml"
    config.write_text(f"INHERIT: {ROOT / 'mkdocs.yml'}\ndocs_dir: docs\nnav:\n  - index.md\n  - other.md\n")
    broken = _build(config, tmp_path / "site-broken")
    assert broken.returncode != 0, broken.output
    assert "#recovery-c35" in broken.output, broken.output
    (docs / "index.md").write_text("# Home\n\nSee [recovery](other.md#recovery-c35-c39).\n")
    fixed = _build(config, tmp_path / "site-fixed")
    assert fixed.returncode == 0, fixed.output
