"""The verb of ``step.patched`` / ``step.deprecate_patch``: new code for new runs, the old path for old ones (C49).

A deploy that changes a task's step sequence breaks the runs already past the
change (C12). ``if step.patched("audit-v2"): <new> else: <old>`` lets both
versions live in one body:

- a run that reaches the call for the first time (its record holds nothing
  past this point) takes the new branch: ``True``, and the marker step
  ``patch:audit-v2`` (kind ``patch``) is committed here, so every replay of
  it answers ``True`` again;
- a run that recorded a marker answers ``True`` from the memo (C9);
- a run whose record already goes past this point without a marker passed
  it before the patch existed: ``False``, nothing is written, and it replays
  its old steps without a divergence.

The marker is a keyed step (``patch:<id>``), so it takes no place among the
unkeyed steps and the ``name#n`` counters and keys of every other step are
unchanged (C1). Once no run is on the old branch (``flexiq check`` says so)
the call becomes ``step.deprecate_patch("audit-v2")`` and the old branch
goes: it replays a recorded marker, writes nothing for new runs, and a run
still on the old branch diverges (C12) instead of running the new code.
"""

from __future__ import annotations

from typing import Any

from .._model.identity import StepId, validate_key
from .._model.records import StepKind
from ..errors import DuplicateStepKey, InvalidStepKey
from .journal import Protocol_, Step, StepJournal, drive

__all__ = ["PATCH_NAME", "PatchVerb", "deprecate_patch", "patch_step", "patched"]

PATCH_NAME = "patch"
"""A patch marker is the keyed step ``patch:<id>``."""


def patch_step(patch_id: object) -> StepId:
    """The identity of the marker of patch ``patch_id``: the step ``patch:<id>`` of kind ``patch``.

    Raises:
      InvalidStepKey: ``patch_id`` is not a non-empty ``str`` of at most 256 bytes without control characters.
    """
    if not isinstance(patch_id, str) or not patch_id:
        raise InvalidStepKey(
            f"patch id {patch_id!r} is not a non-empty str; name the change, e.g. step.patched('audit-v2')"
        )
    valid = validate_key(patch_id)
    return StepId(PATCH_NAME, valid, f"{PATCH_NAME}:{valid}", "patch")


class PatchVerb:
    """The marker of a patch: committed where a run first takes its new branch; its memo answers ``True`` (C49)."""

    kind: StepKind = "patch"

    def replay(self, journal: StepJournal, step: Step) -> bool:
        """A recorded marker: the run took the new branch."""
        return True

    def execute(self, journal: StepJournal, step: Step) -> Protocol_:
        """``False`` if the run's record goes past this point (it predates the patch), else ``True``."""
        if journal.sequence.first_unreached() is not None:
            return False
        journal.check_new_step(step)  # a check, a compensation replay or a cancelled run writes no marker
        return True
        yield  # pragma: no cover - makes this a generator like every verb

    def commit(self, journal: StepJournal, step: Step, produced: Any) -> bool:
        """Commit the marker for a run on the new branch; leave no trace for one on the old branch."""
        if not produced:
            journal.sequence.abandon(step.id)  # not recorded: it takes no place
            return False
        journal.commit(step, None, None)
        return True


def patched(journal: StepJournal, patch_id: object) -> bool:
    """Whether the run takes the new branch of patch ``patch_id`` (C49); see the module docstring.

    Asked again in the same attempt, it answers the same without a step.

    Raises:
      InvalidStepKey: a bad patch id.
      DuplicateStepKey: a step of the body already took the key ``patch:<id>``.
      ConcurrentStep: another step of this attempt is uncommitted (C8).
      StepDivergence: the record holds another kind of step under ``patch:<id>``.
    """
    step_id = patch_step(patch_id)
    answer = journal.patches.get(step_id.key or "")
    if answer is not None:
        return answer
    _refuse_taken(journal, step_id)
    answer = bool(drive(journal.protocol_for(PatchVerb(), step_id)))
    journal.patches[step_id.key or ""] = answer
    return answer


def deprecate_patch(journal: StepJournal, patch_id: object) -> None:
    """The old branch of patch ``patch_id`` is gone: replay its marker, write nothing new (C49).

    A run that recorded the marker replays it; a run past its record writes
    nothing; a run whose record passed this point on the old branch diverges.

    Raises:
      InvalidStepKey: a bad patch id.
      StepDivergence: the run is on the old branch (latched, so the body cannot catch it away).
    """
    step_id = patch_step(patch_id)
    key = step_id.key or ""
    if key in journal.patches:
        return
    if step_id.step_key in {r.step_key for r in journal.sequence.recorded}:
        drive(journal.protocol_for(PatchVerb(), step_id))
    else:
        _refuse_taken(journal, step_id)
        ahead = journal.sequence.first_unreached()
        if ahead is not None:
            try:
                journal.sequence.diverge_from_patch(key, ahead)
            except BaseException as exc:
                journal.refuse(exc)
    journal.patches[key] = True


def _refuse_taken(journal: StepJournal, step_id: StepId) -> None:
    if journal.sequence.entered(step_id.step_key):
        journal.refuse(
            DuplicateStepKey(
                f"step key {step_id.step_key!r} was already used in this attempt of {journal.job_label}; "
                "a patch marker takes it, so name that step differently"
            )
        )
