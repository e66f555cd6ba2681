"""The policy layer: names, directories, timeouts, re-entrancy, threads, fork; mechanisms do the locking.

A Lock picks one locker when it is made (host.lockers: kernel ranges or owner files; or its fleet Backend's
etcd queue) and holds at most one acquisition at a time. Timeouts, re-entrancy within a thread, exclusion
between threads of one process and fork safety live here, once, for every mechanism.
"""

from __future__ import annotations

import _thread
import time
from _weakref import ref

from .core import forks
from .core import oslite as os
from .core.errors import HostlockError, LockLost, LockTimeout, MechanismError
from .core.model import FLEET_TTL, MECHANISM_CHOICES, MODES, LockStatus, fleet_backend
from .core.names import MAX_SLOTS, check_duration, validate_name
from .core.owner import _Self, build_record, parse_record, record_prefix

# The host mechanisms are imported here, with the policy, not where a host lock first needs them: a process
# that imports hostlock and then drops its privileges (setuid to a user who cannot read the interpreter's
# stdlib under /root, or the engine's files), or whose engine is upgraded under it, must still take host
# locks with the code it imported (tests/integration/engine/test_hostile.py, test_directories.py). Not when
# the engine comes from the command's bundle (cli/bundle.py): its code comes from a file it holds open since
# the start, so the functions below import the mechanisms when a host lock needs them, and `hostlock run
# --fleet` never loads them (about 1.5 ms of its start).
if not getattr(getattr(globals().get("__spec__"), "loader", None), "PINNED", False):
    from .host import directory as _host_directory  # noqa: F401 - loaded with the policy (see above)
    from .host import kernel as _host_kernel  # noqa: F401
    from .host import lockers as _host_lockers  # noqa: F401

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from typing import Callable

    from .core.model import Held, Locker

_LIVE: dict = {}  # id -> weakref of every Lock, so a forked child can drop its copies


def _after_fork_in_child() -> None:
    """A child must never unlock (or keep) its parent's locks (filelock #634): close, don't unlock."""
    for r in list(_LIVE.values()):
        lock = r()
        if lock is not None:
            lock._forget()


forks.in_child(_after_fork_in_child)


class _Once:
    """A Lock.acquire's `meanwhile`, run at most once. Run by a locker (`overlapped`), from inside its I/O, an
    Exception is kept for acquire to raise once the lock is released again: in a client's network code it
    would pass for a failure of the network (an OSError of a fork, say)."""

    __slots__ = ("fn", "error")

    def __init__(self, fn: Callable[[], object]) -> None:
        self.fn: Callable[[], object] | None = fn
        self.error: Exception | None = None

    def overlapped(self) -> None:
        fn, self.fn = self.fn, None
        if fn is not None:
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - raised by run(), outside the locker
                self.error = e

    def run(self) -> None:
        """Run what no locker ran; raise what it raised."""
        fn, self.fn = self.fn, None
        if fn is not None:
            fn()
        if self.error is not None:
            raise self.error


def _track(lock: Lock) -> None:
    key = id(lock)
    _LIVE[key] = ref(lock, lambda _r: _LIVE.pop(key, None))


class Lock:
    """An exclusive or shared lock, or an N-slot semaphore, on one name in one lock directory, or with
    `fleet=URL` in an etcd cluster shared by many hosts (ttl: the etcd lease's seconds; on_lost: called once,
    from the keep-alive thread, when a held fleet lock is known lost)."""

    def __init__(self, name: str, *, mode: str = "exclusive", slots: int = 1, directory: str | None = None,
                 mechanism: str = "auto", label: str | None = None, fifo: bool = True, fleet: str | None = None,
                 ttl: float = FLEET_TTL, on_lost: Callable[[], object] | None = None) -> None:
        self.name = validate_name(name)
        if mode not in MODES:
            raise ValueError("mode must be 'exclusive' or 'shared', not %r" % (mode,))
        if not isinstance(slots, int) or isinstance(slots, bool) or not 1 <= slots <= MAX_SLOTS:
            raise ValueError("slots must be a whole number from 1 to %d, not %r" % (MAX_SLOTS, slots))
        if slots > 1 and mode != "exclusive":
            raise ValueError("a semaphore (slots > 1) takes its slots exclusively: use mode='exclusive'")
        if mechanism not in MECHANISM_CHOICES:
            raise ValueError("mechanism must be %s, not %r" % (", ".join(MECHANISM_CHOICES), mechanism))
        self.mode = mode
        self.slots = slots
        self.fifo = bool(fifo)
        self._extra: dict = {"label": label} if label else {}
        self._prefix = b""
        self._prefix_pid = -1  # the cached record prefix belongs to this pid (changes after fork)
        self._mutex = _thread.allocate_lock()
        self._thread: int | None = None
        self._count = 0
        self._held: Held | None = None
        self._locker: Locker
        self.fleet = fleet or None
        if self.fleet is not None:
            if directory is not None or mechanism != "auto":
                raise ValueError("a fleet lock lives in etcd: give fleet= without directory= or mechanism=")
            # The one dispatch on `fleet`: the backend (etcd) supplies the locker; no lock directory is touched.
            backend = fleet_backend(self.fleet)
            self._extra["slots"] = slots
            self.mechanism = "etcd"
            self.directory = backend.url.display()
            self._locker = backend.locker(self.name, slots, ttl, on_lost)
            self.path = self._locker.path
            _track(self)
            return
        import posixpath

        from .host import kernel as _kernel
        from .host.directory import default_directory, directory_mechanism, open_directory
        from .host.lockers import locker

        self.directory = posixpath.abspath(directory or default_directory())
        dirfd, shared_dir = open_directory(self.directory)
        try:
            self.mechanism = directory_mechanism(dirfd, self.directory, mechanism, _kernel.probe)
            if self.mechanism == "ofd" and not _kernel.HAS_OFD:
                raise MechanismError("lock directory %s uses OFD locks, which this platform lacks"
                                     % self.directory, directory=self.directory)
        finally:
            os.close(dirfd)
        self._locker = locker(self.mechanism, self.directory, self.name, slots, shared_dir)
        self.path = self._locker.path
        _track(self)

    # -- public API ------------------------------------------------------------------------------------
    @property
    def locked(self) -> bool:
        """True while this object (in this process) holds the lock."""
        return self._held is not None

    def acquire(self, timeout: float | None = None, meanwhile: Callable[[], object] | None = None) -> Lock:
        """Take the lock; None waits forever, 0 tries once. Re-entrant in the holding thread.

        `meanwhile()`, if given, has run once when this returns: a fleet lock runs it once its requests are on
        their way to etcd (the queue transaction, once etcd answered the lease's grant), so work that needs no
        lock yet overlaps their round trip instead of following it (`hostlock run --fleet` forks its job there,
        held at its gate); a host lock first. What it tells update_record() is in the record once the lock is
        held: for a host lock, the record the lock is taken with; for a fleet lock, written right after (the
        key's record went with the queue transaction, before `meanwhile` ran) unless it was built after
        `meanwhile` anyway. If it raises, acquire raises that, the lock not held; if the lock is not taken, it
        may have run or not.
        """
        if timeout is not None:
            timeout = check_duration(timeout, "timeout")  # None waits forever; past MAX_DURATION is refused
        once = _Once(meanwhile) if meanwhile is not None else None
        me = _thread.get_ident()
        if self._held is not None and self._thread == me:
            if once is not None:
                once.run()
            self._count += 1
            return self
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._mutex.acquire(True, -1 if deadline is None else max(0.0, deadline - time.monotonic())):
            raise self._timeout(timeout)
        try:
            held = self._acquire(deadline, once)
            if held is not None and once is not None:
                try:
                    once.run()  # what no locker ran (a fleet lock whose lease was there already); or raise
                    if self._prefix_pid == -1:  # it changed the record after the locker had built it
                        self._write_record(held)
                except BaseException:
                    self._locker.release(held)
                    raise
        except BaseException:
            self._mutex.release()
            raise
        if held is None:
            self._mutex.release()
            raise self._timeout(timeout)
        self._held, self._thread, self._count = held, me, 1
        return self

    def release(self) -> None:
        """Release one level of acquisition; releasing a lock not held is a no-op."""
        if self._held is None:
            return
        self._count -= 1
        if self._count > 0:
            return
        held, self._held, self._thread = self._held, None, None
        try:
            self._locker.release(held)
        finally:
            self._mutex.release()

    @property
    def fence(self) -> int | None:
        """While a fleet lock is held: its fencing token (the key's create_revision, strictly increasing per
        name); give it to downstream systems so they refuse a holder older than one they have seen."""
        return getattr(self._held, "fence", None)

    @property
    def lost(self) -> bool:
        """True once a held fleet lock is known lost (lease expired or revoked, key deleted); host locks: False."""
        session = getattr(self._held, "session", None)
        return bool(session is not None and session.lost)

    @property
    def valid_until(self) -> float | None:
        """While a fleet lock is held: the CLOCK_BOOTTIME second up to which it is surely still ours (the last
        answered keep-alive's send + TTL, minus a margin; etcd's own expiry is later). Host locks: None.

        `hostlock run`'s watcher kills the job at this moment if hostlock has not reported a later one (hostlock
        stopped or hung), so the job does not outlive a lease that hostlock cannot keep."""
        session = getattr(self._held, "session", None)
        return None if session is None else session.expires

    def check(self) -> None:
        """Raise LockLost if the held fleet lock was lost; call it before acting on what the lock protects."""
        if self.lost:
            why = getattr(getattr(self._held, "session", None), "why", None) or "its lease ended"
            raise LockLost("lost lock %r in %s: %s" % (self.name, self.path, why), path=self.path)

    def descriptors(self) -> list[int]:
        """Descriptors whose open file descriptions carry the held lock (empty when not held, and for the
        record mechanism): a process holding a duplicate of each keeps the lock held after we are gone
        (`hostlock run`'s watcher does, until the job is dead). Unlocking still frees it at once."""
        if self._held is None:
            return []
        return self._locker.descriptors(self._held)

    def update_record(self, job_pid: int | None = None, job_cmdline: str | None = None,
                      label: str | None = None, *, defer: bool = False, **extra: object) -> None:
        """Rewrite our owner record, e.g. so status names the job a supervisor started (not held yet: the record
        the lock will be taken with).

        `defer=True`: a fleet lock's keep-alive thread writes it 0.1 s later (fleet.session.KEY_WATCH_DELAY), and
        not at all if the lock is released (or the record rewritten) first: a lock held that briefly costs no
        second round trip to etcd (`hostlock run --fleet` names its job's pid this way). A key found gone then
        is the lock's loss (`lost`, on_lost), as the thread's watch of it would find. Host locks: written now.
        """
        for key, value in (("jpid", job_pid), ("jcmd", job_cmdline), ("label", label)):
            if value is not None:
                self._extra[key] = value
        self._extra.update({k: v for k, v in extra.items() if v is not None})
        self._prefix_pid = -1
        if self._held is not None:
            self._write_record(self._held, defer)

    def close(self) -> None:
        """Release if held and close the lock file; the object can be used again afterwards."""
        while self._held is not None:
            self.release()
        self._locker.close()

    def __enter__(self) -> Lock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:
        try:
            if getattr(self, "_held", None) is not None and self._count and self._thread is not None:
                self._count = 1
                self.release()
            if getattr(self, "_locker", None) is not None:
                self._locker.close()
        except Exception:  # noqa: BLE001 - never raise from a finaliser at interpreter exit
            pass

    def __repr__(self) -> str:
        return "<hostlock.Lock %r %s%s in %s (%s)%s>" % (
            self.name, self.mode, " slots=%d" % self.slots if self.slots > 1 else "", self.directory,
            self.mechanism, " held" if self.locked else "")

    # -- internals -------------------------------------------------------------------------------------
    def _forget(self) -> None:
        """In a forked child: drop every descriptor without unlocking; the parent still holds the lock."""
        held = self._held
        self._held, self._thread, self._count = None, None, 0
        self._mutex = _thread.allocate_lock()
        self._locker.forget(held)

    def _acquire(self, deadline: float | None, once: _Once | None = None) -> Held | None:
        # Know our identity before any wait: a woken waiter must not spend its first moments
        # reading /proc (a fresh process has not computed it yet). The record is then built from the
        # prefix as it is now, without asking the pid again inside the critical section.
        if once is not None and self.fleet is None:
            once.run()  # a host lock takes no round trip to overlap it with: first, so the record has it
        self._refresh_prefix()
        return self._locker.acquire(self.mode, self.fifo, deadline, self._built_record,
                                    None if once is None else once.overlapped)

    def _refresh_prefix(self) -> None:
        if self._prefix_pid != _Self.get().pid:
            self._prefix = record_prefix(self.mode, self._extra)
            self._prefix_pid = _Self.pid

    def _built_record(self, slot: int | None, ticket: int | None = None) -> bytes:
        """The record from the prefix _acquire has just refreshed (same process: no fork in between), or
        rebuilt from the identity already known if update_record() changed it since (in `meanwhile`)."""
        if self._prefix_pid == -1:
            self._refresh_prefix()
        return build_record(self._prefix, slot, ticket)

    def _write_record(self, held: Held, defer: bool = False) -> None:
        # Rewritten while held (a job's pid, a lease renewal): status's SINCE stays when the lock was taken.
        old = self._own_record()
        at = old.get("at") if old else None
        try:
            taken = float(at) if at else None
        except ValueError:
            taken = None
        self._refresh_prefix()
        self._locker.write_record(held, build_record(self._prefix, held.slot, getattr(held, "ticket", None), taken),
                                  defer)

    def _own_record(self) -> dict | None:
        if self._held is None:
            return None
        return parse_record(self._locker.read_record(self._held))

    def _timeout(self, timeout: float | None) -> LockTimeout:
        if self.fleet is not None:
            return fleet_backend(self.fleet).busy(self.name, timeout)  # a short read: never past the wait
        from .queries import status  # who holds it: the read side, loaded when a wait ends without the lock

        try:
            st = status(self.name, self.directory)
        except HostlockError:
            st = LockStatus(self.name, self.directory, self.path, self.mechanism, self.slots, [], 0)
        return st.timed_out(timeout)
