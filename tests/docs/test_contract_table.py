"""``docs/contract.md`` has one row for every rule of the behavioural contract.

The contract's rules are numbered C1 to C53; the user-facing table says, for
each, what it means for a user, the page that explains it and whether it is in
this release. A rule added to the contract without a row, a row whose page is
gone, or an introduction that names the wrong range fails here.

The rule ids are kept in this file (``RULES``), so the check runs in a clean
clone of the repository. Where the contract's own text is reachable (a
``shared/CONTRACT.md`` beside the repository or above it, or the file
``FLEXIQ_CONTRACT`` names), ``RULES`` is also compared with the rules it
defines, so a rule added there shows up here.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "contract.md"
RULES = tuple(f"C{number}" for number in range(1, 54))
"""Every rule of the contract, in order: a rule added to the contract is added here and to the table."""
STATUSES = {"implemented", "partly", "planned"}
ROW = re.compile(r"^\| (C\d+) \|(.*)$", re.MULTILINE)
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)\s]*)?\)")
SPEC_RULE = re.compile(r"^- (C\d+) ", re.MULTILINE)


def _rows() -> dict[str, list[str]]:
    """The table's rows by rule id: its cells after the id (in short, explained in, status, notes)."""
    rows: dict[str, list[str]] = {}
    for rule, rest in ROW.findall(PAGE.read_text(encoding="utf-8")):
        assert rule not in rows, f"{rule} has two rows in docs/contract.md"
        rows[rule] = [cell.strip() for cell in rest.rstrip().rstrip("|").split(" | ")]
    return rows


def _contract_text() -> Path | None:
    """The contract's own text, if this checkout can reach it."""
    named = os.environ.get("FLEXIQ_CONTRACT")
    if named:
        return Path(named)
    for folder in (ROOT, *ROOT.parents):
        candidate = folder / "shared" / "CONTRACT.md"
        if candidate.is_file():
            return candidate
    return None


def test_every_rule_of_the_contract_has_one_row_in_order() -> None:
    assert list(_rows()) == list(RULES)


def test_the_introduction_names_the_range_of_rules() -> None:
    text = PAGE.read_text(encoding="utf-8")
    assert f"numbered rules, {RULES[0]} to {RULES[-1]}." in text


@pytest.mark.parametrize("rule", RULES)
def test_each_row_says_what_the_rule_means_where_it_is_explained_and_its_status(rule: str) -> None:
    cells = _rows()[rule]
    assert len(cells) == 4, f"{rule}: expected in short | explained in | status | notes, got {cells}"
    in_short, explained_in, status, _notes = cells
    assert in_short, f"{rule} says nothing in short"
    assert status in STATUSES, f"{rule}: status {status!r}"
    pages = LINK.findall(explained_in)
    assert pages, f"{rule} links no page that explains it"
    for page in pages:
        assert (PAGE.parent / page).is_file(), f"{rule} links {page}, which is not in docs/"


def test_the_rules_kept_here_are_the_rules_the_contract_defines() -> None:
    spec = _contract_text()
    if spec is None:
        pytest.skip("the contract's text (shared/CONTRACT.md) is not beside this checkout; RULES is checked alone")
    defined = SPEC_RULE.findall(spec.read_text(encoding="utf-8"))
    assert sorted(defined, key=lambda rule: int(rule[1:])) == list(RULES), f"rules in {spec}"
