"""`etcdctl lock PREFIX/NAME` and hostlock's fleet locks exclude each other, both ways, in arrival order.

etcdctl runs a command while it holds (`etcdctl lock NAME -- sh -c 'echo held; read x < FIFO'`): the line says
it holds, the FIFO says when to let go. hostlock runs in threads of this process. Every step waits on an event
(a line, a key appearing in etcd, a thread's Event); "is still waiting" is checked against etcd's keys, never by
a sleep.
"""

from __future__ import annotations

import json
import os
import select
import shlex
import subprocess
import threading
import time

import fleet_etcd
import pytest

import hostlock

WAIT = 60.0  # bounds a hang only


def until(cond, what: str, within: float = WAIT):
    deadline = time.monotonic() + within
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for " + what)
        time.sleep(0.02)


def entries(etcd, prefix: str) -> list:
    """(key, create_revision) under prefix, in arrival order, read with etcdctl (not hostlock)."""
    r = etcd.etcdctl("get", "--prefix", prefix, "-w", "json")
    assert r.returncode == 0, r.stderr
    import base64

    kvs = json.loads(r.stdout).get("kvs") or []
    return sorted(((base64.b64decode(kv["key"]).decode(), int(kv["create_revision"])) for kv in kvs),
                  key=lambda e: e[1])


class Ctl:
    """`etcdctl lock NAME` running a command that reports it holds, then waits for its FIFO."""

    def __init__(self, etcd, name: str, tmp_path, tag: str) -> None:
        self.fifo = os.path.join(str(tmp_path), tag + ".fifo")
        os.mkfifo(self.fifo)
        cmd = 'echo "held $ETCD_LOCK_KEY"; read x < %s' % shlex.quote(self.fifo)
        self.proc = subprocess.Popen([fleet_etcd.ETCDCTL, "--endpoints", etcd.endpoint, "lock", name, "--", "sh",
                                      "-c", cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=dict(os.environ, ETCDCTL_API="3"))
        self.key: str | None = None

    def holds_now(self) -> bool:
        """True if its command has said it holds (without blocking)."""
        if self.key is None and select.select([self.proc.stdout], [], [], 0)[0]:
            self.wait_held()
        return self.key is not None

    def wait_held(self) -> str:
        ready = select.select([self.proc.stdout], [], [], WAIT)[0]
        assert ready, "etcdctl lock never held"
        line = self.proc.stdout.readline().strip()
        assert line.startswith("held "), (line, self.proc.stderr.read() if self.proc.poll() is not None else "")
        self.key = line.split(" ", 1)[1]
        return self.key

    def release(self) -> None:
        with open(self.fifo, "w") as f:  # its `read` ends, the command exits, etcdctl unlocks
            f.write("go\n")
        assert self.proc.wait(WAIT) == 0, self.proc.stderr.read()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class Taker(threading.Thread):
    """A hostlock Lock acquired in a thread: `held` is set when it holds; it releases when `go` is set."""

    def __init__(self, lock) -> None:
        super().__init__(daemon=True)
        self.lock = lock
        self.held, self.go = threading.Event(), threading.Event()
        self.error: BaseException | None = None
        self.keys_when_held: list = []

    def run(self) -> None:
        try:
            self.lock.acquire(timeout=WAIT)
        except BaseException as e:  # noqa: BLE001 - reported to the test
            self.error = e
            self.held.set()
            return
        self.held.set()
        self.go.wait(WAIT)
        self.lock.release()


@pytest.mark.parametrize("prefix", ["", "team-a"])
def test_etcdctl_holds_so_hostlock_waits_then_gets_it(etcd, tmp_path, prefix):
    keyspace = (prefix or "hostlock") + "/db/"
    url = etcd.url + ("/" + prefix if prefix else "")
    ctl = Ctl(etcd, keyspace.rstrip("/"), tmp_path, "holder")
    try:
        ctl_key = ctl.wait_held()
        ((first, ctl_rev),) = entries(etcd, keyspace)
        assert first == ctl_key
        with pytest.raises(hostlock.LockTimeout):
            hostlock.Lock("db", fleet=url).acquire(timeout=0)
        taker = Taker(hostlock.Lock("db", fleet=url))
        taker.start()
        until(lambda: len(entries(etcd, keyspace)) == 2, "hostlock's key queued behind etcdctl's")
        assert not taker.held.is_set()
        ctl.release()
        assert taker.held.wait(WAIT) and taker.error is None, taker.error
        ((only, rev),) = entries(etcd, keyspace)  # etcdctl's key is gone; ours holds
        assert only != ctl_key and taker.lock.fence == rev > ctl_rev
        taker.go.set()
        taker.join(WAIT)
        assert entries(etcd, keyspace) == []
    finally:
        ctl.kill()


def test_hostlock_holds_so_etcdctl_waits_then_gets_it(etcd, tmp_path):
    lock = hostlock.Lock("db", fleet=etcd.url)
    lock.acquire()
    ctl = Ctl(etcd, "hostlock/db", tmp_path, "waiter")
    try:
        until(lambda: len(entries(etcd, "hostlock/db/")) == 2, "etcdctl's key queued behind ours")
        assert not ctl.holds_now()
        lock.release()
        ctl_key = ctl.wait_held()
        ((only, rev),) = entries(etcd, "hostlock/db/")
        assert only == ctl_key and rev > 0
        # While etcdctl holds, hostlock's status names it (no owner record: etcdctl writes none).
        st = hostlock.status("db", fleet=etcd.url)
        assert st.state == "held" and len(st.holders) == 1 and st.holders[0].fence == rev
        ctl.release()
        assert entries(etcd, "hostlock/db/") == []
    finally:
        ctl.kill()


def test_arrival_order_holds_across_both_clients(etcd, tmp_path):
    """etcdctl A holds; hostlock B queues; etcdctl C queues after B: B gets it before C, C after B lets go."""
    a = Ctl(etcd, "hostlock/db", tmp_path, "a")
    c = None
    try:
        a.wait_held()
        b = Taker(hostlock.Lock("db", fleet=etcd.url))
        b.start()
        until(lambda: len(entries(etcd, "hostlock/db/")) == 2, "B queued")
        c = Ctl(etcd, "hostlock/db", tmp_path, "c")
        until(lambda: len(entries(etcd, "hostlock/db/")) == 3, "C queued")
        a.release()
        assert b.held.wait(WAIT) and b.error is None, b.error
        assert not c.holds_now()  # C is behind B
        assert len(entries(etcd, "hostlock/db/")) == 2
        b.go.set()
        b.join(WAIT)
        c_key = c.wait_held()
        assert [k for k, _r in entries(etcd, "hostlock/db/")] == [c_key]
        c.release()
    finally:
        a.kill()
        if c is not None:
            c.kill()


def test_etcdctl_lock_is_a_writer_to_shared_holders(etcd, tmp_path):
    """A reader holds; etcdctl (exclusive, empty value) queues; a later reader queues behind etcdctl (no writer
    starvation); the reader leaving lets etcdctl in, and etcdctl leaving lets the later reader in."""
    r1 = hostlock.Lock("db", mode="shared", fleet=etcd.url)
    r1.acquire()
    ctl = Ctl(etcd, "hostlock/db", tmp_path, "writer")
    try:
        until(lambda: len(entries(etcd, "hostlock/db/")) == 2, "etcdctl queued behind the reader")
        r2 = Taker(hostlock.Lock("db", mode="shared", fleet=etcd.url))
        r2.start()
        until(lambda: len(entries(etcd, "hostlock/db/")) == 3, "the later reader queued")
        assert not ctl.holds_now() and not r2.held.is_set()
        assert hostlock.status("db", fleet=etcd.url).waiters == 2
        r1.release()
        ctl.wait_held()
        assert not r2.held.is_set()
        ctl.release()
        assert r2.held.wait(WAIT) and r2.error is None, r2.error
        r2.go.set()
        r2.join(WAIT)
    finally:
        ctl.kill()


def test_a_slot_taker_never_joins_an_exclusive_holder(etcd, tmp_path):
    """Every user of one name should agree on its shape (host locks refuse a disagreement); when they do not,
    exclusion must still hold: a slots=2 taker waits for an exclusive holder (hostlock's or etcdctl's) instead
    of counting it as one slot of two. Slot takers of one shape still share."""
    holder = hostlock.Lock("db", fleet=etcd.url)
    holder.acquire()
    with pytest.raises(hostlock.LockTimeout):
        hostlock.Lock("db", slots=2, fleet=etcd.url).acquire(timeout=0)
    holder.release()
    ctl = Ctl(etcd, "hostlock/db", tmp_path, "holder")
    try:
        ctl.wait_held()
        with pytest.raises(hostlock.LockTimeout):
            hostlock.Lock("db", slots=2, fleet=etcd.url).acquire(timeout=0)
        ctl.release()
    finally:
        ctl.kill()
    one, two = hostlock.Lock("db", slots=2, fleet=etcd.url), hostlock.Lock("db", slots=2, fleet=etcd.url)
    one.acquire(timeout=0)
    two.acquire(timeout=0)
    with pytest.raises(hostlock.LockTimeout):
        hostlock.Lock("db", slots=2, fleet=etcd.url).acquire(timeout=0)
    st = hostlock.status("db", fleet=etcd.url)  # shown as slots 1/2 and 2/2, in arrival order, as on a host
    assert st.slots == 2 and [(h.slot, h.fence) for h in st.holders] == [(0, one.fence), (1, two.fence)]
    one.release()
    two.release()


def documented_fenced_txn() -> str:
    """The shell snippet docs/fleet.md gives for a fenced write into etcd (tested as written there)."""
    doc = os.path.join(os.path.dirname(__file__), "..", "..", "..", "docs", "fleet.md")
    with open(doc) as f:
        text = f.read()
    section = text[text.index("**Data in etcd itself:**"):]
    block = section[section.index("```sh\n") + len("```sh\n"):]
    return "\n".join(line[2:] for line in block[:block.index("```")].splitlines())


def test_the_documented_fenced_etcd_write_refuses_a_stale_holder(etcd):
    script = documented_fenced_txn()
    env = dict(os.environ, ETCDCTL_API="3", ETCDCTL_ENDPOINTS=etcd.endpoint,
               PATH=os.path.dirname(fleet_etcd.ETCDCTL) + os.pathsep + os.environ["PATH"])

    def write(fence: int) -> subprocess.CompletedProcess:
        etcd.etcdctl("del", "config/release")
        return subprocess.run(["sh", "-c", script], env=dict(env, HOSTLOCK_FENCE=str(fence)), capture_output=True,
                              text=True, timeout=WAIT, check=False)

    def written() -> str:
        return etcd.etcdctl("get", "config/release", "--print-value-only").stdout.strip()

    old = hostlock.Lock("deploy", fleet=etcd.url)
    old.acquire()
    stale = old.fence
    r = write(stale)
    assert r.returncode == 0 and written() == "v42", r.stderr
    old.release()
    with hostlock.Lock("deploy", fleet=etcd.url) as new:
        assert new.fence > stale
        r = write(stale)  # the old holder, resumed after its loss, still carrying its fence
        assert r.returncode == 1 and "stale fence" in r.stderr and written() == ""
        r = write(new.fence)
        assert r.returncode == 0 and written() == "v42", r.stderr
