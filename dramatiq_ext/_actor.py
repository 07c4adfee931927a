"""Running a durable actor's function inside an attempt.

Dramatiq calls ``actor.fn`` from a worker thread; for an ``async def`` actor
``actor.fn`` is ``dramatiq.asyncio.async_to_sync(fn)``, which runs the
coroutine on the AsyncIO middleware's event loop thread. The middleware swaps
``actor.fn`` for a function that hands the *original* function to an attempt:
``attempt.run`` for a sync actor, ``attempt.arun`` on the event loop thread for
an async one, so ``current_job`` is set in the context the body actually runs
in. Wrapping the function, not a middleware hook, is what lets every step
signal end inside the attempt: Dramatiq's worker never sees a
``BaseException`` of ours (C20).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable
from typing import Any

from dramatiq.asyncio import get_event_loop_thread
from dramatiq.middleware import Shutdown

from flexiq_plugins.integration import Attempt, AttemptDriver, Decision, Failure, JobInfo, PutBack, WorkerInterrupted

__all__ = ["Body", "Raise", "execute", "is_durable", "unwrap_durable", "wrap"]

_MARK = "__flexiq_durable__"


class Body:
    """An actor's own function, as Dramatiq declared it.

    Parameters:
      fn (Callable[..., Any]): ``actor.fn`` before wrapping.
    """

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        wrapped = getattr(fn, "__wrapped__", None)
        self.is_async = not inspect.iscoroutinefunction(fn) and inspect.iscoroutinefunction(wrapped)
        self.target: Callable[..., Any] = wrapped if self.is_async else fn  # type: ignore[assignment]
        self.interruptible = _interruptible(self.target)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the function as Dramatiq would, without durable steps."""
        return self.fn(*args, **kwargs)

    def check(self) -> None:
        """Raise `RuntimeError` before anything is claimed if the body cannot run here."""
        if self.is_async and get_event_loop_thread() is None:
            raise RuntimeError(
                "Global event loop thread not set. Have you added the AsyncIO middleware to your middleware stack?"
            )


def is_durable(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` is already a durable wrapper."""
    return getattr(fn, _MARK, False) is True


def unwrap_durable(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The function a durable wrapper stands in for (``fn`` itself if it is not one)."""
    return fn.__wrapped__ if is_durable(fn) else fn  # type: ignore[attr-defined,no-any-return]


class Raise:
    """What ``call`` returns for an error the actor's function raises to Dramatiq (a `Failure`'s).

    The stand-in raises it itself, so the traceback Dramatiq sees (and
    ``Retries`` formats for every failed message) has one frame of the
    integration's above the body's, not every frame between them.

    Parameters:
      error (BaseException): the error, its traceback already starting at the body's frames.
    """

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error: BaseException | None = error


def wrap(fn: Callable[..., Any], call: Callable[[Body, tuple[Any, ...], dict[str, Any]], Any]) -> Callable[..., Any]:
    """Return a stand-in for ``actor.fn`` that routes every call through ``call(body, args, kwargs)``.

    A `Raise` that ``call`` returns is raised here.
    """
    body = Body(fn)

    @functools.wraps(fn)
    def durable(*args: Any, **kwargs: Any) -> Any:
        outcome = call(body, args, kwargs)
        if type(outcome) is not Raise:
            return outcome
        error, outcome.error = outcome.error, None
        del outcome
        try:
            raise error  # type: ignore[misc]  # set by Raise
        finally:
            del error  # the error raised holds this frame: it must not hold the error back (no cycle)

    setattr(durable, _MARK, True)
    return durable


def execute(
    driver: AttemptDriver,
    job: JobInfo,
    body: Body,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    stopping: Callable[[], bool],
) -> Decision:
    """Run ``body`` as an attempt of ``job`` and return exactly one decision.

    Dramatiq's ``Shutdown`` (an actor with ``notify_shutdown`` interrupted
    by a worker shutdown) reaches the core as
    [`WorkerInterrupted`][flexiq_plugins.errors.WorkerInterrupted]: the job is put
    back, no retry counted (C38). An async body runs on the AsyncIO
    middleware's event loop thread; if the wait for it is interrupted, the
    coroutine is cancelled and the attempt concludes on the loop: as a
    put-back when the worker is ``stopping``, else (``TimeLimitExceeded``)
    as a [`Failure`][flexiq_plugins.integration.Failure] of this attempt. Call `Body.check` first.

    Parameters:
      stopping (Callable[[], bool]): whether the worker is shutting down.
    """
    if not body.is_async:  # the attempt's store calls share one connection (AttemptDriver.run_job)
        return driver.run_job(job, functools.partial(body.interruptible, *args, **kwargs))
    started = driver.start(job)
    if not isinstance(started, Attempt):
        return started
    loop = get_event_loop_thread()
    assert loop is not None, "Body.check() was not called"
    concluded: list[Decision] = []

    async def attempt() -> Decision:
        concluded.append(await started.arun(_cancellable(body.target, stopping), *args, **kwargs))
        return concluded[0]

    try:
        return loop.run_coroutine(attempt())
    except BaseException as exc:
        if concluded and isinstance(concluded[0], PutBack):
            return concluded[0]  # the worker shut down: the attempt put its job back on the loop
        return Failure(exc, started.run_key, started.number or 0, claimed=started.claimed)


def _interruptible(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with Dramatiq's ``Shutdown`` raised as the core's ``WorkerInterrupted`` (C38)."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Shutdown as exc:
            raise WorkerInterrupted(f"the worker shut down: {exc or 'Shutdown'}") from exc

    return call


def _cancellable(fn: Callable[..., Any], stopping: Callable[[], bool]) -> Callable[..., Any]:
    """Async ``fn`` whose cancellation by a worker shutdown is raised as ``WorkerInterrupted`` (C38)."""

    @functools.wraps(fn)
    async def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return await fn(*args, **kwargs)
        except asyncio.CancelledError as exc:
            if stopping():
                raise WorkerInterrupted("the worker shut down while the coroutine ran") from exc
            raise

    return call
