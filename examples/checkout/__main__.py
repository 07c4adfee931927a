"""Run the checkout demo: ``python -m examples.checkout [--framework F] [--broker URL] [--crash] [--ship-fails]
[--wait-payment]``.

The demo publishes one checkout job, runs a real worker process, and prints the
story the task writes to its journal as it happens, then the tally read from
the fake payment API and the step store. With ``--ship-fails`` the carrier
refuses every try: shipping's retry budget runs out and the charge is
refunded by its compensation (C31, C32). With ``--wait-payment`` the checkout
waits for the bank's "payment confirmed" event, which this driver sends with
``flexiq_plugins.send_event`` when it reads that the run waits (C33).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import click

ROOT = Path(__file__).resolve().parents[2]
ORDER = ("order-42", 1999)
TIMEOUT = 120.0


@click.command(context_settings={"help_option_names": ["-h", "--help"]}, name="./dev demo")
@click.option("--framework", type=click.Choice(["celery", "dramatiq"]), default="celery", show_default=True)
@click.option(
    "--broker",
    default="",
    help="redis://127.0.0.1:6379/0 or amqp://guest:guest@127.0.0.1:5672// "
    "(default: no server — kombu's SQLite transport for Celery, an in-process StubBroker for Dramatiq)",
)
@click.option("--crash", is_flag=True, help="SIGKILL the worker right after the charge commits.")
@click.option(
    "--ship-fails",
    is_flag=True,
    help="The carrier refuses every try: the retry budget runs out, the charge is refunded.",
)
@click.option(
    "--wait-payment",
    is_flag=True,
    help="After the charge, wait for the bank's 'payment confirmed' event; the demo sends it.",
)
@click.option("--dir", "workdir", type=click.Path(file_okay=False), help="Where the SQLite files go.")
def main(
    *, framework: str, broker: str, crash: bool, ship_fails: bool, wait_payment: bool, workdir: str | None
) -> None:
    """The checkout demo: charge once, sleep, send a receipt that fails on its first try, ship."""
    if crash and framework == "dramatiq" and not broker:
        raise click.UsageError(
            "--crash needs a real broker with Dramatiq: the StubBroker lives inside this process and "
            "cannot redeliver a message after its worker is killed. Add --broker redis://127.0.0.1:6379/0 "
            "or --broker amqp://guest:guest@127.0.0.1:5672//"
        )
    if broker:
        _check_broker(broker)
    demo_dir = Path(workdir or tempfile.mkdtemp(prefix="flexiq-demo-")).resolve()
    demo_dir.mkdir(parents=True, exist_ok=True)
    os.environ["FLEXIQ_DEMO_DIR"] = str(demo_dir)
    os.environ["FLEXIQ_DEMO_BROKER"] = broker
    # a queue of its own, so another demo (or a leftover message of an interrupted one) never mixes in
    os.environ["FLEXIQ_DEMO_QUEUE"] = f"flexiq-demo-{uuid.uuid4().hex[:8]}"
    if ship_fails:
        os.environ["FLEXIQ_DEMO_SHIP_FAILS"] = "1"
    if wait_payment:
        os.environ["FLEXIQ_DEMO_WAIT_PAYMENT"] = "1"
    sys.path.insert(0, str(ROOT))
    if crash:
        (demo_dir / "crash-armed").touch()
    demo = _Demo(framework, broker, crash, demo_dir, ship_fails=ship_fails, wait_payment=wait_payment)
    sys.exit(demo.run())


def _check_broker(url: str) -> None:
    """Fail with one line, before any worker starts, when the broker cannot be used.

    Raises:
      click.UsageError: not a redis:// or amqp:// URL (exit 2).
      click.ClickException: the broker cannot be reached or refuses us (exit 1).
    """
    if not url.startswith(("redis://", "amqp://")):
        raise click.UsageError(f"--broker {url}: the demo runs on redis://… or amqp://… brokers")
    import kombu

    connection: Any = getattr(kombu, "Connection")  # noqa: B009 - kombu exports it untyped
    try:
        with connection(url, connect_timeout=3) as conn:
            conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0, timeout=5)
    except Exception as exc:
        cause = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise click.ClickException(f"cannot reach the broker at {url}: {cause}") from None


class _Demo:
    def __init__(
        self,
        framework: str,
        broker: str,
        crash: bool,
        demo_dir: Path,
        *,
        ship_fails: bool = False,
        wait_payment: bool = False,
    ) -> None:
        from flexiq_plugins import new_run_key

        self.framework = framework
        self.broker = broker
        self.crash = crash
        self.ship_fails = ship_fails
        self.wait_payment = wait_payment
        self.confirmed = False
        self.dir = demo_dir
        self.run_key = new_run_key()
        self.started = time.monotonic()
        self.worker: subprocess.Popen[bytes] | None = None
        self.crashed_at = 0.0
        self.workers_started = 0

    # ------------------------------------------------------------ the story
    def run(self) -> int:
        transport = self.broker or (
            "kombu's SQLite transport (no server)" if self.framework == "celery" else "in-process StubBroker"
        )
        click.echo(f"flexiq-plugins checkout demo — {self.framework}, broker: {transport}")
        self._say_what_the_demo_changes()
        click.echo(f"step store and demo files: {self.dir}")
        click.echo(f"run key {self.run_key}")
        click.echo(f"publishing checkout{ORDER!r}\n")
        try:
            ok = self._drive()
        finally:
            self._stop_worker()
        return self._tally(ok)

    def _say_what_the_demo_changes(self) -> None:
        """One line for the timings the demo shortens, one for a broker URL it rewrites: nothing silently."""
        if self.framework == "celery":
            from .celery_app import DEMO_TIMINGS
        else:
            from .dramatiq_app import DEMO_TIMINGS, pika_url

            if pika_url(self.broker) != self.broker:
                click.echo(
                    f"broker URL: {self.broker} is given to Dramatiq as {pika_url(self.broker)}: pika writes "
                    "the default vhost '/' as %2F where kombu (Celery) writes //"
                )
        click.echo(
            f"demo timings: {DEMO_TIMINGS}, so that a killed worker's job is taken over within seconds "
            "(keep the defaults in production)"
        )

    def _drive(self) -> bool:
        if self.framework == "dramatiq" and not self.broker:
            return self._drive_in_process()
        # Publish first: kombu's SQLite transport creates a queue's row in whichever process declares
        # it first, under a lock of that process only, so a worker starting up and this publish
        # could both insert it (UNIQUE constraint failed: kombu_queue.name). The job waits queued.
        done = self._publish()
        self._start_worker()
        return self._follow(done)

    def _follow(self, done: Any) -> bool:
        seen = 0
        deadline = time.monotonic() + TIMEOUT
        quiet_since = time.monotonic()
        while time.monotonic() < deadline:
            before, seen = seen, self._print_journal(seen)
            if done():
                self._print_journal(seen)
                return True
            if seen != before:
                quiet_since = time.monotonic()
            elif self.crashed_at and time.monotonic() - quiet_since > 5:
                waited = time.monotonic() - self.crashed_at
                click.echo(f"         ... {waited:.0f}s since the kill: waiting for the broker to redeliver the job")
                quiet_since = time.monotonic()
            time.sleep(0.2)
        click.echo(f"gave up after {TIMEOUT:.0f}s; the worker log is {self.dir / 'worker.log'}")
        return False

    def _print_journal(self, seen: int) -> int:
        from .flow import WAITING_LINE
        from .services import Journal

        for n, at, line in Journal().read_from(seen):
            click.echo(f"[{at - self._epoch_start:5.1f}s] {line}")
            seen = n
            if "CRASH POINT" in line:
                self._crash(line)
            if WAITING_LINE in line and not self.confirmed:
                self._confirm_payment()
        return seen

    def _confirm_payment(self) -> None:
        """Play the bank's webhook: send the "payment confirmed" event from this process (C33)."""
        from flexiq_plugins import send_event

        from .flow import PAYMENT_CONFIRMED

        self.confirmed = True
        sent = send_event(PAYMENT_CONFIRMED, ORDER[0], {"status": "confirmed", "bank_ref": "bk_77"})
        woken = ", ".join(run for run, _ in sent.woken) or "none yet"
        event = f"the 'payment confirmed' event (event id {sent.event.id}; woke run: {woken})"
        click.echo(f"         >>> the driver sent {event}")

    @property
    def _epoch_start(self) -> float:
        return time.time() - (time.monotonic() - self.started)

    # ------------------------------------------------------------- workers
    def _worker_cmd(self) -> list[str]:
        if self.framework == "celery":
            queue = os.environ["FLEXIQ_DEMO_QUEUE"]  # also the node name: another worker on the broker is no clash
            return [sys.executable, "-m", "celery", "-A", "examples.checkout.celery_app", "worker",
                    "-P", "prefork", "-c", "1", "-l", "warning", "-Q", queue, "-n", f"{queue}@%h",
                    "--without-gossip", "--without-mingle", "--without-heartbeat"]  # fmt: skip
        return [sys.executable, "-m", "dramatiq", "examples.checkout.dramatiq_app", "-p", "1", "-t", "1"]

    def _start_worker(self) -> None:
        self.workers_started += 1
        log = open(self.dir / "worker.log", "ab")  # noqa: SIM115 - handed to the child process
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.worker = subprocess.Popen(
            self._worker_cmd(), cwd=ROOT, env=env, stdout=log, stderr=log, start_new_session=True
        )
        click.echo(f"         worker #{self.workers_started} started (pid {self.worker.pid})")

    def _stop_worker(self) -> None:
        if self.worker is not None and self.worker.poll() is None:
            os.killpg(self.worker.pid, signal.SIGTERM)
            try:
                self.worker.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.worker.pid, signal.SIGKILL)
                self.worker.wait()

    def _crash(self, line: str) -> None:
        from .flow import LEASE_SECONDS

        assert self.worker is not None
        self.crashed_at = time.monotonic()
        if self.broker:
            os.killpg(self.worker.pid, signal.SIGKILL)
            self.worker.wait()
            click.echo(f"         >>> SIGKILL to the whole worker (process group {self.worker.pid}):")
            click.echo("             its message is unacknowledged and its claim on the run still holds")
            click.echo("         >>> starting a new worker; the broker redelivers the job (RabbitMQ at once,")
            click.echo("             Redis after its visibility timeout) and the new attempt takes over")
            click.echo(f"             the run once the dead worker's {LEASE_SECONDS:g} s lease has expired")
            self._start_worker()
            return
        pid = int(line.rsplit("pid ", 1)[1].rstrip(")"))
        os.kill(pid, signal.SIGKILL)
        click.echo(f"         >>> SIGKILL to pool process {pid}, which was running the task")
        click.echo("         >>> the embedded SQLite transport cannot redeliver a message whose whole worker")
        click.echo("             died, so this run kills only the pool process: the worker's main process")
        click.echo("             puts the message back (reject_on_worker_lost) and a new pool process takes it")
        click.echo(f"             over once the dead one's {LEASE_SECONDS:g} s lease on the run has expired.")
        click.echo("             Use --broker redis://… or amqp://… to kill the whole worker instead.")

    # ------------------------------------------------------------ publish
    def _publish(self) -> Any:
        if self.framework == "celery":
            from .celery_app import checkout

            result = checkout.apply_async(ORDER, headers={"flexiq_run_key": self.run_key})
            self.result = result
            return result.ready
        from .dramatiq_app import checkout as actor

        actor.send_with_options(args=ORDER, flexiq_run_key=self.run_key)
        return self._run_finished

    def _run_finished(self) -> bool:
        from flexiq_plugins import UnknownRun

        try:
            return self._store().get_run(self.run_key).status in {"succeeded", "failed", "dead", "compensated"}
        except UnknownRun:
            return False

    def _drive_in_process(self) -> bool:
        import logging

        import dramatiq

        from .dramatiq_app import broker, checkout

        logging.getLogger("dramatiq").setLevel(logging.CRITICAL)  # the journal tells the story
        click.echo("         (Dramatiq has no embedded transport a separate process could share:")
        click.echo("          the worker runs in this process, on a StubBroker; its log is hidden)")
        worker = dramatiq.Worker(broker, worker_threads=1)
        worker.start()
        try:
            checkout.send_with_options(args=ORDER, flexiq_run_key=self.run_key)
            return self._follow(self._run_finished)
        finally:
            worker.stop()

    # -------------------------------------------------------------- tally
    def _store(self) -> Any:
        from flexiq_plugins._store.factory import open_store

        return open_store(f"sqlite:///{self.dir}/steps.db")

    def _tally(self, ok: bool) -> int:
        from flexiq_plugins import UnknownRun

        from .services import Carrier, Payments

        try:
            run = self._store().get_run(self.run_key)
        except UnknownRun:
            click.echo(f"\nthe job never started: no run {self.run_key} in the store; see {self.dir / 'worker.log'}")
            return 1
        calls, charges = Payments().calls(self.run_key), Payments().charges(self.run_key)
        refunds, tries = Payments().refunds(self.run_key), Carrier().tries(ORDER[0])
        click.echo("")
        if self.framework == "celery" and ok:
            click.echo(f"AsyncResult({self.result.id}).get() -> {self._result_value()}")
        click.echo(
            f"payment API called {_plural(calls, 'time')} for {_plural(run.attempt, 'attempt')}; "
            f"{_plural(charges, 'charge')} made, {_plural(refunds, 'refund')}; carrier tried {_plural(tries, 'time')}"
        )
        if run.takeovers:
            click.echo(f"the dead worker's claim expired and was taken over {_plural(run.takeovers, 'time')}")
        click.echo(f"run {run.run_key}: {run.status}")
        self._explain()
        if self.ship_fails:
            good = ok and run.status == "compensated" and (charges, refunds, tries) == (1, 1, 3)
            click.echo("OK: one charge, shipping failed for good, the charge refunded once" if good else "NOT OK")
        elif self.wait_payment:
            good = ok and run.status == "succeeded" and calls == 1 and charges == 1 and self.confirmed
            click.echo("OK: one charge, waited for the payment confirmation, shipped" if good else "NOT OK")
        else:
            good = ok and run.status == "succeeded" and calls == 1 and charges == 1 and refunds == 0
            click.echo("OK: one charge, receipt retried, sleep survived" if good else "NOT OK: see above")
        return 0 if good else 1

    def _result_value(self) -> str:
        try:
            return repr(self.result.get(timeout=10))
        except Exception as exc:  # the variant's dead letter: Celery stored the failure
            return f"raised {type(exc).__name__}: {exc}"

    def _explain(self) -> None:
        click.echo("\nThe run key names the job across all its attempts (the framework's job id may change);")
        click.echo("a memo hit is a step whose committed value was returned without calling its body again;")
        click.echo("'charge#0' is the step key: the first step named 'charge'. Inspect the run's steps with:")
        click.echo(f"  .venv/bin/flexiq --store sqlite:///{self.dir}/steps.db runs show {self.run_key}")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


if __name__ == "__main__":
    main()
