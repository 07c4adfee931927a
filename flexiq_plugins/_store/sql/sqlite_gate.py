"""The SQLite store's writer gate: write transactions queue for the file's write lock and are woken in turn.

Why it exists: SQLite lets one write transaction at a time into a database
file. A connection that finds the file locked waits in SQLite's busy handler,
which sleeps 1, 2, 5, 10 … ms between tries and is not woken when the lock
frees. With several workers writing short transactions to one file (Celery's
prefork children, Dramatiq's processes and threads), the writers spent those
sleeps idle while the lock was free: a Celery worker of two processes ran a
3-step job about 17 % slower than with the gate, its machine idle a third of
the time (``benchmarks/MEASUREMENTS.md``).

What it does: before its ``BEGIN IMMEDIATE``, a write transaction of the store
enters the gate of its database file; it leaves after its ``COMMIT`` or
``ROLLBACK``, or when its connection goes back to the pool or is closed.
Inside one process, writers wait on a condition variable; across processes,
on a POSIX lock (``fcntl.lockf``) of a file beside the database,
``<database>-writer-lock``, which the kernel grants to the next waiter as
soon as it is released, and drops with a process that dies. Reads take
nothing (WAL lets them run beside a writer).

What it does not change: SQLite's own lock still guards the data. A writer
that does not take the gate (another program, another version of this
library, a process where ``fcntl`` is missing or the lock file cannot be
created) is ordered by SQLite's busy handler as before; so is a writer whose
wait on this process's gate lasted the busy timeout (30 s). Only one thread
of a process waits for the lock file at a time, the others wait in the
process.

Forks: a ``fork`` waits until no thread of the process is inside a write
transaction of a gated file (at most the timeout; not for the forking
thread's own), and no new one begins until the child exists. Why: SQLite's
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
import threading
from typing import Any

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: the gate orders this process's writers only
    fcntl = None  # type: ignore[assignment]

LOCK_FILE_SUFFIX = "-writer-lock"
"""The lock file's name is the database file's with this appended."""


class WriterGate:
    """One SQLite database file's writer gate in this process (see the module's docstring).

    Get it with `writer_gate`: every store of the process on that file shares it.

    Parameters:
      database (str): the database file's path.
      timeout (float): the longest wait on this process's writers, seconds;
        after it the writer goes on without the gate (SQLite's lock still orders it).
    """

    def __init__(self, database: str, timeout: float) -> None:
        self.lock_file = database + LOCK_FILE_SUFFIX
        self.timeout = timeout
        self._fd: int | None = None
        self._no_file = fcntl is None
        self._reset()

    def _reset(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._owner: Any = None
        self._owner_thread = 0
        self._locked = False

    @property
    def owner(self) -> Any:
        """The connection that holds the gate in this process, or ``None``."""
        return self._owner

    def enter(self, owner: Any) -> bool:
        """Wait for the gate and take it for ``owner`` (a driver connection); ``False`` if the wait timed out.

        Parameters:
          owner (Any): the connection whose write transaction begins; `leave` with it.

        Returns:
          bool: whether ``owner`` holds the gate now.
        """
        with self._cond:
            if self._owner is not None and not self._cond.wait_for(self._free, self.timeout):
                return False
            self._owner = owner
            self._owner_thread = threading.get_ident()
        fd = self._file()
        if fd is not None:
            self._locked = True  # before the call: an exception landing after it must not leave it held
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX)
            except OSError:
                self._locked = False
        return True

    def leave(self, owner: Any) -> None:
        """Release the gate if ``owner`` holds it; nothing otherwise (safe to call at every commit).

        Parameters:
          owner (Any): the connection that may hold it.
        """
        if self._owner is not owner:
            return
        with self._cond:
            if self._owner is not owner:
                return
            if self._locked:
                self._locked = False
                with contextlib.suppress(OSError):
                    fcntl.lockf(self._fd, fcntl.LOCK_UN)  # type: ignore[arg-type]
            self._owner = None
            self._cond.notify()

    def _free(self) -> bool:
        return self._owner is None

    def _file(self) -> int | None:
        """The lock file, opened once per process; ``None`` where it cannot be (the gate then orders this process)."""
        if self._fd is None and not self._no_file:
            try:
                self._fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError:
                self._no_file = True
        return self._fd

    def _hold_for_fork(self) -> None:
        """Before a fork: wait until no other thread is inside a write transaction, and keep new ones out."""
        self._cond.acquire()
        if self._owner is not None and self._owner_thread != threading.get_ident():
            self._cond.wait_for(self._free, self.timeout)

    def _release_after_fork(self) -> None:
        self._cond.release()

    def _after_fork(self) -> None:
        self._reset()  # a parent's thread may have held it: not this process's


_gates: dict[str, WriterGate] = {}
_gates_lock = threading.Lock()


def writer_gate(database: str, timeout: float) -> WriterGate:
    """The writer gate of the SQLite file ``database``, shared by every store of this process on it.

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
    with _gates_lock:
        gates = list(_gates.values())
    for gate in gates:
        gate._hold_for_fork()
    _held_for_fork[:] = gates
    _gates_lock.acquire()


def _after_fork_in_parent() -> None:
    _gates_lock.release()
    for gate in _held_for_fork:
        gate._release_after_fork()
    _held_for_fork.clear()


def _after_fork_in_child() -> None:
    global _gates_lock
    _gates_lock = threading.Lock()
    for gate in _gates.values():
        gate._after_fork()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)
