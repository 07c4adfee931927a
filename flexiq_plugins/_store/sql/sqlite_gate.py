"""The SQLite store's writer gate: write transactions queue for the file's write lock and are woken in turn.

Why it exists: SQLite lets one write transaction at a time into a database
file. A connection that finds the file locked waits in SQLite's busy handler,
which sleeps 1, 2, 5, 10 … ms between tries and is not woken when the lock
frees. With several workers writing short transactions to one file (Celery's
prefork children, Dramatiq's processes and threads), the writers spent those
sleeps idle while the lock was free: with the gate, a Celery worker of two
processes runs about 20 % more 3-step jobs a second, where its machine was
idle a third of the time (``benchmarks/MEASUREMENTS.md``).

What it does: before its ``BEGIN IMMEDIATE``, a write transaction of the store
enters the gate of its database file; it leaves after its ``COMMIT`` or
``ROLLBACK``, or when its connection goes back to the pool or is closed.
Inside one process, writers queue on a lock, which wakes the next one as
soon as it is released. Across processes, the one writer of each process
at the gate takes a POSIX lock (``fcntl.lockf``) of a file beside the
database, ``<database>-writer-lock``: at once if it is free, else it tries
again every 0.05 ms, doubling up to every 1 ms (SQLite's own waits grow to
100 ms); the kernel drops the lock with a process that dies. Reads take
nothing (WAL lets them run beside a writer). A writer that has not entered
the gate within the busy timeout (30 s: a writer that stopped inside its
transaction) fails as SQLite's own wait would, "database is locked"
(`StoreUnavailable`).

What it does not change: SQLite's own lock still guards the data. A writer
that does not take the gate (another program, another version of this
library, a process where ``fcntl`` is missing or the lock file cannot be
created) is ordered by SQLite's busy handler as before.

Forks: a ``fork`` waits until no other thread of the process is at the gate
of a file (at most the busy timeout; not for the forking thread's own
transaction), and no new writer enters until the child exists. Why: SQLite's
in-memory record of the locks its connections hold is copied into the child,
but the locks are not (POSIX locks belong to a process), so a child forked
while its parent was writing believes forever that another connection of its
own holds the write lock, and every write it tries fails as busy. Celery's
prefork pool forks a new child whenever one exits, while the worker's
recovery sweeper writes in the parent. The child starts with every gate free.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
import weakref
from typing import Any

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: the gate orders this process's writers only
    fcntl = None  # type: ignore[assignment]

LOCK_FILE_SUFFIX = "-writer-lock"
"""The lock file's name is the database file's with this appended."""

_FIRST_RETRY_S = 0.00005
_LONGEST_RETRY_S = 0.001


class WriterGate:
    """One SQLite database file's writer gate in this process (see the module's docstring).

    Get it with `writer_gate`: every store of the process on that file shares it.

    Parameters:
      database (str): the database file's path.
      timeout (float): the longest wait to enter, seconds (SQLite's busy timeout).
    """

    def __init__(self, database: str, timeout: float) -> None:
        self.lock_file = database + LOCK_FILE_SUFFIX
        self.timeout = timeout
        self._fd: int | None = None
        self._no_file = fcntl is None
        self._reset()

    def _reset(self) -> None:
        self._queue = threading.Lock()  # held by the writer at the gate: the others wait on it
        self._state = threading.Lock()  # guards the owner (a C-level lock: an async exception cannot leak it)
        self._owner: Any = None
        self._owner_thread = 0
        self._locked = False
        self._fork_waiting = False  # a fork waits for the writer at the gate: no new writer enters before it
        self._entries = 0

    @property
    def owner(self) -> Any:
        """The connection at the gate in this process, or ``None``."""
        return self._owner

    def enter(self, owner: Any) -> None:
        """Wait for the gate and take it for ``owner`` (a driver connection); `leave` with it.

        Parameters:
          owner (Any): the connection whose write transaction begins.

        Raises:
          sqlite3.OperationalError: "database is locked": not entered within the timeout.
        """
        deadline = time.monotonic() + self.timeout
        retry = _FIRST_RETRY_S
        while self._fork_waiting and time.monotonic() < deadline:  # a flag, not a lock: nothing to leak
            time.sleep(retry)
            retry = min(retry * 2, _LONGEST_RETRY_S)
        entries = self._entries
        if not self._queue.acquire(timeout=max(deadline - time.monotonic(), 0)):
            with self._state:  # taken through the whole wait by no writer and no fork: one interrupted as it entered
                if self._owner is None and not self._fork_waiting and self._entries == entries and self._queue.locked():
                    self._queue.release()
            if not self._queue.acquire(blocking=False):
                raise self._busy()
        with self._state:
            self._owner = owner
            self._owner_thread = threading.get_ident()
            self._entries += 1
        fd = self._file()
        if fd is None:
            return
        self._locked = True  # before the lock: an exception landing after it must not leave the lock held
        retry = _FIRST_RETRY_S
        while True:
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except (BlockingIOError, PermissionError):  # held by another process
                if time.monotonic() >= deadline:
                    self.leave(owner)
                    raise self._busy() from None
                time.sleep(retry)
                retry = min(retry * 2, _LONGEST_RETRY_S)
            except OSError:
                self._locked = False  # a file system without POSIX locks: this process's writers are still ordered
                return

    def _busy(self) -> sqlite3.OperationalError:
        return sqlite3.OperationalError(f"database is locked (waited {self.timeout:g} s for {self.lock_file})")

    def leave(self, owner: Any) -> None:
        """Release the gate if ``owner`` holds it; nothing otherwise (safe to call at every commit).

        Parameters:
          owner (Any): the connection that may hold it.
        """
        if self._owner is not owner:
            return
        with self._state:
            if self._owner is not owner:
                return
            if self._locked:
                with contextlib.suppress(OSError):
                    fcntl.lockf(self._fd, fcntl.LOCK_UN)  # type: ignore[arg-type]
                self._locked = False
            self._owner = None
            with contextlib.suppress(RuntimeError):  # released already (a gate taken back as leaked)
                self._queue.release()

    def _file(self) -> int | None:
        """The lock file, opened once per gate; ``None`` where it cannot be (the gate then orders this process)."""
        if self._fd is None and not self._no_file:
            try:
                self._fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError:
                self._no_file = True
            else:
                weakref.finalize(self, os.close, self._fd)
        return self._fd

    def _hold_for_fork(self) -> bool:
        """Before a fork: wait until no other thread is at the gate, and keep writers out; whether it holds it."""
        if self._owner is not None and self._owner_thread == threading.get_ident():
            return False  # the forking thread's own transaction
        self._fork_waiting = True
        held = self._queue.acquire(timeout=self.timeout)
        if not held:
            self._fork_waiting = False
        return held

    def _release_after_fork(self) -> None:
        self._queue.release()
        self._fork_waiting = False

    def _after_fork(self) -> None:
        self._reset()  # a parent's thread may have held it: not this process's


_gates: weakref.WeakValueDictionary[str, WriterGate] = weakref.WeakValueDictionary()
_gates_lock = threading.Lock()


def writer_gate(database: str, timeout: float) -> WriterGate:
    """The writer gate of the SQLite file ``database``, shared by every store of this process on it.

    The caller keeps the gate alive (a store's engine does); once none does, its lock file is closed.

    Parameters:
      database (str): the database file's path (made absolute and resolved here).
      timeout (float): see `WriterGate`; the first caller's applies.

    Returns:
      WriterGate: the file's gate.
    """
    key = os.path.realpath(database)
    with _gates_lock:
        gate = _gates.get(key)
        if gate is None:
            gate = _gates[key] = WriterGate(key, timeout)
        return gate


_held_for_fork: list[WriterGate] = []


def _before_fork() -> None:
    _gates_lock.acquire()
    _held_for_fork[:] = [gate for gate in list(_gates.values()) if gate._hold_for_fork()]


def _after_fork_in_parent() -> None:
    for gate in _held_for_fork:
        gate._release_after_fork()
    _held_for_fork.clear()
    _gates_lock.release()


def _after_fork_in_child() -> None:
    global _gates_lock
    _gates_lock = threading.Lock()
    for gate in list(_gates.values()):
        gate._after_fork()
    _held_for_fork.clear()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)
