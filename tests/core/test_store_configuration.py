"""A store that cannot be used: checked at configuration and worker start, never a job acked away (C28, C41).

The core decides for every adapter: :func:`check_store_spec` refuses a store
setting that can never work when the integration is configured;
:func:`check_store_at_start` stops a worker whose store refuses it for good
(one CRITICAL line, exit status 78) and lets it start through a mere outage;
a job that meets either is put back (a :class:`PutBack`), with a delay that
doubles while the outage lasts, up to ``store_retry_max_seconds``.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

from flexiq_plugins import (
    ConfigurationError,
    DurableConfig,
    JobEnvelope,
    MemoryStepStore,
    SqlStepStore,
    StoreUnavailable,
)
from flexiq_plugins._attempt import decisions
from flexiq_plugins.errors import StoreMisconfigured
from flexiq_plugins.integration import (
    EXIT_CONFIGURATION,
    AttemptDriver,
    JobInfo,
    check_store_at_start,
    check_store_spec,
    driver_or_put_back,
)

JOB = JobInfo("run-1", "job-1", JobEnvelope("task", "test"))

UNUSABLE_SETTINGS = [
    "postgresql//x",
    "mongodb://h/db",
    "",
    12345,
    "postgress://u@h/db",
    "mysql+mysqlconnector://root@h/db",
]  # a driver not installed


@pytest.mark.parametrize("spec", UNUSABLE_SETTINGS, ids=repr)
def test_c41_a_store_setting_that_can_never_work_is_refused_without_connecting(spec: object) -> None:
    """C41: an unknown scheme, a malformed URL, a non-URL value or a missing driver is a ``ConfigurationError``.

    The message names the value (or the missing package) so the typo is found
    where it was made, at configuration, never at the first job.
    """
    with pytest.raises(ConfigurationError) as info:
        check_store_spec(spec)  # type: ignore[arg-type]
    assert repr(spec) in str(info.value) or "needs the package" in str(info.value)


@pytest.mark.parametrize(
    "spec",
    [
        None,
        "memory://",
        "sqlite:///steps.db",
        "postgresql://u@127.0.0.1:9/db",
        "postgresql+psycopg2://u@127.0.0.1:9/db",
    ],
    ids=repr,
)
def test_c41_a_usable_store_setting_passes_without_connecting(spec: object) -> None:
    """C41: a setting resolved later (``None``), a memory store or a well-formed URL with its driver passes.

    Nothing connects: a server that is down (port 9) is not a configuration error. psycopg2, a driver the
    store runs on, is accepted when it is installed.
    """
    check_store_spec(spec)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("url", "module", "package"),
    [
        ("postgresql+psycopg2://u@127.0.0.1:9/db", "psycopg2", "the package psycopg2 (pip install psycopg2-binary"),
        ("postgresql://u@127.0.0.1:9/db", "psycopg", "the package psycopg (pip install 'flexiq-plugins[postgres]')"),
        ("mysql://u@127.0.0.1:9/db", "pymysql", "the package pymysql (pip install 'flexiq-plugins[mysql]')"),
    ],
    ids=["psycopg2", "psycopg", "pymysql"],
)
def test_c41_a_missing_driver_names_the_package_of_the_driver_the_url_chose(
    monkeypatch: pytest.MonkeyPatch, url: str, module: str, package: str
) -> None:
    """C41: a URL whose driver cannot be imported names that driver's package, never another driver's.

    ``postgresql+psycopg2://`` without psycopg2 says to install psycopg2, not psycopg 3 (extra 'postgres').
    """
    monkeypatch.setitem(sys.modules, module, None)  # makes ``import <module>`` fail, as when it is not installed
    with pytest.raises(ConfigurationError) as info:
        check_store_spec(url)
    message = str(info.value)
    assert f"needs {package}" in message
    assert f"for its driver {module!r}, which cannot be imported" in message


class RefusingStore(MemoryStepStore):
    """A memory store whose ``begin`` and ``now`` raise ``error`` while ``down``."""

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error
        self.down = True

    def now(self) -> float:
        if self.down:
            raise self.error
        return super().now()

    def begin(self, *args: object, **kwargs: object) -> decisions.Decision:  # type: ignore[override]
        if self.down:
            raise self.error
        return super().begin(*args, **kwargs)  # type: ignore[arg-type,return-value]


def test_c41_a_worker_refuses_to_start_on_a_store_that_refuses_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """C41: a SQLite store in a missing directory stops the worker: exit status 78 and one CRITICAL line.

    The line names the worker and the cause (the missing directory); nothing
    else is logged at ERROR or above.
    """
    missing = tmp_path / "missing"
    driver = AttemptDriver(SqlStepStore(f"sqlite:///{missing / 'steps.db'}"))
    with pytest.raises(SystemExit) as stopped:
        check_store_at_start(lambda: driver, worker="test worker")
    assert stopped.value.code == EXIT_CONFIGURATION == 78
    loud = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.levelno for r in loud] == [logging.CRITICAL]
    assert "test worker cannot start" in loud[0].getMessage()
    assert f"its directory {str(missing)!r} does not exist" in loud[0].getMessage()


def test_c41_a_worker_refuses_to_start_on_a_read_only_sqlite_store(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """C41: a SQLite URI opened read-only (``mode=ro&uri=true``) stops the worker at start, though the file
    exists and reads work: its jobs must write their steps. One CRITICAL line names ``mode=ro``."""
    path = tmp_path / "steps.db"
    SqlStepStore(f"sqlite:///{path}").now()  # an existing, up-to-date store
    driver = AttemptDriver(SqlStepStore(f"sqlite:///file:{path}?mode=ro&uri=true"))
    with pytest.raises(SystemExit) as stopped:
        check_store_at_start(lambda: driver, worker="test worker")
    assert stopped.value.code == EXIT_CONFIGURATION
    loud = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.levelno for r in loud] == [logging.CRITICAL]
    assert "test worker cannot start: " in loud[0].getMessage()
    assert "the URL opens it read-only (mode=ro), and workers write their steps to it" in loud[0].getMessage()


def test_c41_the_refusal_line_keeps_its_level_before_logging_is_set_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """C41: with no handler configured (Celery's ``worker_init`` comes before its logging setup) the line
    still says CRITICAL, on stderr, instead of Python's last-resort bare message."""
    monkeypatch.setattr(logging.getLogger("flexiq_plugins.integration"), "propagate", False)  # no handler above
    driver = AttemptDriver(SqlStepStore(f"sqlite:///{tmp_path / 'missing' / 'steps.db'}"))
    with pytest.raises(SystemExit) as stopped:
        check_store_at_start(lambda: driver, worker="test worker")
    assert stopped.value.code == EXIT_CONFIGURATION
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("CRITICAL:flexiq_plugins.integration:test worker cannot start: ")
    assert logging.getLogger("flexiq_plugins.integration").handlers == []  # nothing left behind


def test_c41_a_worker_refuses_to_start_on_a_setting_read_only_at_start(caplog: pytest.LogCaptureFixture) -> None:
    """C41: a store opened only at worker start (an environment setting) with an unknown scheme stops the worker."""

    def opens() -> AttemptDriver:
        raise ConfigurationError("cannot use 'postgress://x' as a step store")

    with pytest.raises(SystemExit) as stopped:
        check_store_at_start(opens, worker="test worker")
    assert stopped.value.code == EXIT_CONFIGURATION
    assert "postgress://x" in caplog.text


def test_c28_c41_a_worker_starts_through_a_store_outage_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    """C28, C41: a store that is only unreachable is no reason to stop: one WARNING, and the worker starts."""
    driver = AttemptDriver(RefusingStore(StoreUnavailable("connection refused")))
    check_store_at_start(lambda: driver, worker="test worker")
    assert [(r.levelno, "connection refused" in r.getMessage()) for r in caplog.records] == [(logging.WARNING, True)]


def test_c41_a_job_that_cannot_open_its_store_is_put_back(caplog: pytest.LogCaptureFixture) -> None:
    """C41: a job whose store cannot be opened goes back to the broker for ``store_retry_max_seconds``.

    It is a put-back, so no adapter acknowledges it away; the cause is logged at ERROR.
    """

    def opens() -> AttemptDriver:
        raise ConfigurationError("the step store needs the package psycopg")

    decision = driver_or_put_back(opens, DurableConfig(store_retry_max_seconds=42))
    assert decision == decisions.PutBack(
        decisions.PutBackReason.STORE_UNAVAILABLE, 42.0, "the step store needs the package psycopg"
    )
    assert [r.levelno for r in caplog.records] == [logging.ERROR]


def test_c28_c41_put_backs_for_a_store_outage_double_up_to_the_cap_and_are_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """C28, C41: consecutive outage put-backs wait 1, 2, 4, 5, 5 s; the wait starts again at 1 s after the outage.

    The outage is logged once at WARNING when it starts (each longer wait only
    at DEBUG), and the store's return once at INFO: a line per process per
    outage, not one per job.
    """
    caplog.set_level(logging.INFO, logger="flexiq_plugins")
    store = RefusingStore(StoreUnavailable("connection refused"))
    driver = AttemptDriver(store, DurableConfig(store_retry_seconds=1, store_retry_max_seconds=5))
    delays = []
    for _ in range(5):
        decision = driver.start(JOB)
        assert isinstance(decision, decisions.PutBack)
        delays.append(decision.delay)
    assert delays == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert "put back after 1 s, then up to 5 s" in caplog.records[0].getMessage()

    store.down = False
    assert not isinstance(driver.start(JOB.__class__("run-2", "job-2", JOB.envelope)), decisions.PutBack)
    assert caplog.records[-1].getMessage() == "step store reachable again"
    store.down = True
    again = driver.start(JOB)
    assert isinstance(again, decisions.PutBack)
    assert again.delay == 1.0


def test_c41_a_store_refusing_its_configuration_mid_run_puts_jobs_back_logged_as_errors(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """C41: a refusal met while running (a password rotated) is an outage that will not pass: put back, ERROR lines."""
    refusal = StoreMisconfigured(
        "the step store at postgresql://app@db/shop cannot be used: password authentication failed"
    )
    driver = AttemptDriver(RefusingStore(refusal))
    decision = driver.start(JOB)
    assert isinstance(decision, decisions.PutBack)
    assert decision.reason is decisions.PutBackReason.STORE_UNAVAILABLE
    assert [r.levelno for r in caplog.records] == [logging.ERROR]
    assert "password authentication failed" in caplog.text
