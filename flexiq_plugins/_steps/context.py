"""``current_job`` and the step API a task body uses.

``current_job`` reads a `contextvars.ContextVar`, so threads, asyncio
tasks and gevent greenlets each see their own job. The step methods are thin:
they validate what only they can, then hand a verb to the running attempt's
`StepJournal`, which runs the one step protocol
(enter → replay the memo or execute → commit). This module knows nothing of
claims, stores or frameworks; the attempt builds a [`JobContext`][flexiq_plugins.JobContext] and
activates it around the task body.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextvars import ContextVar, Token
from datetime import datetime, timedelta
from typing import Any, Literal, TypeVar

from .._model.durations import MAX_SLEEP_SECONDS, parse_sleep
from .._model.identity import validate_name
from .._model.policies import Compensation, RetryPolicy
from .._store.caller import caller_transaction
from ..errors import InvalidStepBody, InvalidStepName, InvalidWakeTime, NoCurrentJob, NotInStep
from .journal import StepJournal, adrive, back_in_steps, current_step_key, drive, leave_steps, outside_steps
from .map import plan_map
from .patch import deprecate_patch, patched
from .run import StepRunVerb, compensation_of, retry_of
from .sleep import SleepVerb
from .transaction import TransactionVerb
from .wait import EventVerb, WaitVerb, event_step, validate_event_field

__all__ = ["JobContext", "StepContext", "current_job", "no_current_job"]

T = TypeVar("T")
I = TypeVar("I")  # noqa: E741 - the item type of a step map

_job: ContextVar[JobContext | None] = ContextVar("flexiq_current_job", default=None)
_called_directly: ContextVar[str | None] = ContextVar("flexiq_called_directly", default=None)

_NOT_ENABLED = (
    "no durable job is running in this context. current_job is set only inside a task "
    "body run by an integration: for Celery call celery_ext.install(app) at set-up; for "
    "Dramatiq add dramatiq_ext.DurableSteps() to the broker's middleware"
)


def _check_body(name: object, fn: object) -> None:
    """Refuse a step body that is not a callable, before anything runs."""
    if not callable(fn):
        close = getattr(fn, "close", None) if inspect.iscoroutine(fn) else None
        if close is not None:
            close()  # a coroutine passed instead of an async function: it must not warn "never awaited"
        raise InvalidStepBody(
            f"step {name!r} got a {type(fn).__name__} as its body, not a callable: that value was computed "
            "before the step, outside it, and is not memoized; pass the function itself, "
            f"e.g. step.run({name!r}, lambda: charge(order_id))"
        )


class StepContext:
    """The step API of one running attempt: ``current_job.step``.

    Steps run one at a time (C8). Each method validates its arguments before
    anything runs; the errors it raises are listed per method.

    Parameters:
      journal (StepJournal): the attempt's step journal.
      run_key (str): the run's key, for [`idempotency_key`][flexiq_plugins.StepContext.idempotency_key].
    """

    def __init__(self, journal: StepJournal, run_key: str) -> None:
        self._journal = journal
        self._run_key = run_key
        self._plain: StepRunVerb | None = None  # the verb of a step.run with no options: the same every time

    # ------------------------------------------------------------- run
    def run(
        self,
        name: str,
        fn: Callable[[], T],
        *,
        key: str | int | None = None,
        retry: RetryPolicy | Literal[False] | None = None,
        compensate: Callable[[T], object] | Compensation | None = None,
        allow_open_transaction: bool = False,
    ) -> T:
        """Run ``fn()`` once per run and return its value; later attempts get the stored value.

        Parameters:
          name (str): the step name (C2): non-empty, ≤ 128 bytes UTF-8, no
            ``#``, ``:`` or control characters. Never inferred (C4).
          fn (Callable[[], T]): the step body, called with no arguments.
          key (str | int | None): pins the step to data (``name:key``), ≤ 256
            bytes; keyed calls do not advance the ``name#n`` counter (C1).
          retry (RetryPolicy | False | None): the step's durable budget (C31):
            attempts are counted in the store, a failure with attempts left
            ends the attempt and the job comes back after the backoff.
            ``None``: the task's ``step_retry`` option, if any; ``False``: no
            budget, the task's own retry policy decides.
          compensate (Callable[[T], object] | Compensation | None): the undo,
            called with the step's value if the run fails for good (C32).
          allow_open_transaction (bool): run even inside an open database
            transaction the store does not share (C42): say so only when the
            body writes nothing that a rollback of it would undo.

        Returns the value decoded from its stored bytes, on the first run too
        (C7): a tuple under JSON comes back as a list every time.

        Raises:
          InvalidStepName, InvalidStepKey: bad name or key (C2), before anything runs.
          InvalidStepBody: ``fn`` is not a callable (before anything runs), or
            it returned an awaitable (use [`arun`][flexiq_plugins.StepContext.arun]).
          OpenTransaction: called inside an open transaction the store does not
            share (C42): before the body runs, or after it wrote in one.
          DuplicateStepKey: the same step key twice in one attempt (C3).
          ConcurrentStep: another step of this attempt is uncommitted (C8).
          StepDivergence: the recorded sequence has another step here (C12).
          EncodeError: the serializer cannot encode the value; nothing is committed (C7).
          StepLimitExceeded: a size limit refused the commit (C22).
          InvalidStepOption: ``retry`` or ``compensate`` is not an accepted form.
          StepRetryExhausted: the step's budget is spent (C31), on that attempt and every replay.
          NonRetryableError: or the error a policy does not retry: the step failed
            for good; every replay raises it again without calling ``fn`` (C31).
          Exception: whatever ``fn`` raises without a budget; nothing is committed (C6).
        """
        _check_body(name, fn)
        verb = self._verb(retry, compensate, allow_open_transaction)
        return drive(self._journal.protocol(verb, name, key), fn)  # type: ignore[no-any-return]

    async def arun(
        self,
        name: str,
        fn: Callable[[], Awaitable[T] | T],
        *,
        key: str | int | None = None,
        retry: RetryPolicy | Literal[False] | None = None,
        compensate: Callable[[T], object] | Compensation | None = None,
        allow_open_transaction: bool = False,
    ) -> T:
        """Async form of [`run`][flexiq_plugins.StepContext.run]: ``fn()`` may return an awaitable, which is awaited.

        Same parameters, return value and errors as [`run`][flexiq_plugins.StepContext.run]. Two ``arun``
        calls under ``asyncio.gather`` fail the attempt with ``ConcurrentStep`` (C8).
        """
        _check_body(name, fn)
        verb = self._verb(retry, compensate, allow_open_transaction)
        return await adrive(self._journal.protocol(verb, name, key), fn)  # type: ignore[no-any-return]

    def _verb(self, retry: object, compensate: object, allow_open_transaction: bool) -> StepRunVerb:
        if retry is None and compensate is None and not allow_open_transaction:
            if self._plain is None:
                self._plain = StepRunVerb(retry_of(None, self._journal))
            return self._plain
        return StepRunVerb(
            retry_of(retry, self._journal),
            compensation_of(compensate),
            allow_open_transaction=allow_open_transaction,
        )

    # ------------------------------------------------------------- map
    def map(
        self,
        name: str,
        fn: Callable[[I], T],
        items: Iterable[I],
        *,
        key: Callable[[I], str | int],
        max_concurrency: int = 8,
        retry: RetryPolicy | Literal[False] | None = None,
        compensate: Callable[[T], object] | Compensation | None = None,
    ) -> list[T]:
        """Run ``fn(item)`` for every item concurrently, each once per run; return the values in the order of ``items``.

        Each item is the keyed step ``name:key(item)``, run in a thread pool
        and committed as soon as its body returns (batched with the items that
        returned meanwhile, so many fast items cost far fewer commits than
        items). The map itself is one entry of the step sequence (``name#n``):
        starting another step while it runs, inside an item's body too, fails
        the attempt with ``ConcurrentStep`` (C8). On replay every committed
        item is a memo hit and only the others run; a crash loses at most the
        items in flight. Inside an item's body
        [`idempotency_key`][flexiq_plugins.StepContext.idempotency_key] is
        ``"<run key>:<name>:<key>"`` (C10, C51).

        Parameters:
          name (str): the map's name (C2), also the name of its items' steps.
          fn (Callable[[I], T]): the body, called with one item, in a pool thread.
          items (Iterable[I]): the items; read once, before anything runs.
          key (Callable[[I], str | int]): gives each item its key (C2); the
            keys must differ. Required: it is what lets the items run in any
            order and still be found on replay (see Parallel steps).
          max_concurrency (int): how many bodies run at once, at most (default 8).
          retry (RetryPolicy | False | None): each item's durable budget, as
            for [`run`][flexiq_plugins.StepContext.run] (C31): an item that fails with
            attempts left comes back after its backoff, alone.
          compensate (Callable[[T], object] | Compensation | None): each item's
            undo, called with its value if the run fails for good (C32).

        Returns the items' values decoded from their stored bytes (C7), in
        the order of ``items``.

        Raises:
          StepMapFailed: items failed (an ``ExceptionGroup`` on Python 3.11+),
            raised once after every other item finished; the items that
            succeeded are committed, a retry runs only the failed ones. Marked
            final when an item failed for good.
          StepRetrySignal: items failed with attempts left: the attempt ends
            and comes back when the first of them is due; not an error (C31).
          DuplicateStepKey: two items with one key, or a key used earlier in
            this attempt (C3), before any body runs.
          InvalidStepName, InvalidStepKey, InvalidStepBody, InvalidStepOption:
            bad arguments, before any body runs (``fn`` returning an awaitable: use
            [`amap`][flexiq_plugins.StepContext.amap]).
          ConcurrentStep, StepDivergence, OpenTransaction: as for [`run`][flexiq_plugins.StepContext.run].
          StepLimitExceeded, EncodeError: an item's value over a cap or not encodable
            (C7, C22). These stop the whole call: no more items start, the running ones finish.
        """
        _check_body(name, fn)
        verb = StepRunVerb(retry_of(retry, self._journal), compensation_of(compensate))
        return plan_map(self._journal, verb, name, fn, items, key=key, max_concurrency=max_concurrency).run()

    async def amap(
        self,
        name: str,
        fn: Callable[[I], Awaitable[T] | T],
        items: Iterable[I],
        *,
        key: Callable[[I], str | int],
        max_concurrency: int = 8,
        retry: RetryPolicy | Literal[False] | None = None,
        compensate: Callable[[T], object] | Compensation | None = None,
    ) -> list[T]:
        """Async form of [`map`][flexiq_plugins.StepContext.map]: each ``fn(item)`` runs as an asyncio task.

        Same parameters, return value and errors as [`map`][flexiq_plugins.StepContext.map]; ``fn`` may
        return an awaitable, which is awaited (a body that blocks the event loop
        runs the items one after the other: give ``map`` such bodies). An error
        that stops the whole call cancels the items still running.
        """
        _check_body(name, fn)
        verb = StepRunVerb(retry_of(retry, self._journal), compensation_of(compensate))
        return await plan_map(self._journal, verb, name, fn, items, key=key, max_concurrency=max_concurrency).arun()

    def transaction(self, name: str, fn: Callable[[], T], *, using: object, key: str | int | None = None) -> T:
        """Run ``fn()`` and commit its memo in one database transaction with ``fn``'s writes (C42).

        ``fn`` runs inside the transaction of ``using`` (joined as a savepoint
        if one is open, else opened here and committed when the step ends), and
        the step row is written there too, fenced on the attempt's claim. So
        the body's writes and the memo commit or roll back together: exactly
        once for those writes. The step store and the tables ``fn`` writes must
        be in the same database. Later attempts get the stored value like
        [`run`][flexiq_plugins.StepContext.run]'s.

        Parameters:
          name (str): the step name (C2).
          fn (Callable[[], T]): the body; its database writes go through ``using``.
          using (str | object): a Django database alias (``"default"``) or
            connection, or a SQLAlchemy ``Session``, ``scoped_session`` or ``Connection``.
          key (str | int | None): as for [`run`][flexiq_plugins.StepContext.run] (C1).

        Raises:
          InvalidTransaction: ``using`` is none of those, reaches another
            database than the store's, or the store cannot share a transaction.
          OpenTransaction: another open transaction the store does not share.

        Otherwise it raises the errors of [`run`][flexiq_plugins.StepContext.run].
        """
        _check_body(name, fn)
        verb = TransactionVerb(caller_transaction(using))
        return drive(self._journal.protocol(verb, name, key), fn)  # type: ignore[no-any-return]

    # ----------------------------------------------------------- sleep
    def sleep(self, duration: str | timedelta | float, *, name: str | None = None) -> None:
        """End the attempt now; the job comes back after ``duration`` (C15–C19).

        Parameters:
          duration (str | timedelta | int | float): ``"500ms"``, ``"30s"``,
            ``"5m"``, ``"1h30m"``, ``"3d"``, ``"1w"``, a ``timedelta`` or seconds.
          name (str | None): names the sleep step (``name#n``); unnamed sleeps
            are ``sleep#0``, ``sleep#1`` …

        The wake time is fixed by the first commit (C17): a replay of a due
        sleep returns at once; one woken early ends the attempt again.

        Raises:
          InvalidDuration: (a ``ValueError``) a negative, unparsable or longer
            than 366 days duration, naming the accepted forms; a ``datetime``
            (use [`sleep_until`][flexiq_plugins.StepContext.sleep_until]).
          SleepSignal: always, unless the sleep is already due; not an error (C20).
        """
        seconds = parse_sleep(duration)
        self._sleep(name, SleepVerb(lambda now: now + seconds))

    def sleep_until(self, when: datetime, *, name: str | None = None) -> None:
        """End the attempt until the timezone-aware datetime ``when`` (C17, C19).

        Raises:
          InvalidWakeTime: (a ``ValueError``) ``when`` is not a timezone-aware
            ``datetime``, or is more than 366 days ahead of the store's clock.
          SleepSignal: unless ``when`` has passed.
        """
        if not isinstance(when, datetime) or when.tzinfo is None or when.utcoffset() is None:
            raise InvalidWakeTime(
                f"sleep_until needs a timezone-aware datetime, got {when!r}; give it a time zone, "
                "e.g. when.replace(tzinfo=timezone.utc) or datetime.now(timezone.utc) + timedelta(days=1)"
            )
        wake_at = when.timestamp()
        if wake_at - self._journal.now() > MAX_SLEEP_SECONDS:
            raise InvalidWakeTime(f"sleep_until({when.isoformat()}) is more than 366 days ahead, the longest sleep")
        self._sleep(name, SleepVerb(lambda _now: wake_at))

    def _sleep(self, name: str | None, verb: SleepVerb) -> None:
        drive(self._journal.protocol(verb, "sleep" if name is None else name))

    # ------------------------------------------------------------ events
    def wait_for_event(
        self, topic: str, *, key: str, timeout: str | timedelta | float | None = None, name: str | None = None
    ) -> Any:
        """Wait until an event ``(topic, key)`` is sent; return its payload, or ``None`` at the timeout (C33).

        Suspends like a sleep: if no event has arrived the attempt ends, the
        worker is free, and the job comes back when one is sent with
        [`flexiq_plugins.send_event`][flexiq_plugins.send_event] (or at the timeout). An event sent
        after the run was created, or sent to this run by its run key, is
        received even if it came before the wait started; each event is
        received at most once per run, the oldest first. The wait is a
        recorded step: a replay returns the same payload without waiting.

        Parameters:
          topic (str): the event's topic, e.g. ``"payment"``; at most 255
            characters, no control characters.
          key (str): the event's key, e.g. an order id; same rules.
          timeout (str | timedelta | int | float | None): how long to wait
            from the first time this wait is reached (``"2h"``, seconds …);
            ``None`` waits without a timeout.
          name (str | None): names the wait step (``name#n``); default the
            topic, which must then be a valid step name (no ``#`` or ``:``).

        Returns the payload decoded from its stored bytes (C7), or ``None``
        when the timeout passed first.

        Raises:
          InvalidEvent: (a ``ValueError``) a topic or key that is not accepted.
          InvalidDuration: a timeout that is not a duration.
          InvalidStepName: the step name (``name``, or the topic) is not a step name.
          EventWaitSignal: (a ``SleepSignal``) no event yet: the attempt ends; not an error.
          RunCancelled: the run is cancelled (C34); not an error.
        """
        verb, step_name = self._wait_verbs(topic, key, timeout, name)
        wait = drive(self._journal.protocol(verb, step_name))
        return drive(self._journal.protocol_for(EventVerb(topic, key, wait), event_step(wait.step_key)))

    async def await_event(
        self, topic: str, *, key: str, timeout: str | timedelta | float | None = None, name: str | None = None
    ) -> Any:
        """Async form of [`wait_for_event`][flexiq_plugins.StepContext.wait_for_event]: the same parameters, return
        value and errors (C33)."""
        verb, step_name = self._wait_verbs(topic, key, timeout, name)
        wait = await adrive(self._journal.protocol(verb, step_name), _no_body)
        received = self._journal.protocol_for(EventVerb(topic, key, wait), event_step(wait.step_key))
        return await adrive(received, _no_body)

    @staticmethod
    def _wait_verbs(topic: object, key: object, timeout: object, name: str | None) -> tuple[WaitVerb, str]:
        validate_event_field("topic", topic)
        validate_event_field("key", key)
        seconds = None if timeout is None else parse_sleep(timeout)
        if name is None:
            try:
                name = validate_name(topic)
            except InvalidStepName as exc:
                raise InvalidStepName(f"{exc}; the wait's step name defaults to its topic: pass name=...") from None
        return WaitVerb(seconds), name

    # ----------------------------------------------------------- patches
    def patched(self, patch_id: str) -> bool:
        """Whether this run takes the new branch of a change to the step sequence (C49).

        Write a change that would break runs already in flight as
        ``if step.patched("audit-v2"): <new steps> else: <old steps>``. A run
        that reaches this point for the first time gets ``True``, and a
        marker step ``patch:audit-v2`` is recorded here, so its replays get
        ``True`` too. A run whose record already goes past this point (it
        passed it before the patch was deployed) gets ``False``: nothing is
        recorded, and it replays its old steps without a divergence. The keys
        of every other step are unchanged (C1). Works the same in sync and
        async bodies.

        Parameters:
          patch_id (str): names the change: a non-empty str of at most 256 bytes, no control characters.

        Returns:
          bool: ``True`` for the new branch, ``False`` for the old one; the same
          answer when asked again in one attempt.

        Raises:
          InvalidStepKey: a bad ``patch_id``, before anything runs.
          DuplicateStepKey: a step of this attempt already took the key ``patch:<patch_id>``.
          ConcurrentStep: called while another step of this attempt is uncommitted (C8).
          StepDivergence: the record holds a step of another kind under ``patch:<patch_id>`` (C12).
        """
        return patched(self._journal, patch_id)

    def deprecate_patch(self, patch_id: str) -> None:
        """Say the old branch of ``step.patched(patch_id)`` is gone: only the new code remains (C49).

        Replace ``if step.patched(id): <new> else: <old>`` by
        ``step.deprecate_patch(id)`` followed by ``<new>`` once no run is on the
        old branch (``flexiq check`` says when). A run that recorded the marker
        replays it; a new run records nothing; a run still on the old branch
        diverges (C12) rather than run new steps against old records. After
        every run that recorded the marker has finished, the call can go too.

        Parameters:
          patch_id (str): the id given to ``step.patched``.

        Raises:
          InvalidStepKey: a bad ``patch_id``.
          StepDivergence: this run passed this point on the old branch (dead-lettered, C13).
        """
        deprecate_patch(self._journal, patch_id)

    # ----------------------------------------------------- idempotency
    @property
    def idempotency_key(self) -> str:
        """``"<run key>:<step key>"`` of the step whose body is running (C10, C11).

        Derived from nothing else: no clock, payload, serializer or codec.

        Raises:
          NotInStep: read outside a step body.
        """
        step_key = current_step_key()
        if step_key is None:
            raise NotInStep(
                "step.idempotency_key names the step that is running, so it is readable only "
                "inside a step body, e.g. step.run('charge', lambda: pay(key=step.idempotency_key))"
            )
        return f"{self._run_key}:{step_key}"


class JobContext:
    """The running job as the body sees it.

    Attributes:
      run_key (str): the durable identity that survives retries, sleeps and
        dead-letter retries.
      job_id (str): the framework's id of this message.
      attempt (int): this attempt's number, 1 for the first.
      task_name (str): the task or actor name.
      step (StepContext): the step API.
      checking (bool): the body runs in check mode against the run's record
        (``flexiq check``, C48): recorded steps replay, no step body runs and
        nothing is written.

    Parameters:
      run_key (str): as the attributes.
      job_id (str): as the attributes.
      task_name (str): as the attributes.
      attempt (int | None): the attempt's number; ``None`` until the run is claimed.
      journal (StepJournal | None): the attempt's step journal; ``None`` until the run is claimed.
      claim (Callable[[], None] | None): claims the run, called at the first read of
        [`step`][flexiq_plugins.JobContext.step] or [`attempt`][flexiq_plugins.JobContext.attempt] while there is no
        journal (a lazy claim); it calls `bind`, or raises [`ClaimRefused`][flexiq_plugins.errors.ClaimRefused].
      checking (bool): as the attributes.
    """

    def __init__(
        self,
        run_key: str,
        job_id: str,
        attempt: int | None,
        task_name: str,
        journal: StepJournal | None,
        *,
        claim: Callable[[], None] | None = None,
        checking: bool = False,
    ) -> None:
        self.run_key = run_key
        self.job_id = job_id
        self.task_name = task_name
        self.checking = checking
        self._claim = claim
        self._attempt = attempt
        self._step = None if journal is None else StepContext(journal, run_key)

    @property
    def claimed(self) -> bool:
        """Whether this attempt has claimed its run (its body used ``step`` or ``attempt``), C23."""
        return self._step is not None

    def bind(self, attempt: int, journal: StepJournal) -> None:
        """The run is claimed: this is attempt ``attempt``, its steps go to ``journal``."""
        self._attempt = attempt
        self._step = StepContext(journal, self.run_key)

    def _claimed(self) -> None:
        if self._step is None and self._claim is not None:
            self._claim()
        if self._step is None:
            raise RuntimeError(f"job {self.job_id} (run {self.run_key}) has no claim on its run")

    @property
    def step(self) -> StepContext:
        """The step API; the first read claims the run of a lazy attempt."""
        step = self._step
        if step is None:
            self._claimed()
            step = self._step
            assert step is not None
        return step

    @property
    def attempt(self) -> int:
        """This attempt's number, 1 for the first; the first read claims the run of a lazy attempt."""
        if self._attempt is None:
            self._claimed()
        assert self._attempt is not None
        return self._attempt

    @contextlib.contextmanager
    def activate(self) -> Iterator[JobContext]:
        """Make this the current job in the calling context for the ``with`` block.

        A job started inside another job's step body (a nested task call) does
        not see the outer step: its ``idempotency_key`` is its own (C10).
        """
        tokens = self.enter()
        try:
            yield self
        finally:
            self.leave(tokens)

    def enter(self) -> tuple[Token[JobContext | None], Token[str | None] | None]:
        """Make this the current job, outside any step, until `leave` with the tokens returned."""
        return _job.set(self), leave_steps()

    def leave(self, tokens: tuple[Token[JobContext | None], Token[str | None] | None]) -> None:
        """Undo `enter`."""
        back_in_steps(tokens[1])
        _job.reset(tokens[0])


class _CurrentJob:
    """The proxy behind ``current_job``: each attribute reads the running job.

    Raises [`NoCurrentJob`][flexiq_plugins.errors.NoCurrentJob] outside a durable job, saying how to enable
    the plugin.
    """

    def get(self) -> JobContext | None:
        """Return the running job, or ``None`` outside one."""
        return _job.get()

    def _require(self) -> JobContext:
        job = _job.get()
        if job is None:
            task = _called_directly.get()
            raise NoCurrentJob(_NOT_ENABLED if task is None else _called_directly_message(task))
        return job

    @property
    def step(self) -> StepContext:
        """The [`StepContext`][flexiq_plugins.StepContext] of the running job."""
        return self._require().step

    @property
    def run_key(self) -> str:
        """The run key (str, a UUIDv7 when minted at publish)."""
        return self._require().run_key

    @property
    def job_id(self) -> str:
        """The framework's job id (Celery task id, Dramatiq message id)."""
        return self._require().job_id

    @property
    def attempt(self) -> int:
        """The attempt number, 1 for the first."""
        return self._require().attempt

    @property
    def task_name(self) -> str:
        """The task or actor name."""
        return self._require().task_name

    @property
    def checking(self) -> bool:
        """Whether the body runs in check mode (``flexiq check``, C48): steps replay, nothing is written.

        Code between steps does run in a check. Keep it free of side effects;
        the rare body that cannot (it sends a message between two steps) skips
        them with ``if not current_job.checking: ...``.
        """
        return self._require().checking

    def __bool__(self) -> bool:
        return _job.get() is not None

    def __repr__(self) -> str:
        job = _job.get()
        return "<current_job: none>" if job is None else f"<current_job {job.task_name} run={job.run_key}>"


def _no_body() -> None:
    """A wait has no body to call."""


current_job = _CurrentJob()
"""The running durable job; ``current_job.step`` is its [`StepContext`][flexiq_plugins.StepContext]."""


def _called_directly_message(task: str) -> str:
    return (
        f"no durable job is running in this context: {task} was called directly, as a plain function, "
        "not run by a worker, so it has no current_job and no steps; send it as a job (Celery: "
        "task.delay(...) or apply_async; Dramatiq: actor.send(...)) to run it with durable steps"
    )


@contextlib.contextmanager
def no_current_job(task_name: str | None = None) -> Iterator[None]:
    """Run the ``with`` block outside any durable job (a task called directly, as a function).

    Used by the integrations so that calling a durable task like a function
    inside another job's body neither records steps in the outer run nor sees
    its idempotency key. ``current_job`` used inside then says the task
    ``task_name`` was called directly.

    Parameters:
      task_name (str | None): the task or actor called directly, for the message.
    """
    token = _job.set(None)
    direct = _called_directly.set(f"the task {task_name!r}" if task_name else "the durable task")
    try:
        with outside_steps():
            yield
    finally:
        _called_directly.reset(direct)
        _job.reset(token)
