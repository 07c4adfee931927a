"""The demo's outside world: a fake payment API, a flaky receipt mailer, a carrier and a journal.

All three keep their state in one SQLite file shared by the demo and its
worker processes, so what they report survives a worker killed with SIGKILL.

The payment API behaves like a real one: it deduplicates on the idempotency
key (a repeated key returns the first charge) and counts every call it really
received, which is how the demo proves "one charge".
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Carrier", "CarrierDown", "Journal", "Payments", "ReceiptMailer", "ReceiptNotSent", "state_path"]


def state_path() -> Path:
    """The shared SQLite file: ``$FLEXIQ_DEMO_DIR/services.db``."""
    return Path(os.environ.get("FLEXIQ_DEMO_DIR", ".")) / "services.db"


@contextmanager
def _db() -> Iterator[sqlite3.Connection]:
    conn = sqlite3.connect(state_path(), timeout=30, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.executescript(
            """
            CREATE TABLE IF NOT EXISTS payment_calls (n INTEGER PRIMARY KEY, idem_key TEXT, at REAL);
            CREATE TABLE IF NOT EXISTS charges (idem_key TEXT PRIMARY KEY, charge TEXT);
            CREATE TABLE IF NOT EXISTS receipts (n INTEGER PRIMARY KEY, order_id TEXT, ok INTEGER);
            CREATE TABLE IF NOT EXISTS journal (n INTEGER PRIMARY KEY, at REAL, line TEXT);
            CREATE TABLE IF NOT EXISTS refunds (idem_key TEXT PRIMARY KEY, charge TEXT);
            CREATE TABLE IF NOT EXISTS shipments (n INTEGER PRIMARY KEY, order_id TEXT);
            """
        )
        yield conn
    finally:
        conn.close()


class Payments:
    """A fake payment API that deduplicates on the idempotency key."""

    def charge(self, order_id: str, amount_cents: int, *, idempotency_key: str) -> dict[str, object]:
        """Charge once per idempotency key; a repeated key returns the first charge."""
        with _db() as db:
            db.execute("BEGIN IMMEDIATE")
            db.execute("INSERT INTO payment_calls (idem_key, at) VALUES (?, ?)", (idempotency_key, time.time()))
            row = db.execute("SELECT charge FROM charges WHERE idem_key = ?", (idempotency_key,)).fetchone()
            if row is None:
                charge = {"id": "ch_" + uuid.uuid4().hex[:10], "order": order_id, "amount": amount_cents}
                db.execute("INSERT INTO charges VALUES (?, ?)", (idempotency_key, json.dumps(charge)))
            else:
                charge = json.loads(row[0])
            db.execute("COMMIT")
            return charge

    def refund(self, charge_id: str, *, idempotency_key: str) -> str:
        """Refund a charge once per idempotency key; return the refund's id."""
        with _db() as db:
            db.execute("INSERT OR IGNORE INTO refunds VALUES (?, ?)", (idempotency_key, charge_id))
        return "re_" + charge_id.removeprefix("ch_")

    def refunds(self, run_key: str = "") -> int:
        """How many distinct refunds were made (for keys starting with ``run_key``)."""
        with _db() as db:
            return int(db.execute("SELECT count(*) FROM refunds WHERE idem_key LIKE ?", (run_key + "%",)).fetchone()[0])

    def calls(self, run_key: str = "") -> int:
        """How many times the API was really called (for keys starting with ``run_key``)."""
        with _db() as db:
            row = db.execute("SELECT count(*) FROM payment_calls WHERE idem_key LIKE ?", (run_key + "%",))
            return int(row.fetchone()[0])

    def charges(self, run_key: str = "") -> int:
        """How many distinct charges were made (for keys starting with ``run_key``)."""
        with _db() as db:
            return int(db.execute("SELECT count(*) FROM charges WHERE idem_key LIKE ?", (run_key + "%",)).fetchone()[0])


class ReceiptNotSent(Exception):
    """The mail server refused the receipt (it does so once, on purpose)."""


class ReceiptMailer:
    """Sends receipts; the first attempt for an order fails."""

    def send(self, order_id: str, charge: dict[str, object]) -> str:
        """Send a receipt, failing the first time for each order."""
        with _db() as db:
            tries = db.execute("SELECT count(*) FROM receipts WHERE order_id = ?", (order_id,)).fetchone()[0]
            ok = tries > 0
            db.execute("INSERT INTO receipts (order_id, ok) VALUES (?, ?)", (order_id, int(ok)))
        if not ok:
            raise ReceiptNotSent(f"mail server busy, receipt for {order_id} not sent")
        return f"receipt for {charge['id']} sent"


class CarrierDown(Exception):
    """The carrier refused the parcel (in the demo's ``--ship-fails`` variant it always does)."""


class Carrier:
    """Ships parcels; with ``FLEXIQ_DEMO_SHIP_FAILS`` set, every try fails."""

    def ship(self, order_id: str) -> tuple[int, str]:
        """Try to ship; return ``(try number, tracking id)`` or raise :class:`CarrierDown` naming the try."""
        with _db() as db:
            db.execute("INSERT INTO shipments (order_id) VALUES (?)", (order_id,))
            tries = int(db.execute("SELECT count(*) FROM shipments WHERE order_id = ?", (order_id,)).fetchone()[0])
        if os.environ.get("FLEXIQ_DEMO_SHIP_FAILS"):
            raise CarrierDown(f"the carrier refused the parcel for {order_id} (try {tries})")
        return tries, f"trk_{order_id}"

    def tries(self, order_id: str) -> int:
        """How many times shipping was tried for ``order_id``."""
        with _db() as db:
            return int(db.execute("SELECT count(*) FROM shipments WHERE order_id = ?", (order_id,)).fetchone()[0])


@dataclass
class Journal:
    """The story the demo prints: lines written by the task, read by the demo."""

    def write(self, line: str) -> None:
        """Append one line."""
        with _db() as db:
            db.execute("INSERT INTO journal (at, line) VALUES (?, ?)", (time.time(), line))

    def read_from(self, n: int) -> list[tuple[int, float, str]]:
        """Return lines after number ``n``."""
        with _db() as db:
            return list(db.execute("SELECT n, at, line FROM journal WHERE n > ? ORDER BY n", (n,)))
