"""Run N messages of one side of a ``bench_no_step`` pair, for an instruction count (C43).

    valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.out \\
        .venv/bin/python -m benchmarks.no_step_messages dramatiq durable 300

Instructions are stable on a busy machine where times are not: run it with
``0`` and with ``N`` messages and divide the difference of the two totals
(the ``summary:`` line of each output file) by ``N`` for the instructions per
message, producer and worker both included; do it for ``plain`` and
``durable`` and compare. Only the side asked for exists in the process (one
broker, one worker thread polling every second, so an idle worker adds next
to nothing), and the durable side runs without its recovery sweeper, whose
cost is per unit of time, not per message. Each run handles 20 messages
first (imports, the worker's first message, the store's schema), alike in
both runs.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _dramatiq(store: str, durable: bool, failing: bool) -> tuple[Callable[[int], None], Callable[[], None]]:
    import dramatiq
    from dramatiq.brokers.stub import StubBroker
    from dramatiq.middleware import Retries

    from dramatiq_ext import DurableSteps

    broker = StubBroker()
    if durable:
        broker.add_middleware(DurableSteps(store=store, recovery=False), before=Retries)
    broker.emit_after("process_boot")

    @dramatiq.actor(broker=broker, queue_name="q", max_retries=0)
    def noop() -> None:
        """Does nothing."""

    @dramatiq.actor(broker=broker, queue_name="q", max_retries=0)
    def fails() -> None:
        raise ValueError("always")

    actor = fails if failing else noop
    worker = dramatiq.Worker(broker, worker_threads=1, worker_timeout=1000)
    worker.start()

    def run(n: int) -> None:
        for _ in range(n):
            actor.send()
        broker.join("q", fail_fast=False)
        worker.join()

    return run, worker.stop


def _celery(store: str, durable: bool) -> tuple[Callable[[int], None], Callable[[], None]]:
    from celery import Celery

    import celery_ext

    app = Celery("no_step", broker="memory://", backend="cache+memory://", set_as_current=False)
    celery_ext.install(app, store=store)

    @app.task(name="noop", durable=None if durable else False)
    def noop() -> None:
        """Does nothing."""

    def run(n: int) -> None:
        for _ in range(n):
            noop.apply()

    return run, lambda: None


def main() -> None:
    """Run the messages of the side named on the command line."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("framework", choices=("dramatiq", "celery"), help="Dramatiq StubBroker, or Celery eager")
    parser.add_argument("side", choices=("plain", "durable"))
    parser.add_argument("messages", type=int)
    parser.add_argument("--failing", action="store_true", help="Dramatiq: the always-failing actor")
    args = parser.parse_args()
    logging.disable(logging.CRITICAL)
    with tempfile.TemporaryDirectory() as tmp:
        store: Any = f"sqlite:///{Path(tmp) / 'steps.db'}"
        durable = args.side == "durable"
        if args.framework == "dramatiq":
            run, stop = _dramatiq(store, durable, args.failing)
        else:
            run, stop = _celery(store, durable)
        try:
            run(20)
            if args.messages:
                run(args.messages)
        finally:
            stop()


if __name__ == "__main__":
    main()
