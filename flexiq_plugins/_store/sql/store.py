"""The durable step store on SQLAlchemy Core: SQLite, PostgreSQL, MySQL/MariaDB.

[`SqlStepStore`][flexiq_plugins.SqlStepStore] is composed of one module per side of the interface,
over the plumbing they share:

- `connections`: the engine, held connections, one transaction per
  call, the retries of dropped connections and deadlocks, the clock;
- `reads`: what both sides read (the clock, a run, its steps);
- `attempt_side`: `AttemptStore`
  (claims, fenced step writes, the ends of a run);
- `operator_side`: `OperatorStore`
  (listing, dead letters, cleanup, recovery, events).

Why it is built the way it is (engines, migrations and error translation have
their own modules, each with its reasons):

- **The database's clock, not the worker's (C23).** Every method that stamps or
  compares a time first reads the clock *inside its transaction*, after any row
  lock it needs is held (PostgreSQL ``clock_timestamp()``, MySQL/MariaDB
  ``NOW(6)``, SQLite ``julianday('now')``). A worker whose own clock runs an hour
  ahead therefore cannot see a live lease as expired and steal the claim.
- **One transaction per interface call (C9, C25).** ``begin`` decides on the
  run with its row locked (an upsert that returns the row; SQLite serializes
  writers with ``BEGIN IMMEDIATE`` as well), so two deliveries of one job decide
  Finished / Busy / claim one after the other; a run not stored yet is
  inserted already claimed in one statement. On PostgreSQL ``begin`` first
  tries without holding the lock, in one autocommitted statement: a run that
  holds no claim is claimed there if its row is still the version the
  statement read, and any other run is read with its row version, decided on,
  then claimed with a compare-and-set on that version (a second statement:
  `folded` says why either decides the same); only a lost race takes the
  locking transaction. ``mark_recovered`` locks the row the
  same way. ``renew``, ``commit_step`` and ``finish`` are fenced ``UPDATE …
  WHERE run_key AND owner AND attempt``: a zero row count means another
  attempt took the run over, and nothing is written ([`ClaimLost`][flexiq_plugins.errors.ClaimLost]). The
  hot paths (a step, a start, a finish) are folded into as few statements as
  each database allows, in `folded` (one autocommitted statement each on
  PostgreSQL). What each decision is (claim,
  busy, finished, fenced out, recoverable) is not written here but in
  `flexiq_plugins._store.claims`, shared with the memory store.
- **MySQL's insert-if-absent takes the row lock itself.** ``INSERT … ON
  DUPLICATE KEY UPDATE`` X-locks an existing row, where ``INSERT IGNORE`` would
  take a shared lock that two concurrent ``FOR UPDATE`` readers then deadlock
  on. A deadlock the server reports anyway (the whole transaction was rolled
  back) is retried a few times before it surfaces as [`StoreUnavailable`][flexiq_plugins.errors.StoreUnavailable].
- **Lazy schema.** Construction never connects. The first call checks the
  schema once per store object (thread-safe): a schema at the newest revision
  is used as it is, without a lock; an older one (or none) is upgraded with
  the Alembic migrations under the migration lock of `migrate`.
"""

from __future__ import annotations

from ...errors import StoreMisconfigured
from ..base import StepStore
from .attempt_side import SqlAttemptSide
from .engine import safe_url, sqlite_file, sqlite_read_only
from .errors import read_only_message
from .migrate import schema_revision
from .operator_side import SqlOperatorSide

__all__ = ["SqlStepStore"]


class SqlStepStore(SqlAttemptSide, SqlOperatorSide, StepStore):
    """A [`StepStore`][flexiq_plugins.StepStore] in a SQL database, through SQLAlchemy Core.

    Parameters:
      url_or_engine (str | URL | Engine): a SQLAlchemy URL (``sqlite:///path``,
        ``postgresql://…``, ``mysql://…``, ``mariadb://…``; a missing driver is
        filled in: psycopg 3, PyMySQL) or an engine you configured yourself (it
        is used as is, and not disposed by [`close`][flexiq_plugins.StepStore.close]).
      auto_upgrade (bool): run the shipped migrations on first use (once per
        store object). Off, run [`upgrade_store`][flexiq_plugins.upgrade_store] (``flexiq store
        upgrade``) yourself.
      table_prefix (str): prefix of the table names (``flexiq_runs`` …).

    Raises:
      ConfigurationError: an unusable URL, another database or a missing driver.

    Construction does not connect; an unreachable server raises
    [`StoreUnavailable`][flexiq_plugins.errors.StoreUnavailable] at first use.
    """

    def __repr__(self) -> str:
        return f"SqlStepStore({safe_url(self._engine.url)!r}, table_prefix={self._prefix!r})"

    def describe(self) -> str:
        """The store for a worker's start line: its URL (password hidden), table prefix and schema revision.

        Creates or upgrades the tables first if the store does that (``auto_upgrade``).

        Raises:
          StoreUnavailable: the database cannot be reached.
          StoreError: another database error.
        """
        revision = self._read(lambda conn: schema_revision(conn, self._prefix))  # type: ignore[arg-type]
        return f"{self.url} (tables {self._prefix}*, schema revision {revision or 'none: run flexiq store upgrade'})"

    def check_writable(self) -> None:
        """Refuse a SQLite store whose URL opens it read-only (``mode=ro``, ``immutable=1``), without connecting.

        A worker calls it as it starts (C41). Other databases, and a SQLite
        file whose permissions refuse writes, are refused at their first
        write instead ([`StoreMisconfigured`][flexiq_plugins.errors.StoreMisconfigured] too).

        Raises:
          StoreMisconfigured: the URL opens the database read-only.
        """
        read_only = sqlite_read_only(self._engine.url)
        if read_only is not None:
            why = read_only_message(read_only, sqlite_file(self._engine.url) or "")
            raise StoreMisconfigured(f"the step store at {self.url} cannot be used: {why}")
