"""Fleet locks on etcd: the lock recipes (etcd's concurrency.Mutex) and the Backend the engine dispatches to.
(The lease under them and its keep-alive thread: fleet/session.py; the queue's order and rule: fleet/queue.py;
what the keep-alive thread does: fleet/keepalive.py; a waiter's watching: fleet/waiting.py; the Backend's
status, break and leases: fleet/admin.py; the last three loaded only when used.)

Key layout (etcd's own concurrency.Mutex, so `etcdctl lock PREFIX/NAME` and hostlock exclude each other):
every holder or waiter of NAME is one key `<prefix><NAME>/<lease id hex>`, attached to one etcd lease per
acquisition, its value the owner record (core.owner.build_record, plus `slots`). Order is create_revision:

- exclusive (and etcdctl's empty value): holds when no key of NAME has a lower create_revision;
- shared: holds when no non-shared key has a lower create_revision (a waiting writer blocks later readers:
  no writer starvation);
- N slots: holds when fewer than N keys have a lower create_revision.

A waiter watches only what can admit it (never polls; `waits_on`): the deletion of one key ahead, or for the
first slot taker not admitted the deletion of any, or for the slot takers behind it the rewrite of the key
just ahead (a slot taker that waited puts its key again once it holds). Liveness is the lease
(fleet/session.py): its loss, or our key deleted or moved to another lease, is the lock's loss. The fence is
the key's create_revision: strictly increasing per name.
"""

from __future__ import annotations

import _signal

from ..core.errors import FleetConfigError, FleetUnavailable, HostlockError, LockLost
from ..core.names import check_duration
from ..core.signals import ENDING
from .b64 import b64
from .etcd import NOT_FOUND, Client, EtcdError, monotonic, prefix_end
from .queue import blockers, in_order
from .session import Claim, join

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from typing import Any, Callable, Optional

    from ..core.errors import LockTimeout
    from ..core.model import LockStatus, Meanwhile
    from .url import FleetURL

    Builder = Callable[[Optional[int], Optional[int]], bytes]


# How long a release (or a waiter that leaves) tries to revoke its lease, and how long each member gets: an
# election after a hung leader takes a second or two; etcd down altogether costs the release this long, after
# which the lease expires by itself (within the TTL).
REVOKE_WITHIN = 5.0
REVOKE_ATTEMPT = 1.0


class _LostPlace(Exception):
    """A waiter lost its place before it held (its lease or key gone): queue again while time remains,
    else raise `error`."""

    def __init__(self, error: HostlockError, unreachable: bool = False) -> None:
        super().__init__(str(error))
        self.error = error
        self.unreachable = unreachable  # lost because etcd did not answer for the lease's whole TTL


class EtcdHeld:
    """One acquisition: our key, our (shared) lease, our fence, and our claim on the lease's Session."""

    __slots__ = ("key", "lease", "fence", "session", "slot", "ticket", "value")

    def __init__(self, key: bytes, lease: int, fence: int, session: Claim, value: bytes = b"") -> None:
        self.key, self.lease, self.fence, self.session = key, lease, fence, session
        self.slot: int | None = None
        self.ticket: int | None = None
        self.value = value  # our record as we last wrote it: read back without a round trip


def _waiting() -> Any:
    """fleet.waiting: loaded by a waiter that must wait (a lock free at once never loads it)."""
    from . import waiting

    return waiting


class EtcdLocker:
    """The locker (see host.lockers) of one fleet lock name: acquire/release/records through etcd."""

    def __init__(self, backend: EtcdBackend, name: str, slots: int, ttl: float,
                 on_lost: Callable[[], object] | None) -> None:
        self.backend, self.client = backend, backend.client
        self.name, self.slots = name, slots
        self.ttl = check_duration(ttl, "ttl", positive=True)
        self.on_lost = on_lost
        self.prefix = backend.name_prefix(name)
        self.path = backend.url.display(name)

    def _net_deadline(self, deadline: float | None) -> float:
        # Without a caller's deadline, etcd unreachable for a whole TTL ends the wait: our lease is gone by then.
        return deadline if deadline is not None else monotonic() + self.ttl

    def acquire(self, mode: str, fifo: bool, deadline: float | None, record: Builder,
                meanwhile: Meanwhile | None = None) -> EtcdHeld | None:
        """Held (our key first in line for our mode, our record its value), or None once the deadline passed.

        A waiter that gives up or fails revokes its lease first (its key goes with it); if etcd cannot be
        reached, the lease expires by itself within the TTL. `fifo` is always honoured (create_revision order).
        A waiter that loses its place before it holds (its lease ended in an outage longer than the TTL, its
        key deleted, the lease gone between grant and put) queues again, on a new lease, while its time
        remains: a wait of D waits for D. `meanwhile` runs while the queue transaction (with our record, built
        before it: the record names nothing `meanwhile` starts; the Lock writes a record it changed once held) is
        on its way, or the lease's grant when the transaction goes alone later.
        """
        while True:
            try:
                return self._attempt(mode, deadline, record, meanwhile)
            except _LostPlace as e:
                # Without a deadline the wait ends once etcd has been unreachable for a TTL (_net_deadline):
                # a lease lost that way is that TTL, not a reason to queue again and wait one more.
                if (deadline is None and e.unreachable) or (deadline is not None and monotonic() >= deadline):
                    raise e.error from None

    def _attempt(self, mode: str, deadline: float | None, record: Builder,
                 meanwhile: Meanwhile | None = None) -> EtcdHeld | None:
        ids: list = []
        # on_lost is for holders: a waiter that loses its place raises instead (set once it holds, in _queue).
        claim = Claim()
        ok = False
        try:  # from before the grant: whatever ends this (a signal's exception too) takes our key with it
            built: list = []

            def queue(lease: int) -> tuple[str, dict]:
                built[:] = [record(None, None)]
                return "kv/txn", self._enqueue(self.prefix + b"%x" % lease, lease, built[0])

            session, queued = join(self.backend, self.prefix, self.ttl, self._net_deadline(deadline), claim, ids,
                                   meanwhile, queue)
            held = self._queue(mode, deadline, record, self.prefix + b"%x" % session.lease, session.lease, claim,
                               built[0] if queued is not None else None, queued)
            ok = held is not None
            return held
        except EtcdError as e:
            # etcd refused a request we do not expect it to refuse: a fleet failure (CLI 76), said once.
            raise FleetUnavailable("%s: %s" % (self.path, e), endpoints=self.backend.url.members) from None
        finally:
            if not ok:
                # A second signal must not cut this short (timeout(1) signals its command and then its process
                # group; Ctrl-C twice): held until our key is gone, then delivered.
                mask = _signal.pthread_sigmask(_signal.SIG_BLOCK, ENDING)
                try:
                    granted = claim.session is None
                    self._leave(claim, claim.name_key, 0)
                    if granted:
                        # Granted (or being granted) when interrupted, or asked for when etcd did not answer:
                        # the usual two seconds (MIN_TRY), not a release's five, for a lease never seen.
                        for lid in ids:
                            self._revoke(lid, within=0.0)
                finally:
                    _signal.pthread_sigmask(_signal.SIG_SETMASK, mask)

    def _leave(self, claim: Claim, key: bytes | None, fence: int) -> None:
        """Take our key out of etcd: revoke the lease when ours was its last claim, else delete the key alone
        (only while it is still ours: on our lease, and of create revision `fence` when known). If etcd
        cannot be reached, the key ends with the lease: within the TTL, or when this process releases."""
        session = claim.session
        last = claim.stop()
        if session is None:
            return
        if last:
            self._revoke(session.lease)
            return
        if key is None:
            return
        compare = [{"key": b64(key), "target": "LEASE", "lease": str(session.lease)}]
        if fence:
            compare.append({"key": b64(key), "target": "CREATE", "create_revision": str(fence)})
        try:
            self.client.call("kv/txn", {"compare": compare,
                                        "success": [{"request_delete_range": {"key": b64(key)}}]}, monotonic())
        except (EtcdError, FleetUnavailable):
            # Not deleted now, and the lease lives on for the process's other locks: the keep-alive thread
            # deletes it, trying again until it is gone (or the lease ends: the last release, or its loss).
            session.orphan(compare)

    def _range_all(self) -> dict:
        return {"key": b64(self.prefix), "range_end": b64(prefix_end(self.prefix)), "sort_target": "CREATE",
                "sort_order": "ASCEND"}

    def _enqueue(self, key: bytes, lease: int, value: bytes) -> dict:
        """The queue transaction: one round trip creates our key if it is not there yet and reads the queue.
        Retried after a lost answer, the compare fails (our key exists: the first try created it) and the range
        still answers."""
        rng = self._range_all()
        return {"compare": [{"key": b64(key), "target": "CREATE", "create_revision": "0"}],
                "success": [{"request_put": {"key": b64(key), "value": b64(value), "lease": str(lease)}},
                            {"request_range": rng}],
                "failure": [{"request_range": rng}]}

    def _queue(self, mode: str, deadline: float | None, record: Builder, key: bytes, lease: int,
               session: Claim, value: bytes | None = None, reply: dict | None = None) -> EtcdHeld | None:
        """Queue our key (`reply`: the queue transaction's answer when it was sent already, with `value` the
        record it wrote) and wait until it holds."""
        c = self.client
        rng = self._range_all()
        try:
            if reply is None or value is None:
                value = record(None, None)
                reply = c.call("kv/txn", self._enqueue(key, lease, value), self._net_deadline(deadline))
        except EtcdError as e:
            if e.code != NOT_FOUND:
                raise
            # "requested lease not found": the lease ended between its grant and this put (an outage, a
            # paused process). Nothing of ours is in the queue: queue again on a new lease (and so does every
            # other lock of this process that was on it: the lease is lost for all).
            if session.session is not None:
                session.session._lose_all("etcd says our lease %x is gone" % lease)
            raise _LostPlace(FleetUnavailable("the lease for %s ended before our key was written (%s)"
                                              % (self.path, e), endpoints=self.backend.url.members)) from None
        waited = False
        while True:
            rev = int((reply.get("header") or {}).get("revision") or 0)
            responses = reply.get("responses") or [{}]
            kvs = (responses[-1].get("response_range") or {}).get("kvs") if "responses" in reply else reply.get("kvs")
            entries = in_order(kvs)
            idx = next((k for k, e in enumerate(entries) if e.key == key), None)
            if idx is None:
                raise self._gone(session, "our place in the queue of %s vanished while waiting" % self.path)
            me = entries[idx]
            if session.key is None:
                session.watch_key(key, me.rev)
            blocked = bool(blockers(entries, idx))
            waited = waited or blocked
            if not blocked or _waiting().wait(self, entries[:idx], me, rev, deadline, session):
                session.on_lost = self.on_lost  # first, then the check: a loss from here on is reported
                if session.lost:
                    raise self._gone(session, "lost %s while taking it" % self.path)
                if waited and me.slots > 1:
                    _waiting().rewrite(self.client, key, me.rev)
                held = EtcdHeld(key, lease, me.rev, session, value)
                if waited:
                    # The record was built when we queued: status's SINCE (`at`) must say when we took the lock.
                    # Written by the keep-alive thread 0.1 s on (not at all for a shorter hold), never on the
                    # handoff's path; what the caller rewrites meanwhile starts from it (read_record).
                    held.value = record(None, None)
                    session.record_later(held, held.value)
                return held
            if deadline is not None and monotonic() >= deadline:
                return None
            reply = c.call("kv/range", rng, self._net_deadline(deadline))

    def _gone(self, session: Claim, what: str) -> _LostPlace:
        why = session.why or "our key was deleted"
        if session.unavailable:
            return _LostPlace(FleetUnavailable("%s: %s" % (what, why), endpoints=self.backend.url.members),
                              unreachable=True)
        return _LostPlace(LockLost("%s: %s" % (what, why)))

    def _revoke(self, lease: int, within: float = REVOKE_WITHIN) -> None:
        """Revoke our lease, each member asked for REVOKE_ATTEMPT in turn, for REVOKE_WITHIN: a follower whose
        leader hangs holds a forwarded request some 6 s, while the others elect a new leader within a second
        or two. With one long attempt the revoke was dropped, and the next holder waited for the lease's whole
        TTL. A revoke abandoned on one member and done on another is harmless: the second finds no lease.
        Every member refusing connections ends it at once (no etcd runs to wait for), and so does a setting
        that cannot work: a cleanup never replaces the error that made it."""
        try:
            self.client.call("lease/revoke", {"ID": str(lease)}, monotonic() + within, attempt=REVOKE_ATTEMPT,
                             refused_ends=True)
        except EtcdError:
            pass  # already gone
        except (FleetUnavailable, FleetConfigError):
            pass  # unreachable: the lease expires by itself within its TTL

    def release(self, held: EtcdHeld) -> None:
        """Our key is deleted (the lease revoked, if no other lock of this process is on it) when this returns;
        if etcd cannot be reached, it expires within the TTL. Never raises for a lock already lost."""
        self._leave(held.session, held.key, held.fence)

    def write_record(self, held: EtcdHeld, data: bytes, defer: bool = False) -> None:
        """Replace our record, only while the key is still ours (same create_revision). `defer`: the keep-alive
        thread writes it KEY_WATCH_DELAY later, and not at all if the lock is released (or the record written
        again) first, so that a lock held that briefly costs no second round trip (`hostlock run`'s job's pid);
        a key found gone then is the claim's loss (on_lost), as the thread's watch of it would find."""
        claim = held.session
        if defer:
            claim.record_later(held, data)
            return
        with claim.writing:
            with claim._mutex:
                claim.later = None  # this one is newer
            from .keepalive import record_request

            reply = self.client.call("kv/txn", record_request(held, data), monotonic() + self.ttl)
        if not reply.get("succeeded"):
            raise LockLost("lost %s: our key is gone" % self.path)
        held.value = data

    def read_record(self, held: EtcdHeld) -> bytes:
        """Our record as we wrote it (only we write our key while it is ours: no round trip to read it back)."""
        return held.value

    def descriptors(self, held: EtcdHeld) -> list:
        """None: a fleet lock lives in etcd, not in an open file description."""
        return []

    def forget(self, held: EtcdHeld | None) -> None:
        """In a forked child: never renew, release or revoke the parent's lease."""
        if held is not None:
            held.session.forget()
        self.client = self.backend.forked()

    def close(self) -> None:
        pass


class EtcdBackend:
    """The fleet Backend on etcd (see fleet.url.Backend): one client (its connections) per fleet URL."""

    def __init__(self, url: FleetURL, client: Client | None = None) -> None:
        self.url = url
        self.client = client or Client(url)

    def forked(self) -> Client:
        self.client.forget()
        return self.client

    def name_prefix(self, name: str) -> bytes:
        return (self.url.prefix + name + "/").encode("utf-8")

    def locker(self, name: str, slots: int, ttl: float, on_lost: Callable[[], object] | None) -> EtcdLocker:
        return EtcdLocker(self, name, slots, ttl, on_lost)

    # -- the rest of the Backend: fleet/admin.py, loaded when asked (a lock taken and released never is) ------
    def status(self, name: str) -> LockStatus:
        from . import admin

        return admin.status(self, name)

    def busy(self, name: str, timeout: float | None) -> LockTimeout:
        from . import admin

        return admin.busy(self, name, timeout)

    def list_locks(self) -> list:
        from . import admin

        return admin.list_locks(self)

    def break_lock(self, name: str, force: bool) -> list:
        from . import admin

        return admin.break_lock(self, name, force)

    def hold(self, name: str, lease: float, mode: str = "exclusive", slots: int = 1, label: str | None = None,
             timeout: float | None = None) -> str:
        from . import admin

        return admin.hold(self, name, lease, mode, slots, label, timeout)

    def renew(self, name: str, token: str, lease: float | None = None) -> float:
        from . import admin

        return admin.renew(self, name, token, lease)

    def release(self, name: str, token: str) -> None:
        from . import admin

        admin.release(self, name, token)
