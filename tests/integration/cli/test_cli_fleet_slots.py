"""`hostlock run --fleet URL --slots N`: slot waiters on a real etcd are served in arrival order, never more
than N at once, and a waiter killed anywhere in the queue stalls nobody behind it (issue 24: a release wakes
only the waiters it admits; the first not admitted watches the name, each one behind it the key just ahead).

Every job journals "in TAG FENCE" when it starts and "out TAG" when it is told to end (a gate file), so a job
is inside from before its "in" line until after its "out" line: replaying the journal proves order and the
bound. Holders are released one at a time, in an order that is not the queue's, and the test waits for the
job that release must admit (a file it writes), never on a sleep. Leases are 60 s unless a test says
otherwise; waits are hang guards below that.
"""

from __future__ import annotations

import os
import signal

import pytest
from cli_support import wait_file, wait_until
from test_cli_fleet import controller, wait_waiters
from test_cli_fleet_waiters import GUARD, TTL, keys


def job(cli, tag):
    """A gated job that journals; returns (script, started, go)."""
    journal, started, go = cli.tmp / "journal", cli.tmp / ("started-" + tag), cli.tmp / ("go-" + tag)
    script = ('echo "in %s $HOSTLOCK_FENCE" >> %s; echo x > %s; while [ ! -e %s ]; do sleep 0.02; done; '
              'echo "out %s" >> %s' % (tag, journal, started, go, tag, journal))
    return script, started, go


class Queue:
    """Slot takers of `restart`, each a `hostlock run --slots N` of its own controller, started in order."""

    def __init__(self, cli, etcd, slots):
        self.cli, self.etcd, self.slots = cli, etcd, slots
        self.procs, self.started, self.go = {}, {}, {}

    def take(self, tag, *extra, holds=False):
        script, self.started[tag], self.go[tag] = job(self.cli, tag)
        queued = len(keys(self.etcd, "restart"))
        self.procs[tag] = self.cli.start("run", "--fleet", self.etcd.url, "--slots", self.slots, "--ttl", TTL,
                                         "-w", "5m", *extra, "restart", "-c", script, env=controller(self.cli, tag))
        if holds:
            wait_file(self.started[tag], GUARD)
        else:
            wait_until(lambda: len(keys(self.etcd, "restart")) > queued, GUARD, "%s queued" % tag)

    def release(self, tag, admits=None):
        """End TAG's job; wait until it exited and, when given, until the job of ADMITS started."""
        self.go[tag].write_text("")
        assert self.procs[tag].wait(timeout=GUARD) == 0, self.procs[tag].stderr.read()
        if admits is not None:
            wait_file(self.started[admits], GUARD)

    def inside(self):
        return sorted(t for t, f in self.started.items() if f.exists() and not self.go[t].exists())


def replay(cli, slots):
    """The journal's order of entry, after checking it never had more than `slots` jobs inside and that fences
    increase in that order."""
    inside, order, fences = set(), [], []
    for n, line in enumerate((cli.tmp / "journal").read_text().splitlines()):
        word, tag, *fence = line.split()
        if word == "in":
            assert len(inside) < slots, "line %d: %s entered beside %s" % (n, tag, sorted(inside))
            inside.add(tag)
            order.append(tag)
            fences.append(int(fence[0]))
        else:
            inside.remove(tag)
    assert fences == sorted(set(fences)), fences
    return order


def test_slot_waiters_are_served_in_order_never_more_than_n_at_once(cli, etcd):
    q = Queue(cli, etcd, 3)
    for tag in ("h1", "h2", "h3"):
        q.take(tag, holds=True)
    for tag in ("w1", "w2", "w3", "w4", "w5"):
        q.take(tag)
    wait_waiters(cli, etcd.url, "restart", 5)
    # Each release admits exactly the first waiter still queued, whichever of the N holders it was.
    for gone, admitted in (("h2", "w1"), ("w1", "w2"), ("h3", "w3"), ("h1", "w4"), ("w3", "w5")):
        q.release(gone, admitted)
        assert len(q.inside()) == 3, q.inside()
    for tag in q.inside():
        q.release(tag)
    assert replay(cli, 3) == ["h1", "h2", "h3", "w1", "w2", "w3", "w4", "w5"]
    assert keys(etcd, "restart") == []


@pytest.mark.parametrize("sig", ["KILL", "TERM"])
def test_a_slot_waiter_killed_in_the_middle_of_the_queue_stalls_nobody_behind_it(cli, etcd, sig):
    """w2 waits behind w1 (the first not admitted) and w3 watches w2's key. Killed: with SIGTERM its key goes
    at once; with SIGKILL nobody deletes it, so it ends with w2's lease (2 s), and meanwhile a release may
    admit it, dead, into a slot until then. Either way w3 and w4 are served, in order."""
    q = Queue(cli, etcd, 2)
    for tag in ("h1", "h2"):
        q.take(tag, holds=True)
    q.take("w1")
    q.take("w2", "--ttl", "2s")
    q.take("w3")
    q.take("w4")
    wait_waiters(cli, etcd.url, "restart", 4)
    victim = q.procs.pop("w2")
    os.kill(victim.pid, getattr(signal, "SIG" + sig))
    assert victim.wait(timeout=GUARD) == (-9 if sig == "KILL" else 128 + signal.SIGTERM)
    if sig == "TERM":
        assert len(keys(etcd, "restart")) == 5  # its key went with it
    del q.started["w2"], q.go["w2"]
    q.release("h1", "w1")
    q.release("h2", "w3")
    q.release("w1", "w4")
    for tag in q.inside():
        q.release(tag)
    assert replay(cli, 2) == ["h1", "h2", "w1", "w3", "w4"]
    wait_until(lambda: keys(etcd, "restart") == [], GUARD, "every key gone")


def test_a_slot_holder_killed_after_the_chain_admitted_it_stalls_nobody(cli, etcd):
    """w1 was admitted by the first release and rewrote its key, waking w2, which now watches the name; then
    hostlock of w1 is SIGKILLed while its job runs (its watcher kills the job; nobody deletes its key: it ends
    with w1's 2 s lease). w2 is admitted once that slot is free, and w3 after it."""
    q = Queue(cli, etcd, 2)
    for tag in ("h1", "h2"):
        q.take(tag, holds=True)
    q.take("w1", "--ttl", "2s")
    q.take("w2")
    q.take("w3")
    wait_waiters(cli, etcd.url, "restart", 3)
    q.release("h1", "w1")
    victim = q.procs.pop("w1")
    os.kill(victim.pid, signal.SIGKILL)
    assert victim.wait(timeout=GUARD) == -9
    q.go["w1"].write_text("")  # its job is killed by the watcher, or ends on this gate: out of the way either way
    wait_file(q.started["w2"], GUARD)  # w1's slot freed when its lease ended; h2 still holds the other
    q.release("h2", "w3")
    for tag in q.inside():
        q.release(tag)
    # Not replay(): w1's job was killed inside, with no "out" line.
    order = [line.split()[1] for line in (cli.tmp / "journal").read_text().splitlines() if line.startswith("in ")]
    assert order == ["h1", "h2", "w1", "w2", "w3"]
    wait_until(lambda: keys(etcd, "restart") == [], GUARD, "every key gone")


def test_a_slot_waiter_that_loses_its_lease_queues_again_and_stalls_nobody(cli, etcd):
    """w2's lease revoked (as an outage longer than its TTL ends it): it queues again behind w3, which watched
    w2's key and now watches w1's; each release still admits the first waiter queued."""
    q = Queue(cli, etcd, 2)
    for tag in ("h1", "h2"):
        q.take(tag, holds=True)
    for tag in ("w1", "w2", "w3"):
        q.take(tag)
    wait_waiters(cli, etcd.url, "restart", 3)
    first = keys(etcd, "restart")
    assert etcd.etcdctl("lease", "revoke", first[3].rsplit("/", 1)[1]).returncode == 0
    wait_until(lambda: len(keys(etcd, "restart")) == 5 and keys(etcd, "restart")[3] == first[4], GUARD,
               "w2 queued again behind w3")
    q.release("h1", "w1")
    q.release("h2", "w3")
    q.release("w1", "w2")
    for tag in q.inside():
        q.release(tag)
    assert replay(cli, 2) == ["h1", "h2", "w1", "w3", "w2"]
