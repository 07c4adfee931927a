"""Every module, object and file that ``docs/architecture.md`` names exists in the code as it is.

The architecture page is drawn from the code: a module renamed, moved or split
must not leave the page pointing at something that is gone. Checked:

- every dotted name starting with ``flexiq_plugins``, ``celery_ext`` or
  ``dramatiq_ext`` (anywhere on the page, the layer diagram included) is a
  module, or an attribute of one (``flexiq_plugins._attempt.compensation.settle``);
- every ``integration.<name>`` is exported by ``flexiq_plugins.integration``;
- every file or folder path in a code span (``tests/conftest.py``,
  ``flexiq_plugins/_store/migrations/``) exists in the repository.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "architecture.md"
DOTTED = re.compile(r"(?<![\w./])(?:flexiq_plugins|celery_ext|dramatiq_ext)(?:\.[A-Za-z_]\w*)*")
INTEGRATION = re.compile(r"(?<![\w.])integration\.([A-Za-z_]\w*)")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
FILE_PATH = re.compile(r"(?<![\w.])[\w.-]+(?:/[\w.-]+)+/?|(?<![\w.])[\w.-]+/(?![\w.])")
NOT_MODULES = {"flexiq_plugins.adapters": "the entry point group adapters register under"}
"""Dotted names on the page that are not Python objects, with what they are."""


def _text() -> str:
    return PAGE.read_text(encoding="utf-8")


def _resolves(dotted: str) -> bool:
    """Whether ``dotted`` is a module, or a chain of attributes of the longest module it starts with."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            found = importlib.util.find_spec(module_name) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            continue
        target: object = importlib.import_module(module_name)
        for attribute in parts[cut:]:
            if not hasattr(target, attribute):
                return False
            target = getattr(target, attribute)
        return True
    return False


def _dotted_names() -> list[str]:
    return sorted({name for name in DOTTED.findall(_text()) if name not in NOT_MODULES})


def _file_paths() -> list[str]:
    spans = CODE_SPAN.findall(_text())
    return sorted({path for span in spans for path in FILE_PATH.findall(span)})


def test_architecture_paths_the_checks_are_not_vacuous() -> None:
    """The page names many modules and files, and the resolver refuses a module or attribute that does not exist."""
    assert len(_dotted_names()) >= 60
    assert len(_file_paths()) >= 5
    assert _resolves("flexiq_plugins._attempt.compensation.settle")
    assert not _resolves("flexiq_plugins._attempt.nothing_here")
    assert not _resolves("flexiq_plugins._attempt.compensation.nothing_here")


def test_architecture_paths_every_dotted_name_exists() -> None:
    """Each ``flexiq_plugins…``, ``celery_ext…`` and ``dramatiq_ext…`` name on the page imports or resolves."""
    missing = [name for name in _dotted_names() if not _resolves(name)]
    assert missing == []


def test_architecture_paths_every_integration_name_is_exported() -> None:
    """Each ``integration.<name>`` the page names is exported by ``flexiq_plugins.integration``."""
    integration = importlib.import_module("flexiq_plugins.integration")
    names = sorted(set(INTEGRATION.findall(_text())))
    assert names, "the page names no integration.<name>: the pattern no longer matches it"
    assert [name for name in names if name not in integration.__all__] == []


@pytest.mark.parametrize("path", _file_paths())
def test_architecture_paths_every_file_exists(path: str) -> None:
    """A file or folder the page names in a code span exists in the repository."""
    assert (ROOT / path).exists(), f"docs/architecture.md names {path}, which does not exist"
