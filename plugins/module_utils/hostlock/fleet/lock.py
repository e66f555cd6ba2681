"""Fleet locks on etcd: the lock recipes, the leases and their keep-alive thread, and the Backend the engine
dispatches to. (The queue's order and rule: fleet/queue.py; what the keep-alive thread does: fleet/keepalive.py;
a waiter's watching: fleet/waiting.py; the Backend's status, break and leases: fleet/admin.py; all but the
first loaded only when used.)

Key layout (etcd's own concurrency.Mutex, so `etcdctl lock PREFIX/NAME` and hostlock exclude each other):
every holder or waiter of NAME is one key `<prefix><NAME>/<lease id hex>`, attached to one etcd lease per
acquisition, its value the owner record (core.owner.build_record, plus `slots`). Order is create_revision:

- exclusive (and etcdctl's empty value): holds when no key of NAME has a lower create_revision;
- shared: holds when no non-shared key has a lower create_revision (a waiting writer blocks later readers:
  no writer starvation);
- N slots: holds when fewer than N keys have a lower create_revision.

A waiter watches only what can admit it (never polls; `waits_on`): the deletion of one key ahead, or for the
first slot taker not admitted the deletion of any, or for the slot takers behind it the rewrite of the key
just ahead (a slot taker that waited puts its key again once it holds). Liveness is the lease: a keep-alive
thread renews it every TTL/3 and declares the lock lost at the last successful keep-alive send + TTL (minus a
margin), on CLOCK_BOOTTIME so a process stopped and resumed (or a suspended machine) counts the time it did
not run; a keep-alive answer with TTL 0, or our key deleted or moved to another lease
(a watch on it), is a loss too. The fence is the key's create_revision: strictly increasing per name.
"""

from __future__ import annotations

import _signal
import _thread
import time

from ..core import forks
from ..core import oslite as os
from ..core.clock import boottime
from ..core.errors import FleetConfigError, FleetUnavailable, HostlockError, LockLost
from ..core.names import check_duration
from ..core.signals import ENDING
from .b64 import b64
from .etcd import NOT_FOUND, Client, EtcdError, monotonic, prefix_end
from .grant import grant, grant_body, lease_id
from .grant import take as take_early
from .queue import blockers, in_order

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from typing import Any, Callable, Optional

    from ..core.errors import LockTimeout
    from ..core.model import LockStatus, Meanwhile
    from .url import FleetURL

    Builder = Callable[[Optional[int], Optional[int]], bytes]

# A holder's watch on its own key opens this long after the key was made, from the revision after its
# creation, so a deletion in between still arrives: a short job (`hostlock run NAME true`) ends before the
# thread does any work that competes with its start, and a deleted key is known at most this much later.
# Until the queue's answer names the key, the thread looks every KEY_WATCH_DELAY: no wake-up when it comes.
# A record written with defer (write_record: `hostlock run`'s job's pid) waits as long, for the same reason.
KEY_WATCH_DELAY = 0.1


# How long a release (or a waiter that leaves) tries to revoke its lease, and how long each member gets: an
# election after a hung leader takes a second or two; etcd down altogether costs the release this long, after
# which the lease expires by itself (within the TTL).
REVOKE_WITHIN = 5.0
REVOKE_ATTEMPT = 1.0


def _margin(ttl: float) -> float:
    """Declare the lease lost this long before etcd could: scheduling delays, clock-rate differences."""
    return min(1.0, ttl * 0.1)


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


class Claim:
    """One key of this process on a Session's lease: what a waiter or holder sees of it. Lost when the lease is
    lost (every claim on it then), or when its own key is deleted or moved to another lease (this one alone)."""

    def __init__(self) -> None:
        self.session: Session | None = None
        self.on_lost: Callable[[], object] | None = None
        self.key: bytes | None = None  # our key once it is in etcd (watch_key)
        self.name_key: bytes | None = None  # the key we would have on the session's lease: one claim per key
        self.why: str | None = None
        self.unavailable = False
        self._from = 0  # the first watch of our key starts right after its creation: every change arrives
        self.watch_at = 0.0  # boottime from which the thread opens that watch
        self.later: tuple | None = None  # (held, record, boottime due): a record the thread writes (write_record)
        self.writing = _thread.allocate_lock()  # held while our record is written: one write at a time, in order
        self._lost = False
        self._ended = False
        self._mutex = _thread.allocate_lock()
        self.lost_r, self._lost_w = os.pipe()  # readable once lost: wakes a waiter's watch
        os.set_blocking(self._lost_w, False)

    @property
    def lease(self) -> int:
        return self.session.lease if self.session is not None else 0

    @property
    def expires(self) -> float:
        """boottime at which we must consider the lease gone (etcd's own expiry is later than this)."""
        return self.session.expires if self.session is not None else 0.0

    @property
    def lost(self) -> bool:
        """Lost as the keep-alive thread knows it, or by the lease's clock alone: after a pause (SIGSTOP,
        suspend) the holder must know before the thread has run again. No side effect but the reason."""
        if self._lost:
            return True
        s = self.session
        if s is not None and not self._ended and s.lost:
            if self.why is None:
                self.why, self.unavailable = s.why, s.unavailable
            return True
        return False

    def watch_key(self, key: bytes, created: int) -> None:
        """Also watch our own key (made at revision `created`): deleted or moved to another lease means lost."""
        self._from, self.key = created + 1, key
        self.watch_at = boottime() + KEY_WATCH_DELAY  # no _poke(): the thread looks by then (Session._loop)

    def record_later(self, held: EtcdHeld, data: bytes) -> None:
        """Have the keep-alive thread write `data` as our record KEY_WATCH_DELAY from now, unless released (or
        rewritten) first: a lock held for less than that costs no second write (EtcdLocker.write_record)."""
        with self._mutex:
            self.later = (held, data, boottime() + KEY_WATCH_DELAY)
        if self.session is not None:
            self.session._poke()  # a thread asleep until the next keep-alive looks again now

    def key_deleted(self) -> None:
        """Lost: etcd says our key is gone (a watch's DELETE, a read that finds none, a rewrite's compare)."""
        key = (self.key or b"").decode("utf-8", "replace")
        self._lose("our key %s was deleted (revoked, broken, or expired)" % key)

    def _lose(self, why: str, unavailable: bool = False) -> None:
        with self._mutex:
            if self._lost or self._ended:
                return
            self._lost = True
            if self.why is None:
                self.why, self.unavailable = why, unavailable
            try:
                os.write(self._lost_w, b"x")
            except OSError:  # EAGAIN: already readable
                pass
        if self.on_lost is not None:
            try:
                self.on_lost()
            except Exception:  # noqa: BLE001 - a callback's bug must not kill the keep-alive thread silently
                import traceback

                traceback.print_exc()

    def stop(self) -> bool:
        """Leave the lease: no on_lost after this. True when this was the last claim on it (the lease is no
        longer kept alive: the caller revokes it); False when others remain (the caller deletes its own key)
        or when it was left already. Not joined: release() never waits for the thread."""
        with self._mutex:
            if self._ended:
                return False
            self._ended = True
            fds, self._lost_w = (self.lost_r, self._lost_w), -1
            self.lost_r = -1
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass
        return self.session.detach(self) if self.session is not None else False

    def forget(self) -> None:
        """In a forked child: the thread is not there; never renew or revoke the parent's lease."""
        self._mutex = _thread.allocate_lock()
        if self.session is not None:
            self.session.forget()
        self.stop()


class Session:
    """One etcd lease of this process and the thread keeping it alive, shared by every fleet lock the process
    takes on one cluster with one TTL (etcd's concurrency.Session): one grant, one keep-alive for all of them.
    The thread also watches each claim's key. The lease's loss (etcd says it is gone, or no keep-alive answered
    within the TTL, known by the clock even before the thread runs) is every claim's loss."""

    def __init__(self, client: Client, lease: int, ttl: float, sent: float, first: Claim,
                 shared: tuple | None) -> None:
        self.client, self.lease, self.ttl = client, lease, ttl
        self.ok_at = sent  # boottime when the last successful grant/keep-alive was SENT
        self.shared = shared  # its key in _SESSIONS (None: a private lease)
        self.why: str | None = None
        self.unavailable = False
        self._mutex = _thread.allocate_lock()
        self.claims: list = [first]
        first.session, first.name_key = self, None
        self.orphans: list = []  # compares of keys released but not yet deleted (etcd did not answer)
        self._stopped = False
        self._exited = False
        self._sleeping = True  # the thread's first sleep (_loop): until it ends, detach closes the descriptors
        self._lost = False
        self._stop_r, self._stop_w = os.pipe()
        for fd in (self._stop_r, self._stop_w):
            os.set_blocking(fd, False)  # draining must never block; a full pipe is already "poked"
        self._fds: tuple = (self._stop_r, self._stop_w)
        # Started with every signal blocked (a thread inherits its creator's mask): the kernel gives a
        # process-directed signal to any thread that does not block it, and this one must never take it.
        # `hostlock run` blocks what it forwards to its job in its main thread and collects it with
        # sigtimedwait(); landing here, a SIGTERM would run its default action and kill hostlock instead.
        old = _signal.pthread_sigmask(_signal.SIG_BLOCK, _signal.valid_signals())
        try:
            # _thread, not threading: `import threading` is ~2.5 ms of a ~20 ms `hostlock run --fleet`. Like a
            # daemon thread, it ends with the interpreter; the CLI exits with os._exit once released anyway.
            _thread.start_new_thread(self._run, ())
        finally:
            _signal.pthread_sigmask(_signal.SIG_SETMASK, old)

    @property
    def expires(self) -> float:
        """boottime at which we must consider the lease gone (etcd's own expiry is later than this)."""
        return self.ok_at + self.ttl - _margin(self.ttl)

    @property
    def lost(self) -> bool:
        if self._lost:
            return True
        if not self._stopped and boottime() >= self.expires:
            if self.why is None:
                self.why = "no keep-alive was answered within the lease's TTL (%gs)" % self.ttl
                self.unavailable = True
            return True
        return False

    @property
    def thread_has_fds(self) -> bool:
        """Whether the keep-alive thread may be using the session's descriptors: not before its first sleep
        ends (_loop), nor once it exited. Otherwise a stop leaves closing them to the thread."""
        return not (self._exited or self._sleeping)

    def attach(self, claim: Claim, key: bytes) -> bool:
        """Add `claim`, whose key on this lease would be `key`; False when the lease is ending or another
        claim of this process has that key already (the same name twice: that one takes a lease of its own)."""
        with self._mutex:
            if self._stopped or self._lost or self.lost or any(c.name_key == key for c in self.claims):
                return False
            claim.session, claim.name_key = self, key
            self.claims.append(claim)
            return True

    def detach(self, claim: Claim) -> bool:
        """Remove `claim`; True when it was the last: the lease is kept alive no more (the caller revokes it)."""
        with self._mutex:
            if claim in self.claims:
                self.claims.remove(claim)
            last = not self.claims and not self._stopped
            if last:
                self._stopped = True
                _unregister(self)
            idle = not self.thread_has_fds
        self._poke()  # the thread closes that claim's watch, or ends
        if last and idle:
            self._close_fds()
        return last

    def orphan(self, compare: list) -> None:
        """A released key that could not be deleted (compare: its key on our lease, of its create revision):
        the thread deletes it, so the lock is not held by a key nobody holds while other locks keep the lease."""
        with self._mutex:
            self.orphans.append(compare)
        self._poke()

    def _poke(self) -> None:
        with self._mutex:  # never after _close_fds: the number could name someone else's file by then
            if self._fds:
                try:
                    os.write(self._stop_w, b"x")
                except OSError:  # EAGAIN: already poked
                    pass

    def _lose_all(self, why: str, unavailable: bool = False) -> None:
        with self._mutex:
            if self._lost or self._stopped:
                return
            self._lost = True
            if self.why is None:
                self.why, self.unavailable = why, unavailable
            claims = list(self.claims)
            _unregister(self)
        for claim in claims:
            claim._lose(why, unavailable)

    def _close_fds(self) -> None:
        with self._mutex:  # once: a descriptor number closed twice could be someone else's by then
            fds, self._fds = self._fds, ()
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass

    def forget(self) -> None:
        """In a forked child: the thread is not there; never renew or revoke the parent's lease."""
        self._stopped = True
        self._mutex = _thread.allocate_lock()
        self.claims = []
        self._close_fds()

    def _drain(self) -> None:
        try:
            os.read(self._stop_r, 512)
        except OSError:  # EAGAIN: nothing to drain
            pass

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as e:  # noqa: BLE001 - a bug here must not leave a holder believing it holds
            self._lose_all("the keep-alive thread failed: %r" % (e,))
            raise

    def _loop(self) -> None:
        interval = max(0.1, self.ttl / 3.0)
        # Nothing is due sooner (the first keep-alive comes after `interval`, a key's watch after KEY_WATCH_DELAY;
        # a stop is seen on waking). Sleeping first keeps this thread's first pass, the loading of its code
        # (fleet/keepalive.py) and of `select` (a shared library on many builds) off the start of a short job:
        # they ran while the main thread read the queue's answer and opened the job's gate, on a core of two
        # (with the job's process and etcd), and held the GIL (~0.3 ms of a `hostlock run --fleet URL NAME
        # true`); a job shorter than that never loads them. Meanwhile the thread touches none of the session's
        # descriptors: a stop closes them at once (detach), not when this wakes.
        try:
            time.sleep(min(KEY_WATCH_DELAY, interval))
            with self._mutex:  # from here on detach leaves the descriptors to us
                self._sleeping = False
                if self._stopped or self._lost:  # released (or lost) meanwhile: nothing to load
                    return
            from .keepalive import upkeep

            upkeep(self, interval, KEY_WATCH_DELAY)
        finally:
            with self._mutex:
                self._exited = True
                stopped = self._stopped
            if stopped:
                self._close_fds()


# This process's shared leases: (cluster, credentials, TTL) -> Session. A forked child starts with none.
_SESSIONS: dict = {}
_SESSIONS_MUTEX = _thread.allocate_lock()


def _unregister(session: Session) -> None:
    """Called with session._mutex held: the next acquisition grants a new lease (this one ends or is lost)."""
    if session.shared is not None and _SESSIONS.get(session.shared) is session:
        del _SESSIONS[session.shared]


def _forget_sessions() -> None:
    global _SESSIONS_MUTEX
    _SESSIONS_MUTEX = _thread.allocate_lock()
    for session in list(_SESSIONS.values()):
        session.forget()
    _SESSIONS.clear()


forks.in_child(_forget_sessions)


def join(backend: EtcdBackend, prefix: bytes, ttl: float, deadline: float, claim: Claim, ids: list,
         meanwhile: Meanwhile | None = None,
         queue: Callable[[int], tuple[str, dict]] | None = None) -> tuple[Session, dict | None]:
    """Put `claim` on this process's lease for `backend`'s cluster and `ttl`, granting one when there is none
    (or when this process already has a key of that lock name on it: then a lease of its own). Sets
    claim.session and claim.name_key, and returns the session; a grant's id is in `ids` before it is asked for.
    `meanwhile` runs while the grant is on its way (with `queue`: while the queue transaction is; not at all when
    the lease is there already).

    `queue(lease id)`: the request (path, body) that puts our key on the lease. When a grant is needed, it is
    written on the grant's connection once etcd has answered the grant (Client.two_in_turn: never behind an
    unanswered grant, which could reach etcd after we are gone), and its reply is returned with the session.
    The command line's grant was sent early (grant.send_early), so its answer is there by then. None in its
    place: the caller sends it (the lease was there already, or two_in_turn did not succeed: then the grant,
    too, went the one-request-at-a-time way, asking again for the same id)."""
    url = backend.url
    shared = (url.scheme, tuple(url.endpoints), url.user, url.password, url.cacert, url.cert, url.key, ttl)
    with _SESSIONS_MUTEX:
        session = _SESSIONS.get(shared)
        if session is not None and session.attach(claim, prefix + b"%x" % session.lease):
            return session, None
        private = session is not None and not session.lost and not session._stopped
        sent: list = []
        made: list = []

        def start(reply: dict) -> None:
            # The keep-alive thread starts as soon as the lease is known: while the queue's answer is on its way.
            lease = int(reply["ID"])
            made.append(Session(backend.client, lease, float(reply.get("TTL") or ttl), sent[0], claim,
                                None if private else shared))
            claim.name_key = prefix + b"%x" % lease
            if not private:
                _SESSIONS[shared] = made[0]

        # Granted with the registry locked: two threads starting at once share one lease, not two.
        queued = None
        early = take_early(backend.client, ttl)  # the command's grant, on its way already (send_early)
        if queue is None:
            if early is not None:
                early.pending.abandon()  # nothing to write behind it: asked again (grant() revokes it if etcd made it)
                ids.append(early.lid)
            start(grant(backend.client, ttl, deadline, ids, sent, meanwhile,
                        lid=None if early is None else early.lid))
        else:
            lid = lease_id() if early is None else early.lid
            ids.append(lid)
            if early is not None:
                sent[:] = [early.sent]
            reply, queued = backend.client.two_in_turn("lease/grant", grant_body(ttl, lid), lambda: queue(lid),
                                                       deadline, sent, meanwhile, start,
                                                       None if early is None else early.pending)
            if reply is None:
                start(grant(backend.client, ttl, deadline, ids, sent, meanwhile, lid=lid))
        return made[0], queued


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
