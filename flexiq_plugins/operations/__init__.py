"""What an operator does to runs and dead letters, as a Python API (C30, C35).

The ``flexiq`` command line is a thin layer over these functions; a script or
an admin page can call them directly with any :class:`~flexiq_plugins.StepStore`.

- runs: :func:`list_runs`, :func:`show_run`, :func:`cleanup`;
- step values for display: :func:`decode_step_value`;
- dead letters: :func:`retry_dead_letter`, :func:`retry_dead_letters`,
  :func:`purge_dead_letters`;
- recovery: :func:`find_stranded`, :func:`recover`, :class:`Sweeper`;
- events and cancellation: :func:`send_event`, :func:`wake_run`,
  :func:`cleanup_events` (C33), :func:`cancel_run` (C34);
- publishers: :func:`publishers_for` (an app or a broker, through the
  installed adapters) and :func:`load_object` (``module:attribute``).

Re-publishing goes through the job's own framework adapter, found in
:mod:`flexiq_plugins._delivery.registry`: a new job id carrying the old run key (C11,
C36), so the run replays its committed steps and keeps its idempotency keys.
"""

from .._delivery.cancel import DEFAULT_CANCEL_REASON, CancelResult, cancel_run
from .._delivery.events import EventSent, cleanup_events, send_event, wake_run
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
from ..errors import AlreadyRetried, NoPublisher, OperationError, PublishFailed
from ._dead_letters import Retried, purge_dead_letters, retry_dead_letter, retry_dead_letters
from ._runs import RunDetails, cleanup, list_runs, show_run
from ._values import DecodedValue, decode_step_value

__all__ = [
    "DEFAULT_CANCEL_REASON",
    "DEFAULT_GRACE_SECONDS",
    "DEFAULT_INTERVAL_SECONDS",
    "DEFAULT_QUEUED_SECONDS",
    "DEFAULT_STALE_SECONDS",
    "DEFAULT_TARGET_ATTRS",
    "AlreadyRetried",
    "CancelResult",
    "DecodedValue",
    "EventSent",
    "NoPublisher",
    "OperationError",
    "PublishFailed",
    "Publisher",
    "RecoveryReport",
    "Retried",
    "RunDetails",
    "Stranded",
    "Sweeper",
    "cancel_run",
    "cleanup",
    "cleanup_events",
    "decode_step_value",
    "find_stranded",
    "list_runs",
    "load_object",
    "publishers_for",
    "purge_dead_letters",
    "recover",
    "retry_dead_letter",
    "retry_dead_letters",
    "send_event",
    "show_run",
    "wake_run",
]
