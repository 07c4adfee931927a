"""The interface between the core and durable storage.

A store keeps the records of `flexiq_plugins._model.records`: runs, step
rows, step attempts, dead letters and events. Every
method states its atomicity and its fencing; both
implementations ([`MemoryStepStore`][flexiq_plugins.MemoryStepStore],
[`SqlStepStore`][flexiq_plugins.SqlStepStore]) pass one contract test suite.

The interface is split by who calls it:
`AttemptStore` (an attempt and its
delivery), `OperatorStore`
(operators, recovery, event senders), both over
`StoreReads` (the reads both make).
[`StepStore`][flexiq_plugins.StepStore] is both: what a store implements and what users pass around.

Times are ``float`` seconds since the epoch **on the store's clock** (C23): a
SQL store reads the database's clock inside the same transaction, so a worker
whose own clock is skewed can neither take a live claim nor extend a sleep.
"""

from __future__ import annotations

from .attempt_side import AttemptStore
from .operator_side import OperatorStore

__all__ = ["StepStore"]


class StepStore(AttemptStore, OperatorStore):
    """Durable storage for runs, step rows and dead letters.

    Implementations must be safe to share between threads of one process and,
    for SQL, between processes (each process opens its own connections; a
    forked child never reuses its parent's). Errors from the storage engine are
    translated here: connection loss and timeouts raise
    [`StoreUnavailable`][flexiq_plugins.errors.StoreUnavailable].
    """

    def describe(self) -> str:
        """How a worker's start line names the store (no secrets): ``repr`` unless the store says more."""
        return repr(self)

    def check_writable(self) -> None:
        """Refuse a store its configuration makes read-only (a SQLite URL with ``mode=ro``), without connecting.

        A worker calls it as it starts (C41): its jobs must write their steps.
        Nothing here; the SQL store checks its URL.

        Raises:
          StoreMisconfigured: the store is configured read-only.
        """

    def close(self) -> None:
        """Release connections. Optional."""
