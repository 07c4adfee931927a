"""What an operator does to runs and dead letters, as a Python API (C30, C35).

The ``flexiq`` command line is a thin layer over these functions; a script or
an admin page can call them directly with any [`StepStore`][flexiq_plugins.StepStore].

- runs: [`list_runs`][flexiq_plugins.operations.list_runs], [`show_run`][flexiq_plugins.operations.show_run],
[`cleanup`][flexiq_plugins.operations.cleanup];
- the store's upkeep (``flexiq store``): [`clean_store`][flexiq_plugins.operations.clean_store] (finished runs
  and old events at once) and [`upgrade_schema`][flexiq_plugins.operations.upgrade_schema];
- tasks: [`known_tasks`][flexiq_plugins.operations.known_tasks], the tasks known to take steps (C43);
- step values for display: [`decode_step_value`][flexiq_plugins.operations.decode_step_value];
- dead letters: [`retry_dead_letter`][flexiq_plugins.operations.retry_dead_letter],
  [`retry_dead_letters`][flexiq_plugins.operations.retry_dead_letters],
  [`purge_dead_letters`][flexiq_plugins.operations.purge_dead_letters];
- recovery: [`find_stranded`][flexiq_plugins.operations.find_stranded], [`recover`][flexiq_plugins.operations.recover],
[`Sweeper`][flexiq_plugins.operations.Sweeper];
- events and cancellation: [`send_event`][flexiq_plugins.send_event], [`wake_run`][flexiq_plugins.operations.wake_run],
  [`cleanup_events`][flexiq_plugins.operations.cleanup_events] (C33), [`cancel_run`][flexiq_plugins.cancel_run] (C34);
- publishers: [`publishers_for`][flexiq_plugins.operations.publishers_for] (an app or a broker, through the
  installed adapters) and [`load_object`][flexiq_plugins.operations.load_object] (``module:attribute``);
- an operator's window at any size of history (C52, the dashboard): [`overview`][flexiq_plugins.operations.overview],
  keyset pages of runs, dead letters and events ([`browse_runs`][flexiq_plugins.operations.browse_runs],
  [`browse_dead_letters`][flexiq_plugins.operations.browse_dead_letters],
  [`browse_events`][flexiq_plugins.operations.browse_events]), a run's step timeline
  ([`run_timeline`][flexiq_plugins.operations.run_timeline]), a divergence side by side
  ([`divergence_of`][flexiq_plugins.operations.divergence_of]), bulk actions on a filter
  ([`plan_bulk`][flexiq_plugins.operations.plan_bulk], [`bulk_retry`][flexiq_plugins.operations.bulk_retry],
  [`bulk_cancel`][flexiq_plugins.operations.bulk_cancel]), and the words both surfaces use
  ([`run_note`][flexiq_plugins.operations.run_note], [`steps_note`][flexiq_plugins.operations.steps_note],
  [`retried_note`][flexiq_plugins.operations.retried_note], [`human_time`][flexiq_plugins.operations.human_time]).
- deploys: [`check_runs`][flexiq_plugins.operations.check_runs] (new code against the runs in flight, C48),
  [`export_runs`][flexiq_plugins.operations.export_runs] (their records, for a check in CI) and
  [`fork_run`][flexiq_plugins.operations.fork_run] (run a job again from a step, C50).

Re-publishing goes through the job's own framework adapter, found in
`flexiq_plugins._delivery.registry`: a new job id carrying the old run key (C11,
C36), so the run replays its committed steps and keeps its idempotency keys.
"""

from .._attempt.check import RunCheck
from .._delivery.cancel import DEFAULT_CANCEL_REASON, CancelResult, cancel_run
from .._delivery.deploys import CheckReport, DivergenceGroup, PatchUse, TaskReport, check_runs, export_runs
from .._delivery.events import EventSent, cleanup_events, send_event, wake_run
from .._delivery.forking import Forked, fork_run
from .._delivery.publishing import DEFAULT_TARGET_ATTRS, load_object, publishers_for
from .._delivery.recovery import (
    DEFAULT_GRACE_SECONDS,
    DEFAULT_INTERVAL_SECONDS,
    DEFAULT_QUEUED_SECONDS,
    DEFAULT_STALE_SECONDS,
    RecoveryReport,
    Stranded,
    Sweeper,
    find_stranded,
    recover,
)
from .._delivery.registry import Publisher
from .._model.listings import ListedEvent, RunCursor, RunFilter, SweepLease
from ..errors import AlreadyRetried, NoPublisher, OperationError, PublishFailed
from ._browse import (
    DeadLetterPage,
    EventPage,
    RunPage,
    browse_dead_letters,
    browse_events,
    browse_runs,
    parse_moment,
    select_runs,
)
from ._bulk import DEFAULT_BULK_CAP, BulkPlan, BulkResult, bulk_cancel, bulk_retry, plan_bulk
from ._dead_letters import Retried, purge_dead_letters, retry_dead_letter, retry_dead_letters
from ._divergence import Divergence, DivergenceLine, divergence_of
from ._maintenance import StoreCleaned, clean_store, upgrade_schema
from ._overview import DEFAULT_COUNT_CAP, Overview, overview
from ._runs import RunDetails, cleanup, list_runs, show_run
from ._tasks import known_tasks
from ._timeline import RunOutcome, RunTimeline, TimelineStep, run_timeline
from ._values import DecodedValue, decode_step_value, decode_value
from ._wording import human_time, retried_note, run_note, steps_note

__all__ = [
    "DEFAULT_BULK_CAP",
    "DEFAULT_CANCEL_REASON",
    "DEFAULT_COUNT_CAP",
    "DEFAULT_GRACE_SECONDS",
    "DEFAULT_INTERVAL_SECONDS",
    "DEFAULT_QUEUED_SECONDS",
    "DEFAULT_STALE_SECONDS",
    "DEFAULT_TARGET_ATTRS",
    "AlreadyRetried",
    "BulkPlan",
    "BulkResult",
    "CancelResult",
    "CheckReport",
    "DeadLetterPage",
    "DecodedValue",
    "Divergence",
    "DivergenceGroup",
    "DivergenceLine",
    "EventPage",
    "EventSent",
    "Forked",
    "ListedEvent",
    "NoPublisher",
    "OperationError",
    "Overview",
    "PatchUse",
    "PublishFailed",
    "Publisher",
    "RecoveryReport",
    "Retried",
    "RunCheck",
    "RunCursor",
    "RunDetails",
    "RunFilter",
    "RunOutcome",
    "RunPage",
    "RunTimeline",
    "StoreCleaned",
    "Stranded",
    "SweepLease",
    "Sweeper",
    "TaskReport",
    "TimelineStep",
    "browse_dead_letters",
    "browse_events",
    "browse_runs",
    "bulk_cancel",
    "bulk_retry",
    "cancel_run",
    "check_runs",
    "clean_store",
    "cleanup",
    "cleanup_events",
    "decode_step_value",
    "decode_value",
    "divergence_of",
    "export_runs",
    "find_stranded",
    "fork_run",
    "human_time",
    "known_tasks",
    "list_runs",
    "load_object",
    "overview",
    "parse_moment",
    "plan_bulk",
    "publishers_for",
    "purge_dead_letters",
    "recover",
    "retried_note",
    "retry_dead_letter",
    "retry_dead_letters",
    "run_note",
    "run_timeline",
    "select_runs",
    "send_event",
    "show_run",
    "steps_note",
    "upgrade_schema",
    "wake_run",
]
