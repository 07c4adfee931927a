"""Without the OpenTelemetry API the package imports and runs unchanged (C53).

The check runs in a fresh interpreter whose import system refuses every
``opentelemetry`` module, as if the ``[otel]`` extra were not installed.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import sys
    from importlib.abc import MetaPathFinder

    class NoOpenTelemetry(MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "opentelemetry" or name.startswith("opentelemetry."):
                raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
            return None

    sys.meta_path.insert(0, NoOpenTelemetry())

    import celery_ext, dramatiq_ext, flexiq_plugins
    from flexiq_plugins import DurableConfig, current_job
    from flexiq_plugins._observe import observer_for, publishing_trace
    from flexiq_plugins.testing import DurableRun

    def checkout(order):
        step = current_job.step
        charge = step.run("charge", lambda: "ch-" + order)
        step.sleep("1h")
        step.run("receipt", lambda: "receipt for " + charge)
        return step.run("notify", lambda: "sent")

    run = DurableRun(checkout, "A-1")
    assert run.driver.observer is None
    assert observer_for(DurableConfig()) is None
    assert publishing_trace(DurableConfig()) is None
    assert run.attempt().sleeping
    run.clock.advance("1h")
    result = run.attempt()
    assert result.completed and result.value == "sent", result
    assert not any(m == "opentelemetry" or m.startswith("opentelemetry.") for m in sys.modules)
    print("ran without opentelemetry")
    """
)


def test_c53_the_package_imports_and_runs_without_the_opentelemetry_api() -> None:
    """With ``opentelemetry`` unimportable, the core and both adapters import, a run with steps and a sleep
    completes, and no observer is made (C53)."""
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ran without opentelemetry"
