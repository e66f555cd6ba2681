"""Fleet locks under faults, on real etcd: a holder killed, stopped past its TTL, partitioned; a waiter
partitioned; the etcd member killed; a cluster's leader killed; quorum lost.

Holders that must die or stop are separate processes (HOLDER below) driven over their stdin/stdout; waiters are
threads here. Short TTLs (2-3 s) keep the tests fast. Every wait is for an event (a line, an Event, keys read
back from etcd) with a generous bound that only stops a hang; no test asserts how long anything took.
"""

from __future__ import annotations

import base64
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import pytest

import hostlock

WAIT = 90.0  # bounds a hang only: expiry of a 2-3 s TTL on a loaded machine takes a few seconds

HOLDER = r"""
import os, sys, time, hostlock

def say(*words):
    os.write(1, (" ".join(str(w) for w in words) + "\n").encode())  # one write: lines from two threads never mix

name, url, ttl, journal = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
lock = hostlock.Lock(name, fleet=url, ttl=ttl, on_lost=lambda: say("lost"))
lock.acquire(timeout=60)
say("held", lock.fence)
for line in sys.stdin:
    cmd = line.split()
    if cmd[0] == "lost?":
        say("lost?", lock.lost)
    elif cmd[0] == "check":
        try:
            lock.check()
            say("check ok")
        except hostlock.LockLost as e:
            say("check LockLost", e)
    elif cmd[0] == "work":
        # The holder's job: act on the protected resource only after check(), as documented; stop at the loss.
        fd = os.open(journal, os.O_WRONLY | os.O_APPEND)
        try:
            while True:
                try:
                    lock.check()
                except hostlock.LockLost:
                    say("stopped working")
                    break
                os.write(fd, b"holder %d\n" % lock.fence)
                time.sleep(0.005)
        finally:
            os.close(fd)
    elif cmd[0] == "release":
        lock.release()
        say("released")
"""


class Holder:
    """A holder process; its lines are read by a thread into a queue, so waiting for one is bounded."""

    def __init__(self, name: str, url: str, ttl: float, journal: str = "/dev/null") -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", HOLDER, name, url, str(ttl), journal],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        self.lines: queue.Queue = queue.Queue()
        self.seen: list = []
        threading.Thread(target=self._read, daemon=True).start()
        self.fence = int(self.expect("held").split()[1])

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put(None)

    def expect(self, prefix: str) -> str:
        """The first line (seen before or arriving) that starts with prefix."""
        for line in self.seen:
            if line.startswith(prefix):
                self.seen.remove(line)
                return line
        deadline = time.monotonic() + WAIT
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError("holder never said %r (saw %s)" % (prefix, self.seen)) from None
            if line is None:
                raise AssertionError("holder exited before %r: %s" % (prefix, self.proc.stderr.read()))
            if line.startswith(prefix):
                return line
            self.seen.append(line)

    def ask(self, cmd: str, answer: str) -> str:
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return self.expect(answer)

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)

    def close(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
        self.proc.wait()


class Taker(threading.Thread):
    """lock.acquire(timeout) in a thread: `done` is set when it holds or failed (`error`); releases on `go`."""

    def __init__(self, lock, timeout: float | None = WAIT, journal: str | None = None) -> None:
        super().__init__(daemon=True)
        self.lock, self.timeout, self.journal = lock, timeout, journal
        self.done, self.go = threading.Event(), threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.lock.acquire(timeout=self.timeout)
        except BaseException as e:  # noqa: BLE001 - reported to the test
            self.error = e
            self.done.set()
            return
        if self.journal:
            with open(self.journal, "a") as f:  # the new holder acts as soon as it holds
                f.write("taker %d\n" % self.lock.fence)
        self.done.set()
        self.go.wait(WAIT)
        self.lock.release()

    def result(self) -> BaseException | None:
        assert self.done.wait(WAIT), "the taker neither got the lock nor gave up"
        return self.error


def until(cond, what: str, within: float = WAIT):
    deadline = time.monotonic() + within
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for " + what)
        time.sleep(0.05)


def _low(remaining: int, most: int):
    """The lease's remaining TTL once it ran down to at most `most` seconds, else None (not yet)."""
    return remaining if 0 <= remaining <= most else None


def entries(member, prefix: str = "hostlock/") -> list:
    """(key, create_revision, lease hex) under prefix, oldest first, read with etcdctl from one member."""
    r = member.etcdctl("get", "--prefix", prefix, "-w", "json", "--command-timeout=5s")
    assert r.returncode == 0, r.stderr
    kvs = json.loads(r.stdout).get("kvs") or []
    out = [(base64.b64decode(kv["key"]).decode(), int(kv["create_revision"]), "%x" % int(kv.get("lease", 0)))
           for kv in kvs]
    return sorted(out, key=lambda e: e[1])


def queued(url: str, n: int = 1) -> bool:
    try:
        return hostlock.status("db", fleet=url).waiters >= n
    except hostlock.FleetUnavailable:
        return False


# -- the holder ----------------------------------------------------------------------------------------------
def test_sigkilled_holder_frees_the_lock_within_its_ttl(etcd):
    holder = Holder("db", etcd.url, 2)
    try:
        taker = Taker(hostlock.Lock("db", fleet=etcd.url))
        taker.start()
        until(lambda: queued(etcd.url), "the taker queued")
        holder.signal(signal.SIGKILL)
        holder.proc.wait()
        assert taker.result() is None  # its lease expired: the lock passed on without anyone breaking it
        ((key, rev, _lease),) = entries(etcd)
        assert taker.lock.fence == rev > holder.fence
        taker.go.set()
        taker.join(WAIT)
    finally:
        holder.close()


def test_stopped_holder_resumed_past_its_ttl_knows_it_lost_the_lock(etcd):
    holder = Holder("db", etcd.url, 2)
    try:
        taker = Taker(hostlock.Lock("db", fleet=etcd.url))
        taker.start()
        until(lambda: queued(etcd.url), "the taker queued")
        holder.signal(signal.SIGSTOP)  # the holder cannot keep its lease alive, nor notice anything
        assert taker.result() is None
        assert taker.lock.fence > holder.fence
        holder.signal(signal.SIGCONT)
        holder.expect("lost")  # on_lost fired, from the keep-alive thread
        assert holder.ask("lost?", "lost?") == "lost? True"
        assert holder.ask("check", "check").startswith("check LockLost")
        holder.ask("release", "released")  # no error: the lock is already gone
        # ... and its release did not touch the new holder's key.
        assert [rev for _k, rev, _l in entries(etcd)] == [taker.lock.fence]
        taker.go.set()
        taker.join(WAIT)
    finally:
        holder.close()


def test_partitioned_holder_stops_acting_before_the_other_side_gets_the_lock(etcd, proxy_to, tmp_path):
    """The holder reaches etcd through a proxy that is cut; it works only after lock.check(), appending its fence
    to a journal; the other side appends its own as soon as it holds. No holder line may follow a taker line."""
    journal = str(tmp_path / "journal")
    open(journal, "w").close()
    proxy = proxy_to(etcd.endpoint)
    holder = Holder("db", proxy.url, 3, journal)
    try:
        holder.proc.stdin.write("work\n")
        holder.proc.stdin.flush()
        until(lambda: os.path.getsize(journal) > 0, "the holder working")
        taker = Taker(hostlock.Lock("db", fleet=etcd.url), journal=journal)
        taker.start()
        until(lambda: queued(etcd.url), "the taker queued")
        proxy.cut()
        assert taker.result() is None
        assert holder.ask("lost?", "lost?") == "lost? True"  # it knows, by its own clock
        holder.expect("stopped working")
        holder.expect("lost")
        with open(journal) as f:
            acts = [(who, int(fence)) for who, fence in (line.split() for line in f)]
        first_taker = [who for who, _f in acts].index("taker")
        assert all(who == "holder" for who, _f in acts[:first_taker])
        assert all(who == "taker" for who, _f in acts[first_taker:]), "the old holder acted after the new one held"
        assert acts[first_taker][1] > max(f for _w, f in acts[:first_taker])  # a fence downstream can compare
        taker.go.set()
        taker.join(WAIT)
    finally:
        holder.close()


# -- the waiter ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("timeout", [None, 1.0])
def test_waiter_behind_a_cut_link_gives_up_and_leaves_nothing_behind(etcd, proxy_to, timeout):
    proxy = proxy_to(etcd.endpoint)
    holder = hostlock.Lock("db", fleet=etcd.url)
    holder.acquire()
    waiter = Taker(hostlock.Lock("db", fleet=proxy.url, ttl=2), timeout=timeout)
    waiter.start()
    until(lambda: queued(etcd.url), "the waiter queued")
    proxy.cut()
    err = waiter.result()
    if timeout is None:
        assert isinstance(err, hostlock.FleetUnavailable), err  # never waits forever on a dead link
    else:
        assert isinstance(err, (hostlock.FleetUnavailable, hostlock.LockTimeout)), err
    assert proxy.endpoint in str(err) or isinstance(err, hostlock.LockTimeout)
    # Its key could not be revoked through the cut link: it goes with its lease, by itself.
    until(lambda: [rev for _k, rev, _l in entries(etcd)] == [holder.fence], "the waiter's key to expire")
    holder.release()
    again = hostlock.Lock("db", fleet=etcd.url)
    again.acquire(timeout=0)  # nothing half-taken left in front of it
    again.release()


def test_unreachable_at_start_is_fleet_unavailable_and_leaves_nothing(etcd, proxy_to):
    proxy = proxy_to(etcd.endpoint)
    proxy.cut()
    with pytest.raises(hostlock.FleetUnavailable) as e:
        hostlock.Lock("db", fleet=proxy.url).acquire(timeout=1)
    assert proxy.endpoint in str(e.value)
    assert entries(etcd) == []


# -- etcd itself ---------------------------------------------------------------------------------------------
def test_single_member_killed_waiter_gets_unavailable_holder_learns_loss(etcd):
    lost = threading.Event()
    holder = hostlock.Lock("db", fleet=etcd.url, ttl=2, on_lost=lost.set)
    holder.acquire()
    fence = holder.fence
    waiter = Taker(hostlock.Lock("db", fleet=etcd.url, ttl=2), timeout=5)
    waiter.start()
    until(lambda: queued(etcd.url), "the waiter queued")
    etcd.kill()
    try:
        assert isinstance(waiter.result(), hostlock.FleetUnavailable), waiter.error
        assert etcd.endpoint in str(waiter.error)
        assert lost.wait(WAIT) and holder.lost
        with pytest.raises(hostlock.LockLost):
            holder.check()
        with pytest.raises(hostlock.FleetUnavailable):
            hostlock.Lock("other", fleet=etcd.url).acquire(timeout=1)
    finally:
        etcd.start().wait_ready()
    holder.release()  # already lost: no error, even though its key may still be waiting out its lease
    # Back up: the old key expires with its lease (etcd restores leases with a fresh TTL), then it is free.
    after = hostlock.Lock("db", fleet=etcd.url)
    after.acquire(timeout=WAIT)
    assert after.fence > fence
    after.release()


def test_cluster_leader_killed_the_lock_keeps_working(etcd_cluster):
    url = etcd_cluster.url
    lost = threading.Event()
    holder = hostlock.Lock("db", fleet=url, ttl=10, on_lost=lost.set)
    holder.acquire()
    fence = holder.fence
    waiter = Taker(hostlock.Lock("db", fleet=url))
    waiter.start()
    until(lambda: queued(url), "the waiter queued")
    leader = etcd_cluster.leader()
    leader.kill()
    survivor = next(m for m in etcd_cluster.members if m is not leader)
    (lease,) = [lease for _k, rev, lease in entries(survivor) if rev == fence]

    def remaining() -> int:
        out = survivor.etcdctl("lease", "timetolive", lease, "--command-timeout=5s").stdout
        return int(out.split("remaining(")[1].split("s")[0]) if "remaining(" in out else -1

    # A keep-alive reached the new leader (the lease's remaining TTL went back up): not luck, a renewal.
    low = until(lambda: _low(remaining(), 7), "the TTL to run down")
    until(lambda: remaining() > low, "a keep-alive through another member")
    holder.release()
    assert waiter.result() is None
    second = waiter.lock.fence
    assert second > fence
    waiter.go.set()
    waiter.join(WAIT)
    assert not lost.is_set()
    again = hostlock.Lock("db", fleet=url)
    again.acquire(timeout=WAIT)
    assert again.fence > second
    again.release()


def test_quorum_lost_no_lock_is_granted(etcd_cluster):
    url = etcd_cluster.url
    lost = threading.Event()
    holder = hostlock.Lock("db", fleet=url, ttl=2, on_lost=lost.set)
    holder.acquire()
    fence = holder.fence
    a, b, c = etcd_cluster.members
    b.kill()
    c.kill()  # a alone: no quorum, no leader
    try:
        for name in ("db", "other"):
            with pytest.raises(hostlock.FleetUnavailable):
                hostlock.Lock(name, fleet=url).acquire(timeout=2)
        assert lost.wait(WAIT) and holder.lost  # its keep-alives cannot commit: it knows
        holder.release()
    finally:
        b.start()
        a.wait_ready()
        b.wait_ready()
    # Quorum back (2 of 3): locks are granted again, with fences above every earlier one.
    after = hostlock.Lock("other", fleet=url)
    after.acquire(timeout=WAIT)
    assert after.fence > fence
    after.release()
    c.start().wait_ready()
