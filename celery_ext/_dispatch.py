"""Run keys of the jobs Celery's tracer publishes on behalf of a durable run (C44).

When a durable job's attempt ends for a run in the store (it claimed the run,
or replayed a finished one, C37), Celery's tracer goes on to publish, from
the job's request: its ``link`` callbacks (``request.callbacks``), on a
failure it gives up on its ``link_error`` callbacks (``request.errbacks``),
the next task of its chain (``request.chain[-1]``) and, for the part of a
chord's header that completes it, the chord's body (``request.chord``).
Before the attempt hands its outcome back to the tracer, each of these
signatures gets a ``flexiq_run_key`` header derived from the run's key and
its place ([`derived_run_key`][flexiq_plugins.integration.derived_run_key]):
``<run key>/link/<i>``, ``<run key>/link_error/<i>``, ``<run key>/chain``,
``<the chord's group id>/chord``. A duplicate of the job that replays the
run dispatches them again under the same keys, and recovery re-publishes the
same runs, so each is one run (C37, C39).

A signature that carries a run key already keeps it: a key the user set on
the callback wins. A group, chain or chord signature is never stamped itself
(its options reach every member): its members are, with ``/<j>`` for member
``j`` and ``/body`` for a chord's body. A job the body publishes itself
(``.delay()`` inside the body) is not among these signatures: it stays a new
job with a new run key.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

from flexiq_plugins import InvalidRunKey
from flexiq_plugins.integration import derived_run_key

from ._options import RUN_KEY_HEADER

__all__ = ["stamp_dispatches"]


def stamp_dispatches(request: Any, run_key: str) -> None:
    """Stamp derived run keys on the signatures the tracer will publish for the run ``run_key`` (C44).

    Parameters:
      request (celery.app.task.Context): the job's request, whose signatures are changed in place.
      run_key (str): the run's key.
    """
    for place, signatures in (("link", request.callbacks), ("link_error", request.errbacks)):
        for i, signature in enumerate(signatures or ()):
            _stamp(signature, run_key, f"{place}/{i}")
    chain = request.chain
    if chain:
        _stamp(chain[-1], run_key, "chain")
    group = request.group
    if request.chord and isinstance(group, str) and group:
        _stamp(request.chord, group, "chord")


def _stamp(signature: Any, parent: str, place: str) -> None:
    """Give ``signature`` (a signature dict) the key ``derived_run_key(parent, place)``, or its members theirs."""
    if not isinstance(signature, MutableMapping):
        return
    try:
        key = derived_run_key(parent, place)
    except InvalidRunKey:
        return  # a group id that is no run key: the job keeps a new key of its own
    arguments = signature.get("kwargs") or {}
    kind = signature.get("subtask_type")
    if kind in ("group", "chain"):
        for j, member in enumerate(arguments.get("tasks") or ()):
            _stamp(member, key, str(j))
    elif kind == "chord":
        header = arguments.get("header")
        members = (header.get("kwargs") or {}).get("tasks") if isinstance(header, MutableMapping) else header
        for j, member in enumerate(members or ()):
            _stamp(member, key, str(j))
        _stamp(arguments.get("body"), key, "body")
    elif kind is None:
        options = signature.setdefault("options", {})
        headers = options.get("headers") or {}
        if not headers.get(RUN_KEY_HEADER):
            options["headers"] = {**headers, RUN_KEY_HEADER: key}
