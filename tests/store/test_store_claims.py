"""The claim rules both stores share, checked as the pure functions they are (C24–C26, C25, C35).

The contract suite proves each store behaves by these rules end to end; here
the rules themselves are pinned down at their edges (a lease that expires
exactly at ``now``, a claim released versus one left by a dead worker)
without a store or a clock.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from flexiq_plugins._model.records import Busy, Claim, Finished
from flexiq_plugins._store.claims import (
    Granted,
    already_committed,
    claim_lost,
    claim_of_new_run,
    decide_claim,
    fence,
    fence_columns,
    grants_untaken,
    holds,
    lease_remaining,
    may_recover,
)
from flexiq_plugins.errors import ClaimLost

NOW = 1_000.0


@dataclass(frozen=True)
class Run:
    """A run's stored claim fields, as a store reads them."""

    run_key: str = "run-1"
    status: str = "pending"
    owner: str | None = None
    lease_until: float | None = None
    attempt: int = 0
    takeovers: int = 0
    updated_at: float = 900.0
    outcome: bytes | None = None


def test_a_new_run_is_claimed_as_attempt_one_without_a_takeover() -> None:
    """A fresh run gives attempt 1, a lease from the store's ``now`` and no takeover (C24)."""
    decision = decide_claim(Run(), now=NOW, owner="w1", lease_seconds=30.0)

    assert decision == Granted(owner="w1", attempt=1, lease_until=NOW + 30.0, takeovers=0)
    assert decision.claim("run-1") == Claim("run-1", "w1", 1, NOW + 30.0)
    assert decision.values() == {
        "status": "running",
        "owner": "w1",
        "attempt": 1,
        "lease_until": NOW + 30.0,
        "takeovers": 0,
    }


def test_c24_a_run_inserted_claimed_gets_what_a_new_run_is_granted() -> None:
    """The claim a SQL store writes with a new run in one statement is :func:`decide_claim`'s for a fresh run,
    its lease in seconds from the store's clock (C23, C24)."""
    granted = claim_of_new_run("run-1", owner="w1", lease_seconds=30.0)

    assert granted == Granted(owner="w1", attempt=1, lease_until=30.0, takeovers=0)
    shifted = replace(granted, lease_until=NOW + granted.lease_until)
    assert shifted == decide_claim(Run(), now=NOW, owner="w1", lease_seconds=30.0)


STATUSES = ("queued", "pending", "running", "sleeping", "waiting", "retrying", "succeeded", "failed", "dead")


@pytest.mark.parametrize("status", STATUSES)
@pytest.mark.parametrize("owner", [None, "w0"])
@pytest.mark.parametrize("lease_until", [None, NOW - 5.0, NOW + 5.0])
def test_c24_a_run_granted_untaken_gets_attempt_plus_one_at_any_clock(
    status: str, owner: str | None, lease_until: float | None
) -> None:
    """Where :func:`grants_untaken` holds, :func:`decide_claim` grants at every clock reading: ``attempt + 1``,
    the same takeovers, a lease from that reading; where it does not, a store must decide on the run as read
    (C24, C25). The PostgreSQL store writes exactly that grant in one conditional statement."""
    run = Run(status=status, owner=owner, lease_until=lease_until, attempt=4, takeovers=2)
    decisions = [decide_claim(run, now=now, owner="w1", lease_seconds=30.0) for now in (0.0, NOW, NOW * 10)]

    if grants_untaken(run):
        assert decisions == [
            Granted(owner="w1", attempt=5, lease_until=now + 30.0, takeovers=2) for now in (0.0, NOW, NOW * 10)
        ]
    else:
        terminal_or_held = status in ("succeeded", "failed", "dead") or (owner, lease_until) != (None, None)
        assert terminal_or_held
        assert not all(isinstance(d, Granted) and d.takeovers == 2 for d in decisions)


def test_c25_fence_columns_are_the_fields_fence_requires() -> None:
    """A store that builds its fenced statements once fences on exactly the fields of :func:`fence` (C25)."""
    assert fence_columns() == tuple(fence(Claim("run-1", "w1", 3, NOW)))


@pytest.mark.parametrize("status", ["succeeded", "failed", "dead", "cancelled"])
def test_a_terminal_run_is_finished_even_with_a_live_claim(status: str) -> None:
    """A terminal run is never claimed again, whatever its claim fields say (C26)."""
    run = Run(status=status, owner="w1", lease_until=NOW + 10.0, attempt=3)

    assert decide_claim(run, now=NOW, owner="w2", lease_seconds=30.0) == Finished(status)


def test_a_held_claim_with_a_live_lease_is_busy_for_the_time_it_has_left() -> None:
    """A claim whose lease ends after ``now`` makes the run busy for the seconds remaining (C24)."""
    run = Run(status="running", owner="w1", lease_until=NOW + 12.5, attempt=1)

    assert decide_claim(run, now=NOW, owner="w2", lease_seconds=30.0) == Busy(12.5)


def test_a_lease_ending_exactly_now_has_expired_and_counts_a_takeover() -> None:
    """``lease_until == now`` is expired: the run is taken over, attempt and takeovers both go up (C25)."""
    run = Run(status="running", owner="w1", lease_until=NOW, attempt=2, takeovers=1)

    decision = decide_claim(run, now=NOW, owner="w2", lease_seconds=30.0)

    assert decision == Granted(owner="w2", attempt=3, lease_until=NOW + 30.0, takeovers=2)


@pytest.mark.parametrize(
    ("owner", "lease_until"),
    [(None, None), (None, NOW + 60.0), ("w1", None)],
    ids=["released", "no-owner", "no-lease"],
)
def test_a_claim_not_held_is_taken_without_a_takeover(owner: str | None, lease_until: float | None) -> None:
    """A claim counts as held only with both an owner and a lease; otherwise no takeover is counted."""
    run = Run(status="sleeping", owner=owner, lease_until=lease_until, attempt=4, takeovers=1)

    decision = decide_claim(run, now=NOW, owner="w2", lease_seconds=5.0)

    assert decision == Granted(owner="w2", attempt=5, lease_until=NOW + 5.0, takeovers=1)


def test_lease_remaining_is_none_without_a_live_lease() -> None:
    """``lease_remaining`` gives the seconds left of a live lease and ``None`` otherwise."""
    assert lease_remaining(NOW + 2.0, NOW) == 2.0
    assert lease_remaining(NOW, NOW) is None
    assert lease_remaining(NOW - 1.0, NOW) is None
    assert lease_remaining(None, NOW) is None


def test_the_fence_is_run_key_owner_and_attempt() -> None:
    """A write holds only while the run's key, owner and attempt are the claim's (C25)."""
    claim = Claim("run-1", "w1", 2, NOW + 30.0)
    run = Run(status="running", owner="w1", attempt=2, lease_until=NOW - 100.0)

    assert fence(claim) == {"run_key": "run-1", "owner": "w1", "attempt": 2}
    assert holds(run, claim), "an expired lease does not fence a write out; a newer claim does"
    assert not holds(replace(run, owner="w2"), claim)
    assert not holds(replace(run, attempt=3), claim)
    assert not holds(replace(run, owner=None), claim)
    assert not holds(replace(run, run_key="run-2"), claim)


def test_claim_errors_name_the_attempt_and_the_run() -> None:
    """Both fencing errors are :class:`ClaimLost` and say which attempt, run or step lost."""
    claim = Claim("run-1", "w1", 2, NOW)

    assert isinstance(claim_lost(claim), ClaimLost)
    assert str(claim_lost(claim)) == "attempt 2 of run 'run-1' no longer holds its claim"
    assert str(already_committed(claim, "charge#0")) == "step 'charge#0' of run 'run-1' is already committed"


def test_recovery_is_a_compare_and_set_on_status_and_updated_at() -> None:
    """A recoverer wins only if the status and ``updated_at`` it read are still the run's (C35)."""
    run = Run(status="sleeping", updated_at=900.0)

    assert may_recover(run, status="sleeping", updated_at=900.0, now=NOW)
    assert not may_recover(run, status="sleeping", updated_at=899.0, now=NOW)
    assert not may_recover(run, status="pending", updated_at=900.0, now=NOW)


def test_a_running_run_is_recoverable_only_once_its_lease_has_expired() -> None:
    """A ``running`` run with a live lease is left alone; at or after expiry, or with no lease, it may be recovered."""
    running = Run(status="running", owner="w1", attempt=1, updated_at=900.0)

    assert not may_recover(replace(running, lease_until=NOW + 1.0), status="running", updated_at=900.0, now=NOW)
    assert may_recover(replace(running, lease_until=NOW), status="running", updated_at=900.0, now=NOW)
    assert may_recover(replace(running, lease_until=None), status="running", updated_at=900.0, now=NOW)


def test_only_running_runs_need_an_expired_lease_to_be_recovered() -> None:
    """Any other status is recoverable on the compare-and-set alone, whatever its lease fields say."""
    sleeping = Run(status="sleeping", owner="w1", lease_until=NOW + 60.0, updated_at=900.0)

    assert may_recover(sleeping, status="sleeping", updated_at=900.0, now=NOW)
