"""The SQLite store's writer gate (C43: a durable job costs its commits, not SQLite's busy sleeps).

Write transactions on one SQLite file queue for its write lock and are woken
in turn (``flexiq_plugins/_store/sql/sqlite_gate.py``): in a process on a
lock, across processes on a POSIX lock of ``<database>-writer-lock``. These
tests watch that lock from other, real processes: ``lockf`` locks are per
process, so only another process can see one held.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flexiq_plugins._model.records import JobEnvelope, StepRow
from flexiq_plugins._store.sql import SqlStepStore
from flexiq_plugins._store.sql.engine import READ_ONLY
from flexiq_plugins._store.sql.sqlite_gate import LOCK_FILE_SUFFIX, WriterGate, writer_gate
from flexiq_plugins.errors import StoreUnavailable
from tests.polling import wait_for

pytestmark = pytest.mark.skipif(os.name != "posix", reason="the writer lock file is a POSIX lock")

ENVELOPE = JobEnvelope(task_name="shop.checkout", framework="test", args=[1])

_PROBE = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
try:
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
except OSError:
    print("held")
else:
    print("free")
"""


def lock_state(lock_file: str) -> str:
    """``held`` or ``free``: whether another process could take the writer lock now (asked in a new process)."""
    probe = subprocess.run([sys.executable, "-c", _PROBE, lock_file], capture_output=True, text=True, check=True)
    return probe.stdout.strip()


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[SqlStepStore]:
    store = SqlStepStore(f"sqlite:///{tmp_path / 'steps.db'}")
    store.now()  # creates the schema
    try:
        yield store
    finally:
        store.close()


def lock_file_of(store: SqlStepStore) -> str:
    return os.path.realpath(store.engine.url.database or "") + LOCK_FILE_SUFFIX


def test_c43_a_sqlite_write_transaction_holds_the_file_writer_lock_until_it_commits(
    sqlite_store: SqlStepStore,
) -> None:
    """Another process sees the writer lock held from a write transaction's BEGIN to its COMMIT, and free
    after; a read-only transaction takes nothing (WAL readers run beside the writer)."""
    lock_file = lock_file_of(sqlite_store)
    with sqlite_store.engine.connect() as reader:
        reader.execution_options(**{READ_ONLY: True})
        with reader.begin():
            reader.exec_driver_sql("SELECT 1").scalar_one()
            assert lock_state(lock_file) == "free"
    with sqlite_store.engine.begin() as conn:
        conn.exec_driver_sql("SELECT 1").scalar_one()
        assert lock_state(lock_file) == "held"
    assert lock_state(lock_file) == "free"


def test_c43_the_writer_lock_is_released_by_a_rollback_an_error_and_a_closed_connection(
    sqlite_store: SqlStepStore,
) -> None:
    """However a write transaction ends (rolled back, an exception inside it, its connection invalidated
    mid-transaction), the lock is free after it, and the next writer gets it."""
    lock_file = lock_file_of(sqlite_store)
    engine = sqlite_store.engine
    with engine.connect() as conn:
        transaction = conn.begin()
        assert lock_state(lock_file) == "held"
        transaction.rollback()
        assert lock_state(lock_file) == "free"

    def fails_inside() -> None:
        with engine.begin() as conn:
            conn.exec_driver_sql("SELECT 1")
            raise ZeroDivisionError

    with pytest.raises(ZeroDivisionError):
        fails_inside()
    assert lock_state(lock_file) == "free"
    with engine.connect() as conn:
        conn.begin()
        assert lock_state(lock_file) == "held"
        conn.invalidate()
        assert lock_state(lock_file) == "free"
    with engine.begin() as conn:
        assert lock_state(lock_file) == "held"
    assert lock_state(lock_file) == "free"


def _write_one_run(url: str, run_key: str, about_to_write: Any = None) -> None:
    store = SqlStepStore(url)
    store.now()  # opened: the write below is the first to wait
    if about_to_write is not None:
        about_to_write.set()
    try:
        store.record_queued(run_key, "job-1", ENVELOPE)
    finally:
        store.close()


def test_c43_a_writer_of_another_process_waits_for_the_writer_lock_and_commits_once_it_is_released(
    sqlite_store: SqlStepStore,
) -> None:
    """While this process holds a write transaction, another process's store write waits for it and commits
    once the transaction here ends: nothing is refused as busy."""
    url = str(sqlite_store.engine.url)
    spawn = multiprocessing.get_context("spawn")
    about_to_write = spawn.Event()
    with sqlite_store.engine.begin() as conn:
        conn.exec_driver_sql("SELECT 1")
        child = spawn.Process(target=_write_one_run, args=(url, "run-from-the-other-process", about_to_write))
        child.start()
        assert about_to_write.wait(60)
        assert lock_state(lock_file_of(sqlite_store)) == "held"
    child.join(60)
    assert child.exitcode == 0
    assert sqlite_store.get_run("run-from-the-other-process").status == "queued"


def test_c43_a_write_that_cannot_enter_the_gate_in_time_fails_as_busy_instead_of_hanging(
    sqlite_store: SqlStepStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process holds the writer lock and does not let go (stopped inside its transaction): a write
    here fails with ``StoreUnavailable`` ("database is locked") after the busy timeout, as SQLite's own
    wait would, and nothing is written; once the other process ends, the same write goes through."""
    url = str(sqlite_store.engine.url)
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, url], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "inside"
        gate = writer_gate(sqlite_store.engine.url.database or "", 30)
        monkeypatch.setattr(gate, "timeout", 0.5)
        with pytest.raises(StoreUnavailable, match="database is locked"):
            sqlite_store.record_queued("run-while-locked", "job-1", ENVELOPE)
        assert gate.owner is None
    finally:
        holder.kill()
        holder.wait()
    sqlite_store.record_queued("run-while-locked", "job-1", ENVELOPE)
    assert sqlite_store.get_run("run-while-locked").status == "queued"


_HOLDER = """
import sys
from flexiq_plugins._store.sql import SqlStepStore
store = SqlStepStore(sys.argv[1])
with store.engine.begin() as conn:
    conn.exec_driver_sql("SELECT 1")
    print("inside", flush=True)
    sys.stdin.read()
"""


def test_c43_a_fork_waits_for_the_write_transactions_of_other_threads_and_the_child_can_write(
    sqlite_store: SqlStepStore,
) -> None:
    """A fork (Celery's prefork pool replacing a child while the worker's sweeper writes) waits until the
    other threads' write transactions have ended: a child forked inside one would believe forever that a
    connection of its own holds SQLite's write lock, and fail every write as busy. The child writes."""
    inside, release = threading.Event(), threading.Event()

    def hold() -> None:
        with sqlite_store.engine.begin() as conn:
            conn.exec_driver_sql("SELECT 1")
            inside.set()
            release.wait(60)

    holder = threading.Thread(target=hold)
    holder.start()
    children: list[multiprocessing.process.BaseProcess] = []

    def fork_child() -> None:
        child = multiprocessing.get_context("fork").Process(
            target=sqlite_store.record_queued, args=("run-forked", "job-1", ENVELOPE)
        )
        child.start()
        children.append(child)

    try:
        assert inside.wait(60)
        forker = threading.Thread(target=fork_child)
        forker.start()
        wait_for(lambda: "_hold_for_fork" in stack_of(forker), 60, "the fork to wait for the open write transaction")
        assert not children
    finally:
        release.set()
        holder.join(60)
    forker.join(60)
    (child,) = children
    child.join(60)
    assert child.exitcode == 0
    assert sqlite_store.get_run("run-forked").status == "queued"


def stack_of(thread: threading.Thread) -> str:
    """The names of the functions ``thread`` is in now."""
    frame = sys._current_frames().get(thread.ident or 0)
    names = []
    while frame is not None:
        names.append(frame.f_code.co_name)
        frame = frame.f_back
    return " ".join(names)


def test_c43_writers_of_two_processes_and_several_threads_all_commit_every_step(tmp_path: Path) -> None:
    """Two processes of four threads each start runs and commit steps on one SQLite file at once: every
    step of every run is stored, none refused as busy."""
    url = f"sqlite:///{tmp_path / 'steps.db'}"
    store = SqlStepStore(url)
    store.now()
    spawn = multiprocessing.get_context("spawn")
    children = [spawn.Process(target=_busy_writer, args=(url, f"p{n}")) for n in range(2)]
    for child in children:
        child.start()
    for child in children:
        child.join(300)
        assert child.exitcode == 0
    try:
        for process in ("p0", "p1"):
            for thread in range(4):
                for run in range(10):
                    steps = store.get_steps(f"{process}-t{thread}-r{run}")
                    assert [s.step_key for s in steps] == ["a#0", "b#0", "c#0"]
    finally:
        store.close()


def _busy_writer(url: str, name: str) -> None:
    store = SqlStepStore(url)

    def runs(thread: int) -> None:
        for run in range(10):
            run_key = f"{name}-t{thread}-r{run}"
            begun = store.begin(run_key, "job-1", ENVELOPE, f"{name}-{thread}", 30.0)
            claim = begun.claim  # type: ignore[union-attr]
            with store.held():
                for position, step in enumerate("abc"):
                    store.commit_step(claim, StepRow(position, f"{step}#0", "run", value=b"1"))

    threads = [threading.Thread(target=runs, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    store.close()


def test_c43_a_wait_on_the_gate_that_lasts_its_timeout_fails_as_busy_and_a_leaked_gate_is_taken_back(
    tmp_path: Path,
) -> None:
    """In one process: a writer that waits the timeout for another thread's transaction gets SQLite's "database
    is locked"; once the holder leaves, the next writer enters at once. A gate left taken by no writer (one
    interrupted as it entered) is taken back after the timeout instead of blocking every writer for good."""
    gate = WriterGate(str(tmp_path / "steps.db"), timeout=0.05)
    first, second = object(), object()
    gate.enter(first)
    with pytest.raises(sqlite3.OperationalError, match="database is locked"):
        gate.enter(second)
    assert gate.owner is first
    gate.leave(second)  # not its holder: nothing happens
    assert gate.owner is first
    gate.leave(first)
    gate.enter(second)
    assert gate.owner is second
    gate.leave(second)
    assert gate._queue.acquire(blocking=False)  # taken, and no owner recorded
    gate.enter(first)
    assert gate.owner is first
    gate.leave(first)


def test_c43_stores_of_one_process_on_the_same_file_share_its_gate(tmp_path: Path) -> None:
    """Two stores of one process on one file (written with different spellings of its path) share one gate."""
    path = tmp_path / "steps.db"
    assert writer_gate(str(path), 30) is writer_gate(str(tmp_path / "." / "steps.db"), 30)


def test_c43_a_read_only_sqlite_store_creates_no_writer_lock_file(tmp_path: Path) -> None:
    """A store opened read-only (``mode=ro``) never writes: it takes no gate and creates no lock file."""
    path = tmp_path / "steps.db"
    writer = SqlStepStore(f"sqlite:///{path}")
    writer.record_queued("run-1", "job-1", ENVELOPE)
    writer.close()
    Path(str(path) + LOCK_FILE_SUFFIX).unlink()
    reader = SqlStepStore(f"sqlite:///file:{path}?mode=ro&uri=true", auto_upgrade=False)
    try:
        assert reader.get_run("run-1").status == "queued"
    finally:
        reader.close()
    assert not Path(str(path) + LOCK_FILE_SUFFIX).exists()


def test_c43_the_writer_lock_file_is_closed_once_no_store_uses_its_database(tmp_path: Path) -> None:
    """A process that opens and closes stores on many SQLite files does not keep a lock file open for each:
    once no store of the process uses a file, its lock file is closed."""

    def lock_files_open() -> int:
        fds = Path("/proc/self/fd")
        return sum(1 for fd in fds.iterdir() if os.path.realpath(fd).endswith(LOCK_FILE_SUFFIX))

    if not Path("/proc/self/fd").exists():
        pytest.skip("needs Linux's /proc/self/fd")
    gc.collect()
    before = lock_files_open()
    for n in range(20):
        store = SqlStepStore(f"sqlite:///{tmp_path / f'steps-{n}.db'}")
        store.record_queued("run-1", "job-1", ENVELOPE)
        store.close()
        del store
    gc.collect()
    assert lock_files_open() == before
