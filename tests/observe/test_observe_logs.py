"""Log records that name the run: ``run_key``, ``job_id``, ``task`` and, inside a step, ``step_key`` (C53)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest

from flexiq_plugins import DurableConfig, JobEnvelope, JobLogFilter, MemoryStepStore, RetryPolicy, current_job
from flexiq_plugins._attempt.decisions import Completed
from flexiq_plugins._steps.logfields import LIBRARY_LOGGERS
from flexiq_plugins.integration import AttemptDriver, JobInfo, no_current_job
from flexiq_plugins.testing import DurableRun

FIELDS = ("run_key", "job_id", "task", "step_key")


@pytest.fixture
def shop_records() -> Iterator[list[logging.LogRecord]]:
    """What the ``shop`` logger emits through a handler with a ``JobLogFilter``."""
    handler = logging.Handler()
    records: list[logging.LogRecord] = []
    handler.emit = records.append  # type: ignore[method-assign]
    handler.addFilter(JobLogFilter())
    shop = logging.getLogger("shop")
    shop.addHandler(handler)
    shop.setLevel(logging.INFO)
    yield records
    shop.removeHandler(handler)


def flaky() -> None:
    """A step that fails once with a budget: the library logs the failure and the next attempt's delay."""
    calls = {"n": 0}

    def charge() -> str:
        calls["n"] += 1
        logging.getLogger("shop").info("charging")
        if calls["n"] == 1:
            raise ValueError("card declined")
        return "ok"

    current_job.step.run("charge", charge, retry=RetryPolicy(max_attempts=2, initial_delay=1))


def test_c53_the_librarys_records_name_the_run_job_and_task(caplog: pytest.LogCaptureFixture) -> None:
    """A warning the library logs during an attempt carries the run key, job id and task as attributes (C53)."""
    run = DurableRun(flaky, run_key="run-logs", task_name="shop.charge")
    with caplog.at_level(logging.INFO):
        assert run.attempt().step_retrying
    (record,) = [r for r in caplog.records if r.name == "flexiq_plugins" and "failed (attempt 1 of 2)" in r.message]
    assert (record.run_key, record.task) == ("run-logs", "shop.charge")  # type: ignore[attr-defined]
    assert record.job_id.startswith("job-")  # type: ignore[attr-defined]


def test_c53_a_job_log_filter_names_the_step_on_a_users_record(shop_records: list[logging.LogRecord]) -> None:
    """``JobLogFilter`` on the user's handler gives a record logged inside a step body its ``step_key`` too (C53)."""
    DurableRun(flaky, run_key="run-user-logs", task_name="shop.charge").attempt()
    (record,) = shop_records
    assert [getattr(record, f) for f in ("run_key", "task", "step_key")] == ["run-user-logs", "shop.charge", "charge#0"]


def test_c53_outside_a_job_the_fields_are_none_and_extra_wins() -> None:
    """Outside a job the four fields are ``None``; a value passed with ``extra=`` is kept (C53)."""
    record = logging.LogRecord("flexiq_plugins", logging.INFO, __file__, 1, "sweep", (), None)
    assert JobLogFilter().filter(record)
    assert [getattr(record, f) for f in FIELDS] == [None, None, None, None]
    given = logging.LogRecord("flexiq_plugins", logging.INFO, __file__, 1, "x", (), None)
    given.run_key = "mine"
    JobLogFilter().filter(given)
    assert given.run_key == "mine"


def test_c53_a_json_log_line_carries_the_fields(caplog: pytest.LogCaptureFixture) -> None:
    """A JSON formatter over the record's attributes writes the fields, as the docs show (C53)."""
    run = DurableRun(flaky, run_key="run-json", task_name="shop.charge")
    with caplog.at_level(logging.WARNING, logger="flexiq_plugins"):
        run.attempt()
    record = next(r for r in caplog.records if r.name == "flexiq_plugins")
    line = json.dumps(
        {"level": record.levelname, "message": record.getMessage(), **{f: getattr(record, f) for f in FIELDS}}
    )
    assert json.loads(line)["run_key"] == "run-json"


def test_c53_every_library_logger_has_the_filter() -> None:
    """Each logger name the library logs to (``logging.getLogger("...")`` in its sources) has a ``JobLogFilter``."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    names = set()
    for package in ("flexiq_plugins", "celery_ext", "dramatiq_ext"):
        for path in (root / package).rglob("*.py"):
            names |= set(
                re.findall(r'getLogger\("((?:flexiq_plugins|dramatiq_ext|celery_ext)[^"]*)"\)', path.read_text())
            )
    assert names
    assert names <= set(LIBRARY_LOGGERS)
    for name in LIBRARY_LOGGERS:
        assert any(isinstance(f, JobLogFilter) for f in logging.getLogger(name).filters), name


def _job(run_key: str, job_id: str, task: str, *, lazy: bool) -> JobInfo:
    return JobInfo(run_key, job_id, JobEnvelope(task, "test"), lazy=lazy, task_name=task)


def test_c53_a_job_run_inside_another_jobs_body_names_itself(shop_records: list[logging.LogRecord]) -> None:
    """C53: a first delivery run inside another job's attempt (Celery's ``inner.apply()`` in a task body) names the
    inner job on its body's records, and the outer job again after it."""
    driver = AttemptDriver(MemoryStepStore(), DurableConfig())

    def inner() -> str:
        logging.getLogger("shop").info("inner")
        return "in"

    def outer() -> None:
        logging.getLogger("shop").info("outer")
        driver.run_job(_job("run-inner", "job-inner", "inner", lazy=True), inner)
        logging.getLogger("shop").info("outer again")

    assert isinstance(driver.run_job(_job("run-outer", "job-outer", "outer", lazy=False), outer), Completed)
    assert [(r.getMessage(), r.run_key, r.job_id, r.task) for r in shop_records] == [  # type: ignore[attr-defined]
        ("outer", "run-outer", "job-outer", "outer"),
        ("inner", "run-inner", "job-inner", "inner"),
        ("outer again", "run-outer", "job-outer", "outer"),
    ]


def test_c53_a_task_called_directly_in_a_first_delivery_logs_under_the_job_that_runs_it(
    shop_records: list[logging.LogRecord],
) -> None:
    """C53: inside a durable task called as a plain function (no ``current_job`` of its own) the records still name
    the job being handled, whose body calls it."""
    driver = AttemptDriver(MemoryStepStore(), DurableConfig())

    def body() -> None:
        with no_current_job("called_directly"):
            logging.getLogger("shop").info("direct")

    driver.run_job(_job("run-1", "job-1", "outer", lazy=True), body)
    (record,) = shop_records
    assert (record.run_key, record.job_id, record.task) == ("run-1", "job-1", "outer")  # type: ignore[attr-defined]
