"""A waiter's lease that ends between its grant and the put of its key (issue 24 item 7: was exit 65,
"requested lease not found") is retried within the wait: the waiter queues again on a new lease. And the
rule of which key a waiter watches (a release wakes only the waiter it admits) beside `blockers`.

The lease is really revoked in etcd, by etcdctl, in the instant between the grant and the put (a hook on the
client's grant answer), as an outage or a paused process would have let it expire.
"""

from __future__ import annotations

import pytest

import hostlock
from hostlock.fleet import lock as _etcd_lock


def test_a_lease_gone_between_grant_and_put_is_granted_again(etcd, monkeypatch):
    revoked = []
    real_call = _etcd_lock.Client.call

    def call(self, path, body, deadline, *a, **kw):
        reply = real_call(self, path, body, deadline, *a, **kw)
        if path == "lease/grant" and not revoked:
            revoked.append(int(reply["ID"]))
            assert etcd.etcdctl("lease", "revoke", "%x" % revoked[0]).returncode == 0
        return reply

    monkeypatch.setattr(_etcd_lock.Client, "call", call)
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
    got, rewritten = _etcd_lock.waits_on(queue, len(queue) - 1)
    assert (got.key if got is not None else None, rewritten) == watched


@pytest.mark.parametrize("after", ["lease/grant", "kv/txn", "lease/revoke"])
def test_a_hold_interrupted_before_its_token_is_returned_leaves_no_lease(etcd, monkeypatch, after):
    """hold() interrupted (a signal's exception: `hostlock hold` unwinds on SIGTERM) while it moves its key
    onto the --lease lease: after the grant of that lease, after the move, or during the old lease's revoke.
    Nobody has the token, so nothing may stay: neither lease, nor the key (it would hold the lock 5 min)."""
    calls = []
    real_call = _etcd_lock.Client.call

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


def test_a_waiter_interrupted_as_its_grant_is_answered_leaves_no_lease(etcd, monkeypatch):
    """The grant's answer arrives and the signal's exception comes before the caller has read the lease's id:
    the id was chosen before the request (_etcd_lock.grant), so the unwinding wait still revokes it."""
    real_call = _etcd_lock.Client.call

    def call(self, path, body, deadline, *a, **kw):
        reply = real_call(self, path, body, deadline, *a, **kw)
        if path == "lease/grant":
            raise KeyboardInterrupt
        return reply

    monkeypatch.setattr(_etcd_lock.Client, "call", call)
    with pytest.raises(KeyboardInterrupt):
        hostlock.Lock("deploy", fleet=etcd.url).acquire(timeout=30)
    monkeypatch.undo()
    assert etcd.etcdctl("lease", "list").stdout.split("\n", 1)[1].split() == []
