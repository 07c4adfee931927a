"""The verb of ``step.transaction``: the memo commits in the caller's own database transaction (C42).

How an open transaction is found and joined is `flexiq_plugins._store.caller`'s.
"""

from __future__ import annotations

from typing import Any

from .._model.records import StepKind
from .._store.caller import CallerTransaction
from .journal import CALL_BODY, Protocol_, Step, StepJournal

__all__ = ["TransactionVerb"]


class TransactionVerb:
    """``step.transaction``: the body's writes and the memo commit in one database transaction (C42).

    The body runs inside the caller's transaction (joined as a savepoint, or
    opened and committed at the step's end) and the step row is written on the
    caller's connection, fenced on the claim, before that scope closes: if the
    transaction rolls back, the memo goes with the writes, and a retry runs
    the body again.

    Parameters:
      caller (CallerTransaction): the transaction to commit in.
    """

    kind: StepKind = "run"

    def __init__(self, caller: CallerTransaction) -> None:
        self._caller = caller

    def replay(self, journal: StepJournal, step: Step) -> Any:
        """Decode the stored value (C5, C7)."""
        return journal.decode(step)

    def execute(self, journal: StepJournal, step: Step) -> Protocol_:
        """Run the body and write the row in the caller's transaction; return the decoded value."""
        journal.refuse_open_transactions(step, shared=self._caller)
        with self._caller.scope() as connection:
            value = yield CALL_BODY
            journal.refuse_awaitable(step, value)
            encoded, decoded = journal.encode(step, value)
            stored = journal.write(step, encoded, None, connection=connection)
        journal.record(stored)  # only once the scope closed: a failed commit leaves no memo behind
        if self._caller.joined:
            journal.joined.append((step.id.step_key, self._caller))
        return decoded

    def commit(self, journal: StepJournal, step: Step, produced: Any) -> Any:
        """Nothing left to commit: `execute` wrote the row in the caller's transaction."""
        return produced
