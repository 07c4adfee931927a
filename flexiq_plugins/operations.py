"""What an operator does to runs and dead letters, as a Python API (C30, C35).

The ``flexiq`` command line is a thin layer over these functions; a script or
an admin page can call them directly with any :class:`~flexiq_plugins.StepStore`.

Why it is shaped this way:

- **Re-publishing goes through the job's own framework.** A dead-letter retry
  or a recovery publishes the stored :class:`~flexiq_plugins.JobEnvelope` again
  with a *new* job id that carries the *old* run key, through a
  :data:`Publisher` per framework (:func:`celery_publisher`,
  :func:`dramatiq_publisher`). The run replays its committed steps and its
  idempotency keys stay those of the original run (C11).
- **Check, then change, then publish.** A retry first makes sure a publisher
  exists for the job's framework, so a missing ``--app`` changes nothing; only
  then does it reset the run (:meth:`StepStore.prepare_retry`) and publish. If
  the publish fails the run stays ``pending`` and :func:`recover` picks it up.
- **Recovery is exactly-once per stranded state.** Each candidate is claimed
  with :meth:`StepStore.mark_recovered`, a compare-and-set on the run's status
  and ``updated_at``: of two recoverers running at once, one publishes. The
  claim moves ``updated_at`` past the run's due time, so a recovered run is
  not recovered again until ``stale_after`` has passed without it starting.
  A duplicate would still be harmless (the core's claim lets one delivery
  run the body), but it is avoided.
- **Values are decoded only on request, and never unpickled.** The default
  readers cover the JSON family (``json``, ``kombu:json``, ``dramatiq:json``,
  optionally zlib-compressed); anything else (pickle, encrypted values) needs
  the caller's own :class:`~flexiq_plugins.CodecChain` and otherwise gets a
  note instead of a value.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._store.base import JobEnvelope, RunRecord, StepRow, StepStore
from .codec import CodecChain, FunctionSerializer, ZlibCodec
from .durations import parse_duration
from .errors import DecodeError, FlexiqError, StoreError, UnknownDeadLetter

__all__ = [
    "DEFAULT_GRACE_SECONDS",
    "DEFAULT_STALE_SECONDS",
    "AlreadyRetried",
    "DecodedValue",
    "NoPublisher",
    "OperationError",
    "PublishFailed",
    "Publisher",
    "RecoveryReport",
    "Retried",
    "RunDetails",
    "Stranded",
    "Sweeper",
    "celery_publisher",
    "cleanup",
    "decode_step_value",
    "dramatiq_publisher",
    "find_stranded",
    "list_runs",
    "load_object",
    "purge_dead_letters",
    "recover",
    "retry_dead_letter",
    "retry_dead_letters",
    "show_run",
]

logger = logging.getLogger("flexiq_plugins.operations")

Publisher = Callable[[JobEnvelope, str], str]
"""``publish(envelope, run_key) -> new job id``: re-publishes a stored job carrying ``run_key``."""

DEFAULT_GRACE_SECONDS = 60.0
"""How long past its wake time or lease a run may be before :func:`recover` takes it, seconds."""

DEFAULT_STALE_SECONDS = 3600.0
"""How long a ``pending`` or ``retrying`` run may go without an update before :func:`recover` takes it, seconds."""

_SCAN_LIMIT = 100_000
_STALE_STATUSES = ("pending", "retrying")


# ------------------------------------------------------------------ errors
class OperationError(FlexiqError):
    """An operator action could not be carried out (the ``flexiq`` CLI exits 1)."""


class NoPublisher(OperationError):
    """No publisher was given for the job's framework (the CLI exits 2: pass ``--app`` / ``--broker``)."""


class PublishFailed(OperationError):
    """The broker refused or could not be reached while re-publishing a job."""


class AlreadyRetried(OperationError):
    """The dead letter was retried already and its run has moved on (it is no longer ``dead``)."""


# -------------------------------------------------------------- publishers
def celery_publisher(app: Any) -> Publisher:
    """Return a :data:`Publisher` that re-publishes Celery jobs with ``app`` (C11, C30).

    Parameters:
      app(celery.Celery): the application whose broker receives the job.
    """
    import celery_ext

    def publish(envelope: JobEnvelope, run_key: str) -> str:
        return str(celery_ext.republish(app, envelope, run_key).id)

    return publish


def dramatiq_publisher(broker: Any) -> Publisher:
    """Return a :data:`Publisher` that re-publishes Dramatiq jobs on ``broker`` (C11, C30).

    Parameters:
      broker(dramatiq.Broker): the broker to enqueue on.
    """
    import dramatiq_ext

    def publish(envelope: JobEnvelope, run_key: str) -> str:
        return str(dramatiq_ext.republish(broker, envelope, run_key).message_id)

    return publish


def load_object(ref: str, default_attrs: Sequence[str] = ()) -> Any:
    """Import ``module:attribute`` (or ``module``, then its first of ``default_attrs``), like ``celery -A``.

    The current directory is put on ``sys.path`` first, so a project's own
    module is found when the command runs from the project's root.

    Parameters:
      ref(str): ``"proj.celery:app"``, ``"proj.tasks:broker"`` or ``"proj"``.
      default_attrs(Sequence[str]): attribute names tried when ``ref`` has no ``:``.

    Raises:
      ConfigurationError: the module cannot be imported or has no such attribute.
    """
    from .errors import ConfigurationError

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    module_name, _, attr = ref.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"cannot import {module_name!r} (from {ref!r}): {exc}") from exc
    for name in [attr] if attr else default_attrs:
        obj = getattr(module, name, None)
        if obj is not None:
            return obj
    tried = attr or " or ".join(default_attrs)
    raise ConfigurationError(f"module {module_name!r} has no {tried!r} (from {ref!r}); use module:attribute")


def _publisher_for(envelope: JobEnvelope, publishers: Mapping[str, Publisher]) -> Publisher:
    publish = publishers.get(envelope.framework)
    if publish is not None:
        return publish
    flag = {"celery": "--app module:app", "dramatiq": "--broker module:broker"}.get(envelope.framework, "a publisher")
    raise NoPublisher(f"{envelope.task_name!r} is a {envelope.framework} job: pass {flag} to re-publish it")


def _publish(publish: Publisher, envelope: JobEnvelope, run_key: str) -> str:
    try:
        return publish(envelope, run_key)
    except Exception as exc:
        raise PublishFailed(
            f"could not re-publish {envelope.task_name!r} (run {run_key}): {type(exc).__name__}: {exc}"
        ) from exc


# -------------------------------------------------------------------- runs
@dataclass(frozen=True)
class RunDetails:
    """A run with its step rows, as ``flexiq runs show`` prints it.

    Parameters:
      run(RunRecord): the run.
      steps(list[StepRow]): its committed steps by position.
      wake_at(float | None): the latest sleep step's wake time, epoch seconds.
    """

    run: RunRecord
    steps: list[StepRow]
    wake_at: float | None


def list_runs(
    store: StepStore,
    *,
    status: str | None = None,
    task_name: str | None = None,
    since: str | float | None = None,
    limit: int = 100,
) -> list[RunRecord]:
    """Return runs, newest first (``flexiq runs list``).

    Parameters:
      store(StepStore): the store.
      status(str | None): only runs in this status.
      task_name(str | None): only runs of this task or actor.
      since(str | float | None): only runs updated within this window before
        now (``"1h"``, ``"7d"`` or seconds), on the store's clock.
      limit(int): at most this many runs.

    Raises:
      ValueError: ``since`` is not a duration.
      StoreUnavailable: the store cannot be reached.
    """
    cutoff = None if since is None else store.now() - parse_duration(since)
    return store.list_runs(status=status, task_name=task_name, since=cutoff, limit=limit)


def show_run(store: StepStore, run_key: str) -> RunDetails:
    """Return a run with its steps (``flexiq runs show``).

    Raises:
      UnknownRun: no run has ``run_key``.
      StoreUnavailable: the store cannot be reached.
    """
    run = store.get_run(run_key)
    steps = store.get_steps(run_key)
    return RunDetails(run, steps, _wake_at(steps))


def _wake_at(steps: Iterable[StepRow]) -> float | None:
    sleeps = [s for s in steps if s.kind == "sleep" and s.wake_at is not None]
    return max(sleeps, key=lambda s: s.position).wake_at if sleeps else None


# ------------------------------------------------------------------ values
@dataclass(frozen=True)
class DecodedValue:
    """A step value decoded for display, or why it was not.

    Parameters:
      ok(bool): whether ``value`` holds the decoded value.
      value(Any): the value (``None`` when not decoded).
      note(str): why it was not decoded ('' when it was).
    """

    ok: bool
    value: Any = None
    note: str = ""


_JSON_READERS: dict[str, Callable[[bytes], Any]] = {
    "json": json.loads,
    "kombu:json": json.loads,
    "dramatiq:json": lambda data: json.loads(data)["v"],
}


def decode_step_value(row: StepRow, codec: CodecChain | None = None) -> DecodedValue:
    """Decode a step's stored value for display (C7); never raises for bad or foreign bytes.

    With ``codec`` the value is decoded with it. Without, the stored header
    chooses a JSON-family reader (``json``, ``kombu:json``, ``dramatiq:json``,
    each optionally behind ``zlib``); other serializers (pickle) and codecs
    (Fernet) are not decoded and the note says which chain wrote the bytes.

    Parameters:
      row(StepRow): a ``run`` step.
      codec(CodecChain | None): the chain the workers use, if known.
    """
    if row.value is None:
        return DecodedValue(False, note="no value (a sleep)")
    chain = codec or _reader_for(row.value)
    if chain is None:
        return DecodedValue(False, note=f"stored by {_chain_name(row.value)!r}; pass --codec to decode it")
    try:
        return DecodedValue(True, chain.decode(row.value, step_key=row.step_key))
    except DecodeError as exc:
        return DecodedValue(False, note=str(exc))


def _chain_name(stored: bytes) -> str:
    header = stored.partition(b"\n")[0].decode(errors="replace")
    return header.partition("|")[2] if header.startswith("FQ1|") else "unknown"


def _reader_for(stored: bytes) -> CodecChain | None:
    serializer, *codecs = _chain_name(stored).split("|")
    loads = _JSON_READERS.get(serializer)
    if loads is None or any(c != "zlib" for c in codecs):
        return None
    return CodecChain(FunctionSerializer(serializer, _no_dump, loads), [ZlibCodec() for _ in codecs])


def _no_dump(value: Any) -> bytes:
    raise TypeError("a display reader does not encode")


# ------------------------------------------------------------ dead letters
@dataclass(frozen=True)
class Retried:
    """A dead letter re-published (C30).

    Parameters:
      dead_letter_id(int): the dead letter.
      run_key(str): the run, unchanged (C11).
      framework(str): ``"celery"`` or ``"dramatiq"``.
      job_id(str): the new job's id.
    """

    dead_letter_id: int
    run_key: str
    framework: str
    job_id: str


def retry_dead_letter(
    store: StepStore,
    dead_letter_id: int,
    publishers: Mapping[str, Publisher],
    *,
    reset_from: str | None = None,
) -> Retried:
    """Retry one dead letter: reset its run, then re-publish it with a new job id and the same run key (C11, C30).

    Parameters:
      store(StepStore): the store.
      dead_letter_id(int): the dead letter.
      publishers(Mapping[str, Publisher]): a publisher per framework name.
      reset_from(str | None): a step key; that step and every later one are
        dropped so they run again.

    Raises:
      UnknownDeadLetter: no such dead letter.
      UnknownRun: its run is gone, or it has no step ``reset_from``.
      NoPublisher: no publisher for the job's framework (nothing changed).
      AlreadyRetried: retried before and the run is no longer ``dead`` (nothing changed).
      PublishFailed: the broker refused; the run stays ``pending`` for :func:`recover`.
      StoreUnavailable: the store cannot be reached.
    """
    dead = store.get_dead_letter(dead_letter_id)
    publish = _publisher_for(dead.envelope, publishers)
    run = store.get_run(dead.run_key)
    if dead.retried_at is not None and run.status not in ("dead", "pending"):
        raise AlreadyRetried(f"dead letter {dead_letter_id} was retried already; its run is now {run.status!r}")
    store.prepare_retry(dead_letter_id, reset_from=reset_from)
    job_id = _publish(publish, dead.envelope, dead.run_key)
    logger.info("dead letter %s re-published as job %s (run %s)", dead_letter_id, job_id, dead.run_key)
    return Retried(dead_letter_id, dead.run_key, dead.envelope.framework, job_id)


def retry_dead_letters(
    store: StepStore,
    publishers: Mapping[str, Publisher],
    *,
    ids: Sequence[int] | None = None,
    task_name: str | None = None,
) -> tuple[list[Retried], list[tuple[int, OperationError | StoreError]]]:
    """Retry several dead letters; one failure does not stop the others (C30).

    A publisher is checked for every selected dead letter first: if one is
    missing, :class:`NoPublisher` is raised and nothing is changed.

    Parameters:
      store(StepStore): the store.
      publishers(Mapping[str, Publisher]): a publisher per framework name.
      ids(Sequence[int] | None): the dead letters; every one not yet retried when ``None``.
      task_name(str | None): with ``ids=None``, only those of this task or actor.

    Returns:
      tuple: the retried ones, and ``(id, error)`` for each that failed.

    Raises:
      NoPublisher: a selected dead letter's framework has no publisher (nothing changed).
      StoreUnavailable: the store cannot be reached while listing.
    """
    if ids is None:
        ids = [d.id for d in store.list_dead_letters(task_name=task_name)]
    for dead_letter_id in ids:  # all publishers first, so a missing --app/--broker changes nothing
        with contextlib.suppress(UnknownDeadLetter):
            _publisher_for(store.get_dead_letter(dead_letter_id).envelope, publishers)
    done: list[Retried] = []
    failed: list[tuple[int, OperationError | StoreError]] = []
    for dead_letter_id in ids:
        try:
            done.append(retry_dead_letter(store, dead_letter_id, publishers))
        except (OperationError, StoreError) as exc:
            failed.append((dead_letter_id, exc))
    return done, failed


def purge_dead_letters(store: StepStore, ids: Sequence[int] | None = None) -> int:
    """Delete dead letters (all when ``ids`` is ``None``); their runs stay until cleanup (C30).

    Every id is checked first, so an unknown one deletes nothing.

    Returns:
      int: how many were deleted.

    Raises:
      UnknownDeadLetter: one of ``ids`` does not exist.
      StoreUnavailable: the store cannot be reached.
    """
    if ids is not None:
        for dead_letter_id in ids:
            store.get_dead_letter(dead_letter_id)
    return store.purge_dead_letters(ids)


# ---------------------------------------------------------------- recovery
@dataclass(frozen=True)
class Stranded:
    """A run that no broker message will wake (C35).

    Parameters:
      run(RunRecord): the run as read.
      why(str): ``"sleep_overdue"``, ``"lease_expired"`` or ``"stale"``.
      due_at(float): when it should have moved on: the wake time, the lease
        expiry or the last update, epoch seconds.
    """

    run: RunRecord
    why: str
    due_at: float


@dataclass
class RecoveryReport:
    """What :func:`recover` did.

    Parameters:
      dry_run(bool): nothing was changed or published.
      recovered(list[tuple[Stranded, str]]): re-published runs with the new job id ('' in a dry run).
      skipped(list[tuple[Stranded, str]]): runs left alone, with why.
      failed(list[tuple[Stranded, str]]): runs whose publish failed, with the error.
    """

    dry_run: bool
    recovered: list[tuple[Stranded, str]] = field(default_factory=list)
    skipped: list[tuple[Stranded, str]] = field(default_factory=list)
    failed: list[tuple[Stranded, str]] = field(default_factory=list)


def find_stranded(
    store: StepStore,
    *,
    grace: str | float = DEFAULT_GRACE_SECONDS,
    stale_after: str | float = DEFAULT_STALE_SECONDS,
) -> list[Stranded]:
    """Return the runs :func:`recover` would re-publish, oldest due first (C35).

    - ``sleeping`` past its wake time (the latest sleep step's ``wake_at``) by more than ``grace``;
    - ``running`` whose claim lease expired more than ``grace`` ago (its worker died);
    - ``pending`` or ``retrying`` not updated for more than ``stale_after``
      (at least ``grace``).

    Recovering a run moves its ``updated_at`` past the moment it fell due; such
    a run is a candidate again only once that recovery is older than
    ``stale_after`` (its job never started, e.g. no worker consumes the queue),
    so a cron job or a sweeper does not pile up copies of one job.

    Parameters:
      store(StepStore): the store.
      grace(str | float): a duration (``"60s"``) or seconds.
      stale_after(str | float): a duration (``"1h"``) or seconds.

    Raises:
      ValueError: a duration cannot be parsed.
      StoreUnavailable: the store cannot be reached.
    """
    grace_s = parse_duration(grace)
    stale_s = max(parse_duration(stale_after), grace_s)
    now = store.now()
    due, stale = now - grace_s, now - stale_s
    found = [*_overdue_sleepers(store, due, stale), *_lost_claims(store, due, stale)]
    for status in _STALE_STATUSES:
        runs = store.list_runs(status=status, limit=_SCAN_LIMIT)
        found += [Stranded(r, "stale", r.updated_at) for r in runs if r.updated_at < stale]
    return sorted(found, key=lambda s: s.due_at)


def _unclaimed_since(run: RunRecord, due_at: float, stale: float) -> bool:
    """Not recovered yet (nothing touched the run after it fell due), or recovered longer than ``stale`` ago."""
    return run.updated_at <= due_at or run.updated_at < stale


def _overdue_sleepers(store: StepStore, due: float, stale: float) -> list[Stranded]:
    found = []
    for run in store.list_runs(status="sleeping", limit=_SCAN_LIMIT):
        if run.updated_at >= due:
            continue  # a sleep is committed before its wake time: not overdue yet, or just recovered
        wake_at = _wake_at(store.get_steps(run.run_key))
        if wake_at is not None and wake_at < due and _unclaimed_since(run, wake_at, stale):
            found.append(Stranded(run, "sleep_overdue", wake_at))
    return found


def _lost_claims(store: StepStore, due: float, stale: float) -> list[Stranded]:
    found = []
    for run in store.list_runs(status="running", limit=_SCAN_LIMIT):
        expired = run.lease_until if run.lease_until is not None else run.updated_at
        if expired < due and _unclaimed_since(run, expired, stale):
            found.append(Stranded(run, "lease_expired", expired))
    return found


def recover(
    store: StepStore,
    publishers: Mapping[str, Publisher],
    *,
    grace: str | float = DEFAULT_GRACE_SECONDS,
    stale_after: str | float = DEFAULT_STALE_SECONDS,
    dry_run: bool = False,
) -> RecoveryReport:
    """Re-publish stranded runs, each exactly once even with several recoverers at once (C35).

    Each candidate of :func:`find_stranded` is won with
    :meth:`StepStore.mark_recovered`, then re-published through its framework's
    publisher with a new job id carrying its run key.

    Parameters:
      store(StepStore): the store.
      publishers(Mapping[str, Publisher]): a publisher per framework name;
        runs of another framework are skipped.
      grace(str | float): see :func:`find_stranded`.
      stale_after(str | float): see :func:`find_stranded`.
      dry_run(bool): only report what would be re-published.

    Raises:
      ValueError: a duration cannot be parsed.
      StoreUnavailable: the store cannot be reached.
    """
    report = RecoveryReport(dry_run=dry_run)
    for stranded in find_stranded(store, grace=grace, stale_after=stale_after):
        _recover_one(store, publishers, stranded, report)
    return report


def _recover_one(
    store: StepStore, publishers: Mapping[str, Publisher], stranded: Stranded, report: RecoveryReport
) -> None:
    run = stranded.run
    publish = publishers.get(run.framework)
    if publish is None:
        report.skipped.append((stranded, f"no publisher for {run.framework!r} jobs"))
    elif report.dry_run:
        report.recovered.append((stranded, ""))
    elif not store.mark_recovered(run.run_key, status=run.status, updated_at=run.updated_at):
        report.skipped.append((stranded, "changed meanwhile, or recovered by another process"))
    else:
        try:
            job_id = _publish(publish, run.envelope, run.run_key)
        except PublishFailed as exc:
            report.failed.append((stranded, str(exc)))
            return
        logger.info("recovered run %s (%s) as job %s", run.run_key, stranded.why, job_id)
        report.recovered.append((stranded, job_id))


class Sweeper:
    """A daemon thread that calls :func:`recover` every ``interval`` seconds (C35).

    Safe to run in every worker at once: :meth:`StepStore.mark_recovered`
    lets one of them re-publish each stranded run. Errors are logged and the
    next sweep goes on.

    Parameters:
      store(StepStore): the store.
      publishers(Mapping[str, Publisher]): a publisher per framework name.
      interval(str | float): time between sweeps (``"1m"`` or seconds).
      grace(str | float): see :func:`find_stranded`.
      stale_after(str | float): see :func:`find_stranded`.

    Raises:
      ValueError: a duration cannot be parsed, or ``interval`` is zero.
    """

    def __init__(
        self,
        store: StepStore,
        publishers: Mapping[str, Publisher],
        *,
        interval: str | float = 60.0,
        grace: str | float = DEFAULT_GRACE_SECONDS,
        stale_after: str | float = DEFAULT_STALE_SECONDS,
    ) -> None:
        self.store = store
        self.publishers = dict(publishers)
        self.interval = parse_duration(interval)
        if self.interval <= 0:
            raise ValueError("the sweeper's interval must be positive")
        self.grace = parse_duration(grace)
        self.stale_after = parse_duration(stale_after)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Sweeper:
        """Start the thread (once); return ``self``."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="flexiq-sweeper", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        """Ask the thread to stop and wait for it up to ``timeout`` seconds."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def sweep(self) -> RecoveryReport:
        """Run one recovery now and return its report."""
        return recover(self.store, self.publishers, grace=self.grace, stale_after=self.stale_after)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                report = self.sweep()
            except Exception:
                logger.exception("recovery sweep failed; the next one runs in %s s", self.interval)
                continue
            if report.recovered or report.failed:
                logger.info("recovery sweep: %d re-published, %d failed", len(report.recovered), len(report.failed))


# ----------------------------------------------------------------- storage
def cleanup(store: StepStore, older_than: str | float) -> int:
    """Delete succeeded, failed and cancelled runs last updated more than ``older_than`` ago (C27).

    Dead-lettered, sleeping, running and pending runs are kept.

    Parameters:
      store(StepStore): the store.
      older_than(str | float): the retention, a duration (``"7d"``) or seconds.

    Returns:
      int: how many runs were deleted.

    Raises:
      ValueError: ``older_than`` is not a duration.
      StoreUnavailable: the store cannot be reached.
    """
    return store.cleanup(older_than=store.now() - parse_duration(older_than))
