"""Re-publishing a stored job through its framework's adapter, and loading apps and brokers by reference.

A dead-letter retry publishes the stored
[`JobEnvelope`][flexiq_plugins.JobEnvelope] again with a *new* job id that carries
the *old* run key (C11, C36); a recovery or an event's wake-up keeps the
run's job id where the framework allows it, through a [`Publisher`][flexiq_plugins.integration.Publisher]
per framework. Publishers come from the adapters (``flexiq_plugins._delivery.registry``):
the core never imports a framework.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from .._model.records import JobEnvelope
from ..errors import ConfigurationError, CorruptRecord, NoPublisher, PublishFailed
from .registry import Publisher, adapter_for, publisher_for_target

__all__ = ["DEFAULT_TARGET_ATTRS", "load_object", "publish", "publishers_for", "require_publisher", "require_readable"]

DEFAULT_TARGET_ATTRS = ("app", "celery", "broker")
"""Attributes tried, in order, when a reference names only a module."""


def load_object(ref: str, default_attrs: Sequence[str] = ()) -> Any:
    """Import ``module:attribute`` (or ``module``, then its first of ``default_attrs``), like ``celery -A``.

    The current directory is put on ``sys.path`` first, so a project's own
    module is found when the command runs from the project's root.

    Parameters:
      ref (str): ``"proj.celery:app"``, ``"proj.tasks:broker"`` or ``"proj"``.
      default_attrs (Sequence[str]): attribute names tried when ``ref`` has no ``:``.

    Raises:
      ConfigurationError: the module cannot be imported or has no such attribute.
    """
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


def require_publisher(envelope: JobEnvelope, publishers: Mapping[str, Publisher]) -> Publisher:
    """The publisher of ``envelope``'s framework.

    Raises:
      NoPublisher: none was given; the message says how to give one (the adapter's hint).
    """
    publisher = publishers.get(envelope.framework)
    if publisher is not None:
        return publisher
    adapter = adapter_for(envelope.framework)
    how = f"pass {adapter.publish_hint}" if adapter is not None else f"install its {envelope.framework} integration"
    raise NoPublisher(f"{envelope.task_name!r} is a {envelope.framework} job: {how} to re-publish it")


def require_readable(envelope: JobEnvelope, run_key: str) -> None:
    """Refuse an envelope the store could not read: it cannot be re-published (C35).

    Raises:
      CorruptRecord: ``envelope.corrupt`` is set; the message says what to do.
    """
    if envelope.corrupt:
        raise CorruptRecord(
            f"run {run_key!r} ({envelope.task_name!r}) cannot be re-published: {envelope.corrupt}; "
            "publish the job again from its producer with the same run key, or purge it"
        )


def publish(
    publisher: Publisher,
    envelope: JobEnvelope,
    run_key: str,
    *,
    job_id: str | None = None,
    unstarted_only: bool = False,
) -> str:
    """Re-publish ``envelope`` carrying ``run_key``; return the new job id (C11, C36).

    ``job_id`` asks to reuse that job id where the framework allows it (a run
    woken by an event or recovered keeps its job id, so its result waiter
    gets its outcome: C33, C39). ``unstarted_only``
    marks a copy that runs only while its run never started (C39).

    Raises:
      CorruptRecord: the stored envelope could not be read.
      PublishFailed: the broker refused or could not be reached.
    """
    require_readable(envelope, run_key)
    options: dict[str, Any] = {}  # only what is asked: a publisher may be a plain function of fewer keywords
    if job_id is not None:
        options["job_id"] = job_id
    if unstarted_only:
        options["unstarted_only"] = True
    try:
        return publisher(envelope, run_key, **options)
    except Exception as exc:
        raise PublishFailed(
            f"could not re-publish {envelope.task_name!r} (run {run_key}): {type(exc).__name__}: {exc}"
        ) from exc


def publishers_for(*targets: object) -> dict[str, Publisher]:
    """A publisher per framework for the given apps or brokers (``None`` entries are skipped).

    Raises:
      ConfigurationError: no installed integration owns one of ``targets``.
    """
    found: dict[str, Publisher] = {}
    for target in targets:
        if target is not None:
            framework, publisher = publisher_for_target(target)
            found[framework] = publisher
    return found
