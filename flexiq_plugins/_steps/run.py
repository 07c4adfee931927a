"""The verb of ``step.run`` / ``step.arun``: the memo, plus a retry budget, stored failures and an undo (C31, C32).

`StepRunVerb` is `RunVerb` with what
happens when the body raises:

- **No budget** (no ``retry=`` and no task default): as before, nothing is
  committed and the error goes to the task's own retry policy (C6, C28); the
  failure is recorded as a step attempt for ``flexiq runs show``. A
  [`NonRetryableError`][flexiq_plugins.errors.NonRetryableError] fails the step for good instead.
- **A budget** ([`RetryPolicy`][flexiq_plugins.RetryPolicy]): each attempt is
  journaled in the store *before* the body runs (a worker killed inside the
  body has used it; a redelivery does not give it back). A failure with
  attempts left is recorded and the attempt ends like a sleep
  ([`StepRetrySignal`][flexiq_plugins.errors.StepRetrySignal]) until the backoff has
  passed; the task's retry budget is not touched. The last failure commits
  the step as failed for good and raises
  [`StepRetryExhausted`][flexiq_plugins.errors.StepRetryExhausted].
- **Failed for good** (a non-retryable error, or an error the policy's filters
  do not retry): the step row keeps the error, and the same error is raised,
  marked final (`mark_final`): never retried,
  whatever its type. Every replay raises it again without calling the body.

A step with ``compensate=`` records the undo's name in its row when it
commits and registers the undo in the attempt's journal on every commit and
replay, so the compensation phase (`flexiq_plugins._attempt.compensation`) finds
it (C32). Neither a budget nor an undo costs a statement on a memo hit (C9).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, NoReturn

from .._model.failures import (
    ErrorText,
    StepFailure,
    error_text,
    exhausted_error,
    load_failure,
    rebuild_error,
    replay_error,
)
from .._model.policies import Compensation, RetryPolicy
from .._model.records import AttemptNotDue, AttemptsSpent, StepAttempt, StepAttemptFailure, StepKind
from ..errors import FlexiqError, InvalidStepOption, NonRetryableError, StepRetrySignal, mark_final
from .journal import CALL_BODY, Protocol_, Step, StepJournal

__all__ = ["RunVerb", "StepRunVerb", "compensation_of", "retry_of"]

logger = logging.getLogger("flexiq_plugins")

LOST_MESSAGE = "the worker was lost during this attempt (no error was raised)"


def retry_of(retry: object, journal: StepJournal) -> RetryPolicy | None:
    """The budget of a step: ``retry=`` if given, the task's default for ``None``, no budget for ``False`` (C31).

    Raises:
      InvalidStepOption: ``retry`` is not a [`RetryPolicy`][flexiq_plugins.RetryPolicy], ``None`` or ``False``.
    """
    if retry is None:
        return journal.step_retry
    if retry is False:
        return None
    if isinstance(retry, RetryPolicy):
        return retry
    raise InvalidStepOption(
        f"retry={retry!r} is not a RetryPolicy; pass e.g. retry=RetryPolicy(max_attempts=3, initial_delay=1), "
        "None (the task's step_retry) or False (no step budget)"
    )


def compensation_of(compensate: object) -> Compensation | None:
    """The undo of a step: a [`Compensation`][flexiq_plugins.Compensation], or a callable wrapped in one (C32).

    Raises:
      InvalidStepOption: ``compensate`` is neither, nor ``None``.
    """
    if compensate is None or isinstance(compensate, Compensation):
        return compensate
    if callable(compensate):
        return Compensation(compensate)
    raise InvalidStepOption(
        f"compensate={compensate!r} is not callable; pass a function of the step's value, "
        "e.g. compensate=lambda charge: refund(charge['id']), or a Compensation(fn, retry=...)"
    )


# ------------------------------------------------------------------- verbs
class RunVerb:
    """``step.run`` / ``step.arun``: the body's value, encoded, is the memo (C5, C7).

    A new step is refused inside an open transaction the store does not share,
    before its body runs and again before its commit (the body may have
    written in one), unless ``allow_open_transaction`` (C42).

    Parameters:
      allow_open_transaction (bool): skip that check.
    """

    kind: StepKind = "run"

    def __init__(self, *, allow_open_transaction: bool = False) -> None:
        self._check_transactions = not allow_open_transaction

    def replay(self, journal: StepJournal, step: Step) -> Any:
        """Decode the stored value (C5, C7)."""
        return journal.decode(step)

    def execute(self, journal: StepJournal, step: Step) -> Protocol_:
        """Run the body once; a body that returned an awaitable belongs in ``arun`` (refused)."""
        if self._check_transactions:
            journal.refuse_open_transactions(step)
        value = yield CALL_BODY
        journal.refuse_awaitable(step, value)
        if self._check_transactions:
            journal.refuse_open_transactions(step)
        return value

    def commit(self, journal: StepJournal, step: Step, produced: Any) -> Any:
        """Encode, check the size limits and commit; return the decoded value (C7, C22)."""
        encoded, decoded = journal.encode(step, produced)
        journal.commit(step, encoded, None)
        return decoded


@dataclass(frozen=True)
class _Failed:
    """What `StepRunVerb.execute` produced when the body failed: the commit decides what follows."""

    error: Exception
    number: int | None


@dataclass(frozen=True)
class _Spent:
    """The budget was spent before the body could run (the last attempt's worker was lost)."""

    previous: tuple[StepAttempt, ...]


class StepRunVerb(RunVerb):
    """``step.run`` / ``step.arun`` with an optional retry budget and undo (C5–C7, C31, C32).

    Parameters:
      retry (RetryPolicy | None): the step's budget; ``None``: none.
      compensate (Compensation | None): the step's undo.
      allow_open_transaction (bool): run even inside a database transaction the store does not share (C42).
    """

    def __init__(
        self,
        retry: RetryPolicy | None = None,
        compensate: Compensation | None = None,
        *,
        allow_open_transaction: bool = False,
    ) -> None:
        super().__init__(allow_open_transaction=allow_open_transaction)
        self.retry = retry
        self.compensate = compensate

    # ---------------------------------------------------------------- replay
    def replay(self, journal: StepJournal, step: Step) -> Any:
        """Return the stored value, or raise the stored failure again without calling the body (C5, C31)."""
        assert step.memo is not None
        if step.memo.failure is not None:
            failure = load_failure(step.memo.failure)
            assert isinstance(failure, StepFailure)
            raise replay_error(failure, step.id.step_key)
        value = journal.decode(step)
        self.register(journal, step)
        return value

    # --------------------------------------------------------------- execute
    def execute(self, journal: StepJournal, step: Step) -> Protocol_:
        """Journal the attempt (with a budget), run the body once, and hand a failure to `commit`."""
        number: int | None = None
        if self.retry is not None:
            begun = journal.begin_attempt(step, self.retry.max_attempts)
            if isinstance(begun, AttemptNotDue):  # an early delivery: wait for the backoff's end
                journal.refuse(StepRetrySignal(step.id.step_key, begun.retry_at))
            if isinstance(begun, AttemptsSpent):
                return _Spent(begun.previous)
            number = begun.number
        try:
            return (yield from RunVerb.execute(self, journal, step))
        except Exception as exc:
            if exc is journal.latched or (isinstance(exc, FlexiqError) and not isinstance(exc, NonRetryableError)):
                raise  # not the body's failure: a refusal, a store error
            if self.retry is None and not isinstance(exc, NonRetryableError):
                self._record(journal, step, exc)
                raise  # the task's own retry policy decides (C28)
            return _Failed(exc, number)

    # ---------------------------------------------------------------- commit
    def commit(self, journal: StepJournal, step: Step, produced: Any) -> Any:
        """Commit the value (with the undo's name), or settle the failure `execute` produced."""
        self.settle_failure(journal, step, produced)
        encoded, decoded = journal.encode(step, produced)
        journal.commit(step, encoded, None, compensate=self.undo_label)
        self.register(journal, step)
        return decoded

    @staticmethod
    def failed(produced: Any) -> bool:
        """Whether what `execute` produced is a failure for `settle_failure`, not a value to commit."""
        return isinstance(produced, (_Spent, _Failed))

    def settle_failure(self, journal: StepJournal, step: Step, produced: Any) -> None:
        """If `execute` produced a failure, record it and raise what follows; else return (C31).

        Raises:
          StepRetrySignal: attempts are left (latched); the step comes back after the backoff.
          StepRetryExhausted: the budget is spent; the step is committed as failed for good.
          Exception: the body's error marked final (`mark_final`), the step committed as failed for good.
        """
        if isinstance(produced, _Spent):
            self._spent(journal, step, produced.previous)
        if isinstance(produced, _Failed):
            self._failed(journal, step, produced)

    @property
    def undo_label(self) -> str | None:
        """The name of the step's undo that its row records, if it has one (C32)."""
        return self.compensate.label if self.compensate else None

    def register(self, journal: StepJournal, step: Step) -> None:
        """Register the step's undo in the attempt's journal, on its commit and on every replay (C32)."""
        if self.compensate is not None:
            journal.compensations[step.id.step_key] = self.compensate

    # -------------------------------------------------------------- failures
    def _failed(self, journal: StepJournal, step: Step, failed: _Failed) -> NoReturn:
        error, number = failed.error, failed.number
        policy = self.retry
        if policy is None or not policy.retries(error):
            self._for_good(journal, step, error, number)
        assert number is not None
        if number >= policy.max_attempts:
            self._exhausted(journal, step, error, number)
        delay = policy.delay_after(number)
        text = error_text(error, max_traceback=journal.limits.step_bytes)
        attempt = StepAttemptFailure(
            step.id.step_key, number, "failed", text.error_type, text.message, text.traceback, delay
        )
        retry_at = journal.fail_attempt(attempt).attempt.retry_at
        assert retry_at is not None
        self._log_retry(journal, step, error, number, delay)
        signal = StepRetrySignal(step.id.step_key, retry_at)
        signal.__cause__ = error
        journal.refuse(signal)

    def _log_retry(self, journal: StepJournal, step: Step, error: Exception, number: int, delay: float) -> None:
        assert self.retry is not None
        logger.warning(
            "step %r of %s failed (attempt %d of %d): %s: %s; next attempt in %.1f s",
            step.id.step_key,
            journal.job_label,
            number,
            self.retry.max_attempts,
            type(error).__name__,
            error,
            delay,
        )

    def _for_good(self, journal: StepJournal, step: Step, error: Exception, number: int | None) -> NoReturn:
        text = error_text(error, max_traceback=journal.limits.step_bytes)
        stored = StepFailure("non_retryable", text.error_type, text.message, number or 1)
        attempt = StepAttemptFailure(step.id.step_key, number, "non_retryable", *_texts(text))
        journal.commit_failed(step, stored.to_json(), attempt)
        logger.warning(
            "step %r of %s failed for good: %s: %s", step.id.step_key, journal.job_label, text.error_type, text.message
        )
        raise mark_final(error, "non_retryable")

    def _exhausted(self, journal: StepJournal, step: Step, error: Exception, number: int) -> NoReturn:
        text = error_text(error, max_traceback=journal.limits.step_bytes)
        stored = StepFailure("step_retry_exhausted", text.error_type, text.message, number)
        attempt = StepAttemptFailure(step.id.step_key, number, "exhausted", *_texts(text))
        journal.commit_failed(step, stored.to_json(), attempt)
        raise exhausted_error(step.id.step_key, number, error)

    def _spent(self, journal: StepJournal, step: Step, previous: tuple[StepAttempt, ...]) -> NoReturn:
        last = previous[-1]
        message = last.message if last.error_type is not None and last.message is not None else LOST_MESSAGE
        stored = StepFailure("step_retry_exhausted", last.error_type, message, len(previous))
        attempt = StepAttemptFailure(
            step.id.step_key, last.number, "exhausted", last.error_type, message, last.traceback or ""
        )
        journal.commit_failed(step, stored.to_json(), attempt)
        raise exhausted_error(step.id.step_key, len(previous), rebuild_error(last.error_type, message))

    def _record(self, journal: StepJournal, step: Step, error: Exception) -> None:
        """Record the failure of a step without a budget; a store error here is logged, never raised."""
        text = error_text(error, max_traceback=journal.limits.step_bytes)
        try:
            journal.fail_attempt(StepAttemptFailure(step.id.step_key, None, "failed", *_texts(text)))
        except FlexiqError as exc:
            logger.warning(
                "could not record the failure of step %r of %s: %s", step.id.step_key, journal.job_label, exc
            )


def _texts(text: ErrorText) -> tuple[str, str, str]:
    return text.error_type, text.message, text.traceback
