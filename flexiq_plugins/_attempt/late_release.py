"""Claims a store outage left held, released as soon as the store answers again (C23, C28).

An attempt that meets a store outage is put back (C28), but the release of
its claim fails with the store: the claim stays held until its lease runs
out (30 s by default). The put-back's delivery, due within
``store_retry_max_seconds`` (10 s), then finds its own run busy and is put
back again and again until the lease expires, and its claim is taken over
as if a worker had died (C25). So a drain that should take about 10 s after
the store's return took about 20.

`LateReleases` keeps such claims and tries their release again twice
a second from one daemon thread, until it lands, the claim is no longer
this attempt's (``ClaimLost``: another delivery took the run over, or the
release had landed after all), or the lease has run out anyway. The
release is the one the outage path makes when it can (``retrying``, no
outcome): the put-back delivery claims the run and replays it.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from .._model.records import Claim
from .._store.attempt_side import AttemptStore
from ..errors import ClaimLost, StoreUnavailable

__all__ = ["LateReleases"]

logger = logging.getLogger("flexiq_plugins")

_PAUSE_SECONDS = 0.5


@dataclass(frozen=True)
class _Held:
    claim: Claim
    until: float  # time.monotonic() past which the lease has run out anyway


class LateReleases:
    """Releases of claims that failed in a store outage, tried again until they land (see the module's description).

    Thread-safe; the thread runs only while a release is pending.

    Parameters:
      store (AttemptStore): the store the claims are in.
      lease_seconds (float): the claim lease, seconds: a release pending longer is dropped.
    """

    def __init__(self, store: AttemptStore, lease_seconds: float) -> None:
        self._store = store
        self._lease_seconds = lease_seconds
        self._lock = threading.Lock()
        self._pending: list[_Held] = []
        self._thread: threading.Thread | None = None

    def add(self, claim: Claim) -> None:
        """Release ``claim`` (as ``retrying``) as soon as the store answers; starts the thread if needed."""
        with self._lock:
            self._pending.append(_Held(claim, time.monotonic() + self._lease_seconds))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="flexiq-late-release", daemon=True)
                self._thread.start()

    @property
    def pending(self) -> int:
        """How many releases are still waiting for the store."""
        with self._lock:
            return len(self._pending)

    def _run(self) -> None:
        while True:
            time.sleep(_PAUSE_SECONDS)
            with self._lock:
                now = time.monotonic()
                self._pending = [held for held in self._pending if held.until > now]
                todo = list(self._pending)
                if not todo:
                    self._thread = None
                    return
            for held in todo:
                if not self._release(held.claim):
                    break  # the store is still down: try them all again later
                with self._lock:
                    self._pending.remove(held)

    def _release(self, claim: Claim) -> bool:
        """Try one release; whether it is done with (released, or no longer this attempt's to release)."""
        try:
            self._store.finish(claim, "retrying")
        except StoreUnavailable:
            return False
        except ClaimLost:
            return True
        except Exception as exc:  # not an outage: the lease runs out by itself
            logger.debug("run %s: the late release of its claim failed: %s", claim.run_key, exc)
            return True
        logger.debug("run %s: its claim, held through a store outage, is released", claim.run_key)
        return True
