"""The public face of the core: exactly these names, and no framework import.

The list below is the exported API; changing it is a deliberate act that
changes this test too (and the CHANGELOG). The root is a task author's and an
operator's face; an adapter author's names are in ``flexiq_plugins.integration``
and every error is in ``flexiq_plugins.errors``. The core must stay
framework-agnostic: importing it must not pull in Celery, Dramatiq or kombu,
not even through ``flexiq_plugins.integration``.
"""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import flexiq_plugins
from flexiq_plugins import NoCurrentJob, current_job

EXPORTED = [
    "AttemptStore",
    "CancellationPolicy",
    "CodecChain",
    "Compensation",
    "ConfigurationError",
    "DeadLetterRecord",
    "DeadLettered",
    "DurableConfig",
    "FernetCodec",
    "FlexiqError",
    "FunctionSerializer",
    "InvalidEvent",
    "InvalidForkStep",
    "InvalidRunKey",
    "JobCancelled",
    "JobContext",
    "JobEnded",
    "JobEnvelope",
    "JobLogFilter",
    "JsonSerializer",
    "KnownTask",
    "Limits",
    "MemoryStepStore",
    "NoCurrentJob",
    "NonRetryableError",
    "OperatorStore",
    "OutcomeNotKept",
    "ReplayedError",
    "RetryPolicy",
    "RunRecord",
    "SqlStepStore",
    "StepAttempt",
    "StepContext",
    "StepDivergence",
    "StepMapFailed",
    "StepRetryExhausted",
    "StepRow",
    "StepStore",
    "StoreError",
    "StoreUnavailable",
    "UnknownRun",
    "UnknownStep",
    "UnsupportedInEagerMode",
    "ZlibCodec",
    "__version__",
    "cancel_run",
    "current_job",
    "new_run_key",
    "open_store",
    "parse_duration",
    "send_event",
    "upgrade_store",
]
"""The package root's names, sorted: what a task author or an operator calls, configures or catches."""

NOT_AT_THE_ROOT = {
    "flexiq_plugins.integration": ["Attempt", "AttemptDriver", "JobInfo", "Decision", "CancelResult"],
    "flexiq_plugins.errors": ["ClaimLost", "SleepSignal", "StepSignal", "StepUsageError", "WorkerInterrupted"],
}
"""Names that moved off the root to the face they belong to (a sample of each)."""


def test_public_api_all_is_the_explicit_list():
    """``flexiq_plugins.__all__`` is exactly the documented names (grouped by who uses them), each once."""
    assert sorted(flexiq_plugins.__all__) == EXPORTED
    assert len(set(flexiq_plugins.__all__)) == len(flexiq_plugins.__all__)
    assert sorted(EXPORTED) == EXPORTED


@pytest.mark.parametrize(("face", "name"), [(face, name) for face, names in NOT_AT_THE_ROOT.items() for name in names])
def test_public_api_adapter_and_internal_names_live_in_their_face_not_the_root(face, name):
    """An adapter author's names are ``flexiq_plugins.integration``'s and the other errors
    ``flexiq_plugins.errors``'s: importable there, absent from the root."""
    assert name in importlib.import_module(face).__all__
    assert not hasattr(flexiq_plugins, name)


@pytest.mark.parametrize("name", EXPORTED)
def test_public_api_every_name_is_importable(name):
    """Every exported name resolves on a fresh import of the package."""
    module = importlib.import_module("flexiq_plugins")
    assert getattr(module, name) is not None


def test_public_api_core_never_imports_a_framework():
    """Importing the core (and using the memory store) loads no celery, dramatiq or kombu module."""
    code = (
        "import flexiq_plugins, sys\n"
        "from flexiq_plugins import MemoryStepStore\n"
        "from flexiq_plugins.integration import AttemptDriver\n"
        "AttemptDriver(MemoryStepStore())\n"
        "bad = sorted(m for m in sys.modules if m.startswith(('celery', 'dramatiq', 'kombu')))\n"
        "assert not bad, bad\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


def test_public_api_run_keys_are_uuid7_strings():
    """``new_run_key`` mints a UUIDv7 string, time-ordered (the run key of C10/C11)."""
    import uuid

    first, second = flexiq_plugins.new_run_key(), flexiq_plugins.new_run_key()
    assert uuid.UUID(first).version == 7
    assert first != second
    assert first[:8] <= second[:8]


def test_public_api_current_job_outside_a_job_raises_no_current_job():
    """Outside a durable job ``current_job`` is falsy and its attributes raise ``NoCurrentJob``."""
    assert not current_job
    assert current_job.get() is None
    with pytest.raises(NoCurrentJob, match=r"celery_ext\.install"):
        _ = current_job.step
