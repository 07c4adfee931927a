"""Who may act on the dashboard, and how a forged request is refused (C52), in process.

Every ``POST`` is checked in one order: a read-only dashboard refuses it;
then a request without this browser's CSRF token is refused; then one that
is not authorized (no token, or the host's ``authorize`` says no). Only then
does the action run, through the operations the ``flexiq`` command calls.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from starlette.requests import Request

from flexiq_plugins import ConfigurationError, SqlStepStore
from flexiq_plugins.cli import cli
from flexiq_plugins.dashboard import create_app
from tests.dashboard.conftest import Runs

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

ACTIONS = [
    "/actions/retry/1",
    "/actions/purge/1",
    "/actions/cancel/run-nap",
    "/actions/fork/run-nap",
    "/actions/send-event",
    "/actions/recover",
    "/actions/bulk/cancel",
]


@pytest.fixture
def store(tmp_path: Path) -> SqlStepStore:
    """A SQLite store with a sleeping run ``run-nap`` and a dead letter (id 1)."""
    sql = SqlStepStore(f"sqlite:///{tmp_path / 'steps.db'}")
    runs = Runs(sql)
    runs.sleeping("run-nap")
    runs.dead("run-dead")
    return sql


def _csrf(c: TestClient, url: str = "/signin") -> str:
    """The CSRF token of the client's browser, read from a form."""
    found = re.search(r'name="csrf_token" value="([^"]+)"', c.get(url).text)
    assert found is not None
    return found.group(1)


@pytest.mark.parametrize("url", ACTIONS)
def test_c52_a_read_only_dashboard_refuses_every_action_and_renders_none(store: SqlStepStore, url: str) -> None:
    """C52: read-only (the default): every POST is refused with 403; no page holds an action form."""
    c = TestClient(create_app(store))

    refused = c.post(url, data={"reason": "x", "topic": "t", "key": "k"})

    assert refused.status_code == 403
    assert "read-only" in refused.text
    assert store.get_run("run-nap").status == "sleeping"
    for page in ("/", "/runs/run-nap", "/dead-letters/1", "/events"):
        assert 'method="post"' not in c.get(page).text


@pytest.mark.parametrize("url", ACTIONS)
def test_c52_an_action_without_the_csrf_token_is_refused(store: SqlStepStore, url: str) -> None:
    """C52: even with the token, a POST without (or with another browser's) CSRF token is refused."""
    c = TestClient(create_app(store, read_only=False, token="tok"), headers={"Authorization": "Bearer tok"})
    other = TestClient(create_app(store, read_only=False, token="tok"))

    missing = c.post(url, data={"reason": "x"})
    foreign = c.post(url, data={"csrf_token": _csrf(other), "reason": "x"})

    assert missing.status_code == 403
    assert foreign.status_code == 403
    assert "CSRF token is missing or stale" in missing.text
    assert store.get_run("run-nap").status == "sleeping"


def test_c52_an_action_needs_the_token(store: SqlStepStore) -> None:
    """C52: with the CSRF token but neither the session nor the Bearer token, a cancel is refused; with it, done."""
    c = TestClient(create_app(store, read_only=False, token="tok"))
    csrf = _csrf(c)

    anonymous = c.post("/actions/cancel/run-nap", data={"csrf_token": csrf})
    wrong = c.post("/signin", data={"csrf_token": csrf, "token": "guess"})
    assert store.get_run("run-nap").status == "sleeping"
    signed_in = c.post("/signin", data={"csrf_token": csrf, "token": "tok"}, follow_redirects=False)
    done = c.post("/actions/cancel/run-nap", data={"csrf_token": csrf, "reason": "by test"})

    assert anonymous.status_code == 403
    assert wrong.status_code == 403
    assert signed_in.status_code == 303
    assert "tok" not in signed_in.headers["set-cookie"].split(";")[0].split("=", 1)[1]
    assert done.status_code == 200
    assert store.get_run("run-nap").status == "cancelled"


def test_c52_the_host_application_authorizes_each_action(store: SqlStepStore) -> None:
    """C52: with ``authorize``, the host decides per action: here cancel yes, purge no."""
    asked: list[str] = []

    def authorize(request: Request, action: str) -> bool:
        asked.append(action)
        return action == "cancel"

    c = TestClient(create_app(store, read_only=False, authorize=authorize))
    csrf = _csrf(c, "/runs/run-nap")

    purged = c.post("/actions/purge/1", data={"csrf_token": csrf})
    cancelled = c.post("/actions/cancel/run-nap", data={"csrf_token": csrf})

    assert asked == ["purge", "cancel"]
    assert purged.status_code == 403
    assert store.get_dead_letter(1) is not None
    assert cancelled.status_code == 200
    assert store.get_run("run-nap").status == "cancelled"


def test_c50_c52_fork_offers_the_forkable_steps_and_refuses_a_bad_step_or_a_missing_publisher(
    store: SqlStepStore,
) -> None:
    """C50, C52: the run page's fork form lists the steps a run can be forked from; an unknown step is 404
    naming them, a fork without a publisher for the run's framework is 409; neither writes a run."""
    c = TestClient(create_app(store, read_only=False, token="tok"), headers={"Authorization": "Bearer tok"})
    page = c.get("/runs/run-nap").text
    csrf = _csrf(c, "/runs/run-nap")

    unknown = c.post("/actions/fork/run-nap", data={"csrf_token": csrf, "from_step": "refund#0"})
    unpublished = c.post("/actions/fork/run-nap", data={"csrf_token": csrf, "from_step": "sleep#0"})

    assert re.findall(r'<option value="([^"]+)">', page.split('id="fork-from"')[1].split("</select>")[0]) == [
        "charge#0",
        "sleep#0",
    ]
    assert unknown.status_code == 404
    assert "fork it from one of: charge#0, sleep#0" in unknown.text
    assert unpublished.status_code == 409
    assert "No publisher" in unpublished.text
    assert sorted(run.run_key for run in store.list_runs(limit=10)) == ["run-dead", "run-nap"]


def test_c52_actions_without_any_authorization_are_refused_at_construction(store: SqlStepStore) -> None:
    """C52: ``read_only=False`` with neither a token nor ``authorize`` is a configuration error, not an open door."""
    with pytest.raises(ConfigurationError, match="need authorization"):
        create_app(store, read_only=False)


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--allow-actions"], {}, "--allow-actions needs --token-env VAR"),
        (["--allow-actions", "--token-env", "FQ_EMPTY"], {"FQ_EMPTY": ""}, "FQ_EMPTY is not set or empty"),
    ],
)
def test_c52_flexiq_dashboard_refuses_actions_without_a_token(
    store: SqlStepStore, args: list[str], env: dict[str, Any], message: str
) -> None:
    """C52: ``flexiq dashboard --allow-actions`` needs a non-empty token from ``--token-env`` (usage error, exit 2)."""
    result = CliRunner().invoke(cli, ["--store", str(store.url), "dashboard", *args], env=env)

    assert result.exit_code == 2
    assert message in result.output
