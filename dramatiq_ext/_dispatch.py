"""Run keys of the jobs Dramatiq publishes on behalf of a durable run or a group (C44).

Dramatiq's ``Pipelines`` middleware enqueues a pipeline's next stage from
the finished message's ``pipe_target`` option; ``GroupCallbacks`` enqueues a
group's completion callbacks from its members' ``group_completion_callbacks``
option once the group's barrier clears. A message delivered again (a worker
that died after the run ended) replays the run (C37) and reaches those
middleware again; a barrier that has cleared stays cleared, so every later
member delivery dispatches the callbacks again. Each of these jobs therefore
gets a run key derived with
[`derived_run_key`][flexiq_plugins.integration.derived_run_key], so dispatching it again
is the same run:

- the next stage: ``<run key>/pipe``, stamped on ``pipe_target`` when a
  durable actor's attempt ends for a run in the store (it claimed the run or
  replayed it), before ``Pipelines`` reads it;
- completion callback ``i``: ``<group completion id>/group/<i>``, stamped on
  a copy of the callbacks when each member is first enqueued (the group's id
  is the same in every member, whichever completes the group).

A message that carries a ``flexiq_run_key`` option already keeps it: a key
the user set wins. A message an actor sends itself (``.send()`` in the body)
is none of these and stays a new job with a new run key.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

from flexiq_plugins import InvalidRunKey
from flexiq_plugins.integration import derived_run_key

from ._envelope import RUN_KEY_OPTION

__all__ = ["stamp_group_callbacks", "stamp_pipe_target"]

_GROUP_ID = "group_completion_uuid"
_CALLBACKS = "group_completion_callbacks"


def stamp_pipe_target(options: MutableMapping[str, Any], run_key: str) -> None:
    """Give the pipeline's next stage in ``options`` (a message's options) the key ``<run_key>/pipe`` (C44)."""
    target = options.get("pipe_target")
    if isinstance(target, Mapping):
        options["pipe_target"] = _keyed(target, run_key, "pipe")


def stamp_group_callbacks(options: MutableMapping[str, Any]) -> None:
    """Give a group member's completion callbacks the keys ``<group completion id>/group/<i>`` (C44).

    The callbacks are replaced by stamped copies: the group's own list, which
    a re-run of the group (a new completion id) reuses, is left as it is.
    """
    group, callbacks = options.get(_GROUP_ID), options.get(_CALLBACKS)
    if isinstance(group, str) and group and isinstance(callbacks, list):
        options[_CALLBACKS] = [
            _keyed(callback, group, f"group/{i}") if isinstance(callback, Mapping) else callback
            for i, callback in enumerate(callbacks)
        ]


def _keyed(message: Mapping[str, Any], parent: str, place: str) -> Mapping[str, Any]:
    """A copy of the message dict ``message`` carrying ``derived_run_key(parent, place)``, unless it has a key."""
    options = message.get("options") or {}
    if options.get(RUN_KEY_OPTION):
        return message
    try:
        key = derived_run_key(parent, place)
    except InvalidRunKey:
        return message  # a group id that is no run key: the job keeps a new key of its own
    return {**message, "options": {**options, RUN_KEY_OPTION: key}}
