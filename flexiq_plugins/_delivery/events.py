"""Sending an event to the runs that wait for it (C33): commit it, then wake them through their integration.

**Committed first, then woken.** The event is stored before anything is
published: a run that polls from then on receives it, and a run that waits
already is found by the store (`OperatorStore.add_event`) and re-published
through the publisher of its framework (an app or broker of this process,
`flexiq_plugins._delivery.registry`). Without one the run is left to recovery
(``flexiq recover``, the `Sweeper`), which
re-publishes a waiting run whose event has arrived: the event is never lost,
only later.

**Woken once per waiting state.** A ``waiting`` run is won with the same
compare-and-set recovery uses (`OperatorStore.mark_recovered`), so a
sender and a sweeper that read the same state publish it once. A run still ``running``
between its poll and its suspension is published without it: that delivery
finds the run busy and comes back shortly, by which time the run waits.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .._model.codec import CodecChain
from .._model.identity import check_run_key
from .._model.records import EventRecord, RunRecord
from .._steps.wait import encode_payload, validate_event_field
from .._store.factory import StoreSpec
from .._store.operator_side import OperatorStore
from ..errors import PublishFailed
from .process import this_process
from .publishing import publish
from .registry import Publisher

__all__ = ["EventSent", "cleanup_events", "send_event", "wake_run"]

logger = logging.getLogger("flexiq_plugins.operations")


@dataclass(frozen=True)
class EventSent:
    """What [`send_event`][flexiq_plugins.send_event] did (C33).

    Parameters:
      event (EventRecord): the stored event.
      woken (list[tuple[str, str]]): ``(run key, job id)`` of each run re-published now.
      left (list[tuple[str, str]]): ``(run key, why)`` of each waiting run left to
        recovery: no publisher for its framework, woken by another sender, or a
        publish that failed.
    """

    event: EventRecord
    woken: list[tuple[str, str]] = field(default_factory=list)
    left: list[tuple[str, str]] = field(default_factory=list)


def send_event(
    topic: str,
    key: str,
    payload: Any = None,
    *,
    run_key: str | None = None,
    store: StoreSpec = None,
    publishers: Mapping[str, Publisher] | None = None,
    codec: CodecChain | None = None,
) -> EventSent:
    """Send the event ``(topic, key)`` with ``payload`` to the runs that wait for it (C33).

    The event is committed to the store first; then every run waiting on
    ``(topic, key)`` is woken by re-publishing its job through the publisher
    of its framework, if there is one (else by recovery). A run that reaches
    its ``step.wait_for_event`` later still receives it, if the run was
    created before the event was sent or ``run_key`` names it.

    Call it from wherever the outside world reaches your code: a web request
    (a payment webhook), a script, another task. What it needs comes from the
    process it runs in unless given (`flexiq_plugins._delivery.process`).

    Parameters:
      topic (str): the topic, e.g. ``"payment"`` (1–255 characters, no control characters).
      key (str): the key, e.g. an order id (same rules).
      payload (Any): what the wait returns; JSON-compatible values (and
        ``datetime``, ``Decimal``, ``UUID`` …), or what the integration's
        serializer takes; at most the step value limit once encoded.
      run_key (str | None): send it to that run only; it is then received even
        if the run did not exist yet when it was sent.
      store (StepStore | Engine | str | None): where the runs are; ``None``: the
        store of the integration configured in this process, else
        ``FLEXIQ_STORE_URL``, else the default SQLite file (which must exist).
      publishers (Mapping[str, Publisher] | None): a publisher per framework
        name; ``None``: the app or broker of each integration configured in
        this process; ``{}``: wake nobody (recovery does).
      codec (CodecChain | None): encodes the payload; ``None``: the codec chain
        of the integration configured in this process, else the core's JSON
        (workers read both their own chain and JSON).

    Returns:
      EventSent: the stored event, the runs woken now and those left to recovery.

    Raises:
      InvalidEvent: a bad topic, key or payload (one that cannot be encoded or is too big); nothing is stored.
      InvalidRunKey: ``run_key`` is not a str of 1 to 255 characters.
      ConfigurationError: an unusable store setting, or a SQLite file that does not exist.
      StoreUnavailable: the store cannot be reached.
    """
    validate_event_field("topic", topic)
    validate_event_field("key", key)
    if run_key is not None:
        check_run_key(run_key)
    here = this_process(store, publishers)
    chain = codec if codec is not None else here.codec
    data = encode_payload(payload, chain, max_bytes=here.config.step_bytes)
    sent = here.store.add_event(topic, key, data, run_key=run_key)
    report = EventSent(sent.event)
    for run in sent.waiters:
        _wake(here.store, run, here.publishers, report)
    logger.info("event %s (%r, %r) sent; %d run(s) woken", sent.event.id, topic, key, len(report.woken))
    return report


def _wake(store: OperatorStore, run: RunRecord, publishers: Mapping[str, Publisher], report: EventSent) -> None:
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


def wake_run(store: OperatorStore, run: RunRecord, publishers: Mapping[str, Publisher]) -> str | None:
    """Re-publish a run that waits for an event that has arrived; return the job id, or ``None`` (C33).

    A ``waiting`` run is won first (`OperatorStore.mark_recovered`); one
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


def cleanup_events(store: OperatorStore, older_than: float) -> int:
    """Delete events sent more than ``older_than`` seconds ago (store clock); return how many (C33).

    Raises:
      StoreUnavailable: the store cannot be reached.
    """
    return store.cleanup_events(older_than=store.now() - older_than)
