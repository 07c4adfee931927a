"""The ``DurableSteps`` middleware: durable steps in ordinary Dramatiq actors.

It stamps a run key on every message at enqueue, swaps each durable actor's
function for one that runs the body inside an attempt (see ``_actor``), and
turns the attempt's outcome into Dramatiq's verb (see ``_verbs``). A failure
the core calls retryable is re-raised unchanged, so the Retries middleware
decides as it always does; if the message is then acknowledged or rejected
without being enqueued again, Dramatiq has given up and the run is settled
``failed`` before the broker hears of it (C26).
"""

from __future__ import annotations

import contextvars
import logging
import threading
from typing import Any

import dramatiq
from dramatiq.middleware import Middleware

from flexiq_plugins import outcomes
from flexiq_plugins._store.base import StepStore
from flexiq_plugins._store.factory import open_store
from flexiq_plugins.attempt import Attempt, AttemptDriver
from flexiq_plugins.context import no_current_job
from flexiq_plugins.errors import StoreUnavailable
from flexiq_plugins.identity import new_run_key

from . import _actor, _config, _verbs
from ._envelope import RUN_KEY_OPTION, job_info

__all__ = ["DurableSteps"]

_message: contextvars.ContextVar[Any] = contextvars.ContextVar("flexiq_dramatiq_message", default=None)


class DurableSteps(Middleware):
    """Middleware that gives actors durable steps: ``current_job.step.run``, ``sleep`` …

    Every actor is durable unless declared with ``durable=False``. Nothing is
    read or opened until a worker process handles its first message, so this
    works as ``"dramatiq_ext.DurableSteps"`` in django_dramatiq's
    ``DRAMATIQ_BROKER["MIDDLEWARE"]``.

    Parameters:
      store(StepStore | Engine | str | None): the step store, a SQLAlchemy
        engine or URL. ``None`` reads ``FLEXIQ_STORE_URL``, then Django's
        ``FLEXIQ_STORE_URL`` / ``FLEXIQ["STORE_URL"]``, then uses
        ``sqlite:///flexiq_steps.db``.
      max_hop(float | str): the longest delay of one sleep hop, seconds or a
        duration such as ``"15m"`` (C18, default 15 minutes).
      lease_seconds(float | str): the claim lease, seconds (C23, default 30).
      busy_retry_seconds(float | str): the most a message whose run is busy is put
        back for, seconds (C24, default 5).
      max_takeovers(int): claim takeovers from dead workers before the run is
        dead-lettered ``worker_lost`` (C25, default 5).
      step_bytes(int): cap on one step's encoded value, bytes (C22).
      run_bytes(int): cap on all step values of a run, bytes (C22).
      run_steps(int): cap on the number of steps of a run (C22).
      codecs(Sequence[Codec]): byte codecs after the broker's encoder, e.g.
        ``[ZlibCodec(), FernetCodec(keys)]`` (C7).
      keep_succeeded_steps(bool): keep step rows of succeeded runs (C27).

    Raises:
      ConfigurationError: an unknown option (at construction) or an unusable
        store or value (at the first message).
    """

    def __init__(self, store: _config.StoreSpec = None, **options: Any) -> None:
        _config.check_options(options)
        self.logger = logging.getLogger("dramatiq_ext.DurableSteps")
        self._store_arg = store
        self._options = options
        self._driver: AttemptDriver | None = None
        self._lock = threading.Lock()
        self._failing: dict[str, Attempt] = {}
        _verbs.install_quiet_skip_filter()

    @property
    def actor_options(self) -> set[str]:
        """``durable``: ``False`` opts an actor out."""
        return {"durable"}

    @property
    def driver(self) -> AttemptDriver:
        """The attempt driver, created at the first message a worker process handles.

        A SQL store opened before a fork re-creates its connections in the
        child by itself, so each worker process has its own.
        """
        with self._lock:
            if self._driver is None:
                self._driver = self._make_driver()
            return self._driver

    @property
    def store(self) -> StepStore:
        """This process's step store, opened on first use."""
        return self.driver.store

    def _make_driver(self) -> AttemptDriver:
        store = open_store(_config.store_spec(self._store_arg))
        options = {**_config.django_settings()[1], **self._options}
        return AttemptDriver(store, _config.build_config(options, dramatiq.get_encoder()))

    # ----------------------------------------------------------- declaring
    def after_declare_actor(self, broker: dramatiq.Broker, actor: dramatiq.Actor[Any, Any]) -> None:
        """Make the actor durable unless it says ``durable=False``."""
        if actor.options.get("durable", True) is False or _actor.is_durable(actor.fn):
            return
        name = actor.actor_name
        actor.fn = _actor.wrap(actor.fn, lambda body, args, kwargs: self._call(broker, name, body, args, kwargs))

    # ------------------------------------------------------------ messages
    def before_enqueue(self, broker: dramatiq.Broker, message: Any, delay: int | None) -> None:
        """Stamp a run key unless the message has one; note that a failed attempt is being retried."""
        message.options.setdefault(RUN_KEY_OPTION, new_run_key())
        self._failing.pop(message.message_id, None)

    def before_process_message(self, broker: dramatiq.Broker, message: Any) -> None:
        """Remember the message for the actor call that follows in this thread."""
        _message.set(message)

    def after_process_message(
        self, broker: dramatiq.Broker, message: Any, *, result: Any = None, exception: BaseException | None = None
    ) -> None:
        """Forget the current message."""
        _message.set(None)

    def after_skip_message(self, broker: dramatiq.Broker, message: Any) -> None:
        """Forget the current message."""
        _message.set(None)

    def before_ack(self, broker: dramatiq.Broker, message: Any) -> None:
        """Settle a failed run ``failed`` when Dramatiq gave up on it (C26)."""
        attempt = self._failing.pop(message.message_id, None)
        if attempt is not None:
            attempt.settle_failed()

    before_nack = before_ack

    # ---------------------------------------------------------- the call
    def _call(
        self, broker: dramatiq.Broker, actor_name: str, body: _actor.Body, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        message = _message.get()
        if message is None or message.actor_name != actor_name:
            with no_current_job():  # called directly, not by a worker: no durable steps
                return body(*args, **kwargs)
        _message.set(None)  # a direct call from inside the body is a plain call
        body.check()
        outcome = self._attempt(message, body, args, kwargs)
        if isinstance(outcome, outcomes.Retry) and not outcome.always:
            raise outcome.error  # Retries decides; before_ack/before_nack settle if it gives up
        return _verbs.apply_outcome(broker, message, outcome, self.logger)

    def _attempt(
        self, message: Any, body: _actor.Body, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> outcomes.Outcome:
        try:
            started = self.driver.start(job_info(message))
        except StoreUnavailable as exc:
            return outcomes.Retry(exc, always=True)
        if not isinstance(started, Attempt):
            return started
        outcome = _actor.execute(started, body, args, kwargs)
        if isinstance(outcome, outcomes.Retry) and not outcome.always:
            self._failing[message.message_id] = started
        return outcome
