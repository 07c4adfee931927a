"""The dashboard's pages, in process through Starlette's test client, over runs the real core made (C52).

What a page must never do is tested here on every kind of run: show a
stored value, key, name or error as markup, decode a value nobody asked for
(or one an unknown key encrypted), show a store's password, or show the
dashboard's own traceback.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet
from starlette.applications import Starlette
from starlette.routing import Mount

from flexiq_plugins import (
    CodecChain,
    DurableConfig,
    FernetCodec,
    JobEnvelope,
    MemoryStepStore,
    SqlStepStore,
    StepStore,
    current_job,
)
from flexiq_plugins.dashboard import create_app
from flexiq_plugins.integration import AttemptDriver, JobInfo
from tests.conftest import POSTGRES, require_service
from tests.dashboard.conftest import Runs

with warnings.catch_warnings():  # newer Starlette prefers httpx2; httpx works the same
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

SCRIPT = "<script>alert('x')</script>"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqlStepStore]:
    """A SQLite store in the test's directory."""
    sql = SqlStepStore(f"sqlite:///{tmp_path / 'steps.db'}")
    yield sql
    sql.close()


@pytest.fixture
def runs(store: SqlStepStore) -> Runs:
    """A maker of runs in ``store``."""
    return Runs(store)


def client(store: StepStore | str, **options: Any) -> TestClient:
    """A test client of a dashboard over ``store``."""
    return TestClient(create_app(store, **options))


def test_c52_every_page_answers_on_every_kind_of_run(runs: Runs, store: SqlStepStore) -> None:
    """C52: the overview, the runs list (filtered, searched), each run, the dead letters and the events answer 200."""
    runs.succeeded("run-ok")
    runs.sleeping("run-nap")
    dead_id = runs.dead("run-dead")
    store.add_event("payment", "o-1", b"FQ1|json\n1")
    c = client(store)

    for url in (
        "/",
        "/fragments/overview",
        "/runs",
        "/runs?status=dead&task=shop.checkout&since=1h",
        "/runs?order=oldest&until=2999-01-01",
        "/runs/run-ok?values=1",
        "/runs/run-nap",
        "/runs/run-dead",
        "/fragments/run-status/run-nap",
        "/dead-letters",
        "/dead-letters?retried=no&reason=divergence",
        f"/dead-letters/{dead_id}",
        "/events",
        "/events?state=pending",
        "/bulk/cancel?status=sleeping",
    ):
        response = c.get(url)
        assert response.status_code == 200, (url, response.text)
    found = c.get("/runs?q=job-run-nap", follow_redirects=False)
    assert (found.status_code, found.headers["location"]) == (303, "/runs/run-nap")
    assert c.get("/runs?q=nothing-here").status_code == 404
    assert c.get("/runs/nothing-here").status_code == 404


def test_c52_pages_show_the_words_flexiq_prints(runs: Runs, store: SqlStepStore) -> None:
    """C15, C30, C52: a sleeping run's wake time and a dead letter's retry, worded as ``flexiq`` words them."""
    from flexiq_plugins import operations

    runs.sleeping("run-nap")
    dead_id = runs.dead("run-dead")
    store.prepare_retry(dead_id)
    c = client(store)

    assert operations.run_note(store.get_run("run-nap")) in c.get("/runs").text
    assert operations.retried_note(store.get_dead_letter(dead_id)) in c.get("/dead-letters").text


def test_c49_c51_c52_the_timeline_shows_a_step_maps_entry_and_items_and_a_patch_marker(
    runs: Runs, store: SqlStepStore
) -> None:
    """C49, C51, C52: a run with a step map and a patch marker: its page lists the map's entry (kind ``map``),
    each item with its idempotency key and (on request) its value, and the marker (kind ``patch``)."""

    def body() -> None:
        step = current_job.step
        if step.patched("audit-v2"):
            step.run("audit", lambda: "audited")
        step.map("price", lambda sku: f"price of {sku}", ["a", "b"], key=lambda sku: sku)
        step.sleep("1h")

    runs.attempt("run-map", body)
    page = client(store).get("/runs/run-map?values=1").text
    timeline = page.split('id="steps"')[1].split("</table>")[0]

    rows = re.findall(r'<tr class="kind-(\w+)">\s*<td>(\d+)</td>\s*<td><span class="key">([^<]+)</span>', timeline)
    assert [(kind, key) for kind, _, key in rows] == [
        ("patch", "patch:audit-v2"),
        ("run", "audit#0"),
        ("map", "price#0"),
        ("run", "price:a"),
        ("run", "price:b"),
        ("sleep", "sleep#0"),
    ]
    assert "run-map:price:a" in timeline
    assert "price of b" in timeline


def test_c52_stored_values_keys_names_and_errors_are_escaped(runs: Runs, store: SqlStepStore) -> None:
    """C52: a run key, task name, argument, step value and error holding markup are shown as text, never as markup."""
    key = f"run-{SCRIPT}"
    runs.succeeded(key, value={"note": SCRIPT}, task=f"shop.<b>{SCRIPT}</b>", args=[SCRIPT])
    runs.dead(f"dead-{SCRIPT}", task="shop.dead")
    c = client(store)

    pages = [
        c.get("/").text,
        c.get("/runs").text,
        c.get("/runs/" + key.replace("/", "%2F") + "?values=1").text,
        c.get("/dead-letters").text,
    ]

    for html in pages:
        assert "<script>alert" not in html
        assert "<b>" not in html
    assert "&lt;script&gt;alert" in pages[1]
    assert pages[2].count("&lt;script&gt;alert") >= 3  # the key, the argument, the value


def test_c52_values_are_decoded_only_on_request(runs: Runs, store: SqlStepStore) -> None:
    """C52: a step value and the job's arguments appear only with "show values"."""
    runs.succeeded("run-secret", value={"card": "4242-secret"}, args=["arg-secret"])
    c = client(store)

    hidden = c.get("/runs/run-secret").text
    shown = c.get("/runs/run-secret?values=1").text

    assert "4242-secret" not in hidden
    assert "arg-secret" not in hidden
    assert "4242-secret" in shown
    assert "arg-secret" in shown


def test_c52_a_value_encrypted_with_a_key_the_dashboard_lacks_shows_as_encrypted(tmp_path: Path) -> None:
    """C52: without the workers' codec chain an encrypted value reads "encrypted"; with it, the value shows."""
    store = SqlStepStore(f"sqlite:///{tmp_path / 'steps.db'}")
    chain = CodecChain(codecs=[FernetCodec(Fernet.generate_key())])
    driver = AttemptDriver(store, DurableConfig(codecs=chain.codecs, keep_succeeded_steps=True))
    attempt = driver.start(JobInfo("run-enc", "job-1", JobEnvelope("shop.pay", "test")))
    attempt.run(lambda: current_job.step.run("charge", lambda: {"card": "4242-hidden"}))  # type: ignore[union-attr]

    without_key = client(store).get("/runs/run-enc?values=1").text
    with_key = client(store, codec=chain).get("/runs/run-enc?values=1").text

    assert 'class="badge encrypted"' in without_key
    assert "4242-hidden" not in without_key
    assert "4242-hidden" in with_key
    store.close()


@pytest.mark.postgres
def test_c52_a_store_password_is_never_shown() -> None:
    """C52: the store's description and an unreachable store's error page hide the password."""
    require_service(*POSTGRES)
    reachable = client("postgresql+psycopg://postgres:s3cret-pw@127.0.0.1:5432/test")
    unreachable = client("postgresql+psycopg://flexiq:s3cret-pw@127.0.0.1:9/nowhere")

    page = reachable.get("/runs")
    down = unreachable.get("/")

    assert "s3cret-pw" not in page.text
    assert "postgres:***@127.0.0.1" in page.text
    assert down.status_code == 503
    assert "s3cret-pw" not in down.text


class _BrokenStore(MemoryStepStore):
    """A store whose counting fails with an unexpected error naming a secret."""

    def count_runs(self, **kwargs: Any) -> dict[str, int]:
        raise RuntimeError("internal detail: s3cret")


def test_c52_an_unexpected_error_renders_a_page_not_a_traceback(caplog: pytest.LogCaptureFixture) -> None:
    """C52: the page says the dashboard failed; the traceback goes to the log only."""
    response = client(_BrokenStore()).get("/")

    assert response.status_code == 500
    assert "Traceback" not in response.text
    assert "s3cret" not in response.text
    assert "the server&#39;s log has the details" in response.text
    assert "internal detail: s3cret" in caplog.text


def test_c52_mounted_in_a_starlette_app_its_links_follow_the_mount_path(runs: Runs, store: SqlStepStore) -> None:
    """C52: mounted at ``/ops``, every link and form of a page starts with ``/ops``."""
    runs.sleeping("run-nap")
    host = Starlette(routes=[Mount("/ops", create_app(store, read_only=False, token="t"))])
    c = TestClient(host)

    html = c.get("/ops/runs/run-nap").text
    links = re.findall(r'(?:href|action|src|hx-get)="(/[^"]*)"', html)

    assert links
    assert all(link.startswith("/ops/") for link in links), links
    assert c.get("/ops/static/htmx.min.js").status_code == 200


DASHBOARD = Path(__file__).resolve().parents[2] / "flexiq_plugins" / "dashboard"


def test_c52_no_template_marks_anything_safe_or_turns_autoescaping_off() -> None:
    """C52: autoescaping is on for every template, and no template opts out of it (``|safe``, ``autoescape false``)."""
    templates = sorted((DASHBOARD / "templates").glob("*.html"))

    assert templates
    for template in templates:
        text = template.read_text()
        assert "|safe" not in text.replace(" ", ""), template.name
        assert "autoescape" not in text, template.name
        assert "Markup" not in text, template.name


def test_c52_the_dashboard_reads_and_acts_only_through_the_faces() -> None:
    """C52: the dashboard imports from the core only ``flexiq_plugins``, ``errors`` and ``operations``: no store,
    no attempt, no private layer, so everything it does is what ``flexiq`` does."""
    import ast

    imported = set()
    for module in DASHBOARD.glob("*.py"):
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 2:
                imported.add(node.module or "")
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("flexiq_plugins"):
                imported.add((node.module or "").removeprefix("flexiq_plugins").lstrip("."))

    assert imported <= {"", "errors", "operations"}, imported


def test_c52_an_unknown_page_or_method_gets_the_dashboards_error_page(store: SqlStepStore) -> None:
    """C52: a path the dashboard lacks (404) or a GET of an action (405) renders its error page."""
    c = client(store)

    missing = c.get("/no/such/page")
    wrong_method = c.get("/actions/recover")

    assert missing.status_code == 404
    assert "the dashboard has no such page" in missing.text
    assert wrong_method.status_code == 405
    assert "this page takes no such request" in wrong_method.text
