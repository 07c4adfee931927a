"""The ``DurableSteps`` middleware: durable steps in ordinary Dramatiq actors.

It stamps a run key on every new message at enqueue and, for an actor known
to take steps (C43), records its run ``queued`` before the message leaves,
whether the key is new, the producer's or derived from a parent run's (C39,
C44, C46), runs recovery
in every worker (one sweep at a time across them, C39), swaps each durable
actor's function for one that runs the body inside an attempt (see
``_actor``), and turns the attempt's decision into Dramatiq's verb (see
``_verbs``); a pipeline's next stage and a group's completion callbacks
get derived run keys (see ``_dispatch``). A failure
the core calls retryable is re-raised unchanged, so the Retries middleware
decides as it always does; if the message is then acknowledged or rejected
without being enqueued again, Dramatiq has given up: the run is settled
``failed`` before the broker hears of it (C26) or, if it has undos to run,
the same message is enqueued once more to run them (C32).

When Dramatiq ends a durable job by itself, the core hears of it and settles
the run, so recovery never brings it back (C38): a message another
middleware skips before the body runs (a user's ``SkipMessage``) makes the
run ``cancelled`` (its undos run first), or fails it if it failed the message;
``AgeLimit`` (a sleeping job's wake-up past its ``max_age``) makes it fail,
its committed steps' undos running first in a new message (C32, C45); any
other message rejected to the dead-letter queue (``nack``) fails it the same
way; a message of an actor the worker does not have, which Dramatiq
rejects, dead-letters a run no attempt started (reason ``unregistered_task``;
a retried dead letter counts as unstarted until an attempt starts after the
retry).
"""

from __future__ import annotations

import contextvars
import functools
import logging
import math
from typing import Any

import dramatiq
from dramatiq.common import current_millis
from dramatiq.errors import ActorNotFound
from dramatiq.middleware import AgeLimit, Middleware, MiddlewareError

from flexiq_plugins import ConfigurationError, InvalidRunKey
from flexiq_plugins.integration import (
    RECORD_OPTION,
    RECORD_TASK_OPTION,
    RECORDED_FLAG,
    TRACE_HEADER,
    AttemptDriver,
    CancellationPolicy,
    Completed,
    Decision,
    DurableConfig,
    Ended,
    Failure,
    JobInfo,
    PerProcess,
    RetryPolicy,
    StepStore,
    StoreSpec,
    Sweeper,
    belongs_to_a_run,
    body_traceback,
    cancellation_option,
    check_store_at_start,
    check_store_spec,
    dead_letter_unregistered,
    driver_or_put_back,
    durable_at_publish,
    first_publish,
    job_log_fields,
    log_worker_start,
    new_run_key,
    no_current_job,
    publishing_trace,
    record_at_publish,
    register_installation,
    resolve_store,
    resume_mark_at_publish,
    retry_policy_option,
    settle_unclaimed_run,
    start_recovery,
    wants_record,
)

from . import _actor, _config, _dispatch, _verbs
from ._adapter import publisher
from ._envelope import RESUME_OPTION, RUN_KEY_OPTION, job_info, run_key_of

__all__ = ["DurableSteps", "InvalidActorOption"]

_message: contextvars.ContextVar[Any] = contextvars.ContextVar("flexiq_dramatiq_message", default=None)
_handled: contextvars.ContextVar[str | None] = contextvars.ContextVar("flexiq_dramatiq_handled", default=None)
"""The id of the message whose durable call runs in this worker thread, until the worker is done with it."""


class InvalidActorOption(ConfigurationError, MiddlewareError):
    """An actor option of this middleware (``step_retry``) that cannot be used; raised where the actor is declared.

    A `MiddlewareError`, so Dramatiq lets it
    through instead of logging it and leaving the actor without durable steps.
    """


class DurableSteps(Middleware):
    """Middleware that gives actors durable steps: ``current_job.step.run``, ``sleep`` …

    Every actor is durable unless declared with ``durable=False``; one that
    never takes a step is not touched (C43): only an actor declared
    ``durable=True``, or known to take steps (learned at its first step), has
    its messages recorded at enqueue (C39);
    ``step_retry=RetryPolicy(...)`` gives every ``step.run`` of an actor that
    budget unless the call passes its own ``retry=`` (C31);
    ``max_run_seconds`` and ``max_suspended_seconds`` cap each run's duration
    and its time in sleeps and waits: over a run cap it is cancelled (C34). Nothing is
    read or opened until a worker process handles its first message, so this
    works as ``"dramatiq_ext.DurableSteps"`` in django_dramatiq's
    ``DRAMATIQ_BROKER["MIDDLEWARE"]``.

    Parameters:
      store (StepStore | Engine | str | None): the step store, a SQLAlchemy
        engine or URL. ``None`` reads ``FLEXIQ_STORE_URL``, then Django's
        ``FLEXIQ_STORE_URL`` / ``FLEXIQ["STORE_URL"]``, then uses
        ``sqlite:///flexiq_steps.db``.
      options: the fields of [`DurableConfig`][flexiq_plugins.DurableConfig]:
        ``max_hop_seconds`` (seconds or ``"15m"``, C18), ``lease_seconds``
        (C23), ``busy_retry_seconds`` (C24), ``store_retry_seconds`` (C28),
        ``max_takeovers`` (C25), ``step_bytes`` / ``run_bytes`` (bytes) and
        ``run_steps`` (C22), ``serializer`` (default: the broker's encoder)
        and ``codecs`` (C7), ``keep_succeeded_steps`` (C27), ``step_retry``
        (the default budget of every step, C31), ``max_run_seconds`` and
        ``max_suspended_seconds`` (the default run caps of every run, C34),
        ``record_at_publish`` and ``recovery`` (C39), ``known_tasks_refresh_seconds``
        (C43). Each may also be set
        in Django's ``FLEXIQ`` dict, upper case; a keyword option wins.

    Raises:
      ConfigurationError: an unknown option or unusable value, or a store of
        an unknown scheme or type or without its driver (at construction).
        A worker reaches the store once as it boots and refuses to start on
        one it cannot use (C41).
    """

    def __init__(self, store: StoreSpec = None, **options: Any) -> None:
        self._config = DurableConfig.from_options(options, where="DurableSteps()")
        check_store_spec(store)
        self.logger = logging.getLogger("dramatiq_ext.DurableSteps")
        self._store_arg = store
        self._options = options
        self._settings: tuple[str | None, DurableConfig] | None = None
        self._driver: PerProcess[AttemptDriver] = PerProcess(self._make_driver)
        self._failing: dict[str, Failure] = {}
        self._reported: set[str] = set()
        self._stopping = False
        self._sweeper: Sweeper | None = None
        _verbs.install_quiet_skip_filter()

    @property
    def actor_options(self) -> set[str]:
        """``durable``: ``False`` opts an actor out, ``True`` declares it durable from its first message (C43);
        ``step_retry``: its steps' default budget (C31);
        ``max_run_seconds``, ``max_suspended_seconds``: its runs' run caps (C34); ``record_at_publish``:
        ``False`` publishes its new jobs without recording their runs first (C39)."""
        return {"durable", "step_retry", "max_run_seconds", "max_suspended_seconds", RECORD_TASK_OPTION}

    @property
    def driver(self) -> AttemptDriver:
        """The attempt driver of this process, created at the first message it handles.

        A SQL store opened before a fork re-creates its connections in the
        child by itself, so each worker process has its own.
        """
        return self._driver.get()

    @property
    def store(self) -> StepStore:
        """This process's step store, opened on first use."""
        return self.driver.store

    @property
    def config(self) -> DurableConfig:
        """The options in force: the keyword options over Django's ``FLEXIQ`` dict, read at first use.

        Every option comes from here (the driver's, recording at publish and
        recovery, C39), never from the keyword options alone, so a setting in
        ``FLEXIQ`` means the same on every path. Read once per process, the
        first time a message is enqueued or handled or a worker boots (never
        at construction: django_dramatiq builds the middleware while Django
        loads its apps).

        Raises:
          ConfigurationError: the ``FLEXIQ`` dict names an unknown option or an unusable value.
        """
        return self._read_settings()[1]

    def _read_settings(self) -> tuple[str | None, DurableConfig]:
        if self._settings is None:
            django_url, django_options = _config.django_settings()
            config = DurableConfig.from_options({**django_options, **self._options}, where="DurableSteps()")
            self._settings = (django_url, config)
        return self._settings

    def _config_or_arguments(self) -> DurableConfig:
        """[`config`][dramatiq_ext.DurableSteps.config], or the keyword options alone when the settings are unusable (a
        put-back's delay)."""
        try:
            return self.config
        except ConfigurationError:
            return self._config

    def _make_driver(self) -> AttemptDriver:
        django_url, config = self._read_settings()
        store = resolve_store(self._store_arg, lambda: django_url)
        serializer = _config.step_serializer(dramatiq.get_encoder())
        return AttemptDriver(store, config.with_default_serializer(serializer))

    def before_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        """Reach the store once; a store this worker cannot use stops it with one line (C41)."""
        self._stopping = False
        check_store_at_start(self._driver.get, worker="dramatiq worker")

    def before_worker_shutdown(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        """Note the shutdown: an async body it interrupts is put back, not failed (C38)."""
        self._stopping = True

    def after_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        """Log the one start line (the step store, password hidden, and its schema revision); start recovery (C39).

        Each worker process runs a sweeper unless ``recovery=False``; the
        store's lease lets one sweep run at a time across all of them.
        """
        log_worker_start(self._driver.get, "dramatiq worker")
        if self._sweeper is None:
            publishers = {"dramatiq": publisher(broker)}
            self._sweeper = start_recovery(lambda: self.store, publishers, self.config, name="dramatiq worker")

    def after_worker_shutdown(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        """Stop this process's recovery sweeper and give its lease up (C39)."""
        sweeper, self._sweeper = self._sweeper, None
        if sweeper is not None:
            sweeper.stop(timeout=5)

    # ----------------------------------------------------------- declaring
    def before_declare_actor(self, broker: dramatiq.Broker, actor: dramatiq.Actor[Any, Any]) -> None:
        """Check the actor's ``step_retry`` (C31) and run caps (C34) where it is declared.

        Raises:
          InvalidActorOption: ``step_retry`` is not a ``RetryPolicy``, a dict of its fields or ``None``;
            a cap is not a positive duration.
        """
        _step_retry(actor)
        _caps(actor)

    def after_declare_actor(self, broker: dramatiq.Broker, actor: dramatiq.Actor[Any, Any]) -> None:
        """Make the actor durable unless it says ``durable=False``; this process can now send events (C33)."""
        register_installation("dramatiq", broker, self._driver.get)
        if actor.options.get("durable", True) is False or _actor.is_durable(actor.fn):
            return
        name = actor.actor_name
        policy, caps = _step_retry(actor), _caps(actor)
        call = functools.partial(self._call, broker, name, step_retry=policy, cancellation=caps)
        actor.fn = _actor.wrap(actor.fn, call)

    # ------------------------------------------------------------ messages
    def before_enqueue(self, broker: dramatiq.Broker, message: Any, delay: int | None) -> None:
        """Stamp a run key on a new message, record its run (C11, C39, C46) and set the resume mark (C23, C37).

        A run key the producer chose (or one derived from a parent run's,
        C44) may name an existing run, so the job claims before its body
        (C37); one stamped here is a new run, claimed at its first step
        (``integration.resume_mark_at_publish``). A job's first publish
        (``integration.first_publish``) has its run recorded unless it
        exists, whichever key it carries, and its group completion callbacks
        derived keys; a message the middleware publishes again (a sleep hop,
        a put-back, a retry, a recovery) is not recorded again; a retry of an
        attempt that claimed its run resumes it, and a retry of a message
        published without a run key (a producer without the middleware, or
        one that declares the actor ``durable=False``) carries its run's key,
        its message id.
        """
        options = message.options
        try:
            actor_options = broker.get_actor(message.actor_name).options
        except ActorNotFound:  # a producer that does not declare the actor: known if it has taken steps
            actor_options = {}
        if actor_options.get("durable") is False:  # an actor that opts out is not touched (C43) ...
            if first_publish(options.get(RESUME_OPTION)):
                _dispatch.stamp_group_callbacks(options)  # ... but a durable completion callback keeps its key (C44)
            return
        given = bool(options.get(RUN_KEY_OPTION))
        first = first_publish(options.get(RESUME_OPTION))
        failure = self._failing.pop(message.message_id, None) if self._failing else None
        if failure is not None and not given:  # Retries' copy of a message published without a key (C11):
            options[RUN_KEY_OPTION] = failure.run_key  # its run's key (the message id) from now on
            options[RESUME_OPTION] = failure.claimed  # a run it claimed is continued: the retry claims first (C23)
            return
        if not given:
            options[RUN_KEY_OPTION] = new_run_key()
            published = publishing_trace(self._config_or_arguments())
            if published is not None:
                options[TRACE_HEADER] = published  # the run's first attempt links to this span (C53)
        options[RESUME_OPTION] = resume_mark_at_publish(options.get(RESUME_OPTION), run_key_given=given)
        if first:
            _dispatch.stamp_group_callbacks(options)
            self._record(message, delay, actor_options, run_key_given=given)
        if failure is not None and failure.claimed:
            options[RESUME_OPTION] = True  # the retry continues a run: it claims first (C23)

    def _record(self, message: Any, delay: int | None, actor_options: dict[str, Any], *, run_key_given: bool) -> None:
        """Record a new message's run ``queued`` if its actor is known to take steps, unless it opts out (C39, C43)."""
        opted = wants_record(
            self.config,
            task_option=actor_options.get(RECORD_TASK_OPTION),
            call_option=message.options.get(RECORD_OPTION),
        )
        if not opted or not durable_at_publish(
            lambda: self.driver.known_tasks,
            "dramatiq",
            message.actor_name,
            declared=actor_options.get("durable"),
            run_key_given=run_key_given,
        ):
            return  # an actor not known to take steps is not touched: no store statement (C43)
        message.options[RECORDED_FLAG] = True  # in the envelope: re-publishes of the run carry the flag too
        try:
            job = job_info(message)
        except InvalidRunKey:
            return  # the worker refuses the job and says why (C11)
        finally:
            del message.options[RECORDED_FLAG]
        seconds = (delay or 0) / 1000
        job_id = str(message.message_id)
        if record_at_publish(lambda: self.store, job.run_key, job_id, job.job_envelope, delay_seconds=seconds):
            message.options[RECORDED_FLAG] = True

    def before_process_message(self, broker: dramatiq.Broker, message: Any) -> None:
        """Remember the message for the actor call that follows in this thread."""
        _message.set(message)

    def after_process_message(
        self, broker: dramatiq.Broker, message: Any, *, result: Any = None, exception: BaseException | None = None
    ) -> None:
        """Forget the current message; a recorded job of an actor that is not durable ends its run (C39)."""
        if _message.get() is not None:  # a durable call forgot it already
            _message.set(None)
        _handled.set(None)
        if message.options.get(RECORDED_FLAG) and not self._is_durable(broker, message):
            settle_unclaimed_run(self.store, run_key_of(message), "succeeded" if exception is None else "failed")

    def after_skip_message(self, broker: dramatiq.Broker, message: Any) -> None:
        """Forget the current message; a durable job skipped before its body ran ends its run (C38, C45).

        ``AgeLimit`` fails and skips a message past its ``max_age`` (a sleeping
        job's wake-up carries its first enqueue's time): the run fails, and its
        committed undos run first in a new message (C32). Another middleware's
        skip cancels it (C34), or fails it if it failed the message. The
        message's nack that follows is not reported again.
        """
        _message.set(None)
        ours = _handled.get() == message.message_id
        _handled.set(None)
        if ours or not self._is_durable(broker, message):
            return  # our own skip: a put-back, a duplicate, a dead letter
        how = (_age_limited(broker, message) or Ended.FAILED) if message.failed else Ended.SKIPPED
        if message.failed:
            self._reported.add(message.message_id)  # its nack follows
        self._framework_ended(broker, message, how)

    def before_ack(self, broker: dramatiq.Broker, message: Any) -> None:
        """Dramatiq gave up on a failed run: settle it ``failed`` (C26), or enqueue it once more to compensate (C32)."""
        self._give_up(broker, message)

    def before_nack(self, broker: dramatiq.Broker, message: Any) -> None:
        """A durable job rejected to the dead-letter queue: its run is ``failed`` before the broker hears (C26, C38).

        A job of an actor this worker does not have (Dramatiq logs ``Received
        message for undefined actor`` and rejects it) is dead-lettered with
        the reason ``unregistered_task`` if no attempt started its run, or none
        since the run's dead letter was retried (C39).
        """
        if self._give_up(broker, message):
            return
        if message.actor_name not in broker.get_declared_actors():
            dead_letter_unregistered(
                lambda: self.store,
                message.options.get(RUN_KEY_OPTION),
                str(message.message_id),
                message.actor_name,
                known=broker.get_declared_actors(),
                worker="dramatiq worker",
                kind="actor",
            )
        elif message.message_id in self._reported:
            self._reported.discard(message.message_id)  # its skip reported how it ended
        elif self._is_durable(broker, message):
            self._framework_ended(broker, message, Ended.FAILED)

    def _framework_ended(self, broker: dramatiq.Broker, message: Any, how: Ended) -> None:
        """Tell the core how Dramatiq ended a durable job; a run whose undos must run is published on ``broker``.

        Not for a message that can have no run: one of an actor not known to take steps, neither recorded
        at enqueue nor continuing a run (C43): Dramatiq's ending is its own, with no store statement.
        """
        if not self._may_have_a_run(broker, message):
            return
        error = getattr(message, "_exception", None)  # what the worker stuffed into the message
        detail = f"{type(error).__name__}: {error}" if error is not None else ""
        run_key = run_key_of(message)
        job_id = str(message.message_id)
        self.driver.framework_ended(run_key, how, job_id=job_id, detail=detail, publisher=publisher(broker))

    def _give_up(self, broker: dramatiq.Broker, message: Any) -> bool:
        """Hand a failure Dramatiq will not retry to the core; return whether this message had one."""
        failure = self._failing.pop(message.message_id, None)
        if failure is None:
            return False
        after = self.driver.give_up(failure)
        if after is not None:
            _verbs.enqueue_again(broker, message, failure.run_key, math.ceil(after.delay * 1000))
        return True

    def _may_have_a_run(self, broker: dramatiq.Broker, message: Any) -> bool:
        """Whether ``message`` may have a run: recorded, continuing one, or of an actor declared or known (C43)."""
        options = message.options
        if options.get(RECORDED_FLAG) or options.get(RESUME_OPTION):
            return True
        try:
            declared = broker.get_actor(message.actor_name).options.get("durable")
        except ActorNotFound:
            declared = None
        if declared is True:
            return True
        try:
            return self.driver.known_tasks.is_known("dramatiq", message.actor_name)
        except ConfigurationError:
            return False

    @staticmethod
    def _is_durable(broker: dramatiq.Broker, message: Any) -> bool:
        try:
            return _actor.is_durable(broker.get_actor(message.actor_name).fn)
        except ActorNotFound:
            return False

    # ---------------------------------------------------------- the call
    def _call(
        self,
        broker: dramatiq.Broker,
        actor_name: str,
        body: _actor.Body,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        step_retry: RetryPolicy | None,
        cancellation: CancellationPolicy | None,
    ) -> Any:
        message = _message.get()
        if message is None or message.actor_name != actor_name:
            with no_current_job(actor_name):  # called directly, not by a worker: no durable steps
                return body(*args, **kwargs)
        _message.set(None)  # a direct call from inside the body is a plain call
        _handled.set(message.message_id)
        body.check()
        job = job_info(message, step_retry=step_retry, cancellation=cancellation)
        # no local of this frame holds the decision: an error raised from it must not hold it (no cycle)
        return self._attempt(broker, message, job, self._decide(job, body, args, kwargs))

    def _decide(self, job: JobInfo, body: _actor.Body, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Decision:
        """Run the attempt with this process's driver; a store that cannot be opened puts the job back (C41)."""
        driver = driver_or_put_back(self._driver.get, self._config_or_arguments)
        if isinstance(driver, AttemptDriver):
            return _actor.execute(driver, job, body, args, kwargs, stopping=self._is_stopping)
        return driver

    def _is_stopping(self) -> bool:
        """Whether the worker is shutting down: read when the attempt asks."""
        return self._stopping

    def _attempt(self, broker: dramatiq.Broker, message: Any, job: JobInfo, decision: Decision) -> Any:
        """Turn the attempt's decision into Dramatiq's verb; every record it logs names the run (C53).

        The attempt itself names it: the driver while it claims and concludes,
        ``current_job`` while the body runs.
        """
        if type(decision) is Completed and not decision.claimed:  # a body that took no step: its value, as is (C43)
            return decision.value
        with job_log_fields(job.run_key, job.job_id, job.name):
            if belongs_to_a_run(decision):  # the pipeline's next stage is a run of its own (C44)
                _dispatch.stamp_pipe_target(message.options, job.run_key)
            if isinstance(decision, Failure):  # Retries decides; the middleware settles the run if it gives up
                self._failing[message.message_id] = decision
                error = body_traceback(decision.error)
                del decision
                return _actor.Raise(error)  # raised by the actor's function itself: one frame above the body's
            try:
                return _verbs.apply_decision(broker, message, job, decision)
            finally:
                del decision


def _step_retry(actor: dramatiq.Actor[Any, Any]) -> RetryPolicy | None:
    try:
        return retry_policy_option(actor.options.get("step_retry"), where=f"actor {actor.actor_name!r} step_retry")
    except ConfigurationError as exc:
        raise InvalidActorOption(str(exc)) from exc


def _caps(actor: dramatiq.Actor[Any, Any]) -> CancellationPolicy | None:
    options = actor.options
    try:
        return cancellation_option(
            options.get("max_run_seconds"), options.get("max_suspended_seconds"), where=f"actor {actor.actor_name!r}"
        )
    except ConfigurationError as exc:
        raise InvalidActorOption(str(exc)) from exc


def _age_limited(broker: dramatiq.Broker, message: Any) -> Ended | None:
    """``AGE_LIMIT`` if the broker's ``AgeLimit`` failed ``message`` for its age (as it decides), else ``None``."""
    limits = [m for m in broker.middleware if isinstance(m, AgeLimit)]
    if not limits:
        return None
    try:
        actor_options = broker.get_actor(message.actor_name).options
    except ActorNotFound:
        actor_options = {}
    max_age = message.options.get("max_age") or actor_options.get("max_age", limits[0].max_age)
    if not max_age or current_millis() - message.message_timestamp < max_age:
        return None
    return Ended.AGE_LIMIT
