"""A fleet lock's liveness: one etcd lease per process and cluster and TTL, shared by every lock the process
takes there, and the thread that keeps it alive (etcd's concurrency.Session; the locks on it are fleet/lock.py's
mutex, as mutex.go beside session.go). What the thread does, once its first sleep ends: fleet/keepalive.py.

Liveness is the lease: the keep-alive thread renews it every TTL/3 and declares it lost at the last successful
keep-alive send + TTL (minus a margin), on CLOCK_BOOTTIME so a process stopped and resumed (or a suspended
machine) counts the time it did not run; a keep-alive answer with TTL 0 is a loss too. Each lock is a `Claim`
on the session: lost with the lease (every claim on it), or alone when its own key is deleted or moved to
another lease (a watch on it).
"""

from __future__ import annotations

import _signal
import _thread
import time

from ..core import forks
from ..core import oslite as os
from ..core.clock import boottime
from .grant import grant, grant_body, lease_id
from .grant import take as take_early

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from typing import Any, Callable

    from ..core.model import Meanwhile
    from .etcd import Client

    # fleet.lock's EtcdBackend and EtcdHeld as used here (named, not imported: fleet.lock imports this module)
    Backend = Any
    Held = Any

# A holder's watch on its own key opens this long after the key was made, from the revision after its
# creation, so a deletion in between still arrives: a short job (`hostlock run NAME true`) ends before the
# thread does any work that competes with its start, and a deleted key is known at most this much later.
# Until the queue's answer names the key, the thread looks every KEY_WATCH_DELAY: no wake-up when it comes.
# A record written with defer (write_record: `hostlock run`'s job's pid) waits as long, for the same reason.
KEY_WATCH_DELAY = 0.1


def _margin(ttl: float) -> float:
    """Declare the lease lost this long before etcd could: scheduling delays, clock-rate differences."""
    return min(1.0, ttl * 0.1)


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

    def record_later(self, held: Held, data: bytes) -> None:
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


def join(backend: Backend, prefix: bytes, ttl: float, deadline: float, claim: Claim, ids: list,
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
