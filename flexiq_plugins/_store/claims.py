"""The claim rules, written once for every store (C23–C25, C35).

A run is held by at most one attempt at a time. Three questions decide who
holds it, and each is answered here by a pure function of the run's stored
claim fields and the store's clock ``now``:

- may a delivery claim the run (`decide_claim`): a terminal run is
  `Finished`; a claim held with a live lease makes it `Busy`;
  otherwise the new attempt takes it, counting a takeover when the previous
  claim was still held (its lease expired: its worker died);
- does a write still belong to its attempt (`fence`, `holds`):
  only while the run's owner and attempt are the claim's;
- may a recoverer take a stranded run (`may_recover`): a
  compare-and-set on the status and ``updated_at`` it read, and a ``running``
  run only once its lease has expired.

The stores only read the fields and write what the answer says, each under
its own atomicity: the memory store under its lock, the SQL store inside one
transaction after locking the run's row, or by a compare-and-set on the
row's version that writes the answer only if the run is still exactly as
read (PostgreSQL's attempt start), or, for fenced writes, in the ``WHERE``
clause `fence` describes. So the two cannot drift apart.
Times are epoch seconds on the store's clock; a lease with ``lease_until <=
now`` has expired.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .._model.records import TERMINAL_STATUSES, Busy, Claim, Finished, RunStatus
from ..errors import ClaimLost

__all__ = [
    "Granted",
    "RunState",
    "already_committed",
    "claim_lost",
    "claim_of_new_run",
    "decide_claim",
    "fence",
    "fence_columns",
    "grants_untaken",
    "holds",
    "lease_remaining",
    "may_recover",
    "may_settle_cancelled",
    "may_take_sweep_lease",
    "one_already_committed",
    "reported_status",
]


class RunState(Protocol):
    """The fields of a stored run that the rules read: a ``RunRecord`` or a row of the runs table."""

    @property
    def run_key(self) -> str:
        """The run's key."""

    @property
    def status(self) -> str:
        """The run's status."""

    @property
    def owner(self) -> str | None:
        """The claiming worker's id, ``None`` when no claim is held."""

    @property
    def lease_until(self) -> float | None:
        """Lease expiry, epoch seconds, store clock."""

    @property
    def attempt(self) -> int:
        """The last attempt's number, 0 before the first."""

    @property
    def takeovers(self) -> int:
        """Claims taken over so far."""

    @property
    def updated_at(self) -> float:
        """Last change, epoch seconds."""

    @property
    def outcome(self) -> bytes | None:
        """A terminal run's stored outcome (C37), opaque bytes."""


@dataclass(frozen=True)
class Granted:
    """The new attempt claims the run: the run's new claim fields.

    Parameters:
      owner (str): the claiming worker's id.
      attempt (int): the new attempt's number (the previous one plus 1).
      lease_until (float): lease expiry, epoch seconds, store clock.
      takeovers (int): the run's takeover count, this takeover included.
    """

    owner: str
    attempt: int
    lease_until: float
    takeovers: int

    def claim(self, run_key: str) -> Claim:
        """Return the attempt's `Claim` on ``run_key``."""
        return Claim(run_key, self.owner, self.attempt, self.lease_until)

    def values(self) -> dict[str, Any]:
        """Return the run fields to write: status ``running`` and the new claim."""
        return {
            "status": "running",
            "owner": self.owner,
            "attempt": self.attempt,
            "lease_until": self.lease_until,
            "takeovers": self.takeovers,
        }


def lease_remaining(lease_until: float | None, now: float) -> float | None:
    """Return the seconds a lease has left, ``None`` if there is none or it has expired.

    Parameters:
      lease_until (float | None): lease expiry, epoch seconds, store clock.
      now (float): the store's clock, epoch seconds.
    """
    if lease_until is None or lease_until <= now:
        return None
    return lease_until - now


def decide_claim(run: RunState, *, now: float, owner: str, lease_seconds: float) -> Finished | Busy | Granted:
    """Decide what a delivery gets when it begins an attempt on ``run`` (C24–C26).

    The caller reads ``run`` and ``now`` atomically with writing the answer,
    or reads ``now`` after ``run`` and writes the answer only if the run is
    still exactly as read (the clock only moves on, so the answer still holds).

    Parameters:
      run (RunState): the run as stored (a new run is ``pending``, or ``queued`` when
        recorded at publish (C39), with attempt 0).
      now (float): the store's clock, epoch seconds.
      owner (str): the claiming worker's id.
      lease_seconds (float): the new lease, in seconds.

    Returns:
      Finished | Busy | Granted: `Finished` for a terminal run, with its outcome (C37);
        `Busy` (seconds left) while a held claim's lease is live;
        otherwise `Granted` with ``attempt + 1``, a lease to ``now +
        lease_seconds`` and ``takeovers + 1`` if the previous claim was still held.
    """
    if run.status in TERMINAL_STATUSES:
        return Finished(run.status, run.outcome)
    held = run.owner is not None and run.lease_until is not None
    remaining = lease_remaining(run.lease_until, now)
    if held and remaining is not None:
        return Busy(remaining)
    takeovers = run.takeovers + (1 if held else 0)
    return Granted(owner=owner, attempt=run.attempt + 1, lease_until=now + lease_seconds, takeovers=takeovers)


def grants_untaken(run: RunState) -> bool:
    """Whether `decide_claim` grants ``run`` to any delivery, at any clock reading, with no takeover (C24, C25).

    So it is when the run is not terminal and holds no claim (no owner, or no
    lease): the grant is then ``attempt + 1``, ``takeovers`` unchanged and a
    lease to ``now + lease_seconds``, whatever ``now`` is. A store may
    therefore write such a grant in one conditional statement whose
    condition is this one, without reading the run first (the SQL store's
    PostgreSQL attempt start); any other run is decided by `decide_claim`
    on the run as read.

    Parameters:
      run (RunState): the run as stored.
    """
    return run.status not in TERMINAL_STATUSES and (run.owner is None or run.lease_until is None)


@dataclass(frozen=True)
class _NewRun:
    """The state of a run that is not stored yet: ``pending``, attempt 0, no claim."""

    run_key: str
    status: str = "pending"
    owner: str | None = None
    lease_until: float | None = None
    attempt: int = 0
    takeovers: int = 0
    updated_at: float = 0.0
    outcome: bytes | None = None


def claim_of_new_run(run_key: str, *, owner: str, lease_seconds: float) -> Granted:
    """What `decide_claim` grants the first delivery of a run that is not stored yet (C24).

    A store that inserts a new run already claimed, in one statement, writes
    these values; ``lease_until`` is then *seconds from now* (the decision is
    taken at ``now = 0``), which the store adds to its own clock (C23).

    Parameters:
      run_key (str): the new run.
      owner (str): the claiming worker's id.
      lease_seconds (float): the lease, in seconds.
    """
    decision = decide_claim(_NewRun(run_key), now=0.0, owner=owner, lease_seconds=lease_seconds)
    assert isinstance(decision, Granted)  # a new run is never terminal nor held
    return decision


def fence(claim: Claim) -> dict[str, str | int]:
    """Return the run fields a fenced write requires, with the values they must have (C25).

    A write on behalf of an attempt applies only while the run's key, owner
    and attempt are the claim's: a SQL store puts these in its ``WHERE``
    clause, the memory store compares them with `holds`.
    """
    return {"run_key": claim.run_key, "owner": claim.owner, "attempt": claim.attempt}


def fence_columns() -> tuple[str, ...]:
    """The run fields `fence` requires, for a store that builds its fenced statements once (C25)."""
    return ("run_key", "owner", "attempt")


def holds(run: RunState, claim: Claim) -> bool:
    """Whether ``claim`` still holds ``run``: every field of `fence` matches (C25).

    Parameters:
      run (RunState): the stored run.
      claim (Claim): the attempt's claim.
    """
    return all(getattr(run, name) == value for name, value in fence(claim).items())


def claim_lost(claim: Claim) -> ClaimLost:
    """Return the error for a write whose claim no longer holds its run (C25)."""
    return ClaimLost(f"attempt {claim.attempt} of run {claim.run_key!r} no longer holds its claim")


def already_committed(claim: Claim, step_key: str) -> ClaimLost:
    """Return the error for a step whose key another attempt already committed (C25)."""
    return ClaimLost(f"step {step_key!r} of run {claim.run_key!r} is already committed")


def one_already_committed(claim: Claim, step_keys: Sequence[str]) -> ClaimLost:
    """Return the error for steps committed together, one of whose keys is already committed or repeated (C25, C51)."""
    shown = ", ".join(repr(k) for k in step_keys[:5]) + (", …" if len(step_keys) > 5 else "")
    return ClaimLost(f"one of the steps {shown} of run {claim.run_key!r} is already committed (or given twice)")


def may_recover(run: RunState, *, status: str, updated_at: float, now: float) -> bool:
    """Whether a recoverer that read ``status`` and ``updated_at`` may take ``run`` now (C35).

    A compare-and-set: the run must still have the status and ``updated_at``
    the caller read, and a ``running`` run must have no live lease. The caller
    reads ``run`` and ``now`` atomically with setting ``updated_at = now``, so
    of several recoverers exactly one wins.

    Parameters:
      run (RunState): the run as stored.
      status (str): the status the caller read.
      updated_at (float): the ``updated_at`` the caller read, epoch seconds.
      now (float): the store's clock, epoch seconds.
    """
    if run.status != status or run.updated_at != updated_at:
        return False
    return not (status == "running" and lease_remaining(run.lease_until, now) is not None)


def may_take_sweep_lease(holder: str | None, lease_until: float | None, *, owner: str, now: float) -> bool:
    """Whether ``owner`` may take or renew the recovery lease held by ``holder`` until ``lease_until`` (C39).

    Parameters:
      holder (str | None): the current holder, ``None`` when nobody holds it.
      lease_until (float | None): its expiry, epoch seconds, store clock.
      owner (str): the process asking.
      now (float): the store's clock, epoch seconds.
    """
    return holder is None or holder == owner or lease_remaining(lease_until, now) is None


def may_settle_cancelled(run: RunState, *, status: str, attempt: int, now: float) -> bool:
    """Whether a cancellation may end ``run`` now: it still has ``status`` at ``attempt`` and no live claim (C34)."""
    if run.status != status or run.attempt != attempt:
        return False
    return run.owner is None or lease_remaining(run.lease_until, now) is None


_REPORTED: dict[str, RunStatus] = {"succeeded": "succeeded", "failed": "failed", "cancelled": "cancelled"}


def reported_status(status: str) -> RunStatus:
    """``status`` as the terminal status a framework may report for a job that never started its run (C47).

    Raises:
      ValueError: ``status`` is not ``succeeded``, ``failed`` or ``cancelled``.
    """
    try:
        return _REPORTED[status]
    except KeyError:
        raise ValueError(f"a framework reports a job succeeded, failed or cancelled, not {status!r}") from None
