"""Runs as operators see them: listing, showing with steps, cleaning up (``flexiq runs``, ``store cleanup``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .._delivery.recovery import latest_wake_at
from .._model.durations import parse_duration
from .._model.identity import check_run_key
from .._model.records import TERMINAL_STATUSES, RunRecord, StepAttempt, StepRow
from .._store.operator_side import OperatorStore
from ..errors import UnknownRun

__all__ = ["RunDetails", "cleanup", "list_runs", "show_run"]


@dataclass(frozen=True)
class RunDetails:
    """A run with its step rows and step attempts, as ``flexiq runs show`` prints it.

    Parameters:
      run (RunRecord): the run.
      steps (list[StepRow]): its committed steps by position.
      wake_at (float | None): when it wakes: its latest sleep's wake time, or a
        pending step retry's (C31), epoch seconds; ``None`` once the run has
        finished (its kept sleep steps still show their own wake times).
      attempts (list[StepAttempt]): its recorded step attempts (C31).
      job_id (str | None): the job id the run was looked up by, when it was
        given one instead of a run key (see [`show_run`][flexiq_plugins.operations.show_run]).
    """

    run: RunRecord
    steps: list[StepRow]
    wake_at: float | None
    attempts: list[StepAttempt] = field(default_factory=list)
    job_id: str | None = None


def list_runs(
    store: OperatorStore,
    *,
    status: str | None = None,
    task_name: str | None = None,
    since: str | float | None = None,
    limit: int = 100,
) -> list[RunRecord]:
    """Return runs, newest first (``flexiq runs list``).

    Parameters:
      store (OperatorStore): the store.
      status (str | None): only runs in this status.
      task_name (str | None): only runs of this task or actor.
      since (str | float | None): only runs updated within this window before
        now (``"1h"``, ``"7d"`` or seconds), on the store's clock.
      limit (int): at most this many runs.

    Raises:
      ValueError: ``since`` is not a duration.
      StoreUnavailable: the store cannot be reached.
    """
    cutoff = None if since is None else store.now() - parse_duration(since)
    return store.list_runs(status=status, task_name=task_name, since=cutoff, limit=limit)


def show_run(store: OperatorStore, run_key: str) -> RunDetails:
    """Return a run with its steps and step attempts (``flexiq runs show``).

    ``run_key`` may also be the id of the run's current job (a Celery task id,
    a Dramatiq message id), as a user often has that one at hand: the run is
    then found by it and `RunDetails.job_id` says so.

    Raises:
      InvalidRunKey: ``run_key`` cannot be a run key (empty, a control character …).
      UnknownRun: no run has ``run_key`` as its key or its current job's id;
        the message says where run keys come from.
      StoreUnavailable: the store cannot be reached.
    """
    check_run_key(run_key)
    try:
        run, job_id = store.get_run(run_key), None
    except UnknownRun:
        run, job_id = _run_of_job(store, run_key), run_key
    steps = store.get_steps(run.run_key)
    attempts = store.get_step_attempts(run.run_key)
    wake_at = None if run.status in TERMINAL_STATUSES else latest_wake_at(steps, attempts)
    return RunDetails(run, steps, wake_at, attempts, job_id)


def _run_of_job(store: OperatorStore, job_id: str) -> RunRecord:
    found = store.list_runs(job_id=job_id, limit=2)
    if len(found) == 1:
        return found[0]
    raise UnknownRun(
        f"no run has the run key {job_id!r}, nor a current job with that id. A run key is the "
        "flexiq_run_key header (Celery) or message option (Dramatiq) a job carries; `flexiq runs list "
        "--task NAME` lists runs with their keys. A task or message id is found only while it is its "
        "run's current job"
    )


def cleanup(store: OperatorStore, older_than: str | float) -> int:
    """Delete finished runs last updated more than ``older_than`` ago, with their steps (C27).

    Succeeded, failed, cancelled and compensated runs are deleted, and so is a
    dead-lettered run whose dead letters were purged (C30). A run a dead
    letter still names is kept so a retry can replay it; live runs (queued,
    pending, running, sleeping, waiting, retrying) are kept.

    Parameters:
      store (OperatorStore): the store.
      older_than (str | float): the retention, a duration (``"7d"``) or seconds.

    Returns:
      int: how many runs were deleted.

    Raises:
      ValueError: ``older_than`` is not a duration.
      StoreUnavailable: the store cannot be reached.
    """
    return store.cleanup(older_than=store.now() - parse_duration(older_than))
