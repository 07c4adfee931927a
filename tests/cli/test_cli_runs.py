"""``flexiq runs list|show``: tables for people, stable JSON for scripts, values only on request."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest
from cli_support import Runs
from click.testing import CliRunner, Result

from flexiq_plugins import current_job
from flexiq_plugins._store.sql import SqlStepStore
from flexiq_plugins.cli import cli

RUN_KEYS = {
    "run_key", "task_name", "framework", "queue", "status", "attempt", "owner", "lease_until",
    "takeovers", "job_id", "step_count", "step_bytes", "created_at", "updated_at", "wake_at", "recovered_at",
    "wait_topic", "wait_key", "cancel_reason",
}  # fmt: skip
STEP_KEYS = {
    "position", "step_key", "kind", "size", "attempt", "committed_at", "wake_at", "failure", "compensate", "event_id"
}  # fmt: skip
ATTEMPT_KEYS = {"step_key", "number", "run_attempt", "ended", "error_type", "started_at", "failed_at", "retry_at"}


def line_of(output: str, needle: str) -> list[str]:
    """The whitespace-separated cells of the one output line containing ``needle``."""
    (line,) = [ln for ln in output.splitlines() if needle in ln]
    return line.split()


def test_runs_list_prints_a_table_newest_first(runs: Runs, flexiq: Callable[..., Result]) -> None:
    """``runs list`` prints a header and one row per run: key, task, framework, status, attempt, steps, bytes."""
    runs.succeeded("run-ok", task="shop.invoice")
    runs.sleeping("run-zz")
    result = flexiq("runs", "list")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split()[:8] == ["RUN", "KEY", "TASK", "FRAMEWORK", "STATUS", "ATTEMPT", "STEPS", "BYTES"]
    assert line_of(result.stdout, "run-zz")[:7] == ["run-zz", "shop.checkout", "celery", "sleeping", "1", "2", "36"]
    assert line_of(result.stdout, "run-ok")[:4] == ["run-ok", "shop.invoice", "celery", "succeeded"]
    assert result.stdout.index("run-zz") < result.stdout.index("run-ok")


def test_runs_list_json_has_stable_keys_and_filters(runs: Runs, flexiq: Callable[..., Result]) -> None:
    """``--json`` gives exactly the documented keys; ``--status``, ``--task`` and ``--since`` filter."""
    runs.succeeded("run-a", task="shop.invoice")
    runs.sleeping("run-b")
    rows = json.loads(flexiq("runs", "list", "--json").stdout)
    assert [set(r) for r in rows] == [RUN_KEYS, RUN_KEYS]
    assert rows[0]["run_key"] == "run-b"
    assert rows[0]["lease_until"] is None
    assert rows[0]["created_at"].endswith("+00:00")
    by_status = json.loads(flexiq("runs", "list", "--status", "sleeping", "--json").stdout)
    assert [r["run_key"] for r in by_status] == ["run-b"]
    by_task = json.loads(flexiq("runs", "list", "--task", "shop.invoice", "--json").stdout)
    assert [r["run_key"] for r in by_task] == ["run-a"]
    time.sleep(0.3)
    runs.succeeded("run-c")
    recent = json.loads(flexiq("runs", "list", "--since", "200ms", "--json").stdout)
    assert [r["run_key"] for r in recent] == ["run-c"]


def test_runs_show_gives_a_finished_run_no_wake_time(runs: Runs, flexiq: Callable[..., Result]) -> None:
    """A run that slept, woke and succeeded shows ``Wake at: -``; its kept sleep step still shows its own wake time."""

    def body() -> int:
        step = current_job.step
        step.run("charge", lambda: 1)
        step.sleep("10ms")
        return int(step.run("receipt", lambda: 2))

    store = runs.store
    for _ in range(5):
        runs.attempt("run-woke", body)
        if store.get_run("run-woke").status == "succeeded":
            break
        wake = max(s.wake_at or 0.0 for s in store.get_steps("run-woke") if s.kind == "sleep")
        while store.now() < wake:  # the store's clock, which decides the wake (C23)
            time.sleep(0.005)
    assert store.get_run("run-woke").status == "succeeded"
    result = flexiq("runs", "show", "run-woke")
    assert result.exit_code == 0, result.output
    assert line_of(result.stdout, "Wake at:") == ["Wake", "at:", "-"]
    assert line_of(result.stdout, "sleep#0").count("UTC") == 2  # committed at and wake at


def test_runs_show_prints_state_claim_and_steps_without_values(runs: Runs, flexiq: Callable[..., Result]) -> None:
    """``runs show`` lists each step's key, kind, size, commit and wake time, and never a value by default."""
    runs.sleeping("run-s")
    result = flexiq("runs", "show", "run-s")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert line_of(out, "Status:") == ["Status:", "sleeping"]
    assert line_of(out, "Attempts:") == ["Attempts:", "1"]
    assert line_of(out, "Claim:") == ["Claim:", "none"]
    assert line_of(out, "Steps:") == ["Steps:", "2", "(36", "bytes)"]
    assert "UTC" in " ".join(line_of(out, "Wake at:"))
    assert line_of(out, "STEP KEY")[:6] == ["#", "STEP", "KEY", "KIND", "SIZE", "COMMITTED"]
    assert "VALUE" not in out
    assert line_of(out, "charge#0")[:4] == ["0", "charge#0", "run", "36"]
    sleep_row = line_of(out, "sleep#0")
    assert sleep_row[:4] == ["1", "sleep#0", "sleep", "0"]
    assert sleep_row.count("UTC") == 2  # committed at and wake at
    assert "ch_1" not in out


def test_runs_show_values_decodes_on_request(runs: Runs, flexiq: Callable[..., Result]) -> None:
    """``--values`` decodes values with the JSON reader; the JSON shape gains ``value`` and ``value_note``."""
    runs.sleeping("run-v")
    table = flexiq("runs", "show", "run-v", "--values").stdout
    assert "{'id': 'ch_1', 'amount': 1200}" in " ".join(line_of(table, "charge#0"))
    data = json.loads(flexiq("runs", "show", "run-v", "--values", "--json").stdout)
    assert set(data) == {"run", "steps", "attempts"}
    assert set(data["run"]) == RUN_KEYS
    charge, sleep = data["steps"]
    assert set(charge) == STEP_KEYS | {"value", "value_note"}
    assert (charge["value"], charge["value_note"]) == ({"id": "ch_1", "amount": 1200}, None)
    assert sleep["value"] is None
    assert data["run"]["wake_at"] == sleep["wake_at"]
    plain = json.loads(flexiq("runs", "show", "run-v", "--json").stdout)
    assert {k for s in plain["steps"] for k in s} == STEP_KEYS


def test_c51_runs_show_lists_a_step_maps_entry_and_its_items(runs: Runs, flexiq: Callable[..., Result]) -> None:
    """A step map shows as its entry ``price#0`` (kind ``map``, no value: a note says its items hold the values)
    followed by one ``run`` row per item, each with its decoded value (C51)."""
    runs.attempt("run-m", lambda: current_job.step.map("price", lambda sku: {"sku": sku}, ["a", "b"], key=str))
    table = flexiq("runs", "show", "run-m", "--values").stdout
    assert line_of(table, "price#0")[:4] == ["0", "price#0", "map", "0"]
    assert "{'sku': 'a'}" in " ".join(line_of(table, "price:a"))
    data = json.loads(flexiq("runs", "show", "run-m", "--values", "--json").stdout)
    entry, *items = data["steps"]
    assert (entry["kind"], entry["value"]) == ("map", None)
    assert entry["value_note"] == "no value (a step map's entry: its items hold the values)"
    assert sorted((s["step_key"], s["kind"], s["value"]["sku"]) for s in items) == [
        ("price:a", "run", "a"),
        ("price:b", "run", "b"),
    ]


def test_c7_a_framework_serialized_value_decodes_or_gets_a_note(
    runs: Runs, store: SqlStepStore, flexiq: Callable[..., Result]
) -> None:
    """Values a framework serializer stored: JSON-family ones decode; others (pickle) get a note, no traceback (C7)."""
    from flexiq_plugins import CodecChain, DurableConfig, FunctionSerializer, current_job
    from flexiq_plugins.integration import AttemptDriver

    for name, dumps in [
        ("dramatiq:json", lambda v: json.dumps({"v": v}).encode()),
        ("kombu:pickle", lambda v: b"\x80\x04not-unpickled"),
    ]:
        chain = CodecChain(FunctionSerializer(name, dumps, lambda b: json.loads(b)["v"] if b[:1] == b"{" else 0))
        driver = AttemptDriver(
            store, DurableConfig(serializer=chain.serializer, codecs=chain.codecs, keep_succeeded_steps=True)
        )
        runs.driver = driver
        runs.attempt(f"run-{name}", lambda: current_job.step.run("charge", lambda: {"id": "ch_9"}))
    ok = json.loads(flexiq("runs", "show", "run-dramatiq:json", "--values", "--json").stdout)
    assert ok["steps"][0]["value"] == {"id": "ch_9"}
    result = flexiq("runs", "show", "run-kombu:pickle", "--values")
    assert result.exit_code == 0, result.output
    assert "stored by 'kombu:pickle'; pass --codec to decode it" in result.stdout
    assert "Traceback" not in result.output


def test_c30_unknown_run_key_exits_3_without_traceback(flexiq: Callable[..., Result], runs: Runs) -> None:
    """An unknown run key is one ``Error:`` line on stderr and exit code 3."""
    runs.succeeded("run-known")
    result = flexiq("runs", "show", "no-such-run")
    assert result.exit_code == 3
    assert result.stderr.startswith("Error: no run has the run key 'no-such-run', nor a current job with that id")
    assert len(result.stderr.strip().splitlines()) == 1
    assert result.stdout == ""


def test_usage_errors_exit_2(flexiq: Callable[..., Result], runs: Runs) -> None:
    """A bad duration or status is a usage error: exit 2 with the accepted forms."""
    runs.succeeded("run-known")
    bad_since = flexiq("runs", "list", "--since", "5 parsecs")
    assert bad_since.exit_code == 2
    assert "is not a duration" in bad_since.stderr
    assert flexiq("runs", "list", "--status", "asleep").exit_code == 2


def test_unreachable_store_exits_1_with_a_message() -> None:
    """A store that refuses connections (a closed port) is ``Error: … unavailable`` and exit 1, no traceback."""
    result = CliRunner().invoke(cli, ["--store", "postgresql://postgres@127.0.0.1:9/none", "runs", "list"])
    assert result.exit_code == 1
    assert "is unavailable" in result.stderr
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


@pytest.mark.postgres
def test_c41_a_store_that_refuses_its_configuration_exits_1_not_2(require_service: Callable[..., None]) -> None:
    """A database that does not exist (``StoreMisconfigured``, also a ``ConfigurationError``) is exit 1, as a
    store that cannot be used; 2 is for the command line's own mistakes."""
    require_service("PostgreSQL", "127.0.0.1", 5432)
    url = "postgresql://postgres@127.0.0.1:5432/flexiq_no_such_database"
    result = CliRunner().invoke(cli, ["--store", url, "runs", "list"])
    assert result.exit_code == 1, result.output
    assert 'cannot be used: connection failed: connection to server at "127.0.0.1"' in result.stderr
    assert 'database "flexiq_no_such_database" does not exist' in result.stderr
    assert "Traceback" not in result.output


def test_a_store_without_tables_says_to_upgrade(tmp_path: object) -> None:
    """A database without tables is exit 1 with the hint ``flexiq store upgrade``; the CLI never migrates."""
    url = f"sqlite:///{tmp_path}/empty.db"
    result = CliRunner().invoke(cli, ["--store", url, "runs", "list"])
    assert result.exit_code == 1
    assert "flexiq store upgrade" in result.stderr


def test_store_url_comes_from_the_environment(store_url: str, runs: Runs) -> None:
    """Without ``--store`` the CLI reads ``FLEXIQ_STORE_URL``."""
    runs.succeeded("run-env")
    result = CliRunner(env={"FLEXIQ_STORE_URL": store_url}).invoke(cli, ["runs", "list", "--json"])
    assert [r["run_key"] for r in json.loads(result.stdout)] == ["run-env"]


def test_a_wake_time_beyond_year_9999_is_shown_as_seconds(tmp_path) -> None:
    """A stored wake time no datetime can show (a ``timedelta.max`` sleep, written before sleeps were capped
    at 366 days) is printed as seconds."""
    from datetime import timedelta

    from click.testing import CliRunner

    from flexiq_plugins import JobEnvelope, SqlStepStore, StepRow
    from flexiq_plugins.cli import cli

    url = f"sqlite:///{tmp_path / 'far.db'}"
    store = SqlStepStore(url)
    begun = store.begin("r-forever", "j", JobEnvelope("t", "test"), "w", 30.0)
    wake_at = store.now() + timedelta.max.total_seconds()
    store.commit_step(begun.claim, StepRow(0, "sleep#0", "sleep", None, wake_at))  # type: ignore[union-attr]
    store.finish(begun.claim, "sleeping")  # type: ignore[union-attr]
    shown = CliRunner().invoke(cli, ["--store", url, "runs", "show", "r-forever"])
    assert shown.exit_code == 0, shown.output
    assert "seconds since the epoch" in shown.output
    as_json = CliRunner().invoke(cli, ["--store", url, "runs", "show", "r-forever", "--json"])
    assert as_json.exit_code == 0, as_json.output


def compensated_run(runs: Runs, run_key: str) -> None:
    """A run whose ``ship`` step spent its budget of 2 (the card number in the error message), then was compensated."""
    from flexiq_plugins import RetryPolicy, current_job

    def body() -> None:
        step = current_job.step
        step.run("charge", lambda: {"id": "ch_1"}, compensate=lambda charge: None)

        def ship() -> None:
            raise ConnectionError("carrier down for card 4242")

        step.run("ship", ship, retry=RetryPolicy(max_attempts=2, initial_delay=0))

    runs.attempt(run_key, body)
    runs.attempt(run_key, body, job_id=f"job-{run_key}-2")


def test_c31_runs_show_lists_step_attempts_and_errors_only_on_request(
    runs: Runs, flexiq: Callable[..., Result]
) -> None:
    """``runs show`` lists each step attempt (number, how it ended, error type, times) and notes the failed step,
    its undo and the compensation; messages and tracebacks appear only with ``--errors`` (C31, C32)."""
    compensated_run(runs, "run-f")
    out = flexiq("runs", "show", "run-f").stdout
    assert line_of(out, "Status:") == ["Status:", "compensated"]
    assert line_of(out, "COMMITTED AT")[-1] == "NOTE"
    steps = {cells[1]: " ".join(cells[2:]) for cells in (ln.split() for ln in out.splitlines()) if cells[:1] != []}
    assert steps["charge#0"].endswith("undo: compensated_run.<locals>.body.<locals>.<lambda>")
    assert steps["ship#0"].endswith("failed for good: step_retry_exhausted (ConnectionError, 2 attempts)")
    assert "compensating: step_retry_exhausted" in steps["compensation:start"]
    assert "Step attempts:" in out
    attempts = [ln.split() for ln in out.split("Step attempts:")[1].splitlines()[2:]]
    assert [cells[:5] for cells in attempts] == [
        ["ship#0", "1", "1", "failed", "ConnectionError"],
        ["ship#0", "2", "2", "exhausted", "ConnectionError"],
        ["compensate:charge#0", "1", "2", "succeeded", "-"],
    ]
    assert "4242" not in out
    assert "Traceback" not in out

    shown = flexiq("runs", "show", "run-f", "--errors").stdout
    assert "carrier down for card 4242" in shown
    assert "Traceback (most recent call last)" in shown


def test_c31_runs_show_json_has_attempts_with_stable_keys(runs: Runs, flexiq: Callable[..., Result]) -> None:
    """``--json`` adds ``attempts`` (documented keys) and each step's ``failure``/``compensate``; messages
    and tracebacks only with ``--errors`` (C31, C32)."""
    compensated_run(runs, "run-j")
    data = json.loads(flexiq("runs", "show", "run-j", "--json").stdout)
    assert [set(a) for a in data["attempts"]] == [ATTEMPT_KEYS] * 3
    assert [(a["step_key"], a["number"], a["ended"]) for a in data["attempts"]] == [
        ("ship#0", 1, "failed"),
        ("ship#0", 2, "exhausted"),
        ("compensate:charge#0", 1, None),
    ]
    steps = {s["step_key"]: s for s in data["steps"]}
    assert steps["charge#0"]["compensate"] == "compensated_run.<locals>.body.<locals>.<lambda>"
    assert steps["ship#0"]["failure"] == {
        "reason": "step_retry_exhausted",
        "error_type": "ConnectionError",
        "attempts": 2,
    }
    assert steps["compensation:start"]["failure"]["origin"] == "dead_letter"
    assert "4242" not in json.dumps(data)
    with_errors = json.loads(flexiq("runs", "show", "run-j", "--json", "--errors").stdout)
    assert with_errors["attempts"][0]["message"] == "carrier down for card 4242"
    assert "ConnectionError" in with_errors["attempts"][0]["traceback"]
