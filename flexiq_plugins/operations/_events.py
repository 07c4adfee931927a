"""Sending an event to the runs that wait for it (C33): commit it, then wake them through their integration.

**Committed first, then woken.** The event is stored before anything is
published: a run that polls from then on receives it, and a run that waits
already is found by the store (:meth:`StepStore.add_event`) and re-published
through the publisher of its framework (an app or broker of this process,
:mod:`flexiq_plugins.registry`). Without one the run is left to recovery
(``flexiq recover``, the :class:`~flexiq_plugins.operations.Sweeper`), which
re-publishes a waiting run whose event has arrived: the event is never lost,
only later.

**Woken once per waiting state.** A ``waiting`` run is won with the same
compare-and-set recovery uses (:meth:`StepStore.mark_recovered`), so a
sender and a sweeper that read the same state publish it once. A run still ``running``
between its poll and its suspension is published without it: that delivery
finds the run busy and comes back shortly, by which time the run waits.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .._store.base import EventRecord, RunRecord, StepStore
from ..codec import CodecChain
from ..config import DurableConfig
from ..errors import PublishFailed
from ..identity import check_run_key
from ..registry import Publisher
from ..waits import encode_payload, validate_event_field
from ._publishing import publish

__all__ = ["EventSent", "cleanup_events", "send_event", "wake_run"]

logger = logging.getLogger("flexiq_plugins.operations")

_DEFAULT_MAX_BYTES = DurableConfig().step_bytes


@dataclass(frozen=True)
class EventSent:
    """What :func:`send_event` did (C33).

    Parameters:
      event(EventRecord): the stored event.
      woken(list[tuple[str, str]]): ``(run key, job id)`` of each run re-published now.
      left(list[tuple[str, str]]): ``(run key, why)`` of each waiting run left to
        recovery: no publisher for its framework, woken by another sender, or a
        publish that failed.
    """

    event: EventRecord
    woken: list[tuple[str, str]] = field(default_factory=list)
    left: list[tuple[str, str]] = field(default_factory=list)


def send_event(
    store: StepStore,
    topic: str,
    key: str,
    payload: Any = None,
    *,
    run_key: str | None = None,
    publishers: Mapping[str, Publisher] | None = None,
    codec: CodecChain | None = None,
    max_bytes: int = _DEFAULT_MAX_BYTES,
) -> EventSent:
    """Store the event ``(topic, key)``, then wake the runs that wait for it (C33).

    Parameters:
      store(StepStore): the store.
      topic(str): the topic, e.g. ``"payment"`` (1–255 characters, no control characters).
      key(str): the key, e.g. an order id (same rules).
      payload(Any): what ``step.wait_for_event`` returns; anything ``codec`` encodes.
      run_key(str | None): send it to that run only; it is then received even
        if the run did not exist yet when it was sent.
      publishers(Mapping[str, Publisher] | None): a publisher per framework
        name; runs of another framework are left to recovery.
      codec(CodecChain | None): encodes the payload; the core's JSON when
        ``None`` (workers read both their own chain and JSON).
      max_bytes(int): the largest encoded payload, bytes (default the step cap, 262144).

    Raises:
      InvalidEvent: a bad topic or key, or a payload that cannot be encoded or is too big; nothing is stored.
      InvalidRunKey: ``run_key`` is not a str of 1 to 255 characters.
      StoreUnavailable: the store cannot be reached.
    """
    validate_event_field("topic", topic)
    validate_event_field("key", key)
    if run_key is not None:
        check_run_key(run_key)
    sent = store.add_event(topic, key, encode_payload(payload, codec, max_bytes=max_bytes), run_key=run_key)
    report = EventSent(sent.event)
    for run in sent.waiters:
        _wake(store, run, publishers or {}, report)
    logger.info("event %s (%r, %r) sent; %d run(s) woken", sent.event.id, topic, key, len(report.woken))
    return report


def _wake(store: StepStore, run: RunRecord, publishers: Mapping[str, Publisher], report: EventSent) -> None:
    try:
        job_id = wake_run(store, run, publishers)
    except PublishFailed as exc:
        report.left.append((run.run_key, str(exc)))
        return
    if job_id is None:
        why = "no publisher" if run.framework not in publishers else "woken by another sender"
        report.left.append((run.run_key, why))
    else:
        report.woken.append((run.run_key, job_id))


def wake_run(store: StepStore, run: RunRecord, publishers: Mapping[str, Publisher]) -> str | None:
    """Re-publish a run that waits for an event that has arrived; return the job id, or ``None`` (C33).

    A ``waiting`` run is won first (:meth:`StepStore.mark_recovered`); one
    that another sender or a recoverer won, or whose framework has no
    publisher here, returns ``None``. On Celery the job keeps its task id.

    Raises:
      PublishFailed: the broker refused; recovery picks the run up later.
      StoreUnavailable: the store cannot be reached.
    """
    publisher = publishers.get(run.framework)
    if publisher is None:
        return None
    if run.status == "waiting" and not store.mark_recovered(run.run_key, status=run.status, updated_at=run.updated_at):
        return None
    job_id = publish(publisher, run.envelope, run.run_key, job_id=run.job_id)
    logger.info("run %s woken as job %s: its event arrived", run.run_key, job_id)
    return job_id


def cleanup_events(store: StepStore, older_than: float) -> int:
    """Delete events sent more than ``older_than`` seconds ago (store clock); return how many (C33).

    Raises:
      StoreUnavailable: the store cannot be reached.
    """
    return store.cleanup_events(older_than=store.now() - older_than)
