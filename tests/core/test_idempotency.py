"""Idempotency keys, C10 and C11: ``"<run key>:<step key>"``, stable however the run comes back.

One run goes through every way a job can return (a retry, a sleep wake, a
dead-letter retry with a new job id) and the key read inside the same step's
body must be identical each time.
"""

from __future__ import annotations

import asyncio
from unittest.mock import ANY

import pytest
from cryptography.fernet import Fernet

from flexiq_plugins import CodecChain, DurableConfig, FernetCodec, JobEnvelope, ZlibCodec, current_job
from flexiq_plugins._attempt import decisions
from flexiq_plugins.errors import NotInStep
from flexiq_plugins.integration import AttemptDriver, JobInfo


def test_c10_key_is_run_key_colon_step_key(make_harness):
    """Inside a body the key is exactly ``f"{run_key}:{step_key}"`` for unkeyed and keyed steps."""
    harness = make_harness(run_key="018f-run")
    keys: list[str] = []

    def body():
        step = current_job.step
        step.run("charge", lambda: keys.append(step.idempotency_key))
        step.run("charge", lambda: keys.append(step.idempotency_key))
        step.run("fetch", lambda: keys.append(step.idempotency_key), key=1234)
        return "ok"

    assert harness.run(body) == decisions.Completed("ok")
    assert keys == ["018f-run:charge#0", "018f-run:charge#1", "018f-run:fetch:1234"]


def test_c10_key_does_not_depend_on_the_codec_chain(memory_store):
    """Two workers with different serializers/codecs derive the same key for the same run and step."""
    keys: list[str] = []
    chains = [CodecChain(), CodecChain(codecs=[ZlibCodec(), FernetCodec(Fernet.generate_key())])]

    def charge():
        keys.append(current_job.step.idempotency_key)
        raise RuntimeError("never commit, so the second worker runs the body too")

    for n, chain in enumerate(chains):
        driver = AttemptDriver(memory_store, DurableConfig(serializer=chain.serializer, codecs=chain.codecs))
        job = JobInfo("run-1", f"job-{n}", JobEnvelope("task", "test"))
        decision = driver.start(job).run(lambda: current_job.step.run("charge", charge))
        assert isinstance(decision, decisions.Failure)
    assert keys == ["run-1:charge#0", "run-1:charge#0"]


def test_c10_reading_the_key_outside_a_step_body_raises_not_in_step(harness):
    """In the task body but outside any step body, ``idempotency_key`` raises ``NotInStep``."""
    seen: list[BaseException] = []

    def body():
        step = current_job.step
        with pytest.raises(NotInStep) as before:
            _ = step.idempotency_key
        step.run("charge", lambda: step.idempotency_key)
        with pytest.raises(NotInStep) as after:
            _ = step.idempotency_key
        seen.extend([before.value, after.value])
        return "ok"

    assert harness.run(body) == decisions.Completed("ok")
    assert len(seen) == 2
    assert isinstance(seen[0], RuntimeError)


def test_c11_key_is_stable_across_retry_sleep_wake_and_dead_letter_retry(harness, clock):
    """The same step reads one key on a retry, after a sleep wake, and on a dead-letter retry's new job id."""
    keys: list[tuple[str, int, str]] = []
    behaviour = iter(["raise", "unencodable", "ok"])

    def charge():
        step = current_job.step
        keys.append((current_job.job_id, current_job.attempt, step.idempotency_key))
        what = next(behaviour)
        if what == "raise":
            raise RuntimeError("payment API timed out")
        return object() if what == "unencodable" else "charged"

    def body():
        step = current_job.step
        step.sleep("1h", name="wait")
        return step.run("charge", charge)

    assert harness.run(body) == decisions.PutBack(decisions.PutBackReason.SLEEP, ANY, ANY, ANY)
    clock.advance(3601)
    assert isinstance(harness.run(body), decisions.Failure)  # woke, charge raised
    dead = harness.run(body)  # retried, charge returned an unencodable value
    assert isinstance(dead, decisions.DeadLetter)

    (letter,) = harness.store.list_dead_letters()
    harness.store.prepare_retry(letter.id)
    assert harness.run(body, job_id="job-2") == decisions.Completed("charged")

    assert [(job, n) for job, n, _ in keys] == [("job-1", 2), ("job-1", 3), ("job-2", 4)]
    assert {key for _, _, key in keys} == {"run-1:charge#0"}


def test_c11_keyed_step_key_is_stable_across_a_retry(harness):
    """A keyed step's key is the same ``run:name:key`` on every attempt."""
    keys: list[str] = []

    def charge():
        keys.append(current_job.step.idempotency_key)
        if current_job.attempt == 1:
            raise RuntimeError("retry me")
        return "ok"

    def body():
        return current_job.step.run("charge", charge, key="order-9")

    assert isinstance(harness.run(body), decisions.Failure)
    assert harness.run(body) == decisions.Completed("ok")
    assert keys == ["run-1:charge:order-9", "run-1:charge:order-9"]


def test_c10_key_is_readable_inside_an_async_step_body(harness):
    """Inside an ``arun`` body, across an ``await``, the key names that step."""
    keys: list[str] = []

    async def charge() -> str:
        keys.append(current_job.step.idempotency_key)
        await asyncio.sleep(0)
        keys.append(current_job.step.idempotency_key)
        return "ok"

    async def body():
        return await current_job.step.arun("charge", charge)

    assert asyncio.run(harness.start().arun(body)) == decisions.Completed("ok")
    assert keys == ["run-1:charge#0", "run-1:charge#0"]
