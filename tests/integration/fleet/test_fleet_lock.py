"""The fleet lock API on a real etcd (hostlock.Lock(fleet=...), status/holders/list/break, hold/renew/release).

Every wait here is on an event: a thread's Event, a child's line on a pipe, a condition read back from etcd.
No test asserts a duration. Stress, faults and benchmarks live in the fleet-proof suites.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import fleet_etcd
import pytest
from engine_helpers import signum

import hostlock

WAIT = 60.0  # bounds a hang only; never what a test waits for


def until(cond, what: str, within: float = WAIT):
    """Wait for an observable condition (read back from etcd or a thread), failing after `within` seconds."""
    deadline = time.monotonic() + within
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for " + what)
        time.sleep(0.02)


def _low(remaining: int, most: int):
    """The lease's remaining TTL once it ran down to at most `most` seconds, else None (not yet)."""
    return remaining if 0 <= remaining <= most else None


def keys(etcd, prefix: str = "hostlock/") -> list:
    r = etcd.etcdctl("get", "--prefix", prefix, "--keys-only")
    assert r.returncode == 0, r.stderr
    return [k for k in r.stdout.split("\n") if k]


class Waiter(threading.Thread):
    """A thread that takes `lock` and sets `held`; releases when `go` is set."""

    def __init__(self, lock, order: list | None = None, timeout: float | None = WAIT) -> None:
        super().__init__(daemon=True)
        self.lock, self.order, self.timeout = lock, order, timeout
        self.held, self.go, self.error = threading.Event(), threading.Event(), None

    def run(self) -> None:
        try:
            self.lock.acquire(timeout=self.timeout)
        except BaseException as e:  # noqa: BLE001 - reported to the test
            self.error = e
            self.held.set()
            return
        if self.order is not None:
            self.order.append(self)
        self.held.set()
        self.go.wait(WAIT)
        self.lock.release()


def test_exclusive_excludes_and_the_fence_strictly_increases(etcd):
    a = hostlock.Lock("db", fleet=etcd.url)
    b = hostlock.Lock("db", fleet=etcd.url)
    a.acquire()
    assert a.locked and a.mechanism == "etcd" and a.path == etcd.url + "/hostlock/db/"
    with pytest.raises(hostlock.LockTimeout) as e:
        b.acquire(timeout=0)
    # The message names the holder with its host and pid.
    assert "pid %d on %s" % (os.getpid(), os.uname().nodename) in str(e.value)
    first = a.fence
    a.release()
    assert a.fence is None
    b.acquire(timeout=0)
    assert b.fence > first
    second = b.fence
    b.release()
    with a:
        assert a.fence > second
    assert keys(etcd) == []


def _versions(etcd, prefix: str = "hostlock/") -> list:
    """(version, value) of every key under `prefix`: version 1 is a key written once, never rewritten."""
    import json

    r = etcd.etcdctl("get", "--prefix", prefix, "-w", "json")
    assert r.returncode == 0, r.stderr
    import base64

    return [(kv["version"], base64.b64decode(kv["value"])) for kv in json.loads(r.stdout).get("kvs", [])]


@pytest.mark.parametrize("way", ["in_turn", "sequential"])
def test_meanwhile_runs_once_the_requests_are_on_their_way_and_its_record_is_written_once_held(
        etcd, monkeypatch, way):
    """Lock.acquire(meanwhile=...) on a fleet lock: run once, while a request is on its way (where `hostlock run
    --fleet` forks its job): the queue transaction, written once the lease's grant was answered on the same
    connection (in_turn), or the grant alone (sequential: two_in_turn() failed before sending a byte; the
    queue transaction follows its answer). What it told update_record() is written
    once the lock is held: a second write (version 2) when the queue transaction had gone with the record
    before `meanwhile` ran, none when it was built after (version 1)."""
    from hostlock.fleet import etcd as _etcd
    from hostlock.fleet import transport as _transport

    lock = hostlock.Lock("mw", fleet=etcd.url)
    sent = []
    answered = []
    real_send, real_answer = _transport._Conn.send, _transport._Conn.answer

    def send(conn, request, timeout):
        real_send(conn, request, timeout)
        sent.append(request.split(b" ", 2)[1].decode())  # written in full: sendall returned

    def answer(conn, end):
        answered.append(len(sent))
        return real_answer(conn, end)

    monkeypatch.setattr(_transport._Conn, "send", send)
    monkeypatch.setattr(_transport._Conn, "answer", answer)
    if way == "sequential":
        monkeypatch.setattr(_etcd.Client, "two_in_turn", lambda self, *a, **kw: (None, None))
    seen = []

    def meanwhile():
        seen.append((list(sent), len(answered)))
        lock.update_record(job_pid=12345, job_cmdline="backup --all")

    lock.acquire(meanwhile=meanwhile)
    try:
        both = ["/v3/lease/grant", "/v3/kv/txn"] if way == "in_turn" else ["/v3/lease/grant"]
        # once: every request of the moment written, the last one's answer not read yet
        assert seen == [(both, 1 if way == "in_turn" else 0)]
        [(version, value)] = _versions(etcd)
        assert version == (2 if way == "in_turn" else 1)
        assert b"|jpid=12345|" in value and b"|jcmd=backup --all" in value
        assert [h.job_pid for h in hostlock.holders("mw", fleet=etcd.url)] == [12345]
    finally:
        lock.release()
    assert keys(etcd) == []


def test_meanwhile_without_a_grant_to_overlap_still_runs_once_and_names_itself(etcd):
    """The process's lease is there already (another lock holds it): no grant, so acquire runs meanwhile once
    the key is queued and rewrites the record with what it said."""
    first = hostlock.Lock("first", fleet=etcd.url).acquire()
    lock = hostlock.Lock("mw", fleet=etcd.url)
    ran = []

    def meanwhile():
        ran.append(lock.locked)
        lock.update_record(job_pid=54321)

    lock.acquire(meanwhile=meanwhile)
    try:
        assert ran == [False]
        assert [h.job_pid for h in hostlock.holders("mw", fleet=etcd.url)] == [54321]
    finally:
        lock.release()
        first.release()
    assert keys(etcd) == []


def _revision(etcd) -> int:
    import json

    r = etcd.etcdctl("get", "nothing-here", "-w", "json")
    assert r.returncode == 0, r.stderr
    return int(json.loads(r.stdout)["header"]["revision"])


def _fields(record: bytes) -> dict:
    return dict(f.split(b"=", 1) for f in record.rstrip(b"\n").split(b"|")[1:])


def test_a_deferred_record_is_written_by_the_thread_a_moment_later_and_never_for_a_short_hold(etcd):
    """update_record(defer=True) on a held fleet lock (`hostlock run --fleet` naming its job's pid): returns at
    once; the keep-alive thread writes it KEY_WATCH_DELAY later (version 2, the time the lock was taken kept).
    Released sooner, it is never written: such a hold costs etcd two writes (the key, its revoke), as without
    the record (the revision counts etcd's writes; a write tried after the revoke fails its compare)."""
    from hostlock.fleet.session import KEY_WATCH_DELAY

    lock = hostlock.Lock("mw", fleet=etcd.url).acquire()
    try:
        [(version, first)] = _versions(etcd)
        assert version == 1
        t0 = time.monotonic()
        lock.update_record(job_pid=4242, job_cmdline="long job", defer=True)
        until(lambda: _versions(etcd)[0][0] == 2, "the deferred record")
        # A lower bound the thread guarantees (it writes once the delay has passed), not a timing guess.
        assert time.monotonic() - t0 >= KEY_WATCH_DELAY
        [(version, value)] = _versions(etcd)
        fields = _fields(value)
        assert (fields[b"jpid"], fields[b"jcmd"], fields[b"at"]) == (b"4242", b"long job", _fields(first)[b"at"])
        assert [h.job_pid for h in hostlock.holders("mw", fleet=etcd.url)] == [4242]
    finally:
        lock.release()
    before = _revision(etcd)
    t0 = time.monotonic()
    with hostlock.Lock("mw", fleet=etcd.url) as short:
        short.update_record(job_pid=4343, defer=True)
    quick = time.monotonic() - t0 < KEY_WATCH_DELAY  # else (a very busy machine) the thread may have written it
    assert _revision(etcd) - before in ((2,) if quick else (2, 3)) and keys(etcd) == []


def test_a_deferred_record_whose_key_is_gone_is_the_locks_loss_and_resurrects_nothing(etcd):
    """The key deleted before the deferred write (a `break --force`, say): the write's compare fails, so no key
    comes back, and the lock is lost (on_lost), as the thread's watch of the key would find."""
    lost = threading.Event()
    lock = hostlock.Lock("mw", fleet=etcd.url, on_lost=lost.set).acquire()
    try:
        [key] = keys(etcd)
        r = etcd.etcdctl("del", key)
        assert r.returncode == 0, r.stderr
        lock.update_record(job_pid=4444, defer=True)
        assert lost.wait(30)
        assert lock.lost and keys(etcd) == []
    finally:
        lock.release()


def test_what_meanwhile_raises_acquire_raises_and_no_key_is_left(etcd):
    lock = hostlock.Lock("mw", fleet=etcd.url)

    def boom():
        raise OSError(11, "cannot fork")  # an OSError inside the client's I/O: never taken for etcd's

    with pytest.raises(OSError, match="cannot fork"):
        lock.acquire(meanwhile=boom)
    assert not lock.locked and keys(etcd) == []
    other = hostlock.Lock("mw", fleet=etcd.url)
    other.acquire(timeout=0)  # free at once: nothing of the failed acquire holds it
    other.release()


def test_timeout_leaves_no_key_behind(etcd):
    holder = hostlock.Lock("db", fleet=etcd.url)
    holder.acquire()
    mine = keys(etcd)
    assert len(mine) == 1
    waiter = hostlock.Lock("db", fleet=etcd.url)
    with pytest.raises(hostlock.LockTimeout) as e:
        waiter.acquire(timeout=0.5)
    assert [h.pid for h in e.value.holders] == [os.getpid()]
    assert keys(etcd) == mine  # the waiter revoked its lease before raising: its key is gone
    holder.release()
    assert keys(etcd) == []


def test_waiters_are_served_in_arrival_order(etcd):
    holder = hostlock.Lock("q", fleet=etcd.url)
    holder.acquire()
    order: list = []
    waiters = []
    for n in range(3):
        w = Waiter(hostlock.Lock("q", fleet=etcd.url), order)
        w.start()
        # The next one arrives only once this one is queued (its key exists): arrival order is known.
        until(lambda n=n: hostlock.status("q", fleet=etcd.url).waiters == n + 1, "waiter %d queued" % n)
        waiters.append(w)
    holder.release()
    for w in waiters:
        assert w.held.wait(WAIT) and w.error is None
        assert order[-1] is w
        fence = w.lock.fence
        w.go.set()
        w.join(WAIT)
        assert fence > holder.fence if holder.fence else True
    assert order == waiters
    assert keys(etcd) == []


def test_shared_holders_share_and_a_waiting_writer_blocks_later_readers(etcd):
    r1 = hostlock.Lock("cfg", mode="shared", fleet=etcd.url)
    r2 = hostlock.Lock("cfg", mode="shared", fleet=etcd.url)
    r1.acquire(timeout=0)
    r2.acquire(timeout=0)  # readers share
    st = hostlock.status("cfg", fleet=etcd.url)
    assert len(st.holders) == 2 and {h.mode for h in st.holders} == {"shared"}
    r2.release()
    writer = Waiter(hostlock.Lock("cfg", fleet=etcd.url))
    writer.start()
    until(lambda: hostlock.status("cfg", fleet=etcd.url).waiters == 1, "the writer queued")
    late = hostlock.Lock("cfg", mode="shared", fleet=etcd.url)
    with pytest.raises(hostlock.LockTimeout):
        late.acquire(timeout=0)  # no writer starvation: a reader arriving after a waiting writer waits
    r1.release()
    assert writer.held.wait(WAIT) and writer.error is None
    reader = Waiter(hostlock.Lock("cfg", mode="shared", fleet=etcd.url))
    reader.start()
    until(lambda: hostlock.status("cfg", fleet=etcd.url).waiters == 1, "the reader queued")
    assert not reader.held.is_set()
    writer.go.set()
    assert reader.held.wait(WAIT) and reader.error is None
    reader.go.set()
    reader.join(WAIT)
    writer.join(WAIT)


def test_slots_admit_n_holders(etcd):
    locks = [hostlock.Lock("restart", slots=2, fleet=etcd.url) for _i in range(3)]
    locks[0].acquire(timeout=0)
    locks[1].acquire(timeout=0)
    third = Waiter(locks[2])
    third.start()
    until(lambda: hostlock.status("restart", fleet=etcd.url).waiters == 1, "the third queued")
    st = hostlock.status("restart", fleet=etcd.url)
    assert st.slots == 2 and len(st.holders) == 2 and st.state == "held"
    locks[1].release()  # the second holder leaves: the third takes its slot
    assert third.held.wait(WAIT) and third.error is None
    assert locks[0].locked
    third.go.set()
    third.join(WAIT)
    locks[0].release()


def test_the_lease_is_kept_alive_past_its_ttl(etcd):
    lock = hostlock.Lock("long", fleet=etcd.url, ttl=5)
    lock.acquire()
    lease = keys(etcd)[0].rsplit("/", 1)[1]

    def remaining() -> int:
        out = etcd.etcdctl("lease", "timetolive", lease).stdout
        return int(out.split("remaining(")[1].split("s")[0]) if "remaining(" in out else -1

    # Two refreshes observed (etcd's remaining TTL, in whole seconds, went back up twice): renewals, not luck.
    for _refresh in range(2):
        low = until(lambda: _low(remaining(), 3), "the TTL to run down", 30)
        until(lambda low=low: remaining() > low, "a keep-alive", 30)
    assert not lock.lost and len(keys(etcd)) == 1
    lock.check()
    lock.release()
    assert keys(etcd) == []


def _remaining(member, lease: str, endpoints: str) -> int:
    out = member.etcdctl("lease", "timetolive", lease, endpoints=endpoints).stdout
    return int(out.split("remaining(")[1].split("s")[0]) if "remaining(" in out else -1


def test_a_holder_and_a_waiter_live_through_the_leaders_death(etcd_cluster):
    """A follower cut off from a dead leader holds requests for seconds: keep-alives and a newcomer's
    requests move on to another member, and the lease's clock starts from the request that got through."""
    lock = hostlock.Lock("x", fleet=etcd_cluster.url, ttl=5)
    lock.acquire()
    leader = etcd_cluster.leader()
    leader.kill()
    alive = [m for m in etcd_cluster.members if m is not leader]
    others = ",".join(m.endpoint for m in alive)
    waiter = Waiter(hostlock.Lock("x", fleet=etcd_cluster.url, ttl=5))
    waiter.start()
    until(lambda: hostlock.status("x", fleet=etcd_cluster.url).waiters == 1, "the newcomer queued")
    r = alive[0].etcdctl("get", "--prefix", "hostlock/x/", "--keys-only", "--sort-by=CREATE", endpoints=others)
    lease = [k for k in r.stdout.split("\n") if k][0].rsplit("/", 1)[1]
    for _refresh in range(2):  # two keep-alives answered after the leader died: the holder's lease lives on
        low = until(lambda: _low(_remaining(alive[0], lease, others), 3), "the TTL to run down")
        until(lambda low=low: _remaining(alive[0], lease, others) > low, "a keep-alive")
    assert not lock.lost and not waiter.held.is_set()
    fence = lock.fence
    lock.release()
    assert waiter.held.wait(WAIT) and waiter.error is None
    assert waiter.lock.fence > fence
    waiter.go.set()
    waiter.join(WAIT)


@pytest.mark.parametrize("how", ["delete-key", "revoke-lease", "break"])
def test_the_holder_learns_it_lost_the_lock(etcd, how):
    lost = threading.Event()
    lock = hostlock.Lock("job", fleet=etcd.url, on_lost=lost.set)
    lock.acquire()
    key = keys(etcd)[0]
    if how == "delete-key":
        assert etcd.etcdctl("del", key).returncode == 0
    elif how == "revoke-lease":
        assert etcd.etcdctl("lease", "revoke", key.rsplit("/", 1)[1]).returncode == 0
    else:
        assert hostlock.break_lock("job", fleet=etcd.url) == []  # without force: nothing is stale in etcd
        assert not lost.is_set()
        ended = hostlock.break_lock("job", fleet=etcd.url, force=True)
        assert [h.pid for h in ended] == [os.getpid()] and ended[0].fence == lock.fence
    assert lost.wait(WAIT)
    assert lock.lost
    with pytest.raises(hostlock.LockLost):
        lock.check()
    lock.release()  # already gone: no error
    assert not lock.locked
    again = hostlock.Lock("job", fleet=etcd.url)
    again.acquire(timeout=0)
    again.release()


def test_status_holders_and_list(etcd):
    a = hostlock.Lock("alpha", fleet=etcd.url, label="deploy 42")
    b = hostlock.Lock("beta", slots=3, fleet=etcd.url)
    a.acquire()
    b.acquire()
    st = hostlock.status("alpha", fleet=etcd.url)
    assert st.mechanism == "etcd" and st.path == etcd.url + "/hostlock/alpha/" and st.state == "held"
    (h,) = hostlock.holders("alpha", fleet=etcd.url)
    assert h.pid == os.getpid() and h.hostname == os.uname().nodename and h.label == "deploy 42"
    assert h.fence == a.fence and h.to_json()["fence"] == a.fence
    assert "on %s" % os.uname().nodename in h.describe()
    listed = hostlock.list_locks(fleet=etcd.url)
    assert [s.name for s in listed] == ["alpha", "beta"] and listed[1].slots == 3
    # Another program's key under the prefix is skipped, not fatal.
    assert etcd.etcdctl("put", "hostlock/not a name/1", "x").returncode == 0
    assert [s.name for s in hostlock.list_locks(fleet=etcd.url)] == ["alpha", "beta"]
    # A different prefix is a different namespace.
    assert hostlock.list_locks(fleet=etcd.url + "/team-b") == []
    a.release()
    b.release()
    assert hostlock.status("alpha", fleet=etcd.url).state == "free"


SECOND_SIGNAL = r"""
import os, signal, sys
import hostlock
from hostlock.fleet import lock as fleet_lock

class Stop(BaseException):
    pass

def stop(signum, frame):
    raise Stop(signum)

first, second = int(sys.argv[2]), int(sys.argv[3])
signal.signal(first, stop)
signal.signal(second, stop)
revoke = fleet_lock.EtcdLocker._revoke

def revoke_after_a_second_signal(self, lease):
    os.kill(os.getpid(), second)  # as timeout(1) signals its command, then its process group
    revoke(self, lease)

fleet_lock.EtcdLocker._revoke = revoke_after_a_second_signal
print("waiting", flush=True)
try:
    hostlock.Lock("ahead", fleet=sys.argv[1]).acquire()
except Stop:
    print("stopped", flush=True)
"""


# The second signal another than the first too: the engine holds every one that ends a process (core.signals).
@pytest.mark.parametrize("first, second", [("TERM", "TERM"), ("TERM", "USR1"), ("HUP", "RTMIN+1")])
def test_a_second_signal_does_not_cut_a_leaving_waiters_revoke_short(etcd, first, second):
    """A waiter ended by a signal revokes its lease before it leaves; a second signal that comes meanwhile is
    held until the revoke is done (then delivered), so the waiter's key never outlives it."""
    holder = hostlock.Lock("ahead", fleet=etcd.url)
    holder.acquire()
    try:
        w = subprocess.Popen([sys.executable, "-c", SECOND_SIGNAL, etcd.url, str(signum(first)), str(signum(second))],
                             stdout=subprocess.PIPE, text=True)
        assert w.stdout is not None and w.stdout.readline() == "waiting\n"
        until(lambda: len(keys(etcd, "hostlock/ahead/")) == 2, "the waiter's key")
        w.send_signal(signum(first))
        out, _err = w.communicate(timeout=WAIT)
        assert (w.returncode, out) == (0, "stopped\n")
        assert keys(etcd, "hostlock/ahead/") == ["hostlock/ahead/%x" % holder._held.lease]
    finally:
        holder.release()


def test_a_lease_outlives_the_process_that_took_it(etcd):
    code = "import hostlock, sys; print(hostlock.hold('nightly', 120, fleet=sys.argv[1], label='cron'))"
    r = subprocess.run([sys.executable, "-c", code, etcd.url], capture_output=True, text=True, timeout=WAIT,
                       check=False)
    assert r.returncode == 0, r.stderr
    token = r.stdout.strip()
    assert token.startswith("hostlock-etcd.")
    (h,) = hostlock.holders("nightly", fleet=etcd.url)  # its process has exited: the lease holds
    assert h.token_id == hostlock.token_id(token) and h.label == "cron"
    assert h.lease_expires is not None and h.lease_expires > time.time() + 60
    with pytest.raises(hostlock.LockTimeout):
        hostlock.Lock("nightly", fleet=etcd.url).acquire(timeout=0)
    expires = hostlock.renew("nightly", token, 600, fleet=etcd.url)
    assert expires > time.time() + 300
    (h2,) = hostlock.holders("nightly", fleet=etcd.url)
    assert h2.fence == h.fence  # moved to a new lease, same key, same place, same fence
    assert h2.lease_expires == pytest.approx(expires, abs=1)
    hostlock.renew("nightly", token, fleet=etcd.url)  # a keep-alive of the current lease
    with pytest.raises(hostlock.TokenError) as e:
        hostlock.release("nightly", token.rsplit(".", 1)[0] + ".1", fleet=etcd.url)
    assert e.value.reason == "gone"
    hostlock.release("nightly", token, fleet=etcd.url)
    assert hostlock.status("nightly", fleet=etcd.url).state == "free" and keys(etcd) == []
    with pytest.raises(hostlock.TokenError) as e:
        hostlock.release("nightly", token, fleet=etcd.url)
    assert e.value.reason == "gone"


def test_etcdctl_lock_and_hostlock_exclude_each_other(etcd):
    env = dict(os.environ, ETCDCTL_API="3")
    ctl = subprocess.Popen([fleet_etcd.ETCDCTL, "--endpoints", etcd.endpoint, "lock", "hostlock/shared-db"],
                           stdout=subprocess.PIPE, env=env, text=True)
    try:
        assert ctl.stdout.readline().startswith("hostlock/shared-db/")  # etcdctl holds
        lock = hostlock.Lock("shared-db", fleet=etcd.url)
        with pytest.raises(hostlock.LockTimeout) as e:
            lock.acquire(timeout=0)
        assert "etcdctl lock" in str(e.value)
        (h,) = hostlock.holders("shared-db", fleet=etcd.url)
        assert not h.record_ok and h.mode == "exclusive"
        waiter = Waiter(lock)
        waiter.start()
        until(lambda: hostlock.status("shared-db", fleet=etcd.url).waiters == 1, "hostlock queued")
        ctl.send_signal(signal.SIGINT)  # etcdctl ends its session: its key goes
        assert ctl.wait(WAIT) is not None
        assert waiter.held.wait(WAIT) and waiter.error is None
        # And the other way: etcdctl waits while hostlock holds.
        ctl = subprocess.Popen([fleet_etcd.ETCDCTL, "--endpoints", etcd.endpoint, "lock", "hostlock/shared-db"],
                               stdout=subprocess.PIPE, env=env, text=True)
        until(lambda: hostlock.status("shared-db", fleet=etcd.url).waiters == 1, "etcdctl queued")
        assert ctl.poll() is None
        waiter.go.set()
        assert ctl.stdout.readline().startswith("hostlock/shared-db/")  # etcdctl got it only now
        waiter.join(WAIT)
    finally:
        ctl.kill()
        ctl.wait()


def test_unreachable_fleet_is_fleet_unavailable_naming_the_members(proxy_to, etcd):
    port = fleet_etcd.free_port()  # nothing listens there
    url = "etcd://127.0.0.1:%d" % port
    with pytest.raises(hostlock.FleetUnavailable) as e:
        hostlock.Lock("x", fleet=url).acquire(timeout=1)
    assert "127.0.0.1:%d" % port in str(e.value) and e.value.endpoints == "127.0.0.1:%d" % port
    with pytest.raises(hostlock.FleetUnavailable):
        hostlock.status("x", fleet=url)
    # A member that accepts and never answers (a dead route) must not hang the client past its deadline.
    proxy = proxy_to(etcd.endpoint)
    proxy.cut()
    with pytest.raises(hostlock.FleetUnavailable) as e:
        hostlock.Lock("x", fleet=proxy.url).acquire(timeout=1)
    assert proxy.endpoint in str(e.value)


def test_a_dead_member_is_skipped_for_the_next(etcd):
    dead = "127.0.0.1:%d" % fleet_etcd.free_port()
    lock = hostlock.Lock("x", fleet="etcd://%s,%s" % (dead, etcd.endpoint))
    lock.acquire(timeout=5)
    assert lock.fence > 0
    lock.release()
    assert keys(etcd) == []


def test_auth(tmp_path, monkeypatch):
    if not fleet_etcd.have_etcd():
        pytest.skip("etcd/etcdctl not installed")
    member = fleet_etcd.start_etcd(str(tmp_path))
    try:
        for args in (("user", "add", "root:rootpw"), ("user", "add", "ops:opspw"), ("role", "add", "locks"),
                     ("role", "grant-permission", "locks", "--prefix=true", "readwrite", "hostlock/"),
                     ("user", "grant-role", "ops", "locks"),
                     ("user", "add", "viewer:viewpw"), ("role", "add", "look"),
                     ("role", "grant-permission", "look", "--prefix=true", "read", "hostlock/"),
                     ("user", "grant-role", "viewer", "look"), ("auth", "enable")):
            r = member.etcdctl(*args)
            assert r.returncode == 0, r.stderr
        url = "etcd://ops@" + member.endpoint
        monkeypatch.setenv("HOSTLOCK_FLEET_PASSWORD", "opspw")
        with hostlock.Lock("db", fleet=url) as lock:
            assert lock.fence > 0
            assert hostlock.holders("db", fleet=url)[0].fence == lock.fence
        token = hostlock.hold("db", 300, fleet=url)
        # A user who may only read sees the holder (and so could derive the token), yet cannot end,
        # renew, break or take the lock: etcd's permissions are the boundary.
        viewer = "etcd://viewer@" + member.endpoint
        monkeypatch.setenv("HOSTLOCK_FLEET_PASSWORD", "viewpw")
        (h,) = hostlock.holders("db", fleet=viewer)
        assert h.token_id == hostlock.token_id(token)
        for attempt in (lambda: hostlock.release("db", token, fleet=viewer),
                        lambda: hostlock.renew("db", token, 60, fleet=viewer),
                        lambda: hostlock.break_lock("db", fleet=viewer, force=True),
                        lambda: hostlock.Lock("other", fleet=viewer).acquire(timeout=1)):
            with pytest.raises(hostlock.FleetUnavailable, match="permission denied"):
                attempt()
        monkeypatch.setenv("HOSTLOCK_FLEET_PASSWORD", "opspw")
        assert hostlock.holders("db", fleet=url)[0].token_id == hostlock.token_id(token)
        hostlock.release("db", token, fleet=url)
        assert hostlock.status("db", fleet=url).state == "free"
        # Without credentials, or with the wrong password, or outside the granted prefix: refused.
        with pytest.raises(hostlock.FleetUnavailable, match="refused|denied|permission"):
            hostlock.Lock("db", fleet="etcd://" + member.endpoint).acquire(timeout=1)
        with pytest.raises(hostlock.FleetUnavailable, match="refused|denied|permission"):
            hostlock.Lock("db", fleet=url + "/elsewhere").acquire(timeout=1)
        monkeypatch.setenv("HOSTLOCK_FLEET_PASSWORD", "wrong")
        with pytest.raises(hostlock.FleetUnavailable, match="refused user 'ops'"):
            hostlock.Lock("db", fleet=url).acquire(timeout=1)
        monkeypatch.delenv("HOSTLOCK_FLEET_PASSWORD")
        with pytest.raises(hostlock.FleetConfigError, match="HOSTLOCK_FLEET_PASSWORD"):
            hostlock.status("db", fleet=url)
    finally:
        member.stop()


def _make_pki(d) -> dict:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, made with openssl."""
    def ssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=str(d), check=True, capture_output=True)

    # Extensions as Python 3.13's strict verification (VERIFY_X509_STRICT) requires of a CA and its leaves.
    ssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=hostlock test CA",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        "-keyout", "ca.key", "-out", "ca.pem")
    (d / "san.cnf").write_text("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n"
                               "keyUsage=critical,digitalSignature,keyEncipherment\n"
                               "authorityKeyIdentifier=keyid,issuer\nsubjectKeyIdentifier=hash\n")
    for who in ("server", "client"):
        ssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=%s" % who, "-keyout", who + ".key",
            "-out", who + ".csr")
        ssl("x509", "-req", "-in", who + ".csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", "2", "-extfile", "san.cnf", "-out", who + ".pem")
    return {k: str(d / k) for k in ("ca.pem", "server.pem", "server.key", "client.pem", "client.key")}


def test_tls_with_client_certificates(tmp_path):
    import shutil

    if not fleet_etcd.have_etcd() or not shutil.which("openssl"):
        pytest.skip("etcd/etcdctl or openssl not installed")
    pki = _make_pki(tmp_path)
    client, peer = fleet_etcd.free_port(), fleet_etcd.free_port()
    endpoint = "127.0.0.1:%d" % client
    member = fleet_etcd.Etcd("tls", str(tmp_path / "tls.data"), client, peer, "tls=http://127.0.0.1:%d" % peer,
                             extra=["--listen-client-urls", "https://" + endpoint,
                                    "--advertise-client-urls", "https://" + endpoint,
                                    "--cert-file", pki["server.pem"], "--key-file", pki["server.key"],
                                    "--client-cert-auth", "--trusted-ca-file", pki["ca.pem"]])
    member.start()
    try:
        tls = ("--cacert", pki["ca.pem"], "--cert", pki["client.pem"], "--key", pki["client.key"])
        until(lambda: member.etcdctl(*tls, "endpoint", "health").returncode == 0, "etcd (TLS) healthy")
        url = "etcds://%s?cacert=%s&cert=%s&key=%s" % (endpoint, pki["ca.pem"], pki["client.pem"],
                                                       pki["client.key"])
        with hostlock.Lock("db", fleet=url) as lock:
            (h,) = hostlock.holders("db", fleet=url)
            assert h.fence == lock.fence
            other = hostlock.Lock("db", fleet=url)
            with pytest.raises(hostlock.LockTimeout):
                other.acquire(timeout=0)
        # A server certificate the client cannot verify, or no client certificate: refused, clearly.
        with pytest.raises(hostlock.FleetUnavailable, match="does not verify against the system's CA certificates"):
            hostlock.status("db", fleet="etcds://%s" % endpoint)
        with pytest.raises(hostlock.FleetUnavailable, match="%s refused our client certificate [(]no client "
                           "certificate" % endpoint):
            hostlock.status("db", fleet="etcds://%s?cacert=%s" % (endpoint, pki["ca.pem"]))
        with pytest.raises(hostlock.FleetConfigError, match="%s speaks TLS: use etcds://" % endpoint):
            hostlock.Lock("db", fleet="etcd://%s" % endpoint).acquire(timeout=0)  # plain HTTP to a TLS port
    finally:
        member.stop()


def test_a_forked_child_neither_releases_nor_renews_the_parents_lock(etcd):
    """After fork the child drops its copy (filelock #634's lesson): its release() and its exit leave the
    parent's lease and key alone, and the parent keeps renewing."""
    lock = hostlock.Lock("forked", fleet=etcd.url, label="parent")
    lock.acquire()
    before = keys(etcd)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            ok = not lock.locked and lock.fence is None
            lock.release()
            lock.close()
            os.write(w, b"ok" if ok else b"child saw the parent's hold")
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        said = f.read()
    os.waitpid(pid, 0)
    assert said == b"ok"
    assert keys(etcd) == before and lock.locked and not lock.lost
    lock.update_record(job_pid=os.getpid(), label="after fork")  # the parent's lock still writes its record
    (h,) = hostlock.holders("forked", fleet=etcd.url)
    assert h.label == "after fork" and h.job_pid == os.getpid() and h.fence == lock.fence
    lock.release()
    assert keys(etcd) == []


def test_hold_that_times_out_leaves_nothing(etcd):
    holder = hostlock.Lock("busy", fleet=etcd.url)
    holder.acquire()
    with pytest.raises(hostlock.LockTimeout) as e:
        hostlock.hold("busy", 60, fleet=etcd.url, timeout=0.2)
    assert [h.pid for h in e.value.holders] == [os.getpid()]
    assert len(keys(etcd)) == 1
    holder.release()
    with pytest.raises(hostlock.TokenError) as e:
        hostlock.renew("busy", "hostlock-etcd.abc.1", fleet=etcd.url)
    assert e.value.reason == "gone"
