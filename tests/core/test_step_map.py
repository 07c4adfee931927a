"""Parallel keyed steps, ``step.map`` / ``step.amap`` (C51), and the rules they keep (C3, C7–C10, C12, C14, C22,
C31, C32, C34), unit-level.

Each body is driven attempt by attempt with ``flexiq_plugins.testing`` (``durable_run``) on the in-memory store,
or with the core harness for ``amap``; overlap is forced with barriers and events, never with timing. A
``SimulatedCrash`` inside an item's body is a killed worker. The same behaviour with real workers and brokers,
a SIGKILL included, is in ``tests/conformance``; the batch commit on every store in ``tests/store``.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
import sys
import threading
from collections.abc import Callable
from typing import Any

import pytest

from flexiq_plugins import (
    DurableConfig,
    MemoryStepStore,
    NonRetryableError,
    RetryPolicy,
    StepMapFailed,
    StepRetryExhausted,
    StepStore,
    current_job,
)
from flexiq_plugins._attempt import decisions
from flexiq_plugins.errors import ConcurrentStep, Disposition, DuplicateStepKey, InvalidStepOption, classify
from flexiq_plugins.testing import DurableRun, FakeClock, SimulatedCrash
from tests.core.conftest import Harness
from tests.polling import wait_for


class CountingStore(MemoryStepStore):
    """A memory store that keeps the rows of each commit transaction and counts every other write of an attempt."""

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        super().__init__(clock)
        self.commits: list[list[str]] = []
        self.other_writes = 0

    def commit_step(self, claim: Any, row: Any) -> Any:
        self.commits.append([row.step_key])
        return super().commit_step(claim, row)

    def commit_steps(self, claim: Any, rows: Any) -> Any:
        self.commits.append([row.step_key for row in rows])
        return super().commit_steps(claim, rows)

    def begin_step_attempt(self, *args: Any, **kwargs: Any) -> Any:
        self.other_writes += 1
        return super().begin_step_attempt(*args, **kwargs)

    def fail_step_attempt(self, *args: Any, **kwargs: Any) -> Any:
        self.other_writes += 1
        return super().fail_step_attempt(*args, **kwargs)


KEEP = DurableConfig(keep_succeeded_steps=True)
"""Succeeded runs keep their step rows here, so the tests can look at them."""


@pytest.fixture
def durable_run(flexiq_store: MemoryStepStore, flexiq_clock: FakeClock) -> Callable[..., DurableRun]:
    """``durable_run(body)``: the plugin's fixture, keeping the rows of a succeeded run (``KEEP``)."""

    def make(body: Callable[..., Any], **kwargs: Any) -> DurableRun:
        kwargs.setdefault("config", KEEP)
        return DurableRun(body, store=flexiq_store, clock=flexiq_clock, **kwargs)

    return make


@pytest.fixture
def counting_run(flexiq_clock: FakeClock) -> Callable[..., DurableRun]:
    """``counting_run(body)``: a ``DurableRun`` of ``body`` on a fresh ``CountingStore`` (``run.store``)."""

    def make(body: Callable[..., Any], **kwargs: Any) -> DurableRun:
        return DurableRun(body, store=CountingStore(flexiq_clock), clock=flexiq_clock, config=KEEP, **kwargs)

    return make


class Calls:
    """What the item bodies did: each call's item and idempotency key, thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.seen: list[tuple[Any, str]] = []

    def note(self, item: Any) -> int:
        """Record a call of ``item``'s body; return how many calls of it there are now."""
        with self._lock:
            self.seen.append((item, current_job.step.idempotency_key))
            return sum(1 for i, _ in self.seen if i == item)

    def count(self, item: Any) -> int:
        with self._lock:
            return sum(1 for i, _ in self.seen if i == item)


# ------------------------------------------------------------- the basics
def test_c51_c7_c10_a_map_returns_each_items_decoded_value_in_the_order_of_the_items(durable_run):
    """``step.map`` returns the values in the order of ``items`` (not of completion), each decoded from its stored
    bytes (a tuple under JSON is a list, C7); the map's entry ``price#0`` (kind ``map``) and one keyed row per item
    are committed; inside each body the idempotency key is ``"<run key>:price:<key>"`` (C10)."""
    calls = Calls()

    def quote(sku: str) -> tuple[str, int]:
        calls.note(sku)
        return (sku, len(sku))

    def body() -> list[Any]:
        return current_job.step.map("price", quote, ["ab", "c", "def"], key=lambda sku: sku)

    run = durable_run(body, run_key="r-1")
    result = run.attempt()

    assert result.completed
    assert result.value == [["ab", 2], ["c", 1], ["def", 3]]
    assert sorted(calls.seen) == [("ab", "r-1:price:ab"), ("c", "r-1:price:c"), ("def", "r-1:price:def")]
    rows = run.steps
    assert (rows[0].step_key, rows[0].kind, rows[0].value) == ("price#0", "map", None)
    items = sorted((r.step_key, r.kind) for r in rows[1:])
    assert items == [("price:ab", "run"), ("price:c", "run"), ("price:def", "run")]


def test_c51_the_items_bodies_run_at_the_same_time(durable_run):
    """Four items with ``max_concurrency=4`` meet at a barrier of four inside their bodies: they only pass it if all
    four run at once."""
    barrier = threading.Barrier(4, timeout=10)

    def fetch(n: int) -> int:
        barrier.wait()
        return n * 10

    result = durable_run(lambda: current_job.step.map("fetch", fetch, range(4), key=int, max_concurrency=4)).attempt()

    assert result.completed
    assert result.value == [0, 10, 20, 30]


def test_c51_max_concurrency_bounds_how_many_bodies_run_at_once(durable_run):
    """Six items with ``max_concurrency=2``: the bodies meet in pairs at a barrier of two, and never more than two
    run at once."""
    barrier = threading.Barrier(2, timeout=10)
    lock = threading.Lock()
    running = [0, 0]  # now, peak

    def fetch(n: int) -> int:
        with lock:
            running[0] += 1
            running[1] = max(running)
        barrier.wait()
        with lock:
            running[0] -= 1
        return n

    result = durable_run(lambda: current_job.step.map("fetch", fetch, range(6), key=int, max_concurrency=2)).attempt()

    assert result.completed
    assert running[1] == 2


def test_c51_an_empty_map_returns_an_empty_list_and_takes_its_place(durable_run):
    """A map of no items returns ``[]`` and commits its entry alone, so the steps after it keep their places on
    replay."""
    attempts: list[int] = []

    def body() -> str:
        assert current_job.step.map("fetch", lambda n: n, [], key=int) == []
        current_job.step.run("ship", lambda: "shipped")
        attempts.append(current_job.attempt)
        if len(attempts) == 1:
            raise ConnectionError("retry the task")
        return "done"

    run = durable_run(body)
    assert run.attempt().failed
    assert run.attempt().completed
    assert run.step_keys == ["fetch#0", "ship#0"]


# ------------------------------------------------------------ replay (C5, C9)
def test_c51_c5_c6_a_replay_runs_only_the_items_not_committed(durable_run):
    """Item ``c`` raises on its first call: the attempt fails with one ``StepMapFailed`` after the others committed;
    the next attempt calls only ``c`` (C5, C6) and returns every value."""
    calls = Calls()

    def fetch(item: str) -> str:
        if calls.note(item) == 1 and item == "c":
            raise ConnectionError("c is down")
        return item.upper()

    run = durable_run(lambda: current_job.step.map("fetch", fetch, "abcd", key=str))
    first = run.attempt()
    second = run.attempt()

    assert first.failed
    assert isinstance(first.error, StepMapFailed)
    assert second.completed
    assert second.value == ["A", "B", "C", "D"]
    assert [calls.count(item) for item in "abcd"] == [1, 1, 2, 1]


def test_c9_a_replayed_map_writes_nothing_to_the_store(counting_run):
    """Once every item is committed, a replay of the map calls no body and makes no store write (C9)."""
    calls = Calls()
    attempts: list[int] = []

    def body() -> list[int]:
        values = current_job.step.map("fetch", lambda n: calls.note(n) and n, range(5), key=int)
        attempts.append(1)
        if len(attempts) == 1:
            raise ConnectionError("fail after the map")
        return values

    run = counting_run(body)
    assert run.attempt().failed
    commits, writes = list(run.store.commits), run.store.other_writes
    result = run.attempt()

    assert result.completed
    assert result.value == [0, 1, 2, 3, 4]
    assert (run.store.commits, run.store.other_writes) == (commits, writes)
    assert len(calls.seen) == 5


def test_c51_items_that_return_together_are_committed_in_one_transaction():
    """``amap``: five items that all return in one turn of the event loop are committed, with the map's entry, in
    one transaction."""
    store = CountingStore()
    harness = Harness(store, DurableConfig())
    started: list[int] = []
    everyone = asyncio.Event()

    async def fetch(n: int) -> int:
        started.append(n)
        if len(started) == 5:
            everyone.set()
        await everyone.wait()
        return n

    async def body() -> list[int]:
        return await current_job.step.amap("fetch", fetch, range(5), key=int)

    decision = asyncio.run(harness.start().arun(body))

    assert isinstance(decision, decisions.Completed)
    assert decision.value == [0, 1, 2, 3, 4]
    assert store.commits == [["fetch#0", "fetch:0", "fetch:1", "fetch:2", "fetch:3", "fetch:4"]]


# -------------------------------------------------------------- identity
def test_c3_c51_two_items_with_one_key_are_refused_before_any_body_runs(durable_run):
    """Two items whose key function gives the same key: ``DuplicateStepKey``, dead-lettered, no body called and
    nothing committed (C3)."""
    calls = Calls()
    run = durable_run(lambda: current_job.step.map("fetch", calls.note, ["a", "b", "A"], key=str.lower))
    result = run.attempt()

    assert result.dead_lettered
    assert isinstance(result.error, DuplicateStepKey)
    assert "'fetch:a'" in str(result.error)
    assert calls.seen == []
    assert run.steps == []


def test_c3_an_items_key_used_by_an_earlier_step_of_the_attempt_is_a_duplicate(durable_run):
    """An item ``fetch:a`` after a keyed ``step.run("fetch", key="a")`` is refused with ``DuplicateStepKey`` (C3)."""

    def body() -> None:
        current_job.step.run("fetch", lambda: 1, key="a")
        current_job.step.map("fetch", lambda item: item, ["b", "a"], key=str)

    result = durable_run(body).attempt()
    assert result.dead_lettered
    assert isinstance(result.error, DuplicateStepKey)


@pytest.mark.parametrize(
    ("options", "problem"),
    [({"key": "id"}, "not callable"), ({"key": str, "max_concurrency": 0}, "max_concurrency=0")],
)
def test_c51_a_map_needs_a_key_function_and_a_positive_concurrency(durable_run, options, problem):
    """``key`` must be callable and ``max_concurrency`` an int of at least 1: ``InvalidStepOption``, dead-lettered,
    before any body runs."""
    calls = Calls()
    result = durable_run(lambda: current_job.step.map("fetch", calls.note, ["a"], **options)).attempt()

    assert result.dead_lettered
    assert isinstance(result.error, InvalidStepOption)
    assert problem in str(result.error)
    assert calls.seen == []


# ------------------------------------------------------- one step at a time (C8)
def test_c8_a_step_started_inside_an_items_body_fails_the_attempt(durable_run):
    """An item's body that starts a step (even catching the refusal) fails the attempt with ``ConcurrentStep``
    naming the map; dead-lettered."""

    def fetch(item: str) -> str:
        with contextlib.suppress(ConcurrentStep):
            current_job.step.run("inner", lambda: 1)
        return item

    result = durable_run(lambda: current_job.step.map("fetch", fetch, ["a"], key=str)).attempt()

    assert result.dead_lettered
    assert isinstance(result.error, ConcurrentStep)
    assert "'fetch#0'" in str(result.error)


def test_c8_a_step_started_from_another_thread_while_a_map_runs_is_refused(durable_run):
    """While an item's body runs, a step started by another thread of the task fails with ``ConcurrentStep``, and
    the attempt is dead-lettered."""
    inside, tried = threading.Event(), threading.Event()
    refused: list[BaseException] = []

    def fetch(item: str) -> str:
        inside.set()
        assert tried.wait(10), "the other thread never tried its step"
        return item

    def body() -> None:
        step = current_job.step

        def other() -> None:
            assert inside.wait(10), "the item never started"
            try:
                step.run("other", lambda: 1)
            except ConcurrentStep as exc:
                refused.append(exc)
            tried.set()

        thread = threading.Thread(target=other)
        thread.start()
        step.map("fetch", fetch, ["a"], key=str)
        thread.join(10)

    result = durable_run(body).attempt()

    assert len(refused) == 1
    assert result.dead_lettered
    assert isinstance(result.error, ConcurrentStep)


# ------------------------------------------------------------ failures
def test_c51_failed_items_are_raised_once_as_a_group_after_the_others_committed(durable_run):
    """Two of four items fail: the others are committed, and the call raises one ``StepMapFailed`` (an
    ``ExceptionGroup``, retryable by the task) holding both errors with their step keys, in item order."""
    calls = Calls()

    def fetch(item: str) -> str:
        calls.note(item)
        if item in "bd":
            raise ValueError(f"no price for {item}")
        return item

    run = durable_run(lambda: current_job.step.map("fetch", fetch, "abcd", key=str))
    result = run.attempt()

    assert result.failed
    group = result.error
    assert isinstance(group, StepMapFailed)
    assert classify(group) is Disposition.RETRY
    assert group.step_keys == ("fetch:b", "fetch:d")
    assert [str(e) for e in group.exceptions] == ["no price for b", "no price for d"]
    assert "2 of 4 items of step map 'fetch#0' failed" in str(group)
    assert sorted(run.step_keys) == ["fetch#0", "fetch:a", "fetch:c"]
    assert len(calls.seen) == 4


def test_c51_a_map_whose_failure_the_body_caught_keeps_its_place(durable_run):
    """A body that catches the map's ``StepMapFailed`` and goes on: the map keeps its place, so the steps after it
    replay without a divergence, and the failed item runs again on the next attempt."""
    caught: list[list[str]] = []
    attempts: list[int] = []

    def fetch(item: str) -> str:
        if item == "b" and not attempts:
            raise ValueError("b is late")
        return item

    def body() -> str:
        try:
            current_job.step.map("fetch", fetch, "ab", key=str)
        except StepMapFailed as group:
            caught.append([str(e) for e in group.exceptions])
        current_job.step.run("ship", lambda: "shipped")
        attempts.append(1)
        if len(attempts) == 1:
            raise ConnectionError("retry the task")
        return "done"

    run = durable_run(body)
    assert run.attempt().failed
    assert run.attempt().completed
    assert caught == [["b is late"]]
    assert run.step_keys[:2] == ["fetch#0", "fetch:a"]
    assert set(run.step_keys[2:]) == {"ship#0", "fetch:b"}


@pytest.mark.skipif(sys.version_info < (3, 11), reason="ExceptionGroup is a builtin from Python 3.11 on")
def test_c51_on_python_3_11_the_group_is_an_exception_group(durable_run):
    """From Python 3.11 on ``StepMapFailed`` is an ``ExceptionGroup``: ``split`` (what ``except*`` uses) picks the
    items' errors by type."""

    def fetch(item: str) -> str:
        raise (ValueError if item == "a" else KeyError)(item)

    group = durable_run(lambda: current_job.step.map("fetch", fetch, "ab", key=str)).attempt().error

    assert isinstance(group, builtins.ExceptionGroup)  # type: ignore[attr-defined]
    values, rest = group.split(ValueError)
    assert [str(e) for e in values.exceptions] == ["a"]
    assert [type(e) for e in rest.exceptions] == [KeyError]


@pytest.mark.skipif(sys.version_info >= (3, 11), reason="from Python 3.11 on it is an ExceptionGroup (test above)")
def test_c51_on_python_3_10_the_group_is_an_exception_with_its_message_and_exceptions():
    """Where Python has no ``ExceptionGroup`` (3.10), ``StepMapFailed`` is an ``Exception`` with the same
    ``message``, ``exceptions`` and ``str()`` as a group's."""
    failed = StepMapFailed("2 items failed", [ValueError("a"), KeyError("b")], ["m:a", "m:b"])

    assert isinstance(failed, Exception)
    assert failed.message == "2 items failed"
    assert [type(e) for e in failed.exceptions] == [ValueError, KeyError]
    assert failed.step_keys == ("m:a", "m:b")
    assert str(failed) == "2 items failed (2 sub-exceptions)"


def test_c31_an_item_failed_for_good_fails_the_run_for_good(durable_run):
    """An item raising ``NonRetryableError`` is stored as failed for good; the group is marked final, so the run is
    dead-lettered (reason ``non_retryable``) without a task retry."""

    def fetch(item: str) -> str:
        if item == "b":
            raise NonRetryableError("unknown sku")
        return item

    run = durable_run(lambda: current_job.step.map("fetch", fetch, "abc", key=str))
    result = run.attempt()

    assert result.dead_lettered
    assert result.decision.reason == "non_retryable"
    assert isinstance(result.error, StepMapFailed)
    assert "fetch:b" in run.step_keys
    assert [r.failure is not None for r in run.steps if r.step_key == "fetch:b"] == [True]


# ------------------------------------------------------------ divergence (C12, C14)
def test_c12_a_map_at_the_place_of_a_recorded_run_diverges(durable_run):
    """A deploy replaces ``step.run("fetch")`` by ``step.map("fetch", ...)``: the replay dead-letters with
    ``divergence`` naming the recorded ``fetch#0`` and the running map."""

    def body() -> None:
        if current_job.attempt == 1:
            current_job.step.run("fetch", lambda: 1)
            raise ConnectionError("retry the task")
        current_job.step.map("fetch", lambda item: item, "ab", key=str)

    run = durable_run(body)
    assert run.attempt().failed
    result = run.attempt()

    assert result.dead_lettered
    assert result.decision.reason == "divergence"
    assert "now 'fetch#0 (map)'" in str(result.error)


def test_c12_a_run_at_the_place_of_a_recorded_map_diverges(durable_run):
    """The reverse: a recorded map's place taken by a ``step.run`` of the same name is a divergence too."""

    def body() -> None:
        if current_job.attempt == 1:
            current_job.step.map("fetch", lambda item: item, "ab", key=str)
            raise ConnectionError("retry the task")
        current_job.step.run("fetch", lambda: 1)

    run = durable_run(body)
    assert run.attempt().failed
    result = run.attempt()

    assert result.dead_lettered
    assert result.decision.reason == "divergence"


def test_c14_an_item_set_that_shrank_replays_and_logs_the_keys_not_reached(durable_run, caplog):
    """Items removed between attempts are not a divergence: the run succeeds and one warning names the keys not
    reached."""
    items = ["a", "b", "c"]

    def body() -> list[str]:
        values = current_job.step.map("fetch", str.upper, list(items), key=str)
        if current_job.attempt == 1:
            raise ConnectionError("retry the task")
        return values

    run = durable_run(body)
    assert run.attempt().failed
    items.remove("c")
    with caplog.at_level(logging.WARNING, logger="flexiq_plugins"):
        result = run.attempt()

    assert result.completed
    assert result.value == ["A", "B"]
    warnings = [r.getMessage() for r in caplog.records if "without reaching" in r.getMessage()]
    assert len(warnings) == 1
    assert "fetch:c" in warnings[0]


def test_c51_items_added_between_attempts_run_and_the_others_replay(durable_run):
    """Items added between attempts run and commit; the ones committed before replay without calling their body."""
    calls = Calls()
    items = ["a", "b"]

    def body() -> list[str]:
        values = current_job.step.map("fetch", lambda item: calls.note(item) and item, list(items), key=str)
        if current_job.attempt == 1:
            raise ConnectionError("retry the task")
        return values

    run = durable_run(body)
    assert run.attempt().failed
    items.append("c")
    result = run.attempt()

    assert result.completed
    assert result.value == ["a", "b", "c"]
    assert [calls.count(item) for item in "abc"] == [1, 1, 1]


# ------------------------------------------------------------ caps and codec (C7, C22)
def test_c22_an_item_over_the_step_bytes_limit_stops_the_call_and_dead_letters(flexiq_clock):
    """An item's value over ``step_bytes`` refuses its commit: the call stops, the job is dead-lettered
    (``size_limit``) with the usual message, and no row of that item is stored."""

    def fetch(item: str) -> str:
        return item * (300 if item == "big" else 1)

    run = DurableRun(
        lambda: current_job.step.map("fetch", fetch, ["big"], key=str),
        clock=flexiq_clock,
        config=DurableConfig(step_bytes=200, keep_succeeded_steps=True),
    )
    result = run.attempt()

    assert result.dead_lettered
    assert result.decision.reason == "size_limit"
    assert "step 'fetch:big' exceeds the step bytes limit" in str(result.error)
    assert run.steps == []


def test_c7_c29_an_item_value_the_serializer_cannot_encode_dead_letters(durable_run):
    """An item returning a value JSON cannot encode fails the call with ``EncodeError``: dead-lettered
    (``unencodable_value``), the item not committed."""
    run = durable_run(lambda: current_job.step.map("fetch", lambda item: object(), ["a"], key=str))
    result = run.attempt()

    assert result.dead_lettered
    assert result.decision.reason == "unencodable_value"
    assert "fetch:a" not in run.step_keys


def test_c51_map_refuses_a_body_that_returns_an_awaitable(durable_run):
    """``step.map`` does not await: an async body is refused (``InvalidStepBody``, naming ``amap``)."""

    async def fetch(item: str) -> str:
        return item

    result = durable_run(lambda: current_job.step.map("fetch", fetch, ["a"], key=str)).attempt()

    assert result.dead_lettered
    assert result.decision.reason == "invalid_step_body"
    assert "step.amap" in str(result.error)


# ------------------------------------------------------------ budgets and undos (C31, C32)
def test_c31_an_item_with_attempts_left_comes_back_alone_after_its_backoff(durable_run):
    """``retry=RetryPolicy(max_attempts=3)``: item ``b`` fails once; the others commit, the attempt ends like a
    step retry (no task retry), and after the backoff only ``b`` runs again."""
    calls = Calls()

    def fetch(item: str) -> str:
        if calls.note(item) == 1 and item == "b":
            raise ConnectionError("b is down")
        return item

    run = durable_run(
        lambda: current_job.step.map("fetch", fetch, "abc", key=str, retry=RetryPolicy(max_attempts=3, initial_delay=5))
    )
    first = run.attempt()
    assert first.step_retrying
    run.wake()
    second = run.attempt()

    assert second.completed
    assert second.value == ["a", "b", "c"]
    assert [calls.count(item) for item in "abc"] == [1, 2, 1]
    assert [(a.step_key, a.number, a.ended) for a in run.step_attempts if a.step_key == "fetch:b"] == [
        ("fetch:b", 1, "failed"),
        ("fetch:b", 2, None),
    ]


def test_c31_an_item_whose_budget_is_spent_fails_the_run_for_good(durable_run):
    """An item failing on each of its ``max_attempts=2`` attempts: the run is dead-lettered
    (``step_retry_exhausted``), the group holding the item's ``StepRetryExhausted``."""

    def fetch(item: str) -> str:
        if item == "b":
            raise ConnectionError("b is down")
        return item

    run = durable_run(
        lambda: current_job.step.map("fetch", fetch, "ab", key=str, retry=RetryPolicy(max_attempts=2, initial_delay=1))
    )
    assert run.attempt().step_retrying
    run.wake()
    result = run.attempt()

    assert result.dead_lettered
    assert result.decision.reason == "step_retry_exhausted"
    assert isinstance(result.error, StepMapFailed)
    assert [type(e) for e in result.error.exceptions] == [StepRetryExhausted]


def test_c32_the_items_undos_run_in_reverse_commit_order_when_the_run_fails_for_good(durable_run):
    """``compensate=``: each committed item registers its undo; when a later step fails for good, every item is
    undone once, the last committed first."""
    undone: list[str] = []

    def body() -> None:
        current_job.step.map("reserve", str.upper, "abc", key=str, compensate=undone.append)
        current_job.step.run("charge", _declined)

    run = durable_run(body)
    result = run.attempt()

    assert result.dead_lettered
    assert run.status == "compensated"
    committed = [r.step_key.removeprefix("reserve:").upper() for r in run.steps if r.step_key.startswith("reserve:")]
    assert undone == list(reversed(committed))
    assert sorted(undone) == ["A", "B", "C"]


def _declined() -> None:
    raise NonRetryableError("card declined")


def test_c34_a_cancellation_seen_at_an_items_commit_stops_the_map_and_undoes_its_items(durable_run, flexiq_store):
    """A cancellation requested while the map runs is seen at the next commit: no more items start, the committed
    ones are undone, and the run ends ``cancelled``."""
    undone: list[str] = []
    calls = Calls()

    def fetch(item: str) -> str:
        calls.note(item)
        if item == "a":
            flexiq_store.request_cancel(current_job.run_key, "customer asked")
        return item

    run = durable_run(
        lambda: current_job.step.map("fetch", fetch, "abc", key=str, max_concurrency=1, compensate=undone.append)
    )
    result = run.attempt()

    assert result.cancelled
    assert run.status == "cancelled"
    assert [item for item, _ in calls.seen] == ["a"]
    assert undone == ["a"]


# ------------------------------------------------------------ crashes
def test_c51_c6_a_crash_mid_map_reruns_only_the_items_not_committed(durable_run):
    """The worker dies inside item ``c`` once ``a`` and ``b`` are committed (``d`` may or may not have been): the
    next attempt takes the claim over and calls only the items with no row; each committed item ran once."""
    calls = Calls()
    run: DurableRun

    def fetch(item: str) -> str:
        n = calls.note(item)
        if item == "c" and n == 1:
            wait_for(lambda: {"fetch:a", "fetch:b"} <= set(run.step_keys), 10, "a and b to commit")
            raise SimulatedCrash("killed inside c")
        return item

    run = durable_run(lambda: current_job.step.map("fetch", fetch, "abcd", key=str, max_concurrency=4))
    assert run.attempt().crashed
    committed = {key.removeprefix("fetch:") for key in run.step_keys if key.startswith("fetch:")}
    result = run.attempt()

    assert result.completed
    assert result.value == ["a", "b", "c", "d"]
    assert {"a", "b"} <= committed
    assert "c" not in committed
    for item in "abcd":
        assert calls.count(item) == (1 if item in committed else 2), item


def test_c51_c25_a_crash_loop_mid_map_converges_each_attempt_keeping_what_it_committed(durable_run):
    """Three attempts in a row die inside the map, each after a few more items committed: every attempt runs only
    what is missing, no committed item runs again, and the fourth attempt finishes (C25: three takeovers)."""
    calls = Calls()
    crash_at = {"c": 1, "f": 1, "i": 1}
    run: DurableRun

    def fetch(item: str) -> str:
        n = calls.note(item)
        if crash_at.get(item) == n:
            before = {chr(ord(item) - 1), chr(ord(item) - 2)}
            wait_for(lambda: {f"fetch:{b}" for b in before} <= set(run.step_keys), 10, f"{before} to commit")
            raise SimulatedCrash(f"killed inside {item}")
        return item

    items = "abcdefghij"
    run = durable_run(lambda: current_job.step.map("fetch", fetch, items, key=str, max_concurrency=1))
    results = [run.attempt() for _ in range(4)]

    assert [r.crashed for r in results] == [True, True, True, False]
    assert results[-1].value == list(items)
    assert [calls.count(item) for item in items] == [1, 1, 2, 1, 1, 2, 1, 1, 2, 1]
    assert run.record.takeovers == 3


# ------------------------------------------------------------ amap
def test_c51_amap_runs_async_bodies_as_tasks_at_the_same_time(harness):
    """``amap``: every body starts before any returns (they wait for each other), and the values come back in the
    order of the items, each with its own idempotency key."""
    started: list[str] = []
    keys: list[str] = []
    everyone = asyncio.Event()

    async def fetch(item: str) -> str:
        started.append(item)
        keys.append(current_job.step.idempotency_key)
        if len(started) == 3:
            everyone.set()
        await everyone.wait()
        return item.upper()

    async def body() -> list[str]:
        return await current_job.step.amap("fetch", fetch, "abc", key=str)

    decision = asyncio.run(harness.start().arun(body))

    assert isinstance(decision, decisions.Completed)
    assert decision.value == ["A", "B", "C"]
    assert sorted(keys) == ["run-1:fetch:a", "run-1:fetch:b", "run-1:fetch:c"]


def test_c51_amap_cancels_the_items_still_running_when_the_call_stops(harness):
    """An item whose value cannot be encoded stops the ``amap``: the items still running are cancelled (they
    commit nothing) and the job is dead-lettered."""
    cancelled: list[str] = []

    async def fetch(item: str) -> Any:
        if item == "bad":
            return object()
        try:
            await asyncio.Event().wait()  # never set: only a cancellation ends it
        except asyncio.CancelledError:
            cancelled.append(item)
            raise

    async def body() -> list[Any]:
        return await current_job.step.amap("fetch", fetch, ["slow-1", "bad", "slow-2"], key=str)

    decision = asyncio.run(harness.start().arun(body))

    assert isinstance(decision, decisions.DeadLetter)
    assert decision.reason == "unencodable_value"
    assert sorted(cancelled) == ["slow-1", "slow-2"]
    assert [r.step_key for r in harness.store.get_steps(harness.run_key)] == []


# ------------------------------------------------------------ many items, every store
@pytest.mark.timeout(120)
def test_c51_a_1000_item_map_commits_every_item_in_far_fewer_transactions(store: StepStore):
    """1,000 items on every store: all values come back in order, 1,001 rows are stored (the entry and the
    items), in fewer commit transactions than half the items; a replay calls no body."""
    commits: list[int] = []
    real = store.commit_steps

    def counted(claim: Any, rows: Any) -> Any:
        commits.append(len(rows))
        return real(claim, rows)

    store.commit_steps = counted  # type: ignore[method-assign]
    calls = Calls()
    attempts: list[int] = []

    def body() -> list[int]:
        values = current_job.step.map("n", lambda n: calls.note(n) and n * 2, range(1000), key=int)
        attempts.append(1)
        if len(attempts) == 1:
            raise ConnectionError("retry the task")
        return values

    run = DurableRun(body, store=store, config=KEEP)
    assert run.attempt().failed
    result = run.attempt()

    assert result.completed
    assert result.value == [n * 2 for n in range(1000)]
    assert len(calls.seen) == 1000
    assert sum(commits) == 1001
    assert len(commits) <= 500, commits
    assert store.get_run(run.run_key).step_count == 1001
