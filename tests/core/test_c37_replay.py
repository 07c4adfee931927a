"""C37: a finished run keeps its outcome, and a duplicate replays it without running the body (the core's part).

The adapters' part (Celery's result backend and chains, Dramatiq's Results
and pipelines) is proven with real workers in ``tests/celery`` and
``tests/dramatiq``.
"""

from __future__ import annotations

from typing import Any

import pytest

from flexiq_plugins import (
    DeadLettered,
    DurableConfig,
    JobEnvelope,
    MemoryStepStore,
    NonRetryableError,
    OutcomeNotKept,
    ReplayedError,
    current_job,
)
from flexiq_plugins._attempt import decisions
from flexiq_plugins._model import replays
from flexiq_plugins._model.codec import CodecChain
from flexiq_plugins.integration import AttemptDriver, JobInfo


class PaymentDeclined(Exception):
    """A body's own error: replayed as itself."""


def _driver(**options: Any) -> AttemptDriver:
    return AttemptDriver(MemoryStepStore(), DurableConfig(**options))


def _job(job_id: str = "job-1") -> JobInfo:
    return JobInfo("run-1", job_id, JobEnvelope("shop.checkout", "test"))


def _run(driver: AttemptDriver, body: Any, job_id: str = "job-1") -> decisions.Decision:
    return driver.run_job(_job(job_id), body)


def _never() -> Any:
    raise AssertionError("the body of a finished run ran again")


def test_c37_a_duplicate_of_a_succeeded_run_replays_its_value_without_running_the_body():
    driver = _driver()
    assert _run(driver, lambda: {"order": "A-1", "total": 12}) == decisions.Completed({"order": "A-1", "total": 12})
    assert _run(driver, _never, job_id="job-2") == decisions.Replay("succeeded", {"order": "A-1", "total": 12})


def test_c37_a_replayed_value_goes_through_the_runs_codec_like_a_step_value():
    """The stored bytes are the codec chain's (header and all), after the outcome's tag."""
    driver = _driver()
    _run(driver, lambda: [1, 2, 3])
    stored = driver.store.get_run("run-1").outcome
    assert stored is not None
    assert stored[1:] == CodecChain().encode([1, 2, 3], step_key="<return value>")


def test_c37_a_duplicate_of_a_failed_run_replays_its_error_by_class():
    driver = _driver()

    def declined() -> None:
        raise PaymentDeclined("card 4242 declined")

    failure = _run(driver, declined)
    assert isinstance(failure, decisions.Failure)
    assert driver.give_up(failure) is None  # the framework will not retry: failed (C26)
    replay = _run(driver, _never, job_id="job-2")
    assert isinstance(replay, decisions.Replay)
    assert (replay.status, type(replay.error), str(replay.error)) == ("failed", PaymentDeclined, "card 4242 declined")


def test_c37_an_error_whose_class_is_gone_replays_as_a_typed_error_naming_it():
    stored = replays.failure_outcome("shop.gone.PaymentDeclined", "card declined")
    replayed = replays.load_outcome(stored, CodecChain())
    assert isinstance(replayed.error, ReplayedError)
    assert isinstance(replayed.error, NonRetryableError)
    assert replayed.error.error_type == "shop.gone.PaymentDeclined"
    assert str(replayed.error) == "shop.gone.PaymentDeclined: card declined"


def test_c37_a_dead_lettered_run_replays_as_dead_lettered_with_its_reason():
    driver = _driver()
    _run(driver, lambda: current_job.step.run("charge", object))  # a value the serializer cannot encode
    replay = _run(driver, _never, job_id="job-2")
    assert isinstance(replay, decisions.Replay)
    assert replay.status == "dead"
    assert isinstance(replay.error, DeadLettered)
    assert str(replay.error).startswith("unencodable_value: step 'charge#0' returned a value")


@pytest.mark.parametrize("size", [0, 1])
def test_c37_a_value_over_the_step_bytes_limit_is_replayed_as_outcome_not_kept_never_none(size):
    """A return value over ``step_bytes`` is not kept: the run succeeds, a duplicate raises ``OutcomeNotKept``."""
    driver = _driver(step_bytes=64)
    big = "x" * (200 + size)
    assert _run(driver, lambda: big) == decisions.Completed(big)
    replay = _run(driver, _never, job_id="job-2")
    assert isinstance(replay, decisions.Replay)
    assert replay.value is None
    assert isinstance(replay.error, OutcomeNotKept)
    assert "over the step bytes limit of 64 bytes" in str(replay.error)


def test_c37_a_value_the_serializer_cannot_encode_is_replayed_as_outcome_not_kept():
    driver = _driver()
    assert isinstance(_run(driver, object), decisions.Completed)  # the run itself succeeds
    replay = _run(driver, _never, job_id="job-2")
    assert isinstance(replay, decisions.Replay)
    assert isinstance(replay.error, OutcomeNotKept)
    assert "could not be encoded" in str(replay.error)


def test_c37_a_run_that_finished_before_outcomes_were_kept_is_acknowledged_as_a_duplicate():
    """A terminal run without a stored outcome (finished before revision 0006) keeps today's behaviour."""
    driver = _driver()
    begun = driver.store.begin("run-1", "job-1", JobEnvelope("shop.checkout", "test"), "w", 30.0)
    driver.store.finish(begun.claim, "succeeded")  # type: ignore[union-attr]
    assert _run(driver, _never, job_id="job-2") == decisions.Ack(decisions.AckReason.DUPLICATE, "succeeded")


def test_c37_a_replayed_key_error_equals_the_original():
    """C37: ``str(KeyError("ar"))`` is ``"'ar'"``; the replay rebuilds ``KeyError("ar")``, not ``KeyError("'ar'")``."""
    driver = _driver()

    def missing() -> None:
        raise KeyError("ar")

    failure = _run(driver, missing)
    assert isinstance(failure, decisions.Failure)
    assert driver.give_up(failure) is None
    replay = _run(driver, _never, job_id="job-2")
    assert isinstance(replay, decisions.Replay)
    assert type(replay.error) is KeyError
    assert replay.error.args == ("ar",)
