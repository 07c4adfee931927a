"""Step identity (C1–C4), the divergence check (C12, C14), and run keys (C11, C44).

A step is identified by what the code asks for, never by the callable (C4):

- unkeyed: ``name#n``, ``n`` = how many unkeyed steps of that name already ran
  in this attempt (``charge#0``, ``fetch#0``, ``fetch#1``);
- keyed: ``name:key``, pinned to the data, so iteration order does not matter.
  A keyed call does not advance the counter: adding one must not shift the key
  of every later unkeyed call of the same name.

`Sequence` replays an attempt against the snapshot loaded when it
started, in memory (C9): keyed steps are matched by key anywhere in the
recorded sequence, unkeyed ones by their position among the unkeyed steps.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NoReturn

from uuid6 import uuid7

from ..errors import DuplicateStepKey, InvalidRunKey, InvalidStepKey, InvalidStepName, StepDivergence
from .records import StepKind, StepRow

__all__ = [
    "MAX_KEY_BYTES",
    "MAX_NAME_BYTES",
    "MAX_RUN_KEY_LENGTH",
    "check_run_key",
    "derived_run_key",
    "new_run_key",
    "run_key_from",
    "Sequence",
    "StepId",
    "validate_key",
    "validate_name",
]

MAX_NAME_BYTES = 128
MAX_KEY_BYTES = 256
_NAME_FORMS = "a non-empty str of at most 128 bytes UTF-8 without '#', ':' or control characters"
_KEY_FORMS = "a str or int of at most 256 bytes UTF-8, without control characters"


def validate_name(name: object) -> str:
    """Return ``name`` if it is a valid step name, else raise [`InvalidStepName`][flexiq_plugins.errors.InvalidStepName]
    (C2)."""
    if not isinstance(name, str):
        raise InvalidStepName(f"step name {name!r} is a {type(name).__name__}; a name is {_NAME_FORMS}")
    problem = _name_problem(name)
    if problem:
        raise InvalidStepName(f"step name {name!r} {problem}; a name is {_NAME_FORMS}")
    return name


@functools.lru_cache(maxsize=4096)
def _name_problem(name: str) -> str:
    """What is wrong with ``name``, or ``""``; cached: a body names the same few steps over and over."""
    size = _utf8_size(name)
    if size < 0:
        return "is not valid Unicode (a lone surrogate)"
    if not name:
        return "is empty"
    if size > MAX_NAME_BYTES:
        return f"is {size} bytes long"
    if "#" in name or ":" in name:
        return "contains '#' or ':'"
    if _has_control(name):
        return "contains a control character"
    return ""


def validate_key(key: object) -> str:
    """Return ``key`` as a ``str`` (an ``int`` is converted), else raise
    [`InvalidStepKey`][flexiq_plugins.errors.InvalidStepKey] (C2)."""
    if isinstance(key, bool) or not isinstance(key, (str, int)):
        raise InvalidStepKey(f"step key {key!r} is a {type(key).__name__}; a key is {_KEY_FORMS}")
    try:
        text = str(key)
    except ValueError as exc:  # an int longer than sys.get_int_max_str_digits() digits
        raise InvalidStepKey(f"step key is an int too long to turn into a str; a key is {_KEY_FORMS}") from exc
    size = _utf8_size(text)
    if size < 0:
        raise InvalidStepKey(f"step key {_short(text)} is not valid Unicode (a lone surrogate); a key is {_KEY_FORMS}")
    if size > MAX_KEY_BYTES:
        raise InvalidStepKey(f"step key {_short(text)} is {size} bytes long; a key is {_KEY_FORMS}")
    if _has_control(text):
        raise InvalidStepKey(f"step key {text!r} contains a control character; a key is {_KEY_FORMS}")
    return text


def _utf8_size(text: str) -> int:
    """The size of ``text`` in UTF-8 bytes, or -1 if it cannot be encoded (a lone surrogate)."""
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        return -1


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
"""The characters of Unicode category ``Cc`` (C0, DEL and C1 controls)."""


def _has_control(text: str) -> bool:
    return _CONTROL.search(text) is not None


def _short(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:37] + "...")


@dataclass(frozen=True)
class StepId:
    """A step's identity within an attempt.

    Parameters:
      name (str): the validated name.
      key (str | None): the validated explicit key, if any.
      step_key (str): ``name#n`` or ``name:key``.
      kind (str): the step's kind (`StepKind`).
    """

    name: str
    key: str | None
    step_key: str
    kind: StepKind

    @property
    def keyed(self) -> bool:
        """Whether the step has an explicit key."""
        return self.key is not None


class Sequence:
    """The running step sequence of one attempt, checked against its snapshot.

    Parameters:
      snapshot (Iterable[StepRow]): the run's committed step rows.
      job_label (str): how divergence messages name the job.
    """

    def __init__(self, snapshot: Iterable[StepRow], job_label: str) -> None:
        self.recorded = sorted(snapshot, key=lambda r: r.position)
        self._keyed = {r.step_key: r for r in self.recorded if _is_keyed(r.step_key)}
        self._unkeyed = [r for r in self.recorded if not _is_keyed(r.step_key)]
        self._job = job_label
        self._counts: Counter[str] = Counter()
        self._seen: set[str] = set()
        self.running: list[str] = []
        self._unkeyed_used = 0

    @property
    def next_position(self) -> int:
        """The position a newly committed step takes."""
        return len(self.recorded)

    def derive(self, name: object, key: object, kind: StepKind) -> StepId:
        """Validate and derive the next step's identity (C1–C3); nothing is recorded yet."""
        valid_name = validate_name(name)
        if key is None:
            step_key = f"{valid_name}#{self._counts[valid_name]}"
            step = StepId(valid_name, None, step_key, kind)
        else:
            valid_key = validate_key(key)
            step = StepId(valid_name, valid_key, f"{valid_name}:{valid_key}", kind)
        if step.step_key in self._seen:
            raise DuplicateStepKey(
                f"step key {step.step_key!r} was already used in this attempt of {self._job}; "
                "two steps must not derive the same key (give them different names or keys)"
            )
        return step

    def enter(self, step: StepId) -> StepRow | None:
        """Record that ``step`` runs now; return its committed row (memo) or ``None`` (new).

        Raises [`StepDivergence`][flexiq_plugins.errors.StepDivergence] if the recorded row at this step's place
        has another key or kind (C12).
        """
        self._seen.add(step.step_key)
        self.running.append(step.step_key)
        if step.keyed:
            row = self._keyed.get(step.step_key)
        else:
            self._counts[step.name] += 1
            row = self._match_unkeyed(step)
        if row is not None and row.kind != step.kind:
            self._diverge(row, step)
        return row

    def _match_unkeyed(self, step: StepId) -> StepRow | None:
        index = self._unkeyed_used
        self._unkeyed_used += 1
        if index >= len(self._unkeyed):
            return None
        row = self._unkeyed[index]
        if row.step_key != step.step_key:
            self._diverge(row, step)
        return row

    def _diverge(self, row: StepRow, step: StepId) -> None:
        now = step.step_key if row.kind == step.kind else f"{step.step_key} ({step.kind})"
        was = row.step_key if row.kind == step.kind else f"{row.step_key} ({row.kind})"
        raise StepDivergence(
            f"step sequence changed for {self._job} at position {row.position}\n"
            f"  recorded: {', '.join(r.step_key for r in self.recorded)}\n"
            f"  running:  {', '.join(self.running)}\n"
            f"  step {row.position} was {was!r}, now {now!r}\n"
            "A memoized result would answer a different question than the step asking for it. "
            "Drain or dead-letter this task's in-flight jobs before deploying a change to its "
            "step sequence, or keep the old sequence for them behind step.patched(...).",
            position=row.position,
            recorded=was,
            running=now,
        )

    def entered(self, step_key: str) -> bool:
        """Whether this attempt has already entered the step ``step_key``."""
        return step_key in self._seen

    def first_unreached(self) -> StepRow | None:
        """The first recorded row this attempt has not reached yet, or ``None`` once it is past its record.

        Patch markers and the compensation row are not steps of the body's
        path and are left aside (C32, C49): a run with such a row left is
        still past its record. ``step.patched`` reads this: a run that has
        recorded steps still ahead of the point where it asks passed that
        point before the patch existed.
        """
        for row in self.recorded:
            if row.kind not in _OFF_PATH and row.step_key not in self._seen:
                return row
        return None

    def diverge_from_patch(self, patch_id: str, row: StepRow) -> NoReturn:
        """Raise [`StepDivergence`][flexiq_plugins.errors.StepDivergence]: the run took the old branch of patch
        ``patch_id``, which ``step.deprecate_patch`` says is gone (C49).

        Parameters:
          patch_id (str): the patch.
          row (StepRow): the first recorded row past the patch point (`first_unreached`).
        """
        raise StepDivergence(
            f"step sequence changed for {self._job} at position {row.position}\n"
            f"  recorded: {', '.join(r.step_key for r in self.recorded)}\n"
            f"  running:  {', '.join([*self.running, f'patch:{patch_id}'])}\n"
            f"  the run passed this point on the old branch of patch {patch_id!r} (step {row.position} is "
            f"{row.step_key!r}, recorded before the patch), and step.deprecate_patch({patch_id!r}) says that "
            "branch is gone. Keep step.patched(...) with its old branch until `flexiq check` reports no run "
            "on it.",
            position=row.position,
            recorded=row.step_key,
            running=f"patch:{patch_id}",
        )

    def abandon(self, step: StepId) -> None:
        """Undo `enter` for a new step whose body raised: it committed nothing (C6).

        The next call of the same step then derives the same key and takes the
        same place, so a retry loop around a failing step inside one attempt
        replays without a false divergence.
        """
        if not self.running or self.running[-1] != step.step_key:
            return
        self.running.pop()
        self._seen.discard(step.step_key)
        if not step.keyed:
            self._counts[step.name] -= 1
            self._unkeyed_used -= 1

    def record(self, row: StepRow) -> None:
        """Add a newly committed row to the recorded sequence."""
        self.recorded.append(row)
        if _is_keyed(row.step_key):
            self._keyed[row.step_key] = row
        else:
            self._unkeyed.append(row)

    def unused(self) -> list[str]:
        """Recorded step keys this attempt did not reach (steps removed from the end, C14)."""
        return [r.step_key for r in self.recorded if r.step_key not in self._seen]


def _is_keyed(step_key: str) -> bool:
    return ":" in step_key


_OFF_PATH = frozenset({"patch", "compensation"})
"""Kinds of rows that mark the run rather than record a step of the body's path."""


MAX_RUN_KEY_LENGTH = 255
"""The longest run key, in characters."""


def new_run_key() -> str:
    """Mint a run key: a UUIDv7 string (time-ordered, RFC 9562), as stamped at publish."""
    return str(uuid7())


def check_run_key(run_key: object) -> str:
    """Return ``run_key`` if it is a ``str`` of 1 to 255 characters, else raise
    [`InvalidRunKey`][flexiq_plugins.errors.InvalidRunKey].

    The characters must be valid Unicode without control characters (a NUL
    cannot be stored by PostgreSQL, and none belongs in an identifier).
    """
    if not isinstance(run_key, str) or not 0 < len(run_key) <= MAX_RUN_KEY_LENGTH:
        raise InvalidRunKey(
            f"run key {run_key!r} is not a str of 1 to {MAX_RUN_KEY_LENGTH} characters; "
            "the run key header/option must be such a string (a UUIDv7 when minted at publish)"
        )
    # the usual key is ASCII, whose only controls are exactly its unprintable characters
    ascii_clean = run_key.isascii() and run_key.isprintable()
    if not ascii_clean and (run_key.isascii() or _utf8_size(run_key) < 0 or _has_control(run_key)):
        raise InvalidRunKey(
            f"run key {run_key!r} contains a control character or a lone surrogate; "
            "the run key header/option must be printable text (a UUIDv7 when minted at publish)"
        )
    return run_key


def run_key_from(carried: object, job_id: str, *, where: str = "run key") -> str:
    """The run key of a delivered job: the one it carries, else its own job id (C1 words, C11).

    Parameters:
      carried (object): the value of the message's run key header or option
        (``None`` or empty when the producer stamped none).
      job_id (str): the framework's job id.
      where (str): names the header or option in the error message.

    Raises:
      InvalidRunKey: a carried value that is not a ``str`` (a ``repr()`` would
        not be a stable identity across producers) or is longer than 255 characters.
    """
    if carried is None or carried == "":
        return job_id
    if not isinstance(carried, str):
        raise InvalidRunKey(f"the {where} {carried!r} is not a str")
    return check_run_key(carried)


_HASH_MARK = "~sha256:"
_HASHED_PREFIX = MAX_RUN_KEY_LENGTH - len(_HASH_MARK) - 64


def derived_run_key(parent: str, place: str) -> str:
    """The run key of a job the framework dispatches on behalf of ``parent``, at ``place`` (C44).

    ``<parent>/<place>``: the same parent and place always give the same
    key, so the job dispatched again (by a replayed duplicate of the parent,
    C37, or by recovery of its ``queued`` record, C39) is the same run, never
    a second one. The places the adapters use:

    ==========================================  ===================================
    Celery ``link`` callback number ``i``        ``<parent>/link/<i>``
    Celery ``link_error`` callback ``i``         ``<parent>/link_error/<i>``
    the next task of a Celery chain              ``<parent>/chain``
    a Celery chord's body                        ``<the chord's group id>/chord``
    the next stage of a Dramatiq pipeline        ``<parent>/pipe``
    a Dramatiq group's completion callback ``i`` ``<the group's completion id>/group/<i>``
    member ``j`` of a group or chain signature   ``<its place's key>/<j>``
    the body of a chord signature                ``<its place's key>/body``
    ==========================================  ===================================

    A chord's body and a group's completion callback are dispatched by
    whichever member finishes last, so their parent is the group, which
    every member names. A key longer than 255 characters becomes its first
    183 characters, ``~sha256:`` and the SHA-256 of the whole key in 64
    hexadecimal digits: as stable, and distinct from every other key.

    Parameters:
      parent (str): the parent's run key (or the group's id), a valid run key.
      place (str): where the job sits in the parent, e.g. ``"link/0"``.

    Returns:
      str: a valid run key (`check_run_key`).

    Raises:
      InvalidRunKey: ``parent`` is not a valid run key, or ``place`` is empty
        or holds a control character.
    """
    check_run_key(parent)
    if not isinstance(place, str) or not place or _utf8_size(place) < 0 or _has_control(place):
        raise InvalidRunKey(f"place {place!r} of a derived run key is not printable, non-empty text")
    key = f"{parent}/{place}"
    if len(key) <= MAX_RUN_KEY_LENGTH:
        return key
    digest = hashlib.sha256(key.encode("utf-8")).hexdigest()
    return f"{key[:_HASHED_PREFIX]}{_HASH_MARK}{digest}"
