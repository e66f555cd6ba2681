"""Real etcd servers for the fleet tests and benchmarks: one member, a cluster, and a proxy that can cut links.

Each server runs from the Debian `etcd` binary on 127.0.0.1, on free ports, with a data directory under the
caller's temporary directory; whoever starts one stops it (the pytest fixtures in
tests/integration/fleet/conftest.py do). Readiness is an event (the member answers /health), never a sleep.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.request

from ports import free_port

ETCD = shutil.which("etcd") or "/usr/bin/etcd"
ETCDCTL = shutil.which("etcdctl") or "/usr/bin/etcdctl"
READY_TIMEOUT = 60.0  # a loaded 2-core machine can take a while to elect a leader; this bounds a hang only


def have_etcd() -> bool:
    return os.access(ETCD, os.X_OK) and os.access(ETCDCTL, os.X_OK)


class Etcd:
    """One etcd member process. `endpoint` is host:port of its client URL, `url` the hostlock fleet URL."""

    def __init__(self, name: str, data_dir: str, client_port: int, peer_port: int, cluster: str,
                 state: str = "new", extra: list | None = None, token: str = "") -> None:
        self.name, self.data_dir = name, data_dir
        self.client_port, self.peer_port = client_port, peer_port
        self.endpoint = "127.0.0.1:%d" % client_port
        self.url = "etcd://" + self.endpoint
        self.log = os.path.join(os.path.dirname(data_dir), name + ".log")
        self.args = [
            ETCD, "--name", name, "--data-dir", data_dir,
            "--listen-client-urls", "http://" + self.endpoint,
            "--advertise-client-urls", "http://" + self.endpoint,
            "--listen-peer-urls", "http://127.0.0.1:%d" % peer_port,
            "--initial-advertise-peer-urls", "http://127.0.0.1:%d" % peer_port,
            "--initial-cluster", cluster, "--initial-cluster-state", state,
            "--initial-cluster-token", token or "hostlock-test-%d" % peer_port,
            # Fast elections: a test of "the member died" should not wait the default 1 s x 10.
            "--heartbeat-interval", "50", "--election-timeout", "500",
            *(extra or []),
        ]
        self.proc: subprocess.Popen | None = None

    def start(self) -> Etcd:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        return self

    def healthy(self) -> bool:
        """True when this member answers /health with a leader and quorum."""
        try:
            with urllib.request.urlopen("http://%s/health" % self.endpoint, timeout=2) as r:
                return json.loads(r.read().decode()).get("health") == "true"
        except (OSError, ValueError):
            return False

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> Etcd:
        deadline = time.monotonic() + timeout
        while not self.healthy():
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError("etcd %s exited %s:\n%s" % (self.name, self.proc.returncode, self.tail()))
            if time.monotonic() > deadline:
                raise RuntimeError("etcd %s not healthy after %ss:\n%s" % (self.name, timeout, self.tail()))
            time.sleep(0.05)
        return self

    def tail(self, n: int = 20) -> str:
        try:
            with open(self.log, "rb") as f:
                return b"".join(f.readlines()[-n:]).decode("utf-8", "replace")
        except OSError:
            return ""

    def pause(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL, as a crash: the data directory stays, so start() brings the member back."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def etcdctl(self, *args: str, endpoints: str | None = None, **kw: object) -> subprocess.CompletedProcess:
        env = dict(os.environ, ETCDCTL_API="3")
        check = bool(kw.pop("check", False))  # callers look at returncode; check=True where they want an exception
        return subprocess.run([ETCDCTL, "--endpoints", endpoints or self.endpoint, *args], env=env,
                              capture_output=True, text=True, check=check, **kw)  # type: ignore[call-overload]


def start_etcd(tmp_path: str, name: str = "solo", extra: list | None = None) -> Etcd:
    """One member, ready (healthy) when this returns."""
    client, peer = free_port(), free_port()
    data = os.path.join(str(tmp_path), name + ".data")
    member = Etcd(name, data, client, peer, "%s=http://127.0.0.1:%d" % (name, peer), extra=extra)
    return member.start().wait_ready()


class Cluster:
    """A cluster of members on 127.0.0.1; `url` names every member, as a user's fleet URL would."""

    def __init__(self, members: list) -> None:
        self.members = members
        self.url = "etcd://" + ",".join(m.endpoint for m in members)
        self.endpoints = ",".join(m.endpoint for m in members)

    def stop(self) -> None:
        for m in self.members:
            m.stop()

    def leader(self) -> Etcd:
        """The member that currently leads (from etcdctl endpoint status)."""
        r = self.members[0].etcdctl("endpoint", "status", "-w", "json", endpoints=",".join(
            m.endpoint for m in self.members if m.proc is not None and m.proc.poll() is None))
        for entry in json.loads(r.stdout or "[]"):
            st = entry.get("Status", {})
            if st.get("leader") and st.get("leader") == st.get("header", {}).get("member_id"):
                return next(m for m in self.members if m.endpoint in entry.get("Endpoint", ""))
        raise RuntimeError("no leader: %s %s" % (r.stdout, r.stderr))


def start_cluster(tmp_path: str, size: int = 3) -> Cluster:
    # (name, client port, peer port) per member; no zip(strict=): the engine's Pythons (3.8+) run this too.
    spec = [("m%d" % i, free_port(), free_port()) for i in range(size)]
    initial = ",".join("%s=http://127.0.0.1:%d" % (n, p) for n, _c, p in spec)
    token = "hostlock-test-%d" % spec[0][2]  # one token for the cluster: members of one cluster share its ID
    members = [Etcd(n, os.path.join(str(tmp_path), n + ".data"), c, p, initial, token=token) for n, c, p in spec]
    for m in members:
        m.start()
    for m in members:
        m.wait_ready()
    return Cluster(members)


class TcpProxy:
    """A TCP forwarder to one endpoint, for partitions: `cut()` drops every connection and black-holes new
    ones (accepted, never answered, as a dead route looks); `heal()` forwards again.
    """

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.endpoint = "127.0.0.1:%d" % self.listener.getsockname()[1]
        self.url = "etcd://" + self.endpoint
        self._forwarding = threading.Event()
        self._forwarding.set()
        self._conns: list = []
        self._pumps: list = []
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _peer = self.listener.accept()
            except OSError:
                return
            if not self._forwarding.is_set():
                with self._lock:
                    self._conns.append((client, None))  # black hole: held open, never answered
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            pump = threading.Thread(target=self._pump, args=(client, upstream), daemon=True)
            with self._lock:
                self._conns.append((client, upstream))
                self._pumps.append(pump)
            pump.start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        peers = {a: b, b: a}
        try:
            while self._forwarding.is_set():
                ready, _writable, _errors = select.select(list(peers), [], [], 0.2)
                for s in ready:
                    if not self._forwarding.is_set():
                        return  # cut while select() waited: nothing more goes through
                    data = s.recv(65536)
                    if not data:
                        return
                    peers[s].sendall(data)
        except (OSError, ValueError):  # ValueError: a socket closed under select() (close() while it waits)
            pass
        finally:
            if self._forwarding.is_set():  # a cut keeps the client side hanging, as a dead route does
                a.close()
            b.close()

    def cut(self) -> None:
        """From when this returns, nothing goes through: every pump has seen the cut (joined)."""
        self._forwarding.clear()
        with self._lock:
            pumps, self._pumps = self._pumps, []
        for pump in pumps:
            pump.join()

    def heal(self) -> None:
        with self._lock:
            conns, self._conns = self._conns, []
        for client, _up in conns:
            client.close()
        self._forwarding.set()

    def close(self) -> None:
        self._closed = True
        self._forwarding.set()
        self.listener.close()
        with self._lock:
            for client, up in self._conns:
                client.close()
                if up is not None:
                    up.close()


class LateProxy:
    """A TCP forwarder that delivers each client's bytes `delay` seconds late, and delivers them even after the
    client gave up and closed (as a congested path or a buffering proxy does): for "a request given up on
    reaches etcd after the command is done". `settled` is set once every byte a client sent has reached the
    member and the member has answered what it got (its answer is read and dropped once the client is gone).
    """

    def __init__(self, target: str, delay: float) -> None:
        host, port = target.rsplit(":", 1)
        self.target, self.delay = (host, int(port)), delay
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.endpoint = "127.0.0.1:%d" % self.listener.getsockname()[1]
        self.settled = threading.Event()
        self._busy = 0
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _peer = self.listener.accept()
            except OSError:
                return
            with self._lock:
                self._busy += 1
                self.settled.clear()
            threading.Thread(target=self._carry, args=(client,), daemon=True).start()

    def _carry(self, client: socket.socket) -> None:
        chunks: list = []  # (when it may go, bytes); None: the client closed
        upstream = socket.create_connection(self.target, timeout=30)
        answered = threading.Event()

        def back() -> None:  # the member's answers: to the client while it is there, then read and dropped
            try:
                while True:
                    data = upstream.recv(65536)
                    if not data:
                        break
                    answered.set()
                    try:
                        client.sendall(data)
                    except OSError:
                        pass
            except OSError:
                pass
            answered.set()

        threading.Thread(target=back, daemon=True).start()
        try:
            while True:
                try:
                    data = client.recv(65536)
                except OSError:
                    data = b""
                chunks.append((time.monotonic() + self.delay, data))
                if not data:
                    break
        finally:
            for due, data in chunks:
                time.sleep(max(0.0, due - time.monotonic()))  # the delay is the fault under test
                if data:
                    answered.clear()
                    upstream.sendall(data)
            answered.wait(30)  # the member answered the last delivery (a bound for a hang only)
            upstream.close()
            client.close()
            with self._lock:
                self._busy -= 1
                if not self._busy:
                    self.settled.set()

    def close(self) -> None:
        self.listener.close()
