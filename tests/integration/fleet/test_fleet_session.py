"""One lease per process (etcd's concurrency.Session): the fleet locks one process takes on one cluster with one
TTL share one etcd lease and one keep-alive, against a real etcd.

The semantics: the last release revokes the lease (nothing lingers); releasing one lock deletes its key alone;
a lock's own key deleted loses that lock alone; the lease lost (revoked, expired) loses every lock on it, each
learning it as a single lost lock is learned (`lost`, `check()`, `on_lost`), and a waiter on it queues again
on a new lease. The same name twice in one process takes a lease of its own (a key is per lease and name).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest

import hostlock
from hostlock import LockLost, LockTimeout

GUARD = 60  # seconds: a hang guard, never a measured bound


def leases(etcd):
    r = etcd.etcdctl("lease", "list")
    assert r.returncode == 0, r.stderr
    return r.stdout.split("\n", 1)[1].split()


def keys(etcd, prefix="hostlock/"):
    r = etcd.etcdctl("get", "--prefix", prefix, "--keys-only")
    assert r.returncode == 0, r.stderr
    return [k for k in r.stdout.split() if k]


def other_sessions_closed():
    """Wait until every session released earlier in this process (other tests') has closed its descriptors: a
    session released while its thread is in a network call leaves them (its stop pipe, its watches) to the thread,
    which closes them when it sees the stop; and a dropped client's socket closes when the collector frees it.
    Counting this process's descriptors before then would count theirs."""
    import gc
    import time

    from hostlock.fleet.session import Session

    def busy(o):
        return isinstance(o, Session) and o._stopped and (o._fds or o.thread_has_fds)

    gc.collect()
    deadline = time.monotonic() + GUARD
    while any(busy(o) for o in gc.get_objects()):
        assert time.monotonic() < deadline, "a released session kept its descriptors"
        time.sleep(0.01)
    gc.collect()


def test_two_locks_of_one_process_share_one_lease_and_the_last_release_revokes_it(etcd):
    a = hostlock.Lock("a", fleet=etcd.url)
    b = hostlock.Lock("b", fleet=etcd.url)
    a.acquire(timeout=GUARD)
    b.acquire(timeout=GUARD)
    try:
        assert len(leases(etcd)) == 1
        ka, kb = keys(etcd, "hostlock/a/"), keys(etcd, "hostlock/b/")
        assert len(ka) == 1 and len(kb) == 1
        assert int(ka[0].rsplit("/", 1)[1], 16) == int(kb[0].rsplit("/", 1)[1], 16) == int(leases(etcd)[0], 16)
        a.release()
        assert keys(etcd, "hostlock/a/") == []  # its key alone went
        assert keys(etcd, "hostlock/b/") == kb and len(leases(etcd)) == 1
        assert b.locked and not b.lost
        b.check()
    finally:
        b.release()
        a.release() if a.locked else None
    assert leases(etcd) == [] and keys(etcd) == []  # the last release revoked the lease


def test_revoking_the_shared_lease_loses_every_lock_on_it(etcd):
    lost = {"a": threading.Event(), "b": threading.Event()}
    a = hostlock.Lock("a", fleet=etcd.url, on_lost=lost["a"].set)
    b = hostlock.Lock("b", fleet=etcd.url, on_lost=lost["b"].set)
    a.acquire(timeout=GUARD)
    b.acquire(timeout=GUARD)
    (lease,) = leases(etcd)
    assert etcd.etcdctl("lease", "revoke", lease).returncode == 0
    for name, ev in lost.items():
        assert ev.wait(GUARD), name
    for lock in (a, b):
        assert lock.lost
        with pytest.raises(LockLost):
            lock.check()
        lock.release()  # never raises for a lost lock
    # The next lock of this process gets a new lease, not the revoked one.
    c = hostlock.Lock("c", fleet=etcd.url)
    c.acquire(timeout=GUARD)
    try:
        assert leases(etcd) != [lease] and len(leases(etcd)) == 1 and not c.lost
    finally:
        c.release()


def test_a_deleted_key_loses_its_own_lock_alone(etcd):
    lost = {"a": threading.Event(), "b": threading.Event()}
    a = hostlock.Lock("a", fleet=etcd.url, on_lost=lost["a"].set)
    b = hostlock.Lock("b", fleet=etcd.url, on_lost=lost["b"].set)
    a.acquire(timeout=GUARD)
    b.acquire(timeout=GUARD)
    try:
        (ka,) = keys(etcd, "hostlock/a/")
        assert etcd.etcdctl("del", ka).returncode == 0
        assert lost["a"].wait(GUARD)
        assert a.lost
        assert not b.lost and not lost["b"].is_set()
        b.check()
        assert len(leases(etcd)) == 1 and len(keys(etcd, "hostlock/b/")) == 1
    finally:
        a.release()
        b.release()
    assert leases(etcd) == []


def test_the_same_name_twice_in_one_process_still_excludes(etcd):
    """Both would have the key NAME/<lease> on a shared lease: the second takes a lease of its own and waits."""
    first = hostlock.Lock("a", fleet=etcd.url)
    second = hostlock.Lock("a", fleet=etcd.url)
    first.acquire(timeout=GUARD)
    try:
        with pytest.raises(LockTimeout):
            second.acquire(timeout=0.3)
        assert len(leases(etcd)) == 1  # the second's own lease went with its wait
        got = []
        t = threading.Thread(target=lambda: got.append(second.acquire(timeout=GUARD)))
        t.start()
        first.release()
        t.join(GUARD)
        assert second.locked
    finally:
        second.release() if second.locked else None
        first.release() if first.locked else None
    assert leases(etcd) == [] and keys(etcd) == []


HOLDER = """
import sys
sys.path.insert(0, %(lib)r)
import hostlock
locks = [hostlock.Lock(n, fleet=%(url)r, ttl=3) for n in ("a", "b")]
for lock in locks:
    lock.acquire(timeout=60)
print("held", flush=True)
sys.stdin.read()
"""


def test_a_killed_process_frees_all_its_locks_with_its_one_lease(etcd, tmp_path):
    lib = os.path.join(os.path.dirname(os.path.dirname(hostlock.__file__)))
    p = subprocess.Popen([sys.executable, "-c", HOLDER % {"lib": lib, "url": etcd.url}], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline() == "held\n"
        assert len(leases(etcd)) == 1 and len(keys(etcd)) == 2
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        for name in ("a", "b"):
            with hostlock.Lock(name, fleet=etcd.url) as lock:  # free once etcd ended the one lease (its TTL)
                assert lock.locked
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert keys(etcd) == []


def test_a_waiter_on_the_shared_lease_queues_again_when_it_is_lost(etcd):
    """This process holds a and waits for b (held by another lease) on one lease; the lease revoked: a is lost,
    the wait for b goes on, on a new lease, and gets b when its holder lets go."""
    other = subprocess.Popen([sys.executable, "-c", HOLDER.replace('("a", "b")', '("b",)') % {
        "lib": os.path.dirname(os.path.dirname(hostlock.__file__)), "url": etcd.url}],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline() == "held\n"
        lost = threading.Event()
        a = hostlock.Lock("a", fleet=etcd.url, ttl=3, on_lost=lost.set)
        a.acquire(timeout=GUARD)
        b = hostlock.Lock("b", fleet=etcd.url, ttl=3)
        t = threading.Thread(target=b.acquire, kwargs={"timeout": GUARD})
        t.start()
        ours = a._held.lease  # noqa: SLF001 - the lease a and b's waiter share
        import time

        deadline = time.monotonic() + GUARD
        while len(keys(etcd, "hostlock/b/")) < 2:  # b's waiter is queued
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert {k.rsplit("/", 1)[1] for k in keys(etcd, "hostlock/b/")} >= {"%x" % ours}
        assert etcd.etcdctl("lease", "revoke", "%x" % ours).returncode == 0
        assert lost.wait(GUARD) and a.lost
        assert t.is_alive()  # still waiting (queued again), not failed
        other.stdin.close()  # b's holder exits and its lease is revoked... or ends within its TTL
        t.join(GUARD)
        assert b.locked and not b.lost
        b.release()
        a.release()
    finally:
        if other.poll() is None:
            other.kill()
        other.wait()


def test_break_force_ends_that_lock_alone_of_a_process_holding_several(etcd):
    lost = {"a": threading.Event(), "b": threading.Event()}
    a = hostlock.Lock("a", fleet=etcd.url, on_lost=lost["a"].set)
    b = hostlock.Lock("b", fleet=etcd.url, on_lost=lost["b"].set)
    a.acquire(timeout=GUARD)
    b.acquire(timeout=GUARD)
    try:
        assert len(hostlock.break_lock("a", fleet=etcd.url, force=True)) == 1
        assert lost["a"].wait(GUARD) and a.lost
        assert keys(etcd, "hostlock/a/") == []
        assert not b.lost and len(leases(etcd)) == 1
        b.check()
    finally:
        a.release()
        b.release()
    assert leases(etcd) == []


def test_a_key_deleted_before_its_watch_opens_is_still_lost(etcd, monkeypatch):
    """The key's watch opens KEY_WATCH_DELAY after the key was made, from the revision after its creation:
    a deletion in between still arrives (here the delay is made long, so the deletion surely comes first)."""
    from hostlock.fleet import session as _session

    monkeypatch.setattr(_session, "KEY_WATCH_DELAY", 5.0)
    lost = threading.Event()
    a = hostlock.Lock("a", fleet=etcd.url, on_lost=lost.set)
    a.acquire(timeout=GUARD)
    try:
        (ka,) = keys(etcd, "hostlock/a/")
        assert etcd.etcdctl("del", ka).returncode == 0
        assert lost.wait(GUARD) and a.lost
    finally:
        a.release()


def test_a_lock_released_at_once_leaves_no_descriptor_behind(etcd):
    """The keep-alive thread sleeps first (nothing is due sooner): a lock released meanwhile closes the session's
    descriptors itself, at the release, not when the thread wakes."""
    other_sessions_closed()
    before = sorted(os.listdir("/proc/self/fd"))
    for _i in range(3):
        lock = hostlock.Lock("quick", fleet=etcd.url)
        lock.acquire()
        lock.release()
        lock._locker.client.close()  # the client's kept-alive connection is not the session's
        assert sorted(os.listdir("/proc/self/fd")) == before


def test_an_attempt_that_fails_before_it_has_a_lease_leaves_no_descriptor(etcd):
    """A member that refuses: each attempt fails before any lease; its claim's pipe must not stay open."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = "etcd://127.0.0.1:%d" % s.getsockname()[1]  # bound, never listening: connection refused
        other_sessions_closed()
        before = len(os.listdir("/proc/self/fd"))
        for _i in range(3):
            with pytest.raises(hostlock.FleetUnavailable):
                hostlock.Lock("a", fleet=dead).acquire(timeout=0)
        assert len(os.listdir("/proc/self/fd")) == before


def test_a_released_key_etcd_did_not_delete_is_deleted_by_the_keep_alive_thread(etcd, monkeypatch):
    """a's delete at its release gets no answer (FleetUnavailable) while b keeps the lease alive: the key must
    not hold lock a for as long as b is held; the keep-alive thread deletes it."""
    from hostlock.fleet import lock as _etcd_lock

    main = threading.get_ident()
    real_call = _etcd_lock.Client.call
    failed = []

    def call(self, path, body, deadline, *a, **kw):
        if path == "kv/txn" and "request_delete_range" in str(body) and threading.get_ident() == main:
            failed.append(path)
            raise hostlock.FleetUnavailable("no answer (test)")
        return real_call(self, path, body, deadline, *a, **kw)

    a = hostlock.Lock("a", fleet=etcd.url)
    b = hostlock.Lock("b", fleet=etcd.url)
    a.acquire(timeout=GUARD)
    b.acquire(timeout=GUARD)
    try:
        monkeypatch.setattr(_etcd_lock.Client, "call", call)
        a.release()
        assert failed
        import time

        deadline = time.monotonic() + GUARD
        while keys(etcd, "hostlock/a/"):
            assert time.monotonic() < deadline, "a's key still there: lock a held by nobody"
            time.sleep(0.05)
        assert b.locked and not b.lost
        other = hostlock.Lock("a", fleet=etcd.url)
        other.acquire(timeout=0)  # free for the next one
        other.release()
    finally:
        monkeypatch.undo()
        b.release()
    assert leases(etcd) == []
