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

import functools
import inspect
from collections.abc import Callable
from typing import Any

from dramatiq.asyncio import get_event_loop_thread

from flexiq_plugins.integration import Attempt, AttemptDriver, Failure, JobInfo, Outcome

__all__ = ["Body", "execute", "is_durable", "unwrap_durable", "wrap"]

_MARK = "__flexiq_durable__"


class Body:
    """An actor's own function, as Dramatiq declared it.

    Parameters:
      fn(Callable[..., Any]): ``actor.fn`` before wrapping.
    """

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        wrapped = getattr(fn, "__wrapped__", None)
        self.is_async = not inspect.iscoroutinefunction(fn) and inspect.iscoroutinefunction(wrapped)
        self.target: Callable[..., Any] = wrapped if self.is_async else fn  # type: ignore[assignment]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the function as Dramatiq would, without durable steps."""
        return self.fn(*args, **kwargs)

    def check(self) -> None:
        """Raise :class:`RuntimeError` before anything is claimed if the body cannot run here."""
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


def wrap(fn: Callable[..., Any], call: Callable[[Body, tuple[Any, ...], dict[str, Any]], Any]) -> Callable[..., Any]:
    """Return a stand-in for ``actor.fn`` that routes every call through ``call(body, args, kwargs)``."""
    body = Body(fn)

    @functools.wraps(fn)
    def durable(*args: Any, **kwargs: Any) -> Any:
        return call(body, args, kwargs)

    setattr(durable, _MARK, True)
    return durable


def execute(driver: AttemptDriver, job: JobInfo, body: Body, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Outcome:
    """Run ``body`` as an attempt of ``job`` and return exactly one outcome.

    An async body runs on the AsyncIO middleware's event loop thread. If the
    wait for it is interrupted (``TimeLimitExceeded``, shutdown), the
    coroutine is cancelled, the attempt concludes on the loop and the
    interruption is reported as a :class:`Failure` of this attempt. Call
    :meth:`Body.check` first.
    """
    started = driver.start(job)
    if not isinstance(started, Attempt):
        return started
    if not body.is_async:
        return started.run(body.target, *args, **kwargs)
    loop = get_event_loop_thread()
    assert loop is not None, "Body.check() was not called"
    try:
        return loop.run_coroutine(started.arun(body.target, *args, **kwargs))
    except BaseException as exc:
        return Failure(exc, started.run_key, started.number)
