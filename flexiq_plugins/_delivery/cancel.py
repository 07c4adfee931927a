"""Cancelling a run on request (C34), re-publishing it when its undos must run, and telling its waiter (C45).

[`cancel_run`][flexiq_plugins.cancel_run] is `flexiq_plugins._attempt.cancellation.cancel` (the
one cancellation: ``flexiq runs cancel``, a framework's revoke) plus, through
the publisher of the run's framework:

- the publish of a run whose compensation waits for a delivery; without a
  publisher, recovery publishes it (a run with a requested cancellation is
  stranded);
- the answer to the job's result waiter (C45): a run cancelled here ends
  outside any framework path, so the framework's result store is told
  ([`ResultReporter`][flexiq_plugins.integration.ResultReporter]) that the job
  raised [`JobCancelled`][flexiq_plugins.errors.JobCancelled]. Without a publisher
  that can, the job's next delivery (its wake-up message, or the
  compensation's) finds the run finished and replays the cancellation
  through the framework (C37); a run waiting for an event without a
  deadline has no such message left, which the result says (``note``).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping

from .._attempt.cancellation import DEFAULT_CANCEL_REASON, CancelResult, cancel
from .._model import replays
from .._model.records import RunRecord
from .._store.factory import StoreSpec
from ..errors import PublishFailed
from .process import this_process
from .publishing import publish
from .registry import Publisher, ResultReporter

__all__ = ["DEFAULT_CANCEL_REASON", "CancelResult", "cancel_run"]

logger = logging.getLogger("flexiq_plugins.operations")


def cancel_run(
    run_key: str, *, reason: str = "", store: StoreSpec = None, publishers: Mapping[str, Publisher] | None = None
) -> CancelResult:
    """Cancel the run ``run_key`` (C34): at once if no attempt runs it, at its next step boundary if one does.

    Its compensations run (C32) and it ends ``cancelled`` with ``reason``; a
    wake-up message of a sleeping or waiting run is dropped when it arrives.
    A run whose undos must run is re-published through the publisher of its
    framework (else recovery re-publishes it). A run cancelled (or
    compensating) here answers its job's result waiter at once through that
    publisher: ``JobCancelled`` (C45); a running one answers it when its
    attempt stops.

    Parameters:
      run_key (str): the run.
      reason (str): why, as ``flexiq runs list`` shows it (default
        ``"cancelled on request"``). The first reason given is kept.
      store (StepStore | Engine | str | None): where the run is; ``None``: the
        store of the integration configured in this process, else
        ``FLEXIQ_STORE_URL``, else the default SQLite file (which must exist).
      publishers (Mapping[str, Publisher] | None): a publisher per framework
        name; ``None``: the app or broker of each integration configured in
        this process; ``{}``: leave the re-publish to recovery.

    Returns:
      CancelResult: ``cancelled``, ``compensating``, ``requested`` or ``finished``, and the run's status.

    Raises:
      UnknownRun: no run has ``run_key``.
      ConfigurationError: an unusable store setting, or a SQLite file that does not exist.
      StoreUnavailable: the store cannot be reached.
    """
    here = this_process(store, publishers)
    before = here.store.get_run(run_key)
    done = cancel(here.store, run_key, reason)
    if done.effect not in ("cancelled", "compensating"):
        return done
    run = here.store.get_run(run_key)
    publisher = here.publishers.get(run.framework)
    if done.effect == "compensating":
        done = _publish_undos(publisher, run, done)
    if not _tell_waiter(publisher, run) and before.status == "waiting" and before.wake_at is None:
        done = dataclasses.replace(done, note="; ".join(n for n in (done.note, _NO_MESSAGE_LEFT) if n))
    return done


def _publish_undos(publisher: Publisher | None, run: RunRecord, done: CancelResult) -> CancelResult:
    """Publish the job whose delivery runs a cancelled run's undos (C32, C34); recovery does it without a publisher."""
    if publisher is None:
        note = f"no publisher for {run.framework!r} jobs here: recovery re-publishes it to run its undos"
        return dataclasses.replace(done, note=note)
    try:  # a new job id: the old one may be revoked (a Celery revoke is what cancelled the run)
        job_id = publish(publisher, run.envelope, run.run_key)
    except PublishFailed as exc:
        return dataclasses.replace(done, note=f"{exc}; recovery re-publishes it")
    logger.info("run %s cancelled: its undos run in job %s", run.run_key, job_id)
    return dataclasses.replace(done, job_id=job_id)


_NO_MESSAGE_LEFT = (
    "no result waiter was told: the run waited for an event without a deadline, so no message of its job is left "
    "to tell it; cancel it where its integration is configured, or pass its app or broker"
)


def _tell_waiter(publisher: Publisher | None, run: RunRecord) -> bool:
    """Store the cancellation as the result of the run's job, for its result waiter (C45); whether it was stored.

    Nothing without a publisher that can ([`ResultReporter`][flexiq_plugins.integration.ResultReporter]), or a job
    id; an error of the result store is logged, not raised.
    """
    if not isinstance(publisher, ResultReporter) or not run.job_id or run.envelope.corrupt:
        return False
    error = replays.cancelled_error(run.cancel_reason or DEFAULT_CANCEL_REASON)
    try:
        told = publisher.report_ended(run.envelope, run.job_id, error)
    except Exception:
        logger.exception("run %s cancelled: could not tell the result waiter of its job %s", run.run_key, run.job_id)
        return False
    if told:
        logger.info("run %s cancelled: its job %s now reports JobCancelled", run.run_key, run.job_id)
    return told
