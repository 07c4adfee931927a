"""Memoization, C5–C7 and C9: what is committed, what comes back, and what it costs.

The store is an in-memory one; C9's "no statement on a memo hit" is checked by
counting the driver's calls on the store interface (the SQL statement counts
belong to the store's own tests).
"""

from __future__ import annotations

import json
from unittest.mock import ANY

import pytest
from cryptography.fernet import Fernet

from flexiq_plugins import (
    CodecChain,
    DurableConfig,
    FernetCodec,
    JobEnvelope,
    JsonSerializer,
    MemoryStepStore,
    ZlibCodec,
    current_job,
)
from flexiq_plugins._attempt import decisions
from flexiq_plugins.errors import DecodeError, EncodeError
from flexiq_plugins.integration import AttemptDriver, JobInfo


class Boom(Exception):
    """A user error raised on purpose."""


def test_c5_memo_hit_returns_the_stored_value_without_calling_the_body(harness):
    """After a step commits, a later attempt returns its stored value and never calls its body."""
    calls: list[int] = []

    def body():
        step = current_job.step
        value = step.run("charge", lambda: calls.append(current_job.attempt) or {"id": "ch_1"})
        if current_job.attempt == 1:
            raise Boom("fail after the charge")
        return value

    assert isinstance(harness.run(body), decisions.Failure)
    assert harness.run(body) == decisions.Completed({"id": "ch_1"})
    assert calls == [1]


def test_c6_body_that_raises_commits_nothing_and_runs_again(harness):
    """A raising step body commits no row, its exception propagates, and the next attempt re-runs it."""
    calls: list[int] = []

    def charge():
        calls.append(current_job.attempt)
        if current_job.attempt == 1:
            raise Boom("card declined")
        return "ok"

    caught: list[BaseException] = []

    def body():
        try:
            return current_job.step.run("charge", charge)
        except Boom as exc:
            caught.append(exc)
            raise

    first = harness.run(body)
    assert isinstance(first, decisions.Failure)
    assert isinstance(first.error, Boom)
    assert not isinstance(first, decisions.PutBack)
    assert len(caught) == 1
    assert harness.store.get_steps(harness.run_key) == []
    assert harness.store.get_run(harness.run_key).status == "retrying"
    assert harness.run(body) == decisions.Completed("ok")
    assert calls == [1, 2]


class _Killed(BaseException):
    """Stands for SIGKILL: the attempt stops where it is and never concludes."""


def test_c6_process_death_before_commit_runs_the_body_again(harness, clock):
    """A worker dying inside a step body commits nothing; the attempt taking over runs the body again."""
    calls: list[str] = []

    def charge_then_die():
        calls.append("w1")
        raise _Killed

    dead = harness.start(owner="w1")
    with pytest.raises(_Killed), dead.activate():
        current_job.step.run("charge", charge_then_die)
    assert harness.store.get_steps(harness.run_key) == []
    clock.advance(60)  # the dead worker's lease runs out
    decision = harness.run(lambda: current_job.step.run("charge", lambda: calls.append("w2") or "ok"), owner="w2")
    assert decision == decisions.Completed("ok")
    assert calls == ["w1", "w2"]


def test_c6_a_step_retried_inside_the_body_keeps_its_key_and_place(harness, clock):
    """C6/C12: a step whose body raised commits nothing and takes no key, so an in-body retry loop
    commits ``fetch#0`` and the replay after a sleep is a memo hit, not a false divergence."""
    calls: list[int] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("first call fails")
        return "data"

    def body() -> str:
        for _ in range(2):
            try:
                value = current_job.step.run("fetch", flaky)
                break
            except ConnectionError:
                continue
        current_job.step.sleep("10s")
        return value

    assert harness.run(body) == decisions.PutBack(decisions.PutBackReason.SLEEP, ANY, ANY, ANY)
    assert [s.step_key for s in harness.store.get_steps("run-1")] == ["fetch#0", "sleep#0"]
    clock.advance(11)
    decision = harness.run(body)
    assert decision == decisions.Completed("data")
    assert len(calls) == 2


def test_c7_tuple_comes_back_as_a_list_on_first_run_and_on_replay(harness):
    """Under JSON a tuple is a list both times, so a caller never sees two types."""
    seen: list[object] = []

    def body():
        value = current_job.step.run("pair", lambda: (1, "a"))
        seen.append(value)
        if current_job.attempt == 1:
            raise Boom("retry")
        return value

    harness.run(body)
    harness.run(body)
    assert seen == [[1, "a"], [1, "a"]]
    assert all(type(v) is list for v in seen)


def test_c7_dict_with_int_keys_comes_back_decoded_on_first_run(harness):
    """The first run returns the decoded value too: JSON turns ``{1: 'a'}`` into ``{'1': 'a'}``."""
    decision = harness.run(lambda: current_job.step.run("m", lambda: {1: "a"}))
    assert decision == decisions.Completed({"1": "a"})


def test_c7_an_int_subclass_comes_back_as_the_int_json_reads_on_first_run_and_on_replay(harness):
    """An ``IntEnum`` member is stored as its number, and the first run returns what a replay will: the ``int``."""
    import enum

    class Size(enum.IntEnum):
        LARGE = 3

    seen: list[object] = []

    def body():
        seen.append(current_job.step.run("size", lambda: Size.LARGE))
        seen.append(current_job.step.run("flag", lambda: True))
        if current_job.attempt == 1:
            raise Boom("retry")

    harness.run(body)
    harness.run(body)
    assert seen == [3, True, 3, True]
    assert [type(v) for v in seen] == [int, bool, int, bool]


@pytest.mark.parametrize(
    "value",
    [pytest.param(object(), id="object"), pytest.param({1, 2}, id="set")],
)  # NaN and the infinities are kept: tests/conformance/test_conformance_value_types.py
def test_c7_unencodable_value_fails_with_encode_error_and_commits_nothing(harness, value):
    """A value JSON cannot encode raises ``EncodeError`` naming the step; no row; dead-lettered."""
    calls: list[str] = []

    def body():
        current_job.step.run("render", lambda: calls.append("ran") or value)

    decision = harness.run(body)
    assert isinstance(decision, decisions.DeadLetter)
    assert decision.reason == "unencodable_value"
    assert isinstance(decision.error, EncodeError)
    assert "'render#0'" in decision.message
    assert "'json'" in decision.message
    assert calls == ["ran"]
    assert harness.store.get_steps(harness.run_key) == []


def _driver(store: MemoryStepStore, codec: CodecChain) -> AttemptDriver:
    return AttemptDriver(store, DurableConfig(serializer=codec.serializer, codecs=codec.codecs))


def _job(job_id: str = "job-1") -> JobInfo:
    return JobInfo("run-1", job_id, JobEnvelope("task", "test"))


def _commit_then_fail(driver: AttemptDriver, value: object) -> None:
    def body():
        current_job.step.run("secret", lambda: value)
        raise Boom("leave the row for a replay")

    assert isinstance(driver.start(_job()).run(body), decisions.Failure)


def _replay(driver: AttemptDriver) -> decisions.Decision:
    calls: list[str] = []
    decision = driver.start(_job()).run(lambda: current_job.step.run("secret", lambda: calls.append("x")))
    assert calls == [], "a replay must not call the body"
    return decision


@pytest.mark.parametrize(
    "codecs",
    [
        pytest.param(lambda: [ZlibCodec()], id="zlib"),
        pytest.param(lambda: [FernetCodec(Fernet.generate_key())], id="fernet"),
        pytest.param(lambda: [ZlibCodec(level=9), FernetCodec(Fernet.generate_key())], id="zlib-fernet"),
    ],
)
def test_c7_codec_chains_round_trip_on_first_run_and_replay(memory_store, codecs):
    """zlib and Fernet chains store transformed bytes and give the value back, first run and replay."""
    driver = _driver(memory_store, CodecChain(codecs=codecs()))
    value = {"card": "4242" * 50, "amount": [1, 2]}
    _commit_then_fail(driver, value)
    stored = memory_store.get_steps("run-1")[0].value
    assert stored is not None
    assert b"4242" not in stored, "the codecs must reach the stored bytes"
    assert _replay(driver) == decisions.Completed(value)


def test_c7_row_stored_by_another_chain_is_a_decode_error_naming_both(memory_store):
    """A worker with another codec chain cannot misread a row: ``DecodeError`` names both chains."""
    _commit_then_fail(_driver(memory_store, CodecChain()), "plain")
    decision = _replay(_driver(memory_store, CodecChain(codecs=[ZlibCodec()])))
    assert isinstance(decision, decisions.Failure)
    assert isinstance(decision.error, DecodeError)
    message = str(decision.error)
    assert "'secret#0'" in message
    assert "stored by codec chain 'FQ1|json'" in message
    assert "configured with 'FQ1|json|zlib'" in message


def test_c7_rotated_out_fernet_key_is_a_decode_error(memory_store):
    """Bytes written with a key no longer configured raise ``DecodeError``, never garbage."""
    old = Fernet.generate_key()
    _commit_then_fail(_driver(memory_store, CodecChain(codecs=[FernetCodec(old)])), "secret")
    decision = _replay(_driver(memory_store, CodecChain(codecs=[FernetCodec(Fernet.generate_key())])))
    assert isinstance(decision, decisions.Failure)
    assert isinstance(decision.error, DecodeError)
    assert "Fernet key" in str(decision.error)


def test_c7_multifernet_rotation_still_decrypts_with_the_old_key_second(memory_store):
    """With ``[new, old]`` keys, rows written under ``old`` still decrypt; new rows use ``new``."""
    old, new = Fernet.generate_key(), Fernet.generate_key()
    _commit_then_fail(_driver(memory_store, CodecChain(codecs=[FernetCodec(old)])), "secret")
    rotated = _driver(memory_store, CodecChain(codecs=[FernetCodec([new, old])]))

    def body():
        first = current_job.step.run("secret", lambda: "never")
        current_job.step.run("fresh", lambda: "new-row")
        raise Boom(first)

    decision = rotated.start(_job()).run(body)
    assert isinstance(decision, decisions.Failure)
    assert str(decision.error) == "secret"
    fresh = memory_store.get_steps("run-1")[1].value
    assert fresh is not None
    _, _, token = fresh.partition(b"\n")
    assert Fernet(new).decrypt(token) == b'"new-row"'


class CountingStore:
    """Wraps a store and records every method the driver calls on it."""

    def __init__(self, inner: MemoryStepStore) -> None:
        self.inner = inner
        self.calls: list[str] = []

    def __getattr__(self, name: str):
        attr = getattr(self.inner, name)
        if not callable(attr) or name in ("local_clock", "held"):  # a clock function, a hold: no round trip
            return attr

        def counted(*args, **kwargs):
            self.calls.append(name)
            return attr(*args, **kwargs)

        return counted


def test_c9_memo_hit_makes_no_store_call_and_a_new_step_makes_one(memory_store):
    """A memo hit (and its divergence check) touches no store method; a new step is one ``commit_step``."""
    store = CountingStore(memory_store)
    driver = AttemptDriver(store, DurableConfig())  # type: ignore[arg-type]
    _commit_then_fail(AttemptDriver(memory_store, DurableConfig()), "v")

    during: dict[str, list[str]] = {}

    def body():
        before = list(store.calls)
        current_job.step.run("secret", lambda: "never")
        during["memo"] = store.calls[len(before) :]
        before = list(store.calls)
        current_job.step.run("new", lambda: "n")
        during["new"] = store.calls[len(before) :]
        return "done"

    attempt = driver.start(_job())
    assert store.calls == ["begin"]
    assert attempt.run(body) == decisions.Completed("done")
    assert during == {"memo": [], "new": ["commit_step"]}


@pytest.mark.parametrize(
    "value",
    [0, -7, 2**63, 10**40, True, False, None],
    ids=["zero", "negative", "2**63", "10**40", "true", "false", "none"],
)
def test_c7_an_int_bool_or_none_is_stored_as_the_json_encoder_writes_it(value):
    """C7: the serializer's shortcut for these values writes the bytes the JSON encoder writes, and reads them back."""
    serializer = JsonSerializer()
    stored = serializer.dumps(value)
    assert stored == json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    assert serializer.loads(stored) == value
    assert type(serializer.loads(stored)) is type(value)


def test_c7_an_int_too_long_for_text_fails_as_the_json_encoder_fails():
    """C7: an int past Python's digit limit is refused with the encoder's own ``ValueError``, shortcut or not."""
    with pytest.raises(ValueError, match="4300 digits"):
        JsonSerializer().dumps(10**5000)
