"""Step identity, C1–C4: how a step's key is derived, which names and keys are refused, and when; derived run
keys (C44).

Every refusal must happen before the step body runs, so each test hands the step
a body that records its calls and checks the list is still empty.
"""

from __future__ import annotations

import hashlib

import pytest

from flexiq_plugins import InvalidRunKey, current_job
from flexiq_plugins._attempt import decisions
from flexiq_plugins._model.identity import MAX_RUN_KEY_LENGTH, check_run_key, derived_run_key
from flexiq_plugins.errors import DuplicateStepKey, InvalidStepKey, InvalidStepName


def _keys_committed(harness) -> list[str]:
    return [row.step_key for row in harness.store.get_steps(harness.run_key)]


def test_c1_unkeyed_steps_are_numbered_per_name(harness):
    """Unkeyed steps are ``name#n``, n counting earlier unkeyed steps of that name in this attempt."""
    seen: list[str] = []

    def body():
        step = current_job.step
        for name in ("fetch", "charge", "fetch", "fetch", "charge"):
            step.run(name, lambda: seen.append(step.idempotency_key.split(":", 1)[1]))
        raise RuntimeError("stop before success drops the rows")

    harness.run(body)
    expected = ["fetch#0", "charge#0", "fetch#1", "fetch#2", "charge#1"]
    assert seen == expected
    assert _keys_committed(harness) == expected


def test_c1_keyed_steps_are_name_colon_key_and_do_not_advance_the_counter(harness):
    """A keyed step is ``name:key``; keyed calls leave the ``name#n`` counter where it was."""

    def body():
        step = current_job.step
        step.run("fetch", lambda: 1)
        step.run("fetch", lambda: 2, key="order-7")
        step.run("fetch", lambda: 3, key=42)
        step.run("fetch", lambda: 4)
        raise RuntimeError("keep the rows")

    harness.run(body)
    assert _keys_committed(harness) == ["fetch#0", "fetch:order-7", "fetch:42", "fetch#1"]


def test_c1_int_key_is_turned_into_str(harness):
    """An ``int`` key becomes its ``str``: ``key=7`` and ``key="7"`` are the same step."""
    calls: list[str] = []

    def first():
        current_job.step.run("fetch", lambda: calls.append("int") or "from-int", key=7)
        raise RuntimeError("retry")

    def second():
        return current_job.step.run("fetch", lambda: calls.append("str") or "from-str", key="7")

    assert isinstance(harness.run(first), decisions.Failure)
    decision = harness.run(second)
    assert decision == decisions.Completed("from-int")
    assert calls == ["int"]


BAD_NAMES = [
    pytest.param("", id="empty"),
    pytest.param(None, id="none"),
    pytest.param(7, id="int"),
    pytest.param(b"charge", id="bytes"),
    pytest.param("x" * 129, id="129-ascii-bytes"),
    pytest.param("é" * 65, id="65-chars-130-utf8-bytes"),
    pytest.param("€" * 43, id="43-chars-129-utf8-bytes"),
    pytest.param("a#b", id="hash"),
    pytest.param("a:b", id="colon"),
    pytest.param("a\nb", id="newline"),
    pytest.param("a\x00b", id="nul"),
    pytest.param("a\x7fb", id="del"),
    pytest.param("tab\t", id="tab"),
]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_c2_bad_name_is_refused_before_the_body_runs(harness, name):
    """A bad name raises ``InvalidStepName`` (a ValueError and a TypeError) and calls nothing."""
    calls: list[str] = []

    def body():
        current_job.step.run(name, lambda: calls.append("ran"))

    decision = harness.run(body)
    assert isinstance(decision, decisions.DeadLetter)
    assert isinstance(decision.error, InvalidStepName)
    assert isinstance(decision.error, ValueError)
    assert isinstance(decision.error, TypeError)
    assert calls == []
    assert _keys_committed(harness) == []


@pytest.mark.parametrize("name", [pytest.param("", id="empty"), pytest.param("a:b", id="colon")])
def test_c2_bad_sleep_name_is_refused_before_anything_is_committed(harness, name):
    """``step.sleep(name=...)`` validates the name like ``run`` does: nothing committed, no sleep."""

    def body():
        current_job.step.sleep("1h", name=name)

    decision = harness.run(body)
    assert isinstance(decision, decisions.DeadLetter)
    assert isinstance(decision.error, InvalidStepName)
    assert _keys_committed(harness) == []


@pytest.mark.parametrize(
    "name", [pytest.param("x" * 128, id="128-ascii"), pytest.param("é" * 64, id="64-chars-128-bytes")]
)
def test_c2_name_of_exactly_128_bytes_is_accepted(harness, name):
    """The 128-byte name limit is inclusive and counted in UTF-8 bytes."""
    decision = harness.run(lambda: current_job.step.run(name, lambda: "ok"))
    assert decision == decisions.Completed("ok")


BAD_KEYS = [
    pytest.param(1.0, id="float"),
    pytest.param(b"k", id="bytes"),
    pytest.param(True, id="bool-true"),
    pytest.param(False, id="bool-false"),
    pytest.param(["k"], id="list"),
    pytest.param(object(), id="object"),
    pytest.param("k" * 257, id="257-ascii-bytes"),
    pytest.param("é" * 129, id="129-chars-258-utf8-bytes"),
    pytest.param(10**300, id="int-of-301-digits"),
    pytest.param(10**5000, id="int-too-long-for-str"),
    pytest.param("a\x00b", id="control"),
]


@pytest.mark.parametrize("key", BAD_KEYS)
def test_c2_bad_key_is_refused_before_the_body_runs(harness, key):
    """A bad key raises ``InvalidStepKey`` (a ValueError and a TypeError) and calls nothing."""
    calls: list[str] = []

    def body():
        current_job.step.run("fetch", lambda: calls.append("ran"), key=key)

    decision = harness.run(body)
    assert isinstance(decision, decisions.DeadLetter)
    assert isinstance(decision.error, InvalidStepKey)
    assert isinstance(decision.error, ValueError)
    assert isinstance(decision.error, TypeError)
    assert calls == []
    assert _keys_committed(harness) == []


def test_c2_key_of_exactly_256_bytes_is_accepted(harness):
    """The 256-byte key limit is inclusive and counted in UTF-8 bytes."""
    key = "é" * 128
    decision = harness.run(lambda: current_job.step.run("fetch", lambda: "ok", key=key))
    assert decision == decisions.Completed("ok")


def test_c3_duplicate_key_in_one_attempt_is_refused_and_dead_letters(harness):
    """Two keyed steps deriving the same key raise ``DuplicateStepKey``; the second body never runs."""
    calls: list[str] = []

    def body():
        step = current_job.step
        step.run("fetch", lambda: calls.append("first"), key="a")
        step.run("fetch", lambda: calls.append("second"), key="a")

    decision = harness.run(body)
    assert isinstance(decision, decisions.DeadLetter)
    assert decision.reason == "duplicate_step_key"
    assert isinstance(decision.error, DuplicateStepKey)
    assert "fetch:a" in decision.message
    assert calls == ["first"]
    assert _keys_committed(harness) == ["fetch:a"]


def test_c3_int_and_str_key_with_the_same_text_are_duplicates(harness):
    """``key=1`` then ``key="1"`` derive the same ``fetch:1`` and are refused, not merged."""

    def body():
        step = current_job.step
        step.run("fetch", lambda: "a", key=1)
        step.run("fetch", lambda: "b", key="1")

    decision = harness.run(body)
    assert isinstance(decision, decisions.DeadLetter)
    assert isinstance(decision.error, DuplicateStepKey)


def test_c3_duplicate_key_caught_by_the_body_still_dead_letters(harness):
    """A body that catches ``DuplicateStepKey`` and returns cannot turn the refusal into a success."""

    def body():
        step = current_job.step
        step.run("fetch", lambda: "a", key="a")
        try:  # noqa: SIM105 - a task body swallowing on purpose is the case under test
            step.run("fetch", lambda: "b", key="a")
        except Exception:
            pass
        return "done"

    decision = harness.run(body)
    assert isinstance(decision, decisions.DeadLetter)
    assert isinstance(decision.error, DuplicateStepKey)


def test_c4_name_is_never_inferred_from_the_callable(harness):
    """Two different callables under one name are the same step: the second gets the first's value."""
    calls: list[str] = []

    def charge_v1():
        calls.append("v1")
        return "charged-by-v1"

    def charge_v2():
        calls.append("v2")
        return "charged-by-v2"

    def first():
        current_job.step.run("charge", charge_v1)
        raise RuntimeError("retry")

    harness.run(first)
    decision = harness.run(lambda: current_job.step.run("charge", charge_v2))
    assert decision == decisions.Completed("charged-by-v1")
    assert calls == ["v1"]


def test_c4_a_callable_passed_as_the_name_is_refused(harness):
    """The name is required: passing the callable where the name goes is ``InvalidStepName``."""

    def charge():
        return 1

    decision = harness.run(lambda: current_job.step.run(charge, charge))
    assert isinstance(decision, decisions.DeadLetter)
    assert isinstance(decision.error, InvalidStepName)


def test_c4_two_lambdas_in_one_attempt_share_the_name_counter(harness):
    """Different lambdas under one name are numbered by the name alone: ``x#0``, ``x#1``."""

    def body():
        step = current_job.step
        step.run("x", lambda: 1)
        step.run("x", lambda: 2)
        raise RuntimeError("keep the rows")

    harness.run(body)
    assert _keys_committed(harness) == ["x#0", "x#1"]


# ------------------------------------------------------------- derived run keys (C44)
def test_c44_a_derived_run_key_is_the_parents_key_and_the_place():
    """C44: ``<parent>/<place>``, the same for the same parent and place, different for another place."""
    assert derived_run_key("order-7", "link/0") == "order-7/link/0"
    assert derived_run_key("order-7", "link/0") == derived_run_key("order-7", "link/0")
    keys = {derived_run_key("order-7", place) for place in ("link/0", "link/1", "link_error/0", "chain", "pipe")}
    assert len(keys) == 5
    nested = derived_run_key(derived_run_key("order-7", "chain"), "0")
    assert nested == "order-7/chain/0"


@pytest.mark.parametrize("parent_length", [242, 255])
def test_c44_a_derived_run_key_over_255_characters_is_a_stable_hash_form(parent_length):
    """C44, C11: a key over 255 characters becomes 183 of them, ``~sha256:`` and the whole key's digest."""
    parent = "é" * parent_length  # characters, not bytes, are counted
    key = derived_run_key(parent, "link_error/12")
    digest = hashlib.sha256(f"{parent}/link_error/12".encode()).hexdigest()
    assert key == f"{parent[:183]}~sha256:{digest}"
    assert len(key) == MAX_RUN_KEY_LENGTH
    assert check_run_key(key) == key
    assert derived_run_key(parent, "link_error/12") == key
    assert derived_run_key(parent, "link_error/13") != key


def test_c44_a_derived_run_key_needs_a_valid_parent_and_a_printable_place():
    """C44, C11: an invalid parent key, or an empty place or one with a control character, is ``InvalidRunKey``."""
    for parent, place in (("", "link/0"), ("x" * 256, "link/0"), ("order-7", ""), ("order-7", "link\n0")):
        with pytest.raises(InvalidRunKey):
            derived_run_key(parent, place)


def test_c44_only_an_attempt_of_a_run_in_the_store_dispatches_with_derived_keys():
    """C44: a claimed attempt that completed or failed, a replay and a dead letter belong to a run; a job that
    took no step, a put-back and an acknowledgement do not."""
    error = ValueError("x")
    assert decisions.belongs_to_a_run(decisions.Completed(1))
    assert decisions.belongs_to_a_run(decisions.Failure(error, "k", 1))
    assert decisions.belongs_to_a_run(decisions.Replay("succeeded", 1))
    assert decisions.belongs_to_a_run(decisions.DeadLetter("divergence", "changed"))
    assert not decisions.belongs_to_a_run(decisions.Completed(1, claimed=False))
    assert not decisions.belongs_to_a_run(decisions.Failure(error, "k", 0, claimed=False))
    assert not decisions.belongs_to_a_run(decisions.PutBack(decisions.PutBackReason.SLEEP, 1.0))
    assert not decisions.belongs_to_a_run(decisions.Ack(decisions.AckReason.DUPLICATE))


def test_c11_a_run_key_with_any_control_character_is_refused_and_printable_text_is_kept():
    """C11: each C0 and C1 control and DEL, anywhere in a run key, is ``InvalidRunKey``; other text passes as is."""
    for code in [*range(0x00, 0x20), *range(0x7F, 0xA0)]:
        with pytest.raises(InvalidRunKey):
            check_run_key(f"order{chr(code)}-1")
    for key in ("order 42", "~!@#$%^&*()_+{}|:<>?", "zahlung-ü-✓", "\xa0nbsp"):
        assert check_run_key(key) == key
