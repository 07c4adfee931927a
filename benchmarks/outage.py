"""A store outage under load: the database cut (connections dropped and refused) for a while, then back.

    .venv/bin/python benchmarks/outage.py --framework dramatiq --broker redis --outage 10 --jobs 100

The workers of ``chaos.py`` (five-step jobs with a 1 s sleep) reach
PostgreSQL through a small TCP proxy in this process. Once the jobs are
running, the proxy drops every connection and refuses new ones for
``--outage`` seconds, then lets them through again. It prints how many jobs
finished and were lost, how long after the database's return the last job
finished (the drain), and how many WARNING-or-worse lines the workers logged
during the outage and after it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Any
from uuid import uuid4

import chaos


class Proxy:
    """A TCP proxy to ``upstream`` on a free local port; :meth:`cut` drops and refuses, :meth:`restore` ends it."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.port = _free_port()
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self._cut = False
        self._listener = self._listen()
        threading.Thread(target=self._accept, daemon=True).start()

    def _listen(self) -> socket.socket:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(128)
        return listener

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                time.sleep(0.05)
                continue
            if self._cut:
                client.close()
                continue
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=_pump, args=(a, b), daemon=True).start()

    def cut(self) -> None:
        """Drop every connection; new ones are accepted and closed at once (a refused connection)."""
        self._cut = True
        with self._lock:
            for sock in self._open:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            self._open.clear()

    def restore(self) -> None:
        """Let connections through again."""
        self._cut = False


def _pump(source: socket.socket, target: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            target.sendall(data)
    except OSError:
        pass
    finally:
        for sock in (source, target):
            with contextlib.suppress(OSError):
                sock.close()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _warnings(directory: str) -> int:
    count = 0
    for log in Path(directory).glob("worker-*.log"):
        for line in log.read_text(errors="replace").splitlines():
            if any(level in line for level in ("WARNING", "ERROR", "CRITICAL")) and "Results middleware" not in line:
                count += 1
    return count


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Publish, let the jobs start, cut the store for ``args.outage`` seconds, restore, drain; return the counts."""
    from flexiq_plugins import SqlStepStore

    proxy = Proxy(("127.0.0.1", 5432))
    url = f"postgresql://postgres@127.0.0.1:{proxy.port}/test"
    directory = tempfile.mkdtemp(prefix="flexiq-outage-")
    config = chaos.ChaosConfig(args.framework, args.broker, url, f"outage{uuid4().hex[:8]}", directory)
    direct = SqlStepStore("postgresql://postgres@127.0.0.1:5432/test", table_prefix=config.table_prefix)
    workers = chaos.Workers(config, 2)
    try:
        workers.fill()
        time.sleep(3)  # the workers boot
        chaos.publish(config, args.jobs)
        time.sleep(2)
        before = _warnings(directory)
        proxy.cut()
        time.sleep(args.outage)
        during = _warnings(directory) - before
        proxy.restore()
        back = time.time()
        deadline = back + args.drain
        runs = chaos._runs(direct, config)
        while time.time() < deadline and (len(runs) < args.jobs or any(not chaos._ended(r.status) for r in runs)):
            time.sleep(0.5)
            runs = chaos._runs(direct, config)
        drain = time.time() - back
        after = _warnings(directory) - before - during
    finally:
        workers.stop()
        chaos._cleanup(config)
        chaos._drop_tables(direct)
    finished = sum(1 for r in runs if r.status == "succeeded")
    return {
        "framework": args.framework,
        "broker": args.broker,
        "jobs": args.jobs,
        "outage_s": args.outage,
        "finished": finished,
        "lost": args.jobs - sum(1 for r in runs if chaos._ended(r.status)),
        "drain_after_return_s": round(drain, 1),
        "warning_lines_during_outage": during,
        "warning_lines_after_return": after,
        "directory": directory,
    }


def main() -> None:
    """Parse the arguments, run, print one JSON object."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--framework", choices=("celery", "dramatiq"), default="dramatiq")
    parser.add_argument("--broker", choices=("redis", "rabbitmq"), default="redis")
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--outage", type=float, default=10.0, help="seconds the store is cut")
    parser.add_argument("--drain", type=float, default=300.0)
    print(json.dumps(run(parser.parse_args())))


if __name__ == "__main__":
    main()
