"""The public face of the core: exactly these names, and no framework import.

The list below is the exported API; changing it is a deliberate act that
changes this test too (and the CHANGELOG). The core must stay framework-agnostic:
importing it must not pull in Celery, Dramatiq or kombu.
"""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import flexiq_plugins
from flexiq_plugins import NoCurrentJob, current_job

EXPORTED = [
    "AlreadyRetried",
    "Attempt",
    "AttemptDriver",
    "AttemptStore",
    "CancelRequested",
    "CancellationPolicy",
    "CheckStopped",
    "ClaimLost",
    "ClaimRefused",
    "CodecChain",
    "CodecError",
    "Compensation",
    "CompensationFailed",
    "ConcurrentStep",
    "ConfigurationError",
    "CorruptRecord",
    "DeadLetterRecord",
    "DeadLettered",
    "DecodeError",
    "DuplicateStepKey",
    "DurableConfig",
    "EncodeError",
    "EventWaitSignal",
    "FernetCodec",
    "FlexiqError",
    "FunctionSerializer",
    "InvalidDuration",
    "InvalidEvent",
    "InvalidForkStep",
    "InvalidRunKey",
    "InvalidStepBody",
    "InvalidStepKey",
    "InvalidStepName",
    "InvalidStepOption",
    "InvalidTransaction",
    "InvalidWakeTime",
    "JobCancelled",
    "JobContext",
    "JobEnded",
    "JobEnvelope",
    "JobInfo",
    "JsonSerializer",
    "Limits",
    "MemoryStepStore",
    "NoCurrentJob",
    "NoPublisher",
    "NonRetryableError",
    "NotInStep",
    "OpenTransaction",
    "OperationError",
    "OperatorStore",
    "OutcomeNotKept",
    "PublishFailed",
    "ReplayStopped",
    "ReplayedError",
    "RetryPolicy",
    "RunCancelled",
    "RunCompensated",
    "RunLocked",
    "RunRecord",
    "SleepSignal",
    "SqlStepStore",
    "StepAttempt",
    "StepContext",
    "StepDivergence",
    "StepLimitExceeded",
    "StepRetryExhausted",
    "StepRetrySignal",
    "StepRow",
    "StepSignal",
    "StepStore",
    "StepUsageError",
    "StoreError",
    "StoreMisconfigured",
    "StoreUnavailable",
    "SwallowedStepSignal",
    "UnknownDeadLetter",
    "UnknownRun",
    "UnknownStep",
    "UnsupportedInEagerMode",
    "WorkerInterrupted",
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


def test_public_api_all_is_the_explicit_sorted_list():
    """``flexiq_plugins.__all__`` is exactly the documented names, sorted."""
    assert flexiq_plugins.__all__ == EXPORTED
    assert sorted(EXPORTED) == EXPORTED


@pytest.mark.parametrize("name", EXPORTED)
def test_public_api_every_name_is_importable(name):
    """Every exported name resolves on a fresh import of the package."""
    module = importlib.import_module("flexiq_plugins")
    assert getattr(module, name) is not None


def test_public_api_core_never_imports_a_framework():
    """Importing the core (and using the memory store) loads no celery, dramatiq or kombu module."""
    code = (
        "import flexiq_plugins, sys\n"
        "from flexiq_plugins import AttemptDriver, MemoryStepStore\n"
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
