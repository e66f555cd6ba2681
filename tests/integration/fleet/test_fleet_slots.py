"""N-slot fleet locks: a release wakes only the waiters it admits (issue 24), against a real etcd.

The first slot taker not admitted watches the deletions of the whole name (any of the N holders leaving admits
it); each waiter behind it watches the key just ahead, which its owner rewrites once it holds, so a release
wakes the waiter it admits and that one wakes the next, never the whole queue (`fleet.queue.waits_on`).

Each taker is a process of its own (TAKER below): it says "held FENCE" once it holds, releases when told (a
line on its stdin), and then says how many event batches its waiting thread received ("wakes N", counted
around fleet.watch.Watch.events, the hook benchmarks/fleet_wakes.py uses); etcd's own counter of the watch
events it sent (etcd_debugging_mvcc_events_total) counts every watcher. Every wait is on a line from a pipe
or a process ending, under a hang guard; nothing asserts on timings.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import urllib.request

import pytest
from test_fleet_interop import Ctl

import hostlock

GUARD = 45  # seconds: a hang guard, never a measured bound (and below the 60 s leases here)
LIB = os.path.dirname(os.path.dirname(hostlock.__file__))

TAKER = """
import _thread, os, signal, sys
sys.path.insert(0, %(lib)r)
import hostlock
from hostlock.fleet import waiting, watch
url, name, slots, how = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
main, wakes, real = _thread.get_ident(), [0], watch.Watch.events
def events(self, deadline):
    evs = real(self, deadline)
    if evs and _thread.get_ident() == main:
        wakes[0] += 1
    return evs
watch.Watch.events = events
if how == "die-before-rewrite":  # admitted, then killed before it could tell the waiter behind it
    waiting.rewrite = lambda client, key, fence: os.kill(os.getpid(), signal.SIGKILL)
lock = hostlock.Lock(name, slots=slots, fleet=url, ttl=60)
lock.acquire(timeout=300)
print("held", lock.fence, flush=True)
sys.stdin.readline()
lock.release()
print("wakes", wakes[0], flush=True)
"""


def keys(etcd, name="restart"):
    r = etcd.etcdctl("get", "--prefix", "hostlock/%s/" % name, "--keys-only", "--sort-by=CREATE")
    assert r.returncode == 0, r.stderr
    return [k for k in r.stdout.split() if k]


def events_sent(etcd) -> float:
    with urllib.request.urlopen("http://%s/metrics" % etcd.endpoint, timeout=10) as r:
        text = r.read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("etcd_debugging_mvcc_events_total"))


class Taker:
    def __init__(self, etcd, slots, how="", name="restart"):
        queued = len(keys(etcd, name))
        self.p = subprocess.Popen([sys.executable, "-c", TAKER % {"lib": LIB}, etcd.url, name, str(slots), how],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        while len(keys(etcd, name)) <= queued:  # queued in this order: its key is in etcd
            assert self.p.poll() is None, "taker exited %s" % self.p.returncode
            select.select([], [], [], 0.01)

    def line(self) -> str:
        assert select.select([self.p.stdout], [], [], GUARD)[0], "no word from the taker within the hang guard"
        return self.p.stdout.readline()

    def held(self) -> int:
        word, fence = self.line().split()
        assert word == "held"
        return int(fence)

    def release(self) -> int:
        """Release; the number of event batches its waiting thread received."""
        self.p.stdin.write("go\n")
        self.p.stdin.flush()
        word, wakes = self.line().split()
        assert word == "wakes" and self.p.wait(timeout=GUARD) == 0
        return int(wakes)

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()


@pytest.fixture
def takers():
    made: list = []
    yield made
    for t in made:
        t.kill()


def test_a_release_wakes_only_the_slot_waiters_it_admits(etcd, takers):
    """3 slots, 3 holders, 9 waiters queued behind them; released one at a time, in an order that is not the
    queue's, each release admits the next waiter. Each waiter's waiting thread wakes at most twice: once when
    the waiter ahead rewrites its key (it is now the first not admitted), once when a holder leaves (it holds).
    Watching the whole name, the last of them woke once per release before its own, 9 times. etcd sends at
    most 5 events per release: the deletion to the first waiter not admitted (and, if they still watch it,
    to the releaser's own key watch and to the waiter behind it), the admitted waiter's rewrite to the waiter
    behind it and to its own key watch; it sent one per waiter still queued before."""
    slots, n = 3, 9
    holders = [Taker(etcd, slots) for _i in range(slots)]
    takers.extend(holders)
    fences = [h.held() for h in holders]
    waiters = [Taker(etcd, slots) for _i in range(n)]
    takers.extend(waiters)
    before = events_sent(etcd)
    inside = list(holders)
    wakes = []
    for k, w in enumerate(waiters):
        gone = inside.pop((k * 2) % len(inside))  # not the queue's order: any of the N holders may leave
        released = gone.release()
        if gone in waiters:
            wakes.append(released)
        fences.append(w.held())
        inside.append(w)
    for t in inside:
        released = t.release()
        if t in waiters:
            wakes.append(released)
    sent = events_sent(etcd) - before
    assert fences == sorted(set(fences))  # served in arrival order
    assert len(wakes) == n and max(wakes) <= 2, wakes
    assert sent <= 5 * (n + slots), sent
    assert keys(etcd) == []


def test_a_slot_taker_killed_before_it_rewrote_its_key_stalls_nobody(etcd, takers):
    """2 slots: h1 and h2 hold, d waits first, w behind it watches d's key. h1 leaves: d is admitted and dies
    (SIGKILL) before its rewrite, so w is never told; its key stays, on a 60 s lease. h2 leaves: w may hold
    beside d's dead key, and does, through the check of its silent watch (a read of the queue), long before
    d's lease could end: its key is still there when w holds."""
    h1, h2 = Taker(etcd, 2), Taker(etcd, 2)
    takers.extend([h1, h2])
    h1.held(), h2.held()
    d = Taker(etcd, 2, "die-before-rewrite")
    w = Taker(etcd, 2)
    takers.extend([d, w])
    dead_key = keys(etcd)[2]
    h1.release()
    assert d.p.wait(timeout=GUARD) == -9
    h2.release()
    w.held()
    assert dead_key in keys(etcd)  # not served by d's lease ending: d's key still holds the other slot
    w.release()
    etcd.etcdctl("del", dead_key)


@pytest.mark.parametrize("ahead", ["exclusive", "3 slots", "etcdctl lock"])
def test_slot_takers_behind_another_kind_hold_together_once_it_leaves(etcd, takers, tmp_path, ahead):
    """A taker of another kind holds (an exclusive holder, a 3-slot semaphore's, `etcdctl lock`'s: an
    exclusive taker of one slot), then two takers of a 2-slot lock queue: once it leaves both hold, together.
    The second no longer waits for the first to leave: it watches the first's rewrite."""
    if ahead == "etcdctl lock":
        ctl = Ctl(etcd, "hostlock/restart", tmp_path, "ctl")
        ctl.wait_held()
        release = ctl.release
    else:
        x = hostlock.Lock("restart", slots=3 if ahead == "3 slots" else 1, fleet=etcd.url)
        x.acquire()
        release = x.release
    try:
        s1, s2 = Taker(etcd, 2), Taker(etcd, 2)
        takers.extend([s1, s2])
    finally:
        release()
    s1.held(), s2.held()
    assert len(keys(etcd)) == 2  # both hold at once
    s1.release(), s2.release()
