"""The task bodies of the conformance suite, written once for every framework.

Each scenario is a plain function ``fn(ledger, *args)`` that uses only
``current_job.step``: the harness of each adapter registers it as a Celery task
or a Dramatiq actor (``celery_app.py``, ``dramatiq_app.py``), with the retry
policy given here in the framework's own words.

Side effects go to a :class:`Ledger`, a file of JSON lines appended with
``O_APPEND``: every line is written by one ``write`` call and is on disk as soon
as it returns, so the counts survive a worker process killed with SIGKILL and
are shared by in-thread workers and worker subprocesses alike. A test reads
the ledger to count how many times each step body really ran, and with which
idempotency key.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any
from uuid import UUID

from flexiq_plugins import current_job

__all__ = ["SCENARIOS", "TYPED_VALUES", "Ledger", "Scenario", "describe"]


class Ledger:
    """The external record of what the task bodies did, one JSON object per line.

    Every entry carries the run key of the job that wrote it (``run``), so the
    tests of one module can share a ledger and still count per run.

    Parameters:
      directory(str | Path): where the ledger file and the flag files live.
    """

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.path = self.directory / "ledger.jsonl"

    # ------------------------------------------------------- written by bodies
    def call(self, what: str) -> int:
        """Record one real call of the step body ``what``; return how many calls of it this run has now.

        Call it inside a step body: the entry keeps the step's idempotency key.
        """
        self._append(what, key=current_job.step.idempotency_key)
        return self.count(current_job.run_key, what)

    def enter(self, retries: int) -> None:
        """Record that the task body started (``"attempt"``), with the framework's retry count."""
        self._append("attempt", retries=retries)

    def note(self, what: str, **data: Any) -> None:
        """Record ``what`` with JSON ``data`` for the current run."""
        self._append(what, **data)

    def hang_first(self, what: str) -> None:
        """The first time ``what`` runs for this run, record this process's id and hang to be killed.

        The test SIGKILLs the process; the hang is the workload the kill
        interrupts, not a wait for anything.
        """
        if self.count(current_job.run_key, what) == 1:
            self._append("hang", step=what)
            time.sleep(120)

    def deployed(self) -> int:
        """The version of the task bodies deployed now (``1`` until a test deploys another, :meth:`deploy`)."""
        path = self.directory / "deployed"
        return int(path.read_text()) if path.exists() else 1

    def deploy(self, version: int) -> None:
        """Deploy version ``version`` of the task bodies: every attempt and check from now on runs it."""
        (self.directory / "deployed").write_text(str(version))

    def flag(self, name: str) -> bool:
        """Whether the test raised the flag ``name`` for the current run."""
        return self._flag_path(current_job.run_key, name).exists()

    def wait_flag(self, name: str, timeout: float = 30.0) -> None:
        """Block the body until the test raises the flag ``name`` (the body's own workload)."""
        deadline = time.monotonic() + timeout
        while not self.flag(name):
            if time.monotonic() > deadline:
                raise TimeoutError(f"flag {name!r} was never raised")
            time.sleep(0.02)

    # ---------------------------------------------------------- read by tests
    def set_flag(self, run_key: str, name: str) -> None:
        """Raise the flag ``name`` for ``run_key``."""
        self._flag_path(run_key, name).touch()

    def entries(self, run_key: str, what: str | None = None) -> list[dict[str, Any]]:
        """Every entry of ``run_key`` (only ``what``'s when given), in the order written."""
        if not self.path.exists():
            return []
        found = []
        for line in self.path.read_text().splitlines():
            entry = json.loads(line)
            if entry["run"] == run_key and (what is None or entry["what"] == what):
                found.append(entry)
        return found

    def count(self, run_key: str, what: str) -> int:
        """How many entries ``what`` the run ``run_key`` has."""
        return len(self.entries(run_key, what))

    def keys(self, run_key: str, what: str) -> list[str]:
        """The idempotency keys of the calls of the step body ``what``, in call order."""
        return [e["key"] for e in self.entries(run_key, what)]

    def attempts(self, run_key: str) -> list[dict[str, Any]]:
        """The ``"attempt"`` entries of ``run_key``: one per execution of the task body."""
        return self.entries(run_key, "attempt")

    def hung(self, run_key: str, step: str) -> int | None:
        """The process id that hangs in the step body ``step`` of ``run_key``, once it does."""
        pids = [e["pid"] for e in self.entries(run_key, "hang") if e["step"] == step]
        return pids[0] if pids else None

    # ---------------------------------------------------------------- private
    def _append(self, what: str, **data: Any) -> None:
        job = current_job.get()
        assert job is not None, "the ledger is written from inside a durable job"
        if job.checking:  # a check of new code (flexiq check) runs the code between steps: no side effects
            return
        entry = {
            "run": job.run_key,
            "what": what,
            "job": job.job_id,
            "attempt": job.attempt,
            "pid": os.getpid(),
            "at": time.time(),
            **data,
        }
        line = (json.dumps(entry) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)

    def _flag_path(self, run_key: str, name: str) -> Path:
        return self.directory / f"flag-{name}-{run_key}"


@dataclass(frozen=True)
class Scenario:
    """A task body and the retry policy it is registered with.

    Parameters:
      name(str): the task / actor name (prefixed by the app's name on Celery).
      fn(Callable[..., Any]): ``fn(ledger, *args)``.
      max_retries(int): the framework's retry budget for exceptions from the body
        (Celery: ``autoretry_for=(Exception,)`` with no delay; Dramatiq: ``Retries``
        with a 10-50 ms backoff).
      time_limit_seconds(float | None): the framework's hard time limit (Celery
        ``time_limit``, which kills the pool process; Dramatiq ``time_limit``,
        which raises ``TimeLimitExceeded`` in the body).
      interruptible(bool): a worker shutdown interrupts the body (Dramatiq
        ``notify_shutdown``; a Celery cold shutdown always does).
      options(dict[str, Any]): durable options of the task or actor, the same
        names on both frameworks (``max_suspended_seconds`` …).
    """

    name: str
    fn: Callable[..., Any]
    max_retries: int = 3
    time_limit_seconds: float | None = None
    interruptible: bool = False
    options: dict[str, Any] = field(default_factory=dict)


SCENARIOS: dict[str, Scenario] = {}


def scenario(
    max_retries: int = 3, name: str | None = None, **options: Any
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the decorated function as a scenario (see :class:`Scenario` for ``options``)."""

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        key = name or fn.__name__
        SCENARIOS[key] = Scenario(key, fn, max_retries, **options)
        return fn

    return register


class DeployedMidRun(Exception):
    """Raised by :func:`deploy_between_attempts` at the end of its first attempt."""


# ------------------------------------------------------------------ scenarios
@scenario()
def notify_fails_once(ledger: Ledger) -> str:
    """``charge``, then ``notify``, whose body raises on its first call (a task-level retry)."""
    step = current_job.step
    step.run("charge", lambda: ledger.call("charge"))

    def notify() -> str:
        if ledger.call("notify") == 1:
            raise ConnectionError("mail server down")
        return "notified"

    return step.run("notify", notify)


@scenario()
def nap(ledger: Ledger, pause: float) -> str:
    """``before``, a sleep of ``pause`` seconds, ``after``."""
    step = current_job.step
    step.run("before", lambda: ledger.call("before"))
    step.sleep(pause)
    step.run("after", lambda: ledger.call("after"))
    return "woke"


scenario(max_retries=0, name="nap_without_retries")(nap)


@scenario()
def checkout(ledger: Ledger, pause: float) -> dict[str, Any]:
    """The seed's checkout: ``charge``, a sleep, ``receipt`` failing once, and a keyed ``refund`` check."""
    step = current_job.step
    charge = step.run("charge", lambda: {"id": "ch_1", "n": ledger.call("charge")})
    step.sleep(pause)

    def receipt() -> str:
        if ledger.call("receipt") == 1:
            raise ConnectionError("mail server down")
        return f"receipt for {charge['id']}"

    sent = step.run("receipt", receipt)
    step.run("audit", lambda: ledger.call("audit"), key="order-7")
    return {"charge": charge, "receipt": sent}


@scenario()
def deploy_between_attempts(ledger: Ledger) -> str:
    """``charge``, then ``reserve`` (renamed ``allocate`` by a deploy before the retry), then ``ship``.

    The first attempt ends with :class:`DeployedMidRun`, a retryable error; every
    later attempt runs the new code, whose second step has another name.
    """
    step = current_job.step
    step.run("charge", lambda: ledger.call("charge"))
    second = "reserve" if current_job.attempt == 1 else "allocate"
    step.run(second, lambda: ledger.call(second))
    if current_job.attempt == 1:
        raise DeployedMidRun("a new version of the task is deployed before the retry")
    step.run("ship", lambda: ledger.call("ship"))
    return "shipped"


@scenario()
def once(ledger: Ledger) -> str:
    """One step, ``work``."""
    current_job.step.run("work", lambda: ledger.call("work"))
    return "done"


@scenario()
def hold(ledger: Ledger) -> str:
    """One step, ``work``, whose body blocks until the test raises the flag ``release``."""

    def work() -> str:
        ledger.call("work")
        ledger.wait_flag("release")
        return "done"

    return current_job.step.run("work", work)


scenario(name="hold_interruptible", interruptible=True)(hold)


@scenario()
def charge_hold_nap(ledger: Ledger, pause: float) -> str:
    """``charge``, then ``work`` blocking until the flag ``release``, a sleep of ``pause`` s, then ``after``."""
    step = current_job.step
    step.run("charge", lambda: ledger.call("charge"))

    def work() -> str:
        ledger.call("work")
        ledger.wait_flag("release")
        return "done"

    step.run("work", work)
    step.sleep(pause)
    step.run("after", lambda: ledger.call("after"))
    return "woke"


@scenario(max_retries=0, time_limit_seconds=1.5)
def overrun(ledger: Ledger) -> str:
    """``charge``, whose body outlives the framework's time limit (it waits for a flag never raised), then ``ship``."""
    step = current_job.step

    def charge() -> int:
        n = ledger.call("charge")
        ledger.wait_flag("never", timeout=120)
        return n

    step.run("charge", charge)
    step.run("ship", lambda: ledger.call("ship"))
    return "shipped"


@scenario(max_retries=0, time_limit_seconds=1.5)
def reserve_then_overrun(ledger: Ledger) -> str:
    """``reserve`` (undone by ``undo reserve``), then ``charge``, whose body outlives the time limit, then ``ship``."""
    step = current_job.step
    step.run("reserve", lambda: ledger.call("reserve"), compensate=_undo(ledger, "reserve"))

    def charge() -> int:
        n = ledger.call("charge")
        ledger.wait_flag("never", timeout=120)
        return n

    step.run("charge", charge)
    step.run("ship", lambda: ledger.call("ship"))
    return "shipped"


@scenario()
def crashy(ledger: Ledger) -> str:
    """``charge`` then ``ship``; the first call of each body hangs until its process is killed."""
    step = current_job.step

    def body(what: str) -> int:
        n = ledger.call(what)
        ledger.hang_first(what)
        return n

    step.run("charge", lambda: body("charge"))
    step.run("ship", lambda: body("ship"))
    return "shipped"


TYPED_VALUES: dict[str, Any] = {
    "when": datetime(2030, 1, 2, 3, 4, 5, 600, tzinfo=timezone(timedelta(hours=2))),
    "amount": Decimal("12.340"),
    "id": UUID("01900000-0000-7000-8000-000000000042"),
}
"""A step value of types JSON has no word for: an aware ``datetime``, a ``Decimal``, a ``UUID``."""


def describe(value: dict[str, Any]) -> dict[str, list[str]]:
    """Each item's type name and exact text (``isoformat`` keeps a datetime's offset)."""
    return {name: [type(v).__name__, v.isoformat() if isinstance(v, datetime) else str(v)] for name, v in value.items()}


@scenario()
def typed_values(ledger: Ledger, pause: float) -> str:
    """A step returns :data:`TYPED_VALUES`; what came back is noted before and after a sleep (a memo hit)."""
    step = current_job.step
    value = step.run("quote", lambda: dict(TYPED_VALUES))
    ledger.note("seen", value=describe(value))
    step.sleep(pause)
    return "quoted"


# ------------------------------------------------- events and cancellation (C33, C34)
def _undo(ledger: Ledger, what: str) -> Callable[[Any], None]:
    def undo(_value: Any) -> None:
        ledger.call(f"undo {what}")

    return undo


@scenario()
def await_payment(ledger: Ledger, order_id: str, timeout: float | None) -> str:
    """``charge``, then wait for ``("payment", order_id)`` (at most ``timeout`` s); note what came; ``ship``."""
    step = current_job.step
    step.run("charge", lambda: ledger.call("charge"))
    paid = step.wait_for_event("payment", key=order_id, timeout=timeout)
    ledger.note("paid", payload=paid)
    step.run("ship", lambda: ledger.call("ship"))
    return "shipped"


@scenario()
def prepare_then_await(ledger: Ledger, order_id: str) -> str:
    """``prepare`` (blocks until the flag ``release``), then wait for ``("payment", order_id)`` and note it."""
    step = current_job.step

    def prepare() -> None:
        ledger.call("prepare")
        ledger.wait_flag("release")

    step.run("prepare", prepare)
    ledger.note("paid", payload=step.wait_for_event("payment", key=order_id))
    return "done"


@scenario()
def await_then_crash(ledger: Ledger, order_id: str) -> str:
    """Wait for ``("payment", order_id)``, note it, then ``ship``, whose first call hangs until it is killed."""
    step = current_job.step
    ledger.note("paid", payload=step.wait_for_event("payment", key=order_id))

    def ship() -> None:
        ledger.call("ship")
        ledger.hang_first("ship")

    step.run("ship", ship)
    return "shipped"


@scenario()
def charge_nap_ship(ledger: Ledger, pause: float) -> str:
    """``charge`` (undone by ``undo charge``), a sleep of ``pause`` seconds, ``ship``."""
    step = current_job.step
    step.run("charge", lambda: ledger.call("charge"), compensate=_undo(ledger, "charge"))
    step.sleep(pause)
    step.run("ship", lambda: ledger.call("ship"))
    return "shipped"


scenario(name="capped_nap", options={"max_suspended_seconds": 1})(charge_nap_ship)


@scenario()
def charge_hold_ship(ledger: Ledger) -> str:
    """``charge`` and ``work`` (both undone; ``work`` blocks until the flag ``release``), then ``ship``."""
    step = current_job.step
    step.run("charge", lambda: ledger.call("charge"), compensate=_undo(ledger, "charge"))

    def work() -> None:
        ledger.call("work")
        ledger.wait_flag("release")

    step.run("work", work, compensate=_undo(ledger, "work"))
    ledger.note("after work")
    step.run("ship", lambda: ledger.call("ship"))
    return "shipped"


# ------------------------------------------------------------ step maps (C51)
@scenario()
def fan_out(ledger: Ledger, items: list[str], max_concurrency: int, hang: list[str], fail_once: list[str]) -> list[str]:
    """``price`` maps over ``items`` (each body noted as ``price <item>``), then ``total``.

    The first call of an item in ``hang`` hangs until its process is killed;
    the first call of an item in ``fail_once`` raises (a task-level retry).
    """
    step = current_job.step

    def price(item: str) -> str:
        what = f"price {item}"
        n = ledger.call(what)
        if item in hang:
            ledger.hang_first(what)
        if item in fail_once and n == 1:
            raise ConnectionError(f"the price service is down for {item}")
        return item.upper()

    values = step.map("price", price, items, key=str, max_concurrency=max_concurrency)
    step.run("total", lambda: ledger.call("total"))
    return values


@scenario()
def fan_out_many(ledger: Ledger, count: int) -> int:
    """``double`` maps over ``range(count)``; the sum of the values is noted as ``total``."""
    values = current_job.step.map("double", lambda n: n * 2, range(count), key=int)
    ledger.note("total", total=sum(values))
    return len(values)


# ------------------------------------------------------------ deploys (C48-C50)
@scenario()
def deploy_reorder(ledger: Ledger, order: str) -> str:
    """``charge``, wait for ``("go", order)``, ``reserve`` and ``notify``, wait for ``("ship", order)``, ``dispatch``.

    Version 2 (:meth:`Ledger.deploy`) runs ``notify`` before ``reserve``: it breaks exactly the runs that
    recorded those two steps.
    """
    step = current_job.step
    step.run("charge", lambda: ledger.call("charge"))
    step.wait_for_event("go", key=order)
    for what in ("reserve", "notify") if ledger.deployed() == 1 else ("notify", "reserve"):
        step.run(what, lambda what=what: ledger.call(what))
    step.wait_for_event("ship", key=order)
    step.run("dispatch", lambda: ledger.call("dispatch"))
    return "dispatched"


@scenario()
def deploy_patch(ledger: Ledger, order: str) -> str:
    """``charge``, wait for ``("go", order)``, ``dispatch``.

    Version 2 audits after the charge behind ``step.patched("audit-v2")``; version 3 audits without the patch
    (what breaks the runs waiting under version 1).
    """
    step = current_job.step
    step.run("charge", lambda: ledger.call("charge"))
    version = ledger.deployed()
    if version == 3 or (version == 2 and step.patched("audit-v2")):
        step.run("audit", lambda: ledger.call("audit"))
    step.wait_for_event("go", key=order)
    step.run("dispatch", lambda: ledger.call("dispatch"))
    return "dispatched"


@scenario()
def deploy_fork(ledger: Ledger, order: str) -> str:
    """``charge``, ``receipt``, wait for ``("go", order)``, ``dispatch``: forked from ``receipt#0`` to send it again."""
    step = current_job.step
    step.run("charge", lambda: ledger.call("charge"))
    step.run("receipt", lambda: ledger.call("receipt"))
    step.wait_for_event("go", key=order)
    step.run("dispatch", lambda: ledger.call("dispatch"))
    return "dispatched"
