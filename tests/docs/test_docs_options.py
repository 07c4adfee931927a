"""The option tables of the docs list exactly the options the code accepts.

``docs/configuration.md`` lists every field of ``DurableConfig``; it and
``docs/celery.md`` list the same Celery-only options, the fields that
``celery_ext.CeleryConfig`` adds. A renamed option (``max_hop`` →
``max_hop_seconds``) then cannot leave a page behind.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from celery_ext import CeleryConfig
from flexiq_plugins import DurableConfig

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _table_options(text: str) -> set[str]:
    return set(re.findall(r"^\| `([a-z_]+)` \|", text, flags=re.MULTILINE))


def _celery_only() -> set[str]:
    shared = {f.name for f in dataclasses.fields(DurableConfig)}
    return {f.name for f in dataclasses.fields(CeleryConfig)} - shared


def test_configuration_page_lists_every_option_and_the_celery_only_ones() -> None:
    """configuration.md's tables are DurableConfig's fields plus CeleryConfig's own, nothing else."""
    listed = _table_options((DOCS / "configuration.md").read_text())
    assert listed == {f.name for f in dataclasses.fields(CeleryConfig)}


def test_celery_page_lists_the_same_celery_only_options() -> None:
    """celery.md's options table is exactly the Celery-only options."""
    text = (DOCS / "celery.md").read_text()
    options = text[text.index("## Options") :]
    celery_only = {"dead_letter_queue", "dead_letter_path", "dead_letter_queue_max_length"}
    assert _table_options(options) == _celery_only() == celery_only


def test_no_page_names_an_option_that_does_not_exist() -> None:
    """Every ``*_seconds``/``*_bytes`` or known option name written in backquotes on a page is a real field."""
    fields = {f.name for f in dataclasses.fields(CeleryConfig)}
    suspicious = re.compile(r"`((?:max_hop|lease|busy_retry|store_retry)(?:_seconds|_s|_ms)?)`")
    for page in sorted(DOCS.rglob("*.md")):
        for name in suspicious.findall(page.read_text()):
            assert name in fields, f"{page.relative_to(DOCS)} names option {name!r}"
