"""The verb of ``step.map`` / ``step.amap``: keyed steps run concurrently, one entry in the sequence (C51).

Steps run one at a time (C8) because an unkeyed step's identity is its
position, and a position depends on which step started first. A keyed step
``name:key`` is matched by its key wherever it sits (C12), so a *set* of
keyed steps has an identity that does not depend on the order their bodies
finish in: the one basis on which steps may run together. A step map is such
a set:

- **One entry.** `StepJournal.map_entry` admits the map as one step and
  enters its own entry ``name#n`` (kind ``map``, no value) and its items
  ``name:key(item)`` at once, before any body runs: the guard (C8), the
  identity and duplicate checks (C1–C3, two items with one key included) and
  the divergence check (C12) are the journal's. A map at the place of a
  recorded ``run`` diverges; an item set that shrank does not (the keys not
  reached are logged when the run succeeds, C14).
- **Replay first.** Committed items are memo hits (no statement, C9) and
  register their undos (C32); only the others run.
- **Who does what.** The items' bodies run in a thread pool (``map``) or as
  asyncio tasks (``amap``), each inside its own step key, so its
  ``idempotency_key`` is ``"<run key>:<name>:<key>"`` (C10). Everything
  else runs in the thread that called the map: each item goes through
  ``step.run``'s own verb (`StepRunVerb`: its budget journaled before the
  body, its failure recorded, its value encoded by the run's codec chain,
  C7, C31), and every store write is made there, fenced on the claim (C25).
- **Commits.** An item's value is encoded as soon as its body returns, and
  committed with every other item that returned meanwhile or within the next
  2 ms (`_GATHER_SECONDS`), in one fenced transaction
  (`StepJournal.commit_rows`, under the caps of C22): a crash loses at most
  the items in flight, and N fast items cost far fewer than N commits. The
  map's own entry goes in its first commit (alone only when the call ends
  without one).
- **Failures.** An item whose body raises commits nothing; the others run on.
  The call then raises once, after every other item finished: a
  [`StepMapFailed`][flexiq_plugins.errors.StepMapFailed] holding the items' errors (marked
  final when one failed for good), or, when items failed with attempts left in
  their budget, the [`StepRetrySignal`][flexiq_plugins.errors.StepRetrySignal] due first. An error that
  stops the whole call (a refused commit, an unencodable value, a lost claim,
  a cancellation, a step started inside an item's body) lets no new item
  start: ``map`` waits for the bodies still running (a thread cannot be
  stopped) and commits what they return, unless nothing more can be written
  (the claim is lost, the store is unreachable, the process is exiting);
  ``amap`` cancels them. A worker's time limit or shutdown reaching
  the calling thread while it waits leaves at once.
- **Observed.** In an observed attempt (C53) the journal is told of each
  committed item replayed (`StepJournal.item_replayed`) and of each item
  that runs (`StepJournal.observe_item`), made current in the thread or task
  its body runs in, and ended when its value is committed or it fails.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from ..errors import (
    ClaimLost,
    CodecError,
    InvalidStepOption,
    NonRetryableError,
    StepLimitExceeded,
    StepMapFailed,
    StepRetryExhausted,
    StepRetrySignal,
    StepSignal,
    StepUsageError,
    StoreError,
    StoreUnavailable,
    final_reason,
    mark_final,
    reason_of,
)
from .journal import ItemObservation, Protocol_, Step, StepJournal, in_step
from .run import StepRunVerb

__all__ = ["StepMap", "plan_map"]

_GATHER_SECONDS = 0.002
"""How long a returned item's value waits for the items returning with it, to commit together, seconds.

Bodies started together do not return at the same instant (each thread or
task starts a little after the previous one); without this window each such
wave would split into several commits, and the split would persist.
"""

_WAKE_SECONDS = 0.5
"""How often ``map``'s waiting thread wakes while no item finishes, so a time limit or shutdown raised in it lands."""


def plan_map(
    journal: StepJournal,
    verb: StepRunVerb,
    name: object,
    fn: Callable[[Any], Any],
    items: Iterable[Any],
    *,
    key: object,
    max_concurrency: object,
) -> StepMap:
    """Check a map's options and compute its items' keys; nothing is entered or run yet.

    Raises:
      InvalidStepOption: ``key`` is not callable, or ``max_concurrency`` is not an ``int`` of at least 1.
      Exception: whatever iterating ``items`` or calling ``key`` raises.
    """
    if not callable(key):
        raise InvalidStepOption(
            f"key={key!r} is not callable; step.map needs a function giving each item its key, "
            "e.g. key=lambda order: order['id']"
        )
    if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) or max_concurrency < 1:
        raise InvalidStepOption(f"max_concurrency={max_concurrency!r} is not an int of at least 1")
    listed = list(items)
    keys: list[object] = [key(item) for item in listed]
    return StepMap(journal, verb, name, fn, listed, keys=keys, max_concurrency=max_concurrency)


@dataclass
class _Item:
    """One item of the map that runs in this attempt: its place, its value, its step and its verb in progress."""

    index: int
    value: Any
    step: Step
    protocol: Protocol_ | None = None
    observed: ItemObservation | None = None


class StepMap:
    """One call of ``step.map`` or ``step.amap`` (see the module docstring).

    Parameters:
      journal (StepJournal): the attempt's journal.
      verb (StepRunVerb): the items' verb: their budget and undo (C31, C32).
      name (object): the map's name (validated by the journal, C2).
      fn (Callable[[Any], Any]): the body, called with one item.
      items (list[Any]): the items, in the order of the values returned.
      keys (list[object]): each item's key (validated by the journal, C2).
      max_concurrency (int): how many bodies run at once, at most.
    """

    def __init__(
        self,
        journal: StepJournal,
        verb: StepRunVerb,
        name: object,
        fn: Callable[[Any], Any],
        items: list[Any],
        *,
        keys: list[object],
        max_concurrency: int,
    ) -> None:
        self._journal = journal
        self._verb = verb
        self._name = name
        self._fn = fn
        self._items = items
        self._keys = keys
        self._limit = max_concurrency
        self._values: list[Any] = [None] * len(items)
        self._errors: dict[int, Exception] = {}
        self._retries: list[StepRetrySignal] = []
        self._fatal: BaseException | None = None
        self._batch: list[tuple[_Item, bytes, Any]] = []
        self._entry: Step | None = None
        self._steps: list[Step] = []
        self._entry_committed = False
        self._observed: list[_Item] = []

    # ----------------------------------------------------------------- calls
    def run(self) -> list[Any]:
        """Run the map with a thread pool; return the values in the order of the items."""
        with self._journal.map_entry(self._name, self._keys) as (entry, steps):
            try:
                new = self._replay(entry, steps)
                if new and self._fatal is None:
                    self._run_threads(new)
                return self._result()
            except BaseException as exc:
                self._end_observed(exc)
                raise

    async def arun(self) -> list[Any]:
        """Run the map with asyncio tasks; return the values in the order of the items."""
        with self._journal.map_entry(self._name, self._keys) as (entry, steps):
            try:
                new = self._replay(entry, steps)
                if new and self._fatal is None:
                    await self._run_tasks(new)
                return self._result()
            except BaseException as exc:
                self._end_observed(exc)
                raise

    # ---------------------------------------------------------------- replay
    def _replay(self, entry: Step, steps: list[Step]) -> deque[_Item]:
        """Replay the committed items (no statement, C9); return the items that run now."""
        self._entry, self._steps = entry, steps
        self._entry_committed = entry.memo is not None
        new: deque[_Item] = deque()
        for index, step in enumerate(steps):
            if step.memo is None:
                new.append(_Item(index, self._items[index], step))
                continue
            self._journal.item_replayed(step)
            try:
                self._values[index] = self._verb.replay(self._journal, step)
            except BaseException as exc:  # a failure stored for good, raised again (C31); a corrupt row
                self._failed(index, exc)
        if new or not self._entry_committed:  # only now: the memo hits registered their undos (C32)
            self._journal.check_new_step(new[0].step if new else entry)
        return new

    # ------------------------------------------------------- the thread pool
    def _run_threads(self, queue: deque[_Item]) -> None:
        running: dict[Future[Any], _Item] = {}
        pool = ThreadPoolExecutor(min(self._limit, len(queue)), thread_name_prefix="flexiq-map")

        def submit(item: _Item) -> Future[Any]:
            context = contextvars.copy_context()  # current_job goes along; the step key is set in the thread
            return pool.submit(context.run, _call, self._fn, item.value, item.step.id.step_key, item.observed)

        try:
            while True:
                self._start_more(queue, running, submit)
                if not running:
                    break
                done, rest = wait(running, timeout=_WAKE_SECONDS, return_when=FIRST_COMPLETED)
                if done and rest and self._fatal is None:  # the items returning with it commit with it
                    done |= wait(rest, timeout=_GATHER_SECONDS)[0]
                for future in sorted(done, key=lambda f: running[f].index):
                    item = running.pop(future)
                    error = future.exception()
                    self._finished(item, None if error is not None else future.result(), error)
                self._flush()
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown(wait=True)

    # ----------------------------------------------------------- the tasks
    async def _run_tasks(self, queue: deque[_Item]) -> None:
        running: dict[asyncio.Future[Any], _Item] = {}

        def submit(item: _Item) -> asyncio.Future[Any]:
            return asyncio.ensure_future(_acall(self._fn, item.value, item.step.id.step_key, item.observed))

        try:
            while True:
                self._start_more(queue, running, submit)
                if not running:
                    break
                if self._fatal is not None:
                    for task in running:
                        task.cancel()
                done, rest = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                if rest and self._fatal is None:  # the items returning with it commit with it
                    done |= (await asyncio.wait(rest, timeout=_GATHER_SECONDS))[0]
                for task in sorted(done, key=lambda t: running[t].index):
                    item = running.pop(task)
                    if task.cancelled():
                        _close(item)
                        self._ended(item, self._fatal or asyncio.CancelledError())
                        continue
                    error = task.exception()
                    self._finished(item, None if error is not None else task.result(), error)
                self._flush()
        except BaseException:
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
            raise

    # ------------------------------------------------------ one item's life
    def _start_more(self, queue: deque[_Item], running: dict[Any, _Item], submit: Callable[[_Item], Any]) -> None:
        while queue and len(running) < self._limit and self._fatal is None:
            item = queue.popleft()
            if self._start(item):
                running[submit(item)] = item

    def _start(self, item: _Item) -> bool:
        """Take the item's verb to its body (its attempt journaled, with a budget, C31); ``False``: it will not run."""
        item.observed = self._journal.observe_item(item.step)
        if item.observed is not None:
            self._observed.append(item)
        item.protocol = self._verb.execute(self._journal, item.step)
        try:
            next(item.protocol)
        except StopIteration as stop:  # the budget was spent before the body could run
            self._produced(item, stop.value)
            return False
        except BaseException as exc:
            self._ended(item, exc)
            self._failed(item.index, exc)
            return False
        return True

    def _finished(self, item: _Item, value: Any, error: BaseException | None) -> None:
        """Hand what the item's body returned or raised back to its verb."""
        assert item.protocol is not None
        try:
            if error is None:
                item.protocol.send(value)
            else:
                item.protocol.throw(error)
        except StopIteration as stop:
            self._produced(item, stop.value)
        except BaseException as exc:
            self._ended(item, exc)
            self._failed(item.index, exc)
        latched = self._journal.latched
        if latched is not None:  # a step started in an item's body was refused, even if the body caught it (C8, C21)
            self._stop(latched)

    def _produced(self, item: _Item, produced: Any) -> None:
        """Settle a failure the verb produced, or encode the value for the next commit (C7, C31)."""
        try:
            if self._verb.failed(produced):
                self._commit_entry()  # before a failed-for-good row: the entry's place comes first
                self._verb.settle_failure(self._journal, item.step, produced)
            encoded, decoded = self._journal.encode(item.step, produced)
        except BaseException as exc:
            self._ended(item, exc)
            self._failed(item.index, exc)
            return
        self._batch.append((item, encoded, decoded))

    def _ended(self, item: _Item, error: BaseException | None, size: int = 0) -> None:
        """Tell the item's observation, if it has one, that the item committed (``error`` ``None``) or failed."""
        observed, item.observed = item.observed, None
        if observed is None:
            return
        if error is None:
            observed.committed(size)
        else:
            observed.failed(error)

    def _end_observed(self, error: BaseException) -> None:
        """End the observation of every item still observed when the whole call raised ``error``."""
        for item in self._observed:
            self._ended(item, error)

    def _failed(self, index: int, exc: BaseException) -> None:
        """Sort an item's error: a step retry to come back for, an error that stops the call, or the item's failure."""
        if isinstance(exc, StepRetrySignal):
            self._journal.unlatch(exc)  # the call decides at its end which signal ends the attempt
            self._retries.append(exc)
        elif isinstance(exc, Exception) and exc is not self._journal.latched and not isinstance(exc, _STOPPING):
            self._errors[index] = exc
        else:
            self._stop(exc)

    def _stop(self, exc: BaseException) -> None:
        if self._fatal is None:
            self._fatal = exc

    def _writes_stopped(self) -> bool:
        """Whether the call stopped on something after which nothing more is written: the store lost the claim or
        cannot be reached, or the process is going away (an interrupt, an exit: not an error, not a step signal)."""
        fatal = self._fatal
        if fatal is None:
            return False
        return isinstance(fatal, (ClaimLost, StoreUnavailable)) or not isinstance(fatal, (Exception, StepSignal))

    # --------------------------------------------------------------- commits
    def _flush(self) -> None:
        """Commit the values encoded since the last commit, with the map's entry if it is not committed (C51)."""
        if not self._batch:
            return
        batch, self._batch = self._batch, []
        if self._writes_stopped():
            assert self._fatal is not None
            for item, _, _ in batch:
                self._ended(item, self._fatal)
            return
        assert self._entry is not None
        pending: list[tuple[Step, bytes | None, str | None]] = []
        if not self._entry_committed:
            pending.append((self._entry, None, None))
        pending += [(item.step, encoded, self._verb.undo_label) for item, encoded, _ in batch]
        try:
            self._journal.commit_rows(pending)
        except BaseException as exc:
            for item, _, _ in batch:
                self._ended(item, exc)
            self._stop(exc)
            return
        self._entry_committed = True
        for item, encoded, decoded in batch:
            self._values[item.index] = decoded
            self._verb.register(self._journal, item.step)
            self._ended(item, None, len(encoded))
        try:
            self._journal.stop_if_cancelled()  # the undos just registered run (C34)
        except BaseException as exc:
            self._stop(exc)

    def _commit_entry(self) -> None:
        if not self._entry_committed:
            assert self._entry is not None
            self._journal.commit_rows([(self._entry, None, None)])
            self._entry_committed = True
            self._journal.stop_if_cancelled()

    # ------------------------------------------------------------ the end
    def _result(self) -> list[Any]:
        """The values, or what the whole call comes to: the error that stopped it, the items' errors, a retry."""
        if self._fatal is not None:
            raise self._fatal
        if self._errors:
            self._commit_entry()
            raise self._group()
        if self._retries:
            self._journal.refuse(min(self._retries, key=lambda signal: signal.wake_at))
        self._commit_entry()
        return self._values

    def _group(self) -> StepMapFailed:
        assert self._entry is not None
        indices = sorted(self._errors)
        errors = [self._errors[index] for index in indices]
        keys = [self._steps[index].id.step_key for index in indices]
        shown = ", ".join(keys[:5]) + (", …" if len(keys) > 5 else "")
        group = StepMapFailed(
            f"{len(errors)} of {len(self._items)} items of step map {self._entry.id.step_key!r} failed: {shown}",
            errors,
            keys,
        )
        final = next((error for error in errors if _for_good(error)), None)
        if final is not None:  # a replay raises it again: the run fails for good, its undos run (C31, C32)
            mark_final(group, reason_of(final))
        return group


_STOPPING = (StoreError, StepUsageError, StepLimitExceeded, CodecError)
"""Errors of an item that stop the whole call: the store's, misuse of the step API, a cap, the codec chain."""


def _for_good(error: Exception) -> bool:
    return isinstance(error, (StepRetryExhausted, NonRetryableError)) or final_reason(error) is not None


def _call(fn: Callable[[Any], Any], value: Any, step_key: str, observed: ItemObservation | None) -> Any:
    """Run one item's body in a pool thread, as the step ``step_key`` (C10), its observation current (C53)."""
    token = observed.activate() if observed is not None else None
    try:
        with in_step(step_key):
            return fn(value)
    finally:
        if observed is not None:
            observed.deactivate(token)


async def _acall(
    fn: Callable[[Any], Awaitable[Any] | Any], value: Any, step_key: str, observed: ItemObservation | None
) -> Any:
    """Run one item's body as a task, as the step ``step_key`` (C10), its observation current (C53); an
    awaitable it returns is awaited."""
    token = observed.activate() if observed is not None else None
    try:
        with in_step(step_key):
            result = fn(value)
            if inspect.isawaitable(result):
                result = await result
            return result
    finally:
        if observed is not None:
            observed.deactivate(token)


def _close(item: _Item) -> None:
    """Close the verb of an item whose body was cancelled: it commits nothing (C6)."""
    if item.protocol is not None:
        item.protocol.close()
