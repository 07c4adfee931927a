"""Every terminal ending a framework reports, settled one way (C32, C34, C38, C45).

A framework ends jobs by itself: it gives up retrying, revokes or expires a
message, kills a body at its hard time limit, drops a message past its age
limit, acknowledges a failure, skips a message. The adapter only reports what
happened ([`Ended`][flexiq_plugins.integration.Ended], through
[`AttemptDriver.framework_ended`][flexiq_plugins.integration.AttemptDriver.framework_ended] or
[`AttemptDriver.give_up`][flexiq_plugins.integration.AttemptDriver.give_up]); what the run becomes is decided here, the
same for every ending and every framework:

- a **cancelling** end (a revoke, an expiry, a skip) is the one cancellation
  (`flexiq_plugins._attempt.cancellation.cancel`): the committed steps'
  undos run, then the run is ``cancelled`` (C34);
- a **failing** end (retries given up, a hard time limit, an age limit, a
  failure the framework acknowledged) records the failure and, if the run
  has committed steps with undos, has them run: the run waits ``pending``
  for one more delivery, which replays the body, runs the undos and ends it
  ``compensated`` (C32); without undos it is ``failed`` at once, keeping a
  [`JobEnded`][flexiq_plugins.errors.JobEnded] (or the body's error) for a
  duplicate to replay (C37).

**One more delivery.** When the framework gave up after the attempt ended
(`given_up`) the adapter re-enqueues the same message itself (a
``PutBack``). Any other ending has already acknowledged the message, so the
core publishes the run's stored job again through the adapter's publisher
(`Republish`), as [`flexiq_plugins.cancel_run`][flexiq_plugins.cancel_run] does for a
cancelled run; without one (or when the publish fails) recovery publishes it
(C35: at once for a cancellation, after ``stale_after`` for a failure).

**Whose run it is.** An ending that *killed* the attempt running the body (a
hard time limit) takes the run from that attempt's claim, which nothing will
release otherwise; the killed attempt is fenced out (C25). Any other ending
leaves a run a live attempt holds to that attempt: the message the
framework dropped was not the one running it (a duplicate, a put-back copy).

**The boundary.** Defects (a divergence, a size limit, a swallowed step signal,
a value the serializer cannot encode: C29) never reach here as a failure:
the attempt dead-letters them *without* compensating, so that a fixed
deploy can retry the run from its committed steps (C13, C30).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from .._model import replays
from .._model.failures import RunFailure
from .._model.records import TERMINAL_STATUSES, JobEnvelope, RunRecord, RunStatus
from .._store.base import StepStore
from ..errors import JobEnded, UnknownRun
from . import cancellation, compensation
from .decisions import Ended

__all__ = ["CANCELLING", "KILLING", "Ending", "Republish", "given_up", "settle"]

logger = logging.getLogger("flexiq_plugins")

Republish = Callable[[JobEnvelope, str], str]
"""``republish(envelope, run_key) -> job id``: publishes a run's stored job again (an adapter's publisher)."""

CANCELLING = frozenset({Ended.REVOKED, Ended.EXPIRED, Ended.SKIPPED})
"""The ends that cancel a run (C34); every other end fails it."""

KILLING = frozenset({Ended.TIME_LIMIT})
"""The ends that killed the attempt running the body: the run is taken from its claim."""


@dataclass(frozen=True)
class Ending:
    """What `settle` did with a run.

    Parameters:
      run_key (str): the run.
      status (str | None): the run's status now; ``None`` when nothing changed
        (it was already terminal or unknown, or a live attempt of another
        delivery holds it).
      undos_next (bool): its undos run at its next delivery (it is ``pending``).
      job_id (str | None): the job published for that delivery, if one was.
      note (str): why no job was published when one was needed ('' otherwise).
    """

    run_key: str
    status: str | None
    undos_next: bool = False
    job_id: str | None = None
    note: str = ""


def settle(
    store: StepStore,
    run_key: str,
    how: Ended,
    *,
    job_id: str | None = None,
    detail: str = "",
    reason: str = "",
    republish: Republish | None = None,
    killed: bool = False,
) -> Ending:
    """Settle the run of a job the framework ended by itself (see the module's description).

    Parameters:
      store (StepStore): the store.
      run_key (str): the run.
      how (Ended): how the framework ended the job.
      job_id (str | None): the ended job's id; a killing end takes the run only
        from that job's claim (``None``: from whichever claim holds it).
      detail (str): what the framework said (``"hard time limit (1.5 s)"``), for the recorded failure.
      reason (str): a cancelling end's reason, as ``flexiq runs list`` shows it
        (default ``"<how> by the framework"``).
      republish (Republish | None): publishes the run's job when its undos
        must run; ``None``: recovery does.
      killed (bool): the framework killed the attempt running the job's body
        (a lost worker process it acknowledged); always so for `KILLING` ends.

    Returns:
      Ending: what became of the run.

    Raises:
      StoreError: the store cannot be read or written.
    """
    if how in CANCELLING:
        ended = _cancelled(store, run_key, how, reason)
    else:
        ended = _failed(store, run_key, how, job_id=job_id, detail=detail, killed=killed or how in KILLING)
    if ended.status is not None:
        logger.info("run %s is %s: its job was %s by the framework", run_key, ended.status, how.value)
    return _delivered(store, ended, republish) if ended.undos_next else ended


def given_up(store: StepStore, run_key: str, attempt: int, error: BaseException) -> bool:
    """The framework will not retry ``error``, which ended ``attempt``: compensate the run, else fail it (C26, C32).

    Returns ``True`` when the run now waits ``pending`` for the delivery that
    runs its undos (the caller re-enqueues the job); else it is ``failed``,
    keeping the body's error for a duplicate to replay (C37). Applies only
    while the run is still ``retrying`` at ``attempt``.

    Raises:
      StoreError: the store cannot be read or written.
    """
    if compensation.start_after_failure(store, run_key, attempt, error):
        return True
    store.settle_failed(run_key, attempt)
    return False


def _cancelled(store: StepStore, run_key: str, how: Ended, reason: str) -> Ending:
    try:
        done = cancellation.cancel(store, run_key, reason or f"{how.value} by the framework")
    except UnknownRun:
        return Ending(run_key, None)
    if done.effect == "finished":
        return Ending(run_key, None)
    return Ending(run_key, done.status, undos_next=done.effect == "compensating")


def _failed(store: StepStore, run_key: str, how: Ended, *, job_id: str | None, detail: str, killed: bool) -> Ending:
    run = _run_or_none(store, run_key)
    if run is None or run.status in TERMINAL_STATUSES:
        return Ending(run_key, None)  # never claimed (a job that took no step, C23), or already settled
    compensating = compensation.is_compensating(store.get_steps(run_key))
    status: str | None = run.status
    if status == "running":
        status = _taken_from_killed(store, run, how, job_id=job_id, compensating=compensating, killed=killed)
    elif compensating:  # its undos wait for a delivery; one dropped as too old is replaced by a new message
        return Ending(run_key, None, undos_next=how is Ended.AGE_LIMIT)
    if status is None or compensating:  # held by a live attempt; or an undo was killed: its delivery goes on
        return Ending(run_key, status, undos_next=status is not None)
    error = JobEnded(f"the framework ended the job ({how.value}{': ' + detail if detail else ''})")
    failure = RunFailure.of(error, "framework")
    if compensation.begin_compensation(store, run_key, failure, status=status, attempt=run.attempt):
        logger.warning("run %s: %s; its committed steps are compensated at its next delivery", run_key, error)
        return Ending(run_key, "pending", undos_next=True)
    kept = replays.failure_outcome(failure.error_type, failure.message)  # a duplicate replays it (C37)
    applied = store.release_run(run_key, "failed", while_status={status}, outcome=kept)
    return Ending(run_key, "failed" if applied else None)


def _taken_from_killed(
    store: StepStore, run: RunRecord, how: Ended, *, job_id: str | None, compensating: bool, killed: bool
) -> str | None:
    """Release a ``running`` run from the attempt the framework killed; its status now, ``None`` if left alone.

    Only an end that killed the attempt running the body takes the run, and
    only from the ended job's own claim: any other claim is a live attempt of
    another delivery. The run becomes ``retrying`` at the killed attempt (as
    if it had failed there), or stays ``pending`` with its undos to go on
    when the attempt was compensating.
    """
    if not killed or (job_id is not None and run.job_id != job_id):
        logger.info("run %s: its job %s was %s; a live attempt holds the run", run.run_key, job_id, how.value)
        return None
    status: RunStatus = "pending" if compensating else "retrying"
    return status if store.release_run(run.run_key, status, while_status={"running"}) else None


def _delivered(store: StepStore, ended: Ending, republish: Republish | None) -> Ending:
    """Publish the job whose delivery runs the undos (C32, C34); recovery does it without a publisher."""
    run = store.get_run(ended.run_key)
    job_id, note = None, ""
    if republish is None:
        note = f"no publisher for {run.framework!r} jobs here: recovery re-publishes it to run its undos"
    elif run.envelope.corrupt:
        note = f"its job cannot be re-published ({run.envelope.corrupt})"
    else:
        try:  # a new job id: the old one may be revoked, or its message too old
            job_id = republish(run.envelope, run.run_key)
        except Exception as exc:  # the broker refused: recovery publishes it
            note = f"could not re-publish {run.task_name!r}: {type(exc).__name__}: {exc}; recovery re-publishes it"
    if job_id is not None:
        logger.info("run %s: its undos run in job %s", run.run_key, job_id)
    else:
        logger.warning("run %s: its undos wait for a delivery: %s", run.run_key, note)
    return Ending(ended.run_key, ended.status, True, job_id, note)


def _run_or_none(store: StepStore, run_key: str) -> RunRecord | None:
    try:
        return store.get_run(run_key)
    except UnknownRun:
        return None
