"""The dashboard in a real browser, served by ``flexiq dashboard``, over a store real workers fill (C52).

Each module-scoped combination is one framework's in-thread worker (Celery,
Dramatiq, on Redis) over one store (a SQLite file, a PostgreSQL database of
its own), the conformance harness's scenarios publishing the jobs, and two
``flexiq dashboard`` subprocesses on that store: one allowing actions with a
token, one read-only. Chromium clicks every action; each test then checks the
store (and the ledger of real step-body calls) for what the click did.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
import sqlalchemy as sa

from flexiq_plugins import new_run_key
from flexiq_plugins._store.sql.tables import store_tables
from tests.conformance.harness import Harness, HarnessConfig
from tests.conftest import POSTGRES, POSTGRES_URL, require_service
from tests.dashboard.conftest import TOKEN, DashboardServer, screenshot
from tests.polling import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.redis, pytest.mark.timeout(180)]

COMBINATIONS = [
    "celery-sqlite",
    pytest.param("celery-postgres", marks=pytest.mark.postgres),
    "dramatiq-sqlite",
    pytest.param("dramatiq-postgres", marks=pytest.mark.postgres),
]
SCRIPT = "<script>alert('flexiq')</script>"


@pytest.fixture(scope="module", params=COMBINATIONS)
def combination(request: pytest.FixtureRequest) -> str:
    """``<framework>-<store>``, each in turn."""
    require_service("Redis", "127.0.0.1", 6379)
    if request.param.endswith("postgres"):
        require_service(*POSTGRES)
    return str(request.param)


@pytest.fixture(scope="module")
def store_url(combination: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A SQLite file, or a PostgreSQL database made for this module and dropped afterwards."""
    if combination.endswith("sqlite"):
        yield f"sqlite:///{tmp_path_factory.mktemp('store') / 'steps.db'}"
        return
    name = f"fqdash_{uuid4().hex[:10]}"
    admin = sa.create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f"CREATE DATABASE {name}"))
    yield POSTGRES_URL.rsplit("/", 1)[0] + f"/{name}"
    with admin.connect() as conn:
        conn.execute(sa.text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
    admin.dispose()


@pytest.fixture(scope="module")
def harness(combination: str, store_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    """The framework's harness on Redis over ``store_url``, its in-thread worker running."""
    framework = combination.split("-", maxsplit=1)[0]
    unique = uuid4().hex[:10]
    config = HarnessConfig(
        name=f"{framework}-redis",
        broker="redis",
        queue=f"fqdash{unique}",
        namespace=f"fqdash-{unique}",
        store_url=store_url,
        directory=str(tmp_path_factory.mktemp(combination)),
    )
    built: Harness
    if framework == "celery":
        from tests.conformance.celery_harness import CeleryHarness

        built = CeleryHarness(config)
    else:
        from tests.conformance.dramatiq_harness import DramatiqHarness

        built = DramatiqHarness(config)
    built.store.now()  # creates the tables before the dashboard (which never migrates) opens the store
    with built.thread_worker():
        yield built
    built.close()


def _app_ref(harness: Harness) -> str:
    return (
        "tests.conformance.celery_app:app" if harness.framework == "celery" else "tests.conformance.dramatiq_app:broker"
    )


@pytest.fixture(scope="module")
def server(harness: Harness) -> Iterator[DashboardServer]:
    """``flexiq dashboard --app … --allow-actions --token-env FLEXIQ_TEST_TOKEN`` on the harness's store."""
    directory = Path(harness.config.directory)
    options = ("--app", _app_ref(harness), "--allow-actions", "--token-env", "FLEXIQ_TEST_TOKEN")
    started = DashboardServer(harness.config.store_url, directory, harness.config.to_env(), *options)
    yield started
    started.stop()


@pytest.fixture(scope="module")
def read_only_server(harness: Harness) -> Iterator[DashboardServer]:
    """``flexiq dashboard`` with no option but the store: read-only."""
    started = DashboardServer(harness.config.store_url, Path(harness.config.directory), harness.config.to_env())
    yield started
    started.stop()


@pytest.fixture
def page(browser: Any, server: DashboardServer) -> Iterator[Any]:
    """A browser page signed in to the acting dashboard (a fresh context: its own cookies).

    At the end, no dialog opened (no stored value ran as script) and the
    console logged no error (no script or style the Content-Security-Policy
    blocked: htmx runs), the 403s the refusal tests provoke aside.
    """
    context = browser.new_context(viewport={"width": 1100, "height": 720})
    opened = context.new_page()
    dialogs: list[str] = []
    errors: list[str] = []
    opened.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    opened.on(
        "console", lambda m: errors.append(m.text) if m.type == "error" and "status of 403" not in m.text else None
    )
    opened.goto(f"{server.url}/signin")
    opened.fill("#token", TOKEN)
    opened.click("#signin")
    opened.wait_for_url(f"{server.url}/")
    yield opened
    assert dialogs == [], f"a stored value ran as script: {dialogs}"
    assert errors == [], f"the page logged errors (a blocked script or style, a failed request): {errors}"
    context.close()


def _diverged(harness: Harness) -> tuple[str, int]:
    job = harness.publish("deploy_between_attempts")
    harness.wait_status(job.run_key, "dead", timeout=60)
    (dead,) = harness.dead_letters(job.run_key)
    return job.run_key, dead.id


# ---------------------------------------------------------------------- tests
def test_c12_c52_a_divergence_shows_its_diff_and_a_retry_from_a_step_finishes_with_one_charge(
    page: Any, server: DashboardServer, harness: Harness
) -> None:
    """C11, C12, C30, C52: the dead letter page lays the two sequences out; retry from ``reserve#0`` finishes.

    The diff marks position 1 changed (``reserve#0`` recorded, ``allocate#0``
    running). Retrying from ``reserve#0`` re-publishes the job with the same
    run key; a real worker replays ``charge`` from the store and runs
    ``allocate`` and ``ship``: one charge in all.
    """
    run_key, dead_id = _diverged(harness)

    page.goto(f"{server.url}/dead-letters/{dead_id}")
    changed = page.locator("#divergence tr.diff-changed td")
    assert changed.all_inner_texts()[:4] == ["1", "reserve#0", "allocate#0", "changed"]
    screenshot(page, "dead-letter")
    page.select_option("#reset-from", "reserve#0")
    page.click("#retry")
    assert f"retried dead letter {dead_id}: run {run_key}" in page.inner_text("#result")

    harness.wait_status(run_key, "succeeded", timeout=60)
    assert harness.ledger.count(run_key, "charge") == 1
    assert harness.ledger.count(run_key, "allocate") == 1
    assert harness.store.get_dead_letter(dead_id).retried_at is not None
    page.goto(f"{server.url}/runs/{run_key}")
    assert page.inner_text("#status") == "succeeded"
    screenshot(page, "run")


def test_c34_c52_cancel_ends_a_sleeping_run(page: Any, server: DashboardServer, harness: Harness) -> None:
    """C34, C52: the run page's cancel button ends a sleeping run ``cancelled`` with the reason given."""
    job = harness.publish("nap", 3600.0)
    harness.wait_status(job.run_key, "sleeping")

    page.goto(f"{server.url}/runs/{job.run_key}")
    assert page.inner_text("#note").startswith("wakes at ")
    page.fill("input[name=reason]", "customer left")
    page.click("#cancel-run")

    assert f"run {job.run_key}: cancelled" in page.inner_text("#result")
    run = harness.wait_status(job.run_key, "cancelled")
    assert run.cancel_reason == "customer left"


def test_c50_c52_fork_from_a_step_makes_a_new_run_that_replays_the_steps_before_it(
    page: Any, server: DashboardServer, harness: Harness
) -> None:
    """C50, C52: a sleeping run forked from ``sleep#0`` on its page: a real worker runs the new run, whose
    copied ``before`` step is a memo hit (its body not called) and which sleeps again; the old run is unchanged."""
    job = harness.publish("nap", 3600.0)
    harness.wait_status(job.run_key, "sleeping")
    before = harness.store.get_steps(job.run_key)

    page.goto(f"{server.url}/runs/{job.run_key}")
    page.select_option("#fork-from", "sleep#0")
    page.click("#fork-run")
    result = page.inner_text("#result")
    assert f"forked run {job.run_key} from sleep#0: new run " in result
    assert "(1 step row copied)" in result
    new_key = result.split("new run ", 1)[1].split(" ", 1)[0]

    harness.wait_status(new_key, "sleeping", timeout=60)
    assert [s.step_key for s in harness.store.get_steps(new_key)] == ["before#0", "sleep#0"]
    assert harness.ledger.count(new_key, "before") == 0
    assert harness.ledger.count(job.run_key, "before") == 1
    assert harness.status(job.run_key) == "sleeping"
    assert harness.store.get_steps(job.run_key) == before
    page.click("#back")  # the result links to the new run
    assert page.inner_text("#run-key") == new_key
    assert page.inner_text("#status") == "sleeping"


def test_c52_a_script_in_a_value_is_text_and_an_event_sent_from_the_page_wakes_the_run(
    page: Any, server: DashboardServer, harness: Harness
) -> None:
    """C33, C52: a ``<script>`` order id and payload show as text everywhere; the send-event form wakes the run.

    The run waits for ``("payment", "<script>…")``: the runs list, the run page
    (its arguments shown on request) and the events page show the text, and
    no script runs (the page fixture fails on any dialog). The event sent
    from the page is received by the run, which then finishes on a real worker.
    """
    job = harness.publish("await_payment", SCRIPT, None)
    harness.wait_status(job.run_key, "waiting")

    page.goto(f"{server.url}/runs?status=waiting")
    assert SCRIPT in page.inner_text("table.runs")
    page.goto(f"{server.url}/runs/{job.run_key}?values=1")
    assert SCRIPT in page.inner_text("#arguments")
    assert SCRIPT in page.inner_text("#note")
    page.goto(f"{server.url}/events")
    page.fill("#event-topic", "payment")
    page.fill("#event-key", SCRIPT)
    page.fill("#event-data", f'{{"note": "{SCRIPT}"}}')
    page.click("#send-event")

    assert "sent" in page.inner_text("#result")
    harness.wait_status(job.run_key, "succeeded", timeout=60)
    assert harness.ledger.entries(job.run_key, "paid")[0]["payload"] == {"note": SCRIPT}
    page.goto(f"{server.url}/events?state=received")
    assert SCRIPT in page.inner_text("#events")
    assert job.run_key in page.inner_text("#events")


def test_c30_c52_purge_deletes_a_dead_letter(page: Any, server: DashboardServer, harness: Harness) -> None:
    """C30, C52: the purge button deletes the dead letter; its run stays (until cleanup)."""
    run_key, dead_id = _diverged(harness)

    page.goto(f"{server.url}/dead-letters/{dead_id}")
    page.click("#purge")

    assert "purged 1 dead letter" in page.inner_text("#result")
    assert harness.store.find_dead_letters(run_key=run_key) == []
    assert harness.status(run_key) == "dead"


def test_c35_c52_recover_now_republishes_a_sleeping_run_whose_wake_up_was_lost(
    page: Any, server: DashboardServer, harness: Harness
) -> None:
    """C35, C52: the broker loses a wake-up; "Recover now" re-publishes the overdue run, which finishes.

    The lost run's wake time is moved two minutes back (past the default
    grace of a minute) instead of waiting for the clock.
    """
    run_key = new_run_key()
    lost = harness.lose_publishes(run_key)
    harness.publish("nap", 0.2, run_key=run_key)
    wait_for(lambda: lost.used == 1, 30, "the wake-up to be lost")
    runs = store_tables("flexiq_").runs
    with harness.store.engine.begin() as conn:
        conn.execute(sa.update(runs).where(runs.c.run_key == run_key).values(wake_at=harness.store.now() - 120))

    page.goto(f"{server.url}/")
    assert run_key in page.inner_text("section.stuck")
    screenshot(page, "overview")
    page.click("#recover-now")

    assert f"re-published run {run_key}" in page.inner_text("#result")
    harness.wait_status(run_key, "succeeded", timeout=60)
    assert harness.ledger.count(run_key, "before") == 1
    assert harness.ledger.count(run_key, "after") == 1


def test_c52_bulk_retry_and_bulk_cancel_show_the_count_first_then_act_on_the_filter(
    page: Any, server: DashboardServer, harness: Harness
) -> None:
    """C30, C34, C52: each bulk action's confirmation counts the filtered runs; confirming acts on exactly those."""
    since = harness.store.now()
    dead = [_diverged(harness)[0] for _ in range(2)]
    naps = [harness.publish("nap", 3600.0).run_key for _ in range(2)]
    for key in naps:
        harness.wait_status(key, "sleeping")
    start = page.evaluate(f"new Date({since * 1000}).toISOString().slice(0, 23)")

    page.goto(f"{server.url}/runs?status=dead&since={start}")
    screenshot(page, "runs")
    page.click("#bulk-retry")
    assert "selects 2 runs; 2 of them are dead" in page.inner_text("#bulk-count")
    page.click("#bulk-confirm")
    assert page.inner_text("#result").count("re-published as job") == 2
    assert all(harness.dead_letters(k)[0].retried_at is not None for k in dead)

    page.goto(f"{server.url}/runs?status=sleeping&since={start}")
    page.click("#bulk-cancel")
    assert "selects 2 runs; 2 of them are unfinished" in page.inner_text("#bulk-count")
    page.click("#bulk-confirm")
    for key in naps:
        harness.wait_status(key, "cancelled")


def test_c52_a_read_only_dashboard_shows_no_action_and_refuses_one_sent_by_hand(
    browser: Any, read_only_server: DashboardServer, harness: Harness
) -> None:
    """C52: no action button anywhere; a cancel POSTed by hand is refused and nothing changes."""
    job = harness.publish("nap", 3600.0)
    harness.wait_status(job.run_key, "sleeping")
    context = browser.new_context()
    page = context.new_page()

    page.goto(f"{read_only_server.url}/runs/{job.run_key}")
    assert page.locator("#read-only").is_visible()
    assert page.locator("form.action").count() == 0
    page.goto(f"{read_only_server.url}/")
    assert page.locator("#recover-now").count() == 0
    status = page.evaluate(
        """async (key) => (await fetch('/actions/cancel/' + encodeURIComponent(key), {
            method: 'POST', headers: {'Content-Type': 'application/x-www-form-urlencoded'},
            body: 'reason=by+hand'})).status""",
        job.run_key,
    )

    assert status == 403
    assert harness.status(job.run_key) == "sleeping"
    context.close()


def test_c52_a_post_without_the_csrf_token_or_without_the_token_is_refused(
    browser: Any, page: Any, server: DashboardServer, harness: Harness
) -> None:
    """C52: signed in but without the form's CSRF token: refused; with the CSRF token but not signed in: refused."""
    job = harness.publish("nap", 3600.0)
    harness.wait_status(job.run_key, "sleeping")
    post = """async ([key, csrf]) => {
        const r = await fetch('/actions/cancel/' + encodeURIComponent(key), {method: 'POST',
            headers: {'Content-Type': 'application/x-www-form-urlencoded'},
            body: csrf ? 'csrf_token=' + encodeURIComponent(csrf) : 'reason=forged'});
        return [r.status, await r.text()];
    }"""

    page.goto(f"{server.url}/runs/{job.run_key}")
    no_csrf = page.evaluate(post, [job.run_key, ""])
    anonymous = browser.new_context().new_page()
    anonymous.goto(f"{server.url}/runs/{job.run_key}")
    assert anonymous.locator("#cancel-run").count() == 0
    anonymous.goto(f"{server.url}/signin")  # its own CSRF token, from the sign-in form
    csrf = anonymous.get_attribute("input[name=csrf_token]", "value")
    not_signed_in = anonymous.evaluate(post, [job.run_key, csrf])

    assert no_csrf[0] == 403
    assert "CSRF token is missing or stale" in no_csrf[1]
    assert not_signed_in[0] == 403
    assert "not authorized to cancel: sign in with the dashboard" in not_signed_in[1]
    assert harness.status(job.run_key) == "sleeping"
    anonymous.context.close()
