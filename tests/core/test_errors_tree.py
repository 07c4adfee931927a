"""The error tree drawn in ``flexiq_plugins.errors``' docstring is the real class hierarchy.

The docstring draws every error of the package as a tree, one class a line,
indentation for inheritance and the other bases in parentheses. A reader
trusts that drawing; these tests parse it and compare it with the classes.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass

import flexiq_plugins
from flexiq_plugins import errors

ROOTS = {"BaseException": BaseException, "Exception": Exception}
LINE = re.compile(r"^(?P<indent>[ │├└─]*)(?P<name>[A-Z]\w*)(?: \((?P<extra>[\w, ]+)\))?(?:\s{2,}.*)?$")


@dataclass(frozen=True)
class Drawn:
    """One class as the tree draws it: its parent line and the other bases in parentheses."""

    name: str
    parent: str | None
    extra: tuple[str, ...]


def drawn_tree() -> list[Drawn]:
    """Parse the tree of the module docstring: 4 columns a level, from ``BaseException`` to the blank line."""
    doc = errors.__doc__ or ""
    lines = doc.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "BaseException")
    margin = len(lines[start]) - len(lines[start].lstrip())
    drawn: list[Drawn] = []
    stack: list[str] = []
    for line in lines[start:]:
        if not line.strip():
            break
        match = LINE.match(line[margin:])
        assert match is not None, f"not a line of the tree: {line!r}"
        indent = match.group("indent")
        assert len(indent) % 4 == 0, f"indentation not a multiple of 4: {line!r}"
        depth = len(indent) // 4
        del stack[depth:]
        assert len(stack) == depth, f"a line deeper than its parent: {line!r}"
        extra = tuple(e.strip() for e in (match.group("extra") or "").split(",") if e.strip())
        drawn.append(Drawn(match.group("name"), stack[-1] if stack else None, extra))
        stack.append(match.group("name"))
    return drawn


def defined_errors() -> dict[str, type[BaseException]]:
    """Every exception class defined in ``flexiq_plugins.errors`` (not imported into it)."""
    return {
        name: obj
        for name, obj in vars(errors).items()
        if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == errors.__name__
    }


def test_errors_tree_lists_every_error_once_and_nothing_else():
    """Each error class of the module is drawn exactly once; the tree draws no class that is not defined there."""
    names = [d.name for d in drawn_tree() if d.name not in ROOTS]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    assert set(names) == set(defined_errors())


def test_errors_tree_draws_each_error_under_its_real_bases():
    """A class is drawn under its first base (``BaseException`` and ``Exception`` are the roots) and names
    every other base in parentheses, in order."""
    classes = defined_errors()
    for d in drawn_tree():
        if d.name in ROOTS:
            assert d.parent is None, f"{d.name} is a root of the drawing"
            continue
        bases = classes[d.name].__bases__
        assert d.parent == bases[0].__name__, f"{d.name} is drawn under {d.parent}, its first base is {bases[0]}"
        assert d.extra == tuple(b.__name__ for b in bases[1:]), f"{d.name}'s other bases"


def test_errors_tree_every_error_is_in_the_modules_all():
    """``flexiq_plugins.errors.__all__`` names every error defined there: the module is where each is reached."""
    assert set(defined_errors()) <= set(errors.__all__)
    assert all(getattr(errors, name) is not None for name in errors.__all__)


def test_errors_tree_root_errors_are_the_same_classes():
    """An error the package root exports is the very class of ``flexiq_plugins.errors``, not a copy."""
    for name in set(flexiq_plugins.__all__) & set(defined_errors()):
        assert getattr(flexiq_plugins, name) is getattr(errors, name)
