"""Bulk actions on the runs of a filter: retry their dead letters, or cancel them (C30, C34, C52).

A bulk action is the single action, run for each selected run: the same
[`retry_dead_letters`][flexiq_plugins.operations.retry_dead_letters] and
[`cancel_run`][flexiq_plugins.cancel_run] that ``flexiq dlq retry`` and
``flexiq runs cancel`` call, so nothing is written twice. It acts on at most
``cap`` runs: a wider filter is refused before anything changes, so an
operator is never surprised by how much a click touched.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .._delivery.cancel import cancel_run
from .._delivery.registry import Publisher
from .._model.listings import RunFilter
from .._model.records import TERMINAL_STATUSES, RunRecord
from .._store.base import StepStore
from .._store.operator_side import OperatorStore
from ..errors import OperationError, StoreError
from ._browse import select_runs
from ._dead_letters import retry_dead_letters

__all__ = ["DEFAULT_BULK_CAP", "BulkPlan", "BulkResult", "bulk_cancel", "bulk_retry", "plan_bulk"]

DEFAULT_BULK_CAP = 1000
"""The most runs one bulk action touches; a filter selecting more is refused."""


@dataclass(frozen=True)
class BulkPlan:
    """What a bulk action would touch, read before it acts (its confirmation).

    Parameters:
      action (str): ``"retry"`` or ``"cancel"``.
      selected (int): the runs the filter selects (at most ``cap + 1``).
      acting_on (list[RunRecord]): those the action applies to: dead runs for
        a retry, unfinished ones for a cancel.
      cap (int): the most runs the action touches.
    """

    action: str
    selected: int
    acting_on: list[RunRecord]
    cap: int

    @property
    def too_many(self) -> bool:
        """Whether the filter selects more than ``cap`` runs (the action refuses)."""
        return self.selected > self.cap


@dataclass
class BulkResult:
    """What a bulk action did.

    Parameters:
      done (list[tuple[str, str]]): ``(run key, what happened)`` for each run acted on.
      failed (list[tuple[str, str]]): ``(run key, error)`` for each that failed.
    """

    done: list[tuple[str, str]] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)


def plan_bulk(store: OperatorStore, action: str, where: RunFilter, *, cap: int = DEFAULT_BULK_CAP) -> BulkPlan:
    """Read what ``action`` (``"retry"`` or ``"cancel"``) would touch among the runs ``where`` selects.

    Raises:
      ValueError: an unknown action.
      StoreUnavailable: the store cannot be reached.
    """
    if action not in ("retry", "cancel"):
        raise ValueError(f"no bulk action {action!r}; the bulk actions are retry and cancel")
    selected = select_runs(store, where, cap=cap)
    if action == "retry":
        acting = [r for r in selected if r.status == "dead"]
    else:
        acting = [r for r in selected if r.status not in TERMINAL_STATUSES]
    return BulkPlan(action, len(selected), acting if len(selected) <= cap else [], cap)


def bulk_retry(
    store: OperatorStore, where: RunFilter, publishers: Mapping[str, Publisher], *, cap: int = DEFAULT_BULK_CAP
) -> BulkResult:
    """Retry the dead letters not yet retried of the dead runs ``where`` selects (C30).

    Raises:
      ValueError: the filter selects more than ``cap`` runs (nothing changed).
      NoPublisher: a selected dead letter's framework has no publisher (nothing changed).
      StoreUnavailable: the store cannot be reached.
    """
    plan = _checked(plan_bulk(store, "retry", where, cap=cap))
    ids = [d.id for r in plan.acting_on for d in store.find_dead_letters(run_key=r.run_key, retried=False)]
    done, failed = retry_dead_letters(store, publishers, ids=ids)
    keys = {d.id: d.run_key for r in plan.acting_on for d in store.find_dead_letters(run_key=r.run_key)}
    return BulkResult(
        done=[(r.run_key, f"dead letter {r.dead_letter_id} re-published as job {r.job_id}") for r in done],
        failed=[(keys.get(i, "?"), f"dead letter {i}: {error}") for i, error in failed],
    )


def bulk_cancel(
    store: StepStore,
    where: RunFilter,
    publishers: Mapping[str, Publisher],
    *,
    reason: str = "",
    cap: int = DEFAULT_BULK_CAP,
) -> BulkResult:
    """Cancel the unfinished runs ``where`` selects, each as [`cancel_run`][flexiq_plugins.cancel_run] does (C34).

    Raises:
      ValueError: the filter selects more than ``cap`` runs (nothing changed).
      StoreUnavailable: the store cannot be reached.
    """
    plan = _checked(plan_bulk(store, "cancel", where, cap=cap))
    result = BulkResult()
    for run in plan.acting_on:
        try:
            done = cancel_run(run.run_key, reason=reason, store=store, publishers=publishers)
        except (OperationError, StoreError) as exc:
            result.failed.append((run.run_key, str(exc)))
            continue
        result.done.append((run.run_key, done.effect))
    return result


def _checked(plan: BulkPlan) -> BulkPlan:
    if plan.too_many:
        raise ValueError(
            f"the filter selects more than {plan.cap} runs; narrow it (status, task, time window) "
            f"so that one {plan.action} touches at most {plan.cap}"
        )
    return plan
