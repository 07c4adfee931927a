"""Ways to cut a database off for the outage benchmark: a TCP proxy that drops and refuses, and a black hole.

:class:`Proxy` is a userspace TCP proxy: :meth:`Proxy.cut` closes every
connection and refuses new ones, so clients get an error at once. It cannot
make a *silent* network: the kernel acknowledges whatever reaches a
userspace proxy.

:class:`BlackHole` puts the database behind a veth pair into a network
namespace of its own (iproute2 only: no netem, iptables or nft needed)::

    client ──> ns_ip:port (forwarder inside the namespace, ``ip netns exec``)
           ──veth──> host_ip:port (forwarder on the host end, a Proxy)
           ──> the database

:meth:`BlackHole.cut` sets the namespace's end of the veth down: the host's
end loses its carrier and every frame is dropped silently, both ways. An
established connection then gets no reset and no error (a statement waits
forever unless the client has timeouts of its own); a new connection's SYN
goes unanswered. Both neighbour entries are pinned (``nud permanent``) so a
failed ARP cannot report "host unreachable" early. :meth:`BlackHole.restore`
sets the link up again and the same connections carry on.

Names (namespace, veth, a /30 in 10.213.0.0/16) carry this process's id and a serial, so
parallel runs do not clash; :meth:`BlackHole.close` removes everything, and a
new black hole first removes those left by processes that no longer exist.
Needs root (``CAP_NET_ADMIN`` and ``CAP_SYS_ADMIN``); without it the
constructor raises :class:`BlackHoleUnavailable`.

    python benchmarks/netcut.py --forward LISTEN_HOST:PORT UPSTREAM_HOST:PORT

runs a plain forwarder (what the namespace side runs) until killed.
"""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import threading
import time

PREFIX = "fqbh"
"""The prefix of our namespaces and veth names (followed by the owning process's id)."""
_NETWORK = ipaddress.ip_network("10.213.0.0/16")
_SERIAL = itertools.count()


class BlackHoleUnavailable(RuntimeError):
    """This machine does not let us make a network namespace (not root, no iproute2, a container without it)."""


class Proxy:
    """A TCP proxy to ``upstream`` on ``host``; :meth:`cut` drops and refuses, :meth:`restore` ends it.

    Parameters:
      upstream(tuple[str, int]): where to forward.
      host(str): the address to listen on.
      port(int): the port to listen on; 0 picks a free one (then read :attr:`port`).
    """

    def __init__(self, upstream: tuple[str, int], host: str = "127.0.0.1", port: int = 0) -> None:
        self.upstream = upstream
        self.host = host
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self._cut = False
        self._closed = False
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((host, port))
        self._listener.listen(128)
        self.port = int(self._listener.getsockname()[1])
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
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
            with self._lock:  # a cut while this connected drops it too: no connection outlives a cut
                if self._cut or self._closed:
                    client.close()
                    server.close()
                    continue
                self._open += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=_pump, args=(a, b), daemon=True).start()

    def cut(self) -> None:
        """Drop every connection; new ones are accepted and closed at once (a refused connection)."""
        with self._lock:
            self._cut = True
        self._drop_all()

    def restore(self) -> None:
        """Let connections through again."""
        self._cut = False

    def close(self) -> None:
        """Stop listening and drop every connection."""
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.close()
        self._drop_all()

    def _drop_all(self) -> None:
        with self._lock:
            for sock in self._open:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            self._open.clear()


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


class BlackHole:
    """``upstream`` reached through a network namespace whose link can be cut silently (see the module).

    Connect to :attr:`host`:`port`. Use it as a context manager, or call :meth:`close`.

    Parameters:
      upstream(tuple[str, int]): the database's address, reachable from this process.

    Raises:
      BlackHoleUnavailable: network namespaces cannot be made here.
    """

    def __init__(self, upstream: tuple[str, int]) -> None:
        if shutil.which("ip") is None:
            raise BlackHoleUnavailable("iproute2's `ip` is not installed")
        remove_stale()
        tag = f"{PREFIX}{os.getpid()}x{next(_SERIAL)}"
        self.namespace, self._host_if, self._ns_if = tag, f"{tag}h", f"{tag}n"
        self._forwarder: subprocess.Popen[bytes] | None = None
        self._proxy: Proxy | None = None
        try:
            _ip("netns", "add", self.namespace)
        except subprocess.CalledProcessError as exc:
            raise BlackHoleUnavailable(f"`ip netns add` is not permitted here: {_stderr(exc)}") from exc
        try:
            host_ip, self.host = _free_subnet()
            self._host_ip = host_ip
            _ip("link", "add", self._host_if, "type", "veth", "peer", "name", self._ns_if, "netns", self.namespace)
            _ip("addr", "add", f"{host_ip}/30", "dev", self._host_if)
            _ip("link", "set", self._host_if, "up")
            _ip("-n", self.namespace, "addr", "add", f"{self.host}/30", "dev", self._ns_if)
            _ip("-n", self.namespace, "link", "set", "lo", "up")
            _ip("-n", self.namespace, "link", "set", self._ns_if, "up")
            self._pin_neighbours()
            self._proxy = Proxy(upstream, host=host_ip)
            self.port = upstream[1]
            self._forwarder = subprocess.Popen(
                ["ip", "netns", "exec", self.namespace, sys.executable, os.path.abspath(__file__), "--forward",
                 f"{self.host}:{self.port}", f"{host_ip}:{self._proxy.port}"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )  # fmt: skip
            assert self._forwarder.stdout is not None
            if self._forwarder.stdout.readline().strip() != b"ready":
                raise BlackHoleUnavailable("the forwarder in the network namespace did not start")
        except BaseException:
            self.close()
            raise

    def _pin_neighbours(self) -> None:
        """Permanent neighbour entries both ways: no ARP, so no early "host unreachable" while cut."""
        ns_mac = _mac(["-n", self.namespace], self._ns_if)
        host_mac = _mac([], self._host_if)
        _ip("neigh", "replace", self.host, "lladdr", ns_mac, "dev", self._host_if, "nud", "permanent")
        _ip("-n", self.namespace, "neigh", "replace", self._host_ip, "lladdr", host_mac, "dev", self._ns_if,
            "nud", "permanent")  # fmt: skip

    def cut(self) -> None:
        """Drop every frame silently, both ways, from now on; connections stay open and hear nothing."""
        _ip("-n", self.namespace, "link", "set", self._ns_if, "down")

    def restore(self) -> None:
        """Let frames through again (the same connections carry on)."""
        _ip("-n", self.namespace, "link", "set", self._ns_if, "up")
        self._pin_neighbours()  # an interface set down forgets its neighbours, permanent ones too

    def close(self) -> None:
        """Stop both forwarders and remove the namespace and the veth pair."""
        if self._forwarder is not None:
            self._forwarder.kill()
            self._forwarder.wait()
        if self._proxy is not None:
            self._proxy.close()
        _remove(self.namespace, self._host_if)

    def __enter__(self) -> BlackHole:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def remove_stale() -> None:
    """Remove the namespaces and veths of black holes whose process no longer exists."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    for match in re.finditer(rf"^{PREFIX}(\d+)x\d+", listed, re.MULTILINE):
        if not os.path.exists(f"/proc/{match.group(1)}"):
            _remove(match.group(0), f"{match.group(0)}h")


def _remove(namespace: str, host_if: str) -> None:
    subprocess.run(["ip", "netns", "delete", namespace], capture_output=True, check=False)
    subprocess.run(["ip", "link", "delete", host_if], capture_output=True, check=False)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], capture_output=True, check=True)


def _stderr(exc: subprocess.CalledProcessError) -> str:
    return (exc.stderr or b"").decode(errors="replace").strip()


def _mac(namespace_args: list[str], interface: str) -> str:
    shown = subprocess.run(
        ["ip", *namespace_args, "-br", "link", "show", interface], capture_output=True, text=True, check=True
    ).stdout
    return shown.split()[2]


def _free_subnet() -> tuple[str, str]:
    """A /30 of 10.213.0.0/16 no interface uses yet: (host end, namespace end)."""
    used = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True, check=True).stdout
    subnets = list(_NETWORK.subnets(new_prefix=30))
    for subnet in random.sample(subnets, 64):
        host, inner = (str(address) for address in subnet.hosts())
        if host not in used and inner not in used:
            return host, inner
    raise BlackHoleUnavailable("no free /30 in 10.213.0.0/16")


def _serve_forward(listen: str, upstream: str) -> None:
    host, port = listen.rsplit(":", 1)
    up_host, up_port = upstream.rsplit(":", 1)
    Proxy((up_host, int(up_port)), host=host, port=int(port))
    print("ready", flush=True)
    sys.stdin.buffer.read()  # until the owner closes the pipe or dies
    os._exit(0)


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] != "--forward":
        sys.exit(__doc__)
    _serve_forward(sys.argv[2], sys.argv[3])
