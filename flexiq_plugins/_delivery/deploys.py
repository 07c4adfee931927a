"""Deploying without draining: check the runs in flight against new code, export them for CI (C48, C49).

[`check_runs`][flexiq_plugins.operations.check_runs] reads every unfinished run that has recorded
steps (queued again, pending, running, sleeping, waiting, retrying, and dead
letters that could be retried) from a store, or from a file
[`export_runs`][flexiq_plugins.operations.export_runs] wrote, and runs the new body of its task in
check mode over its record (`flexiq_plugins._attempt.check`). A dead-lettered
run is checked as its retry would replay it: without the step that failed for
good and the later ones (C30, C31). The report groups the runs by task and by
the first position where the new code parts from their record, and says for
each ``step.patched`` id how many runs are on its old branch.

An export file is JSON: for each run its key, task, framework, status, job
id, last attempt, job envelope, and its step rows with values base64-encoded
exactly as stored (encrypted values stay encrypted).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from .._attempt.check import RecordedRun, RunCheck, check_run
from .._model.codec import CodecChain
from .._model.config import DurableConfig, Limits
from .._model.records import JobEnvelope, RunRecord, StepRow
from .._store.operator_side import OperatorStore
from .._store.step_attempts import retry_cut_position
from ..errors import ConfigurationError
from .jobs import PAYLOAD_OPTION, envelope_arguments
from .readers import reader_chain
from .registry import installations
from .tasks import TaskTable, task_table

__all__ = [
    "CHECKED_STATUSES",
    "EXPORT_FORMAT",
    "CheckReport",
    "DivergenceGroup",
    "PatchUse",
    "TaskReport",
    "check_runs",
    "export_runs",
    "read_export",
]

CHECKED_STATUSES = ("queued", "pending", "running", "sleeping", "waiting", "retrying", "dead")
"""The statuses of the runs a check reads: every run that may still run its body, dead letters included."""

EXPORT_FORMAT = "flexiq-runs/1"
"""The ``format`` field of an export file."""

_ALL = 2**31 - 1
"""A listing limit no store reaches."""


# ----------------------------------------------------------------- the report
@dataclass(frozen=True)
class DivergenceGroup:
    """The runs of one task whose record the new code leaves at the same place (C12, C48).

    Parameters:
      position (int | None): the recorded position.
      recorded (str | None): the step recorded there.
      running (str | None): the step the new code asks for there.
      runs (list[RunCheck]): the runs, each with the report a worker would raise.
    """

    position: int | None
    recorded: str | None
    running: str | None
    runs: list[RunCheck]


@dataclass(frozen=True)
class PatchUse:
    """Which runs of a task are on each branch of ``step.patched(patch_id)`` (C49).

    Parameters:
      patch_id (str): the patch.
      old (list[str]): run keys on the old branch (``patched`` answered ``False``).
      new (list[str]): run keys on the new branch (their marker is recorded).
    """

    patch_id: str
    old: list[str] = field(default_factory=list)
    new: list[str] = field(default_factory=list)

    @property
    def safe_to_deprecate(self) -> bool:
        """Whether no run checked is on the old branch: ``step.deprecate_patch`` may replace the branch."""
        return not self.old


@dataclass(frozen=True)
class TaskReport:
    """The checks of one task's runs.

    Parameters:
      task_name (str): the task or actor.
      compatible (list[RunCheck]): runs the new code replays.
      divergent (list[DivergenceGroup]): runs it would dead-letter, grouped by their first divergent position.
      errors (list[RunCheck]): runs on which it raises.
      missing (list[RunCheck]): runs of a task the new code does not have.
      patches (list[PatchUse]): each ``step.patched`` id the new code asked, with the runs on each branch.
    """

    task_name: str
    compatible: list[RunCheck] = field(default_factory=list)
    divergent: list[DivergenceGroup] = field(default_factory=list)
    errors: list[RunCheck] = field(default_factory=list)
    missing: list[RunCheck] = field(default_factory=list)
    patches: list[PatchUse] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether every run of the task is compatible."""
        return not (self.divergent or self.errors or self.missing)


@dataclass(frozen=True)
class CheckReport:
    """What a check of new code against the runs in flight found (C48).

    Parameters:
      checks (list[RunCheck]): one per run checked, in the order read.
      source (str): what was read (the store, or the export file).
    """

    checks: list[RunCheck]
    source: str = ""

    @property
    def ok(self) -> bool:
        """Whether every run is compatible: a deploy of this code breaks none of them."""
        return all(c.ok for c in self.checks)

    @property
    def failed(self) -> list[RunCheck]:
        """The runs the new code would break: divergent, raising, or of a task it does not have."""
        return [c for c in self.checks if not c.ok]

    def by_task(self) -> list[TaskReport]:
        """The checks grouped by task (sorted by name), divergences grouped by their first divergent position.

        Within a task, runs are listed by run key.
        """
        names = sorted({c.task_name for c in self.checks})
        return [_task_report(name, [c for c in self.checks if c.task_name == name]) for name in names]


def _task_report(name: str, checks: list[RunCheck]) -> TaskReport:
    checks = sorted(checks, key=lambda c: c.run_key)
    report = TaskReport(name)
    groups: dict[tuple[int | None, str | None, str | None], list[RunCheck]] = {}
    for check in checks:
        if check.verdict == "divergent":
            groups.setdefault((check.position, check.recorded, check.running), []).append(check)
        else:
            {"compatible": report.compatible, "error": report.errors, "missing": report.missing}[check.verdict].append(
                check
            )
    ordered = sorted(groups.items(), key=lambda item: (item[0][0] is None, item[0][0] or 0, str(item[0][1:])))
    report.divergent.extend(DivergenceGroup(*where, runs) for where, runs in ordered)
    uses: dict[str, PatchUse] = {}
    for check in checks:
        for patch_id, new in check.patches.items():
            use = uses.setdefault(patch_id, PatchUse(patch_id))
            (use.new if new else use.old).append(check.run_key)
    report.patches.extend(uses[p] for p in sorted(uses))
    return report


# ------------------------------------------------------------------ checking
def check_runs(
    source: OperatorStore | str | os.PathLike[str],
    tasks: object,
    *,
    task_name: str | None = None,
    codec: CodecChain | None = None,
    config: DurableConfig | None = None,
) -> CheckReport:
    """Check the new code of ``tasks`` against every unfinished run with recorded steps (C48).

    For each run its task's body runs in check mode over the run's record:
    every recorded step is a memo hit, the first step past the record ends the
    check (compatible), and a step whose key differs from the record is a
    divergence, reported as a worker would raise it (C12). Nothing is written
    to the store, no step body runs and nothing is published; the code between
    steps does run (``current_job.checking`` is true there).

    Parameters:
      source (OperatorStore | str | PathLike): the store to read the runs from, or the path of a
        file [`export_runs`][flexiq_plugins.operations.export_runs] wrote (a CI job without production access).
      tasks (object): the new code: a Celery app or a Dramatiq broker (its tasks or actors, through the
        installed adapter; runs of other frameworks are left out), or a mapping of task name to a
        task, an actor or a plain function.
      task_name (str | None): only the runs of this task.
      codec (CodecChain | None): the chain the workers store values with; default: that of the
        integration installed on ``tasks`` in this process, else a reader chosen by each value's header
        (the JSON family; pickled or encrypted values need the chain).
      config (DurableConfig | None): the caps (C22); default: the installed integration's, else defaults.

    Returns:
      CheckReport: one [`RunCheck`][flexiq_plugins.operations.RunCheck] per run; ``ok`` when none would break.

    Raises:
      ConfigurationError: ``tasks`` is not an app, a broker or a mapping; the file is not an export.
      OSError: the file cannot be read.
      StoreUnavailable: the store cannot be reached.
    """
    table = task_table(tasks)
    installed = _installed_driver(table.target)
    codec = codec or (installed.codec if installed is not None else None)
    limits = (config or (installed.config if installed is not None else None) or DurableConfig()).limits
    if isinstance(source, OperatorStore):
        checker = _Checker(table, codec, limits, source.now())
        runs, where = _read_store(source, task_name, table.framework), "the store"
    else:
        checker = _Checker(table, codec, limits, time.time())
        runs, where = _read_export(source), os.fspath(source)
        runs = [(r, e) for r, e in runs if _selected(r.task_name, r.framework, task_name, table.framework)]
    return CheckReport([checker.check(run, envelope) for run, envelope in runs], where)


def _installed_driver(target: object | None) -> Any:
    if target is None:
        return None
    for installation in installations():
        if installation.target() is target:
            return installation.driver()
    return None


def _selected(task: str, framework: str, task_name: str | None, wanted: str | None) -> bool:
    return (task_name is None or task == task_name) and (wanted is None or framework == wanted)


@dataclass(frozen=True)
class _Checker:
    """Checks runs against one set of task bodies, with one codec chain (or a reader per run), caps and clock."""

    table: TaskTable
    codec: CodecChain | None
    limits: Limits
    now: float

    def check(self, run: RecordedRun, envelope: JobEnvelope) -> RunCheck:
        body = self.table.bodies.get(run.task_name)
        if body is None:
            known = ", ".join(sorted(self.table.bodies)) or "none"
            message = f"the new code has no task {run.task_name!r} (it has: {known}); this run could not go on"
            return RunCheck(run.run_key, run.task_name, run.status, "missing", message=message)
        chain = self.codec or _reader_of(run.steps)
        arguments = _arguments(envelope, chain)
        if isinstance(arguments, str):
            return RunCheck(run.run_key, run.task_name, run.status, "error", message=arguments)
        recorded = dataclasses.replace(run, args=arguments[0], kwargs=arguments[1])
        return check_run(recorded, body, codec=chain, limits=self.limits, now=self.now)


def _reader_of(steps: Sequence[StepRow]) -> CodecChain:
    for row in steps:
        if row.value is not None:
            chain = reader_chain(row.value)
            if chain is not None:
                return chain
    return CodecChain()


def _arguments(envelope: JobEnvelope, chain: CodecChain) -> tuple[list[Any], dict[str, Any]] | str:
    """The job's arguments, or why they cannot be read."""
    if envelope.corrupt:
        return f"its job envelope cannot be read: {envelope.corrupt}"
    payload = envelope.options.get(PAYLOAD_OPTION)
    if payload and payload.get("serializer") != chain.serializer.name:
        return f"its arguments are stored encoded by {payload.get('serializer')!r}; pass the workers' codec chain"
    try:
        return envelope_arguments(envelope, chain.serializer)
    except Exception as exc:
        return f"its arguments cannot be read: {type(exc).__name__}: {exc}"


# --------------------------------------------------------------- reading runs
def _read_store(
    store: OperatorStore, task_name: str | None, framework: str | None
) -> list[tuple[RecordedRun, JobEnvelope]]:
    runs = [
        run
        for status in CHECKED_STATUSES
        for run in store.list_runs(status=status, task_name=task_name, limit=_ALL)
        if run.step_count > 0 and (framework is None or run.framework == framework)
    ]
    steps = store.get_steps_of([run.run_key for run in runs])
    return [_recorded(run, steps[run.run_key]) for run in runs]


def _recorded(run: RunRecord, steps: Sequence[StepRow]) -> tuple[RecordedRun, JobEnvelope]:
    rows = _as_retried(run.run_key, run.status, steps)
    envelope = run.envelope
    recorded = RecordedRun(run.run_key, run.task_name, run.status, rows, (), {}, run.job_id, run.attempt, run.framework)
    return recorded, envelope


def _as_retried(run_key: str, status: str, steps: Sequence[StepRow]) -> tuple[StepRow, ...]:
    """A dead run's steps as its retry replays them: without the step that failed for good and the later ones."""
    rows = tuple(sorted(steps, key=lambda r: r.position))
    if status != "dead":
        return rows
    cut = retry_cut_position(rows, None, run_key)
    return rows if cut is None else tuple(r for r in rows if r.position < cut)


# ------------------------------------------------------------------ exporting
def export_runs(
    store: OperatorStore,
    out: str | os.PathLike[str] | IO[str],
    run_keys: Iterable[str] = (),
    *,
    task_name: str | None = None,
) -> int:
    """Write runs' recorded step sequences to a JSON file a check reads without the store (C48).

    Each run is written with its task, framework, status, job envelope and
    step rows, values base64-encoded exactly as stored (so a value the
    workers encrypt stays encrypted). Read it back with
    [`check_runs`][flexiq_plugins.operations.check_runs]``(path, tasks)``.

    Parameters:
      store (OperatorStore): the store.
      out (str | PathLike | IO[str]): the file to write (replaced), or an open text stream.
      run_keys (Iterable[str]): the runs to export; none: every unfinished run with recorded steps.
      task_name (str | None): with no ``run_keys``, only the runs of this task.

    Returns:
      int: how many runs were written.

    Raises:
      UnknownRun: one of ``run_keys`` names no run (nothing is written).
      StoreUnavailable: the store cannot be reached.
      OSError: the file cannot be written.
    """
    keys = list(run_keys)
    if keys:
        runs = [store.get_run(key) for key in keys]
    else:
        runs = [
            r
            for status in CHECKED_STATUSES
            for r in store.list_runs(status=status, task_name=task_name, limit=_ALL)
            if r.step_count > 0
        ]
    steps = store.get_steps_of([run.run_key for run in runs])
    data = {"format": EXPORT_FORMAT, "exported_at": store.now(), "runs": [_run_dict(r, steps[r.run_key]) for r in runs]}
    text = json.dumps(data, indent=1)
    if isinstance(out, (str, os.PathLike)):
        Path(out).write_text(text + "\n")
    else:
        out.write(text + "\n")
    return len(runs)


def _run_dict(run: RunRecord, steps: Sequence[StepRow]) -> dict[str, Any]:
    return {
        "run_key": run.run_key,
        "task_name": run.task_name,
        "framework": run.framework,
        "status": run.status,
        "job_id": run.job_id,
        "attempt": run.attempt,
        "envelope": run.envelope.to_dict(),
        "steps": [_step_dict(s) for s in steps],
    }


def _step_dict(row: StepRow) -> dict[str, Any]:
    return {
        "position": row.position,
        "step_key": row.step_key,
        "kind": row.kind,
        "value": None if row.value is None else base64.b64encode(row.value).decode(),
        "wake_at": row.wake_at,
        "committed_at": row.committed_at,
        "attempt": row.attempt,
        "failure": row.failure,
        "compensate": row.compensate,
        "event_id": row.event_id,
    }


def read_export(path: str | os.PathLike[str]) -> list[RecordedRun]:
    """The runs of an export file, each with its step rows (a dead run's as its retry replays them).

    The job's arguments are left in each run's envelope: `check_runs`
    decodes them with the chain it uses.

    Raises:
      ConfigurationError: the file is not an export of this format.
      OSError: it cannot be read.
    """
    return [run for run, _ in _read_export(path)]


def _read_export(path: str | os.PathLike[str]) -> list[tuple[RecordedRun, JobEnvelope]]:
    try:
        data = json.loads(Path(path).read_text())
        if not isinstance(data, Mapping) or data.get("format") != EXPORT_FORMAT:
            raise ValueError(f"its format is not {EXPORT_FORMAT!r}")
        return [_from_dict(item) for item in data["runs"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigurationError(
            f"{os.fspath(path)} is not a file `flexiq runs export` wrote: {type(exc).__name__}: {exc}"
        ) from exc


def _from_dict(item: Mapping[str, Any]) -> tuple[RecordedRun, JobEnvelope]:
    steps = [
        StepRow(
            position=int(s["position"]),
            step_key=str(s["step_key"]),
            kind=s["kind"],
            value=None if s.get("value") is None else base64.b64decode(s["value"]),
            wake_at=s.get("wake_at"),
            committed_at=s.get("committed_at"),
            attempt=int(s.get("attempt") or 0),
            failure=s.get("failure"),
            compensate=s.get("compensate"),
            event_id=s.get("event_id"),
        )
        for s in item["steps"]
    ]
    envelope = JobEnvelope.from_dict(item["envelope"])
    rows = _as_retried(str(item["run_key"]), str(item["status"]), steps)
    run = RecordedRun(
        str(item["run_key"]),
        str(item["task_name"]),
        str(item["status"]),
        rows,
        envelope.args,
        envelope.kwargs,
        item.get("job_id"),
        int(item.get("attempt") or 0),
        str(item.get("framework") or envelope.framework),
    )
    return run, envelope
