"""A waiter's lease that ends between its grant and the put of its key (issue 24 item 7: was exit 65,
"requested lease not found") is retried within the wait: the waiter queues again on a new lease. And the
rule of which key a waiter watches (a release wakes only the waiter it admits) beside `blockers`.

The lease is really revoked in etcd, by etcdctl, in the instant between the grant and the put (a hook on the
client's grant answer, or, with the put pipelined behind the grant, on the put's building once etcd has
answered the grant), as an outage or a paused process would have let it expire.

The grant and the queue transaction go in one round trip (Client.two_in_turn); each test that hooks the grant
runs both ways: `pipelined` as it is, and `sequential` (pipelined() answering nothing, as when its connection
fails before a byte: every request then goes through Client.call, today's path).
"""

from __future__ import annotations

import socket
import threading
import time

import pytest

import hostlock
from hostlock.fleet import etcd as _etcd
from hostlock.fleet import lock as _etcd_lock
from hostlock.fleet import queue as _etcd_queue
from hostlock.fleet import transport as _transport


@pytest.fixture(params=["in_turn", "sequential"])
def way(request, monkeypatch):
    if request.param == "sequential":
        monkeypatch.setattr(_etcd.Client, "two_in_turn", lambda self, *a, **kw: (None, None))
    return request.param


def _revoke(etcd, lid: int) -> None:
    r = etcd.etcdctl("lease", "revoke", "%x" % lid)
    assert r.returncode == 0, r.stderr


def test_a_lease_gone_between_grant_and_put_is_granted_again(etcd, monkeypatch, way):
    revoked = []
    real_call = _etcd_lock.Client.call
    real_two_in_turn = _etcd.Client.two_in_turn
    real_send = _transport._Conn.send
    grants = []  # the connection the pipelined grant went on, once written in full

    def call(self, path, body, deadline, *a, **kw):
        reply = real_call(self, path, body, deadline, *a, **kw)
        if path == "lease/grant" and not revoked:
            revoked.append(int(reply["ID"]))
            _revoke(etcd, revoked[0])
        return reply

    def send(conn, request, timeout):
        real_send(conn, request, timeout)
        if request.startswith(b"POST /v3/lease/grant "):
            grants.append(conn)

    def two_in_turn(self, path, body, then, *a, **kw):
        def revoke_then():
            if not revoked:
                # two_in_turn() builds the put once etcd has answered the grant: the lease exists now.
                assert len(grants) == 1, "then() ran before the grant was written in full"
                revoked.append(int(body["ID"]))
                _revoke(etcd, revoked[0])
            return then()

        return real_two_in_turn(self, path, body, revoke_then, *a, **kw)

    monkeypatch.setattr(_etcd_lock.Client, "call", call)
    if way == "in_turn":
        monkeypatch.setattr(_transport._Conn, "send", send)
        monkeypatch.setattr(_etcd.Client, "two_in_turn", two_in_turn)
    lock = hostlock.Lock("deploy", fleet=etcd.url)
    lock.acquire(timeout=30)
    try:
        assert revoked and lock.locked
        key = etcd.etcdctl("get", "--prefix", "hostlock/deploy/", "--keys-only").stdout.split()
        assert len(key) == 1 and not key[0].endswith("/%x" % revoked[0])  # a new lease, the old one gone
    finally:
        lock.release()


class E:
    """An entry as _etcd_lock sees one: key, mode, slots."""

    def __init__(self, key, mode="exclusive", slots=1):
        self.key, self.mode, self.slots = key, mode, slots


@pytest.mark.parametrize(("queue", "watched"), [
    ([E("h"), E("w1"), E("me")], ("w1", False)),  # exclusive: the key just ahead, not the holder
    ([E("r1", "shared"), E("w", "exclusive"), E("r2", "shared"), E("me", "shared")], ("w", False)),  # the writer
    ([E("r1", "shared"), E("r2", "shared"), E("me")], ("r2", False)),  # a writer: the last reader ahead
    ([E("a", slots=2), E("b", slots=2), E("me", slots=2)], (None, False)),  # first not admitted: any going
    ([E("a", slots=2), E("b", slots=2), E("c", slots=2), E("me", slots=2)], ("c", True)),  # c's rewrite
    ([E("x"), E("b", slots=2), E("me", slots=2)], ("b", True)),  # b holds once x goes, and says so
    ([E("a", slots=3), E("b", slots=2), E("me", slots=2)], ("b", True)),  # another N ahead of b: the same
    ([E("b", slots=2), E("x"), E("me", slots=2)], ("x", False)),  # an exclusive just ahead: its deletion
    ([E("x"), E("me", slots=2)], ("x", False)),
    ([E("me")], (None, False)),  # holds
])
def test_a_waiter_watches_only_the_key_that_can_admit_it(queue, watched):
    got, rewritten = _etcd_queue.waits_on(queue, len(queue) - 1)
    assert (got.key if got is not None else None, rewritten) == watched


@pytest.mark.parametrize("after", ["lease/grant", "kv/txn", "lease/revoke"])
def test_a_hold_interrupted_before_its_token_is_returned_leaves_no_lease(etcd, monkeypatch, after, way):
    """hold() interrupted (a signal's exception: `hostlock hold` unwinds on SIGTERM) while it moves its key
    onto the --lease lease: after the grant of that lease, after the move, or during the old lease's revoke.
    Nobody has the token, so nothing may stay: neither lease, nor the key (it would hold the lock 5 min)."""
    calls = []
    real_call = _etcd_lock.Client.call
    real_two_in_turn = _etcd.Client.two_in_turn

    def two_in_turn(self, path, body, then, *a, **kw):
        got = real_two_in_turn(self, path, body, then, *a, **kw)
        calls.extend(p for p, reply in zip((path, "kv/txn"), got, strict=True) if reply is not None)
        return got

    if way == "in_turn":
        monkeypatch.setattr(_etcd.Client, "two_in_turn", two_in_turn)

    def call(self, path, body, deadline, *a, **kw):
        reply = real_call(self, path, body, deadline, *a, **kw)
        calls.append(path)
        # The wait's own grant, put and read come first; interrupt the move's `after` request, once.
        if path == after and calls.count("lease/grant") == 2 and "interrupted" not in calls:
            calls.append("interrupted")
            raise KeyboardInterrupt
        return reply

    monkeypatch.setattr(_etcd_lock.Client, "call", call)
    with pytest.raises(KeyboardInterrupt):
        hostlock.hold("deploy", lease=300, fleet=etcd.url)
    assert "interrupted" in calls
    monkeypatch.undo()
    assert etcd.etcdctl("get", "--prefix", "hostlock/", "--keys-only").stdout.split() == []
    assert etcd.etcdctl("lease", "list").stdout.split("\n", 1)[1].split() == []


def test_a_waiter_interrupted_as_its_grant_is_answered_leaves_no_lease(etcd, monkeypatch, way):
    """The grant's answer arrives and the signal's exception comes before the caller has read the lease's id:
    the id was chosen before the request (_etcd_lock.grant), so the unwinding wait still revokes it (and with
    it our key, when the queue transaction went right behind the grant)."""
    real_call = _etcd_lock.Client.call
    real_two_in_turn = _etcd.Client.two_in_turn

    def call(self, path, body, deadline, *a, **kw):
        reply = real_call(self, path, body, deadline, *a, **kw)
        if path == "lease/grant":
            raise KeyboardInterrupt
        return reply

    def interrupted(reply):
        raise KeyboardInterrupt

    def two_in_turn(self, path, body, then, deadline, sent, meanwhile=None, between=None, pending=None):
        return real_two_in_turn(self, path, body, then, deadline, sent, meanwhile, interrupted, pending)

    monkeypatch.setattr(_etcd_lock.Client, "call", call)
    if way == "in_turn":
        monkeypatch.setattr(_etcd.Client, "two_in_turn", two_in_turn)
    with pytest.raises(KeyboardInterrupt):
        hostlock.Lock("deploy", fleet=etcd.url).acquire(timeout=30)
    monkeypatch.undo()
    assert etcd.etcdctl("lease", "list").stdout.split("\n", 1)[1].split() == []
    assert etcd.etcdctl("get", "--prefix", "hostlock/", "--keys-only").stdout.split() == []


def test_the_queue_transaction_follows_the_grants_answer_on_its_connection(etcd, monkeypatch):
    """A fresh process's uncontended acquire: the grant, its answer, then the queue transaction on the same
    connection, and its answer; Client.call sends neither. Never the transaction behind an unanswered grant:
    a grant that reached etcd late (after the command revoked its id) would take that transaction's key with
    it, a key nobody holds (Client.two_in_turn)."""
    order = []
    real_send, real_answer = _transport._Conn.send, _transport._Conn.answer

    def send(conn, request, timeout):
        order.append(request.split(b" ")[1])
        return real_send(conn, request, timeout)

    def answer(conn, end):
        order.append(b"answer")
        return real_answer(conn, end)

    monkeypatch.setattr(_transport._Conn, "send", send)
    monkeypatch.setattr(_transport._Conn, "answer", answer)
    lock = hostlock.Lock("deploy", fleet=etcd.url)
    lock.acquire(timeout=30)
    try:
        assert order[:4] == [b"/v3/lease/grant", b"answer", b"/v3/kv/txn", b"answer"]
        keys = etcd.etcdctl("get", "--prefix", "hostlock/deploy/", "--keys-only").stdout.split()
        assert keys == ["hostlock/deploy/%x" % lock._held.lease]
    finally:
        lock.release()
    assert etcd.etcdctl("lease", "list").stdout.split("\n", 1)[1].split() == []


@pytest.mark.parametrize("broken", [1, 2])
def test_a_connection_broken_after_a_request_falls_back_to_one_request_at_a_time(etcd, monkeypatch, broken):
    """The connection breaks as the grant's answer (1) or the queue's (2) is read, after etcd acted on the
    request: the grant is asked again for the same id (LEASE_EXISTS: that lease, our key with it,
    is revoked and another granted, as after any lost answer), or the queue transaction is sent again (its
    compare finds our key, its range reads the queue). Either way one key, on the lease we keep, and no lease
    left behind."""
    seen = []
    real_answer = _transport._Conn.answer

    def answer(self, end):
        seen.append(1)
        if len(seen) == broken:
            real_answer(self, end)  # etcd acted and answered; the answer is lost on the way
            raise ConnectionResetError("cut")
        return real_answer(self, end)

    monkeypatch.setattr(_transport._Conn, "answer", answer)
    lock = hostlock.Lock("deploy", fleet=etcd.url)
    lock.acquire(timeout=30)
    try:
        keys = etcd.etcdctl("get", "--prefix", "hostlock/deploy/", "--keys-only").stdout.split()
        assert keys == ["hostlock/deploy/%x" % lock._held.lease]
        listed = etcd.etcdctl("lease", "list").stdout.split("\n", 1)[1].split()
        assert [int(lid, 16) for lid in listed] == [lock._held.lease]
    finally:
        lock.release()
    assert etcd.etcdctl("lease", "list").stdout.split("\n", 1)[1].split() == []


def test_a_stopped_first_member_costs_the_grant_one_attempt_not_two(etcd_cluster, monkeypatch):
    """The URL's first member is stopped (SIGSTOP: it accepts connections and never answers): the grant
    written for two_in_turn() times out there, and the one-at-a-time path that follows asks the next member
    first, as call() does after a failure, instead of waiting on the stopped one a second time."""
    leader = etcd_cluster.leader()
    stopped = next(m for m in etcd_cluster.members if m is not leader)
    order = [stopped] + [m for m in etcd_cluster.members if m is not stopped]
    url = "etcd://" + ",".join(m.endpoint for m in order)
    opened = []
    real_open = _etcd.Client._open

    def _open(self, i, timeout):
        opened.append(i)
        return real_open(self, i, timeout)

    monkeypatch.setattr(_etcd.Client, "_open", _open)
    stopped.pause()
    try:
        lock = hostlock.Lock("deploy", fleet=url)
        lock.acquire(timeout=30)
        try:
            assert opened.count(0) == 1 and lock.locked, opened
        finally:
            lock.release()
    finally:
        stopped.resume()


def test_a_grant_answered_with_connection_close_still_starts_the_session(monkeypatch):
    """A member that ends the connection after the grant's answer (Connection: close): the lease is ours all the
    same (`between` runs: join starts its session), and the queue transaction is left to call() (None)."""
    from hostlock.fleet import url as _url

    grant = b'{"header":{"revision":"1"},"ID":"7","TTL":"10"}'  # every answer of etcd's gateway has a header
    a, b = socket.socketpair()

    def peer() -> None:
        with b:
            data = b""
            while b"\r\n\r\n" not in data:  # the grant: the second is written only once it is answered
                more = b.recv(4096)
                if not more:  # the client gave up before writing it: no answer (the assertion says what)
                    return
                data += more
            b.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(grant), grant))

    threading.Thread(target=peer, daemon=True).start()
    client = _etcd.Client(_url.parse("etcd://127.0.0.1:9"))
    monkeypatch.setattr(client, "_conn", lambda i, timeout: (_transport._Conn(a), False))
    started = []
    first, second = client.two_in_turn("lease/grant", {"ID": "7", "TTL": 10}, lambda: ("kv/txn", {}),
                                       time.monotonic() + 30, [], None, started.append)
    reply = {"header": {"revision": "1"}, "ID": "7", "TTL": "10"}
    assert (first, second, started) == (reply, None, [reply])
