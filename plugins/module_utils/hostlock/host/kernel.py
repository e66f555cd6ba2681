"""Kernel lock mechanisms: Linux OFD byte-range locks, and flock() where OFD locks do not exist.

Kernel locks vanish with their holder, even on SIGKILL, so they can never go stale. Never POSIX record
locks (lockf/F_SETLK): those drop when *any* descriptor of the file closes in the process, and never
exclude threads (fasteners #93, #116, #130). OFD locks belong to the open file description, so two Lock
objects exclude each other even inside one process.

One lock file per name; byte offsets name independent lock ranges, most far beyond the file's data:
  META        guards the ticket counter (held for a few syscalls only)
  MAIN        the exclusive/shared lock itself
  OPEN        read-locked by every Lock object that has the file open (ofd): `hostlock gc` needs the whole
              file, so it never unlinks a file someone can still lock (see KernelLocker._open)
  SLOT0+k     semaphore slot k
  REC0+i      claims owner-record index i for a shared holder
  QUEUE0+t    held by the waiter with ticket t until it holds MAIN (an exclusive holder: until it releases):
              waiters wait on their predecessor's range, so they are served in arrival order (FIFO), and a
              writer is never starved by readers.
  WAITING0+t  held by the waiter with ticket t until it holds MAIN: the waiter behind it sleeps on this
              first, then spins briefly on QUEUE0+t (see _spin), then sleeps on it.
The file holds a header (slot count), the ticket counter, and fixed-size owner records.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import sys
import time

from ..core import forks
from ..core.names import MAX_SLOTS
from . import waiting as _waiting
from .waiting import TIMED_OUT, Expired, Race

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from typing import Callable

    from .waiting import Alarm

F_OFD_GETLK = getattr(fcntl, "F_OFD_GETLK", 36)  # constants missing before Python 3.9; same on all arches
F_OFD_SETLK = getattr(fcntl, "F_OFD_SETLK", 37)
F_OFD_SETLKW = getattr(fcntl, "F_OFD_SETLKW", 38)
HAS_OFD = sys.platform.startswith("linux")
RD, WR, UN = fcntl.F_RDLCK, fcntl.F_WRLCK, fcntl.F_UNLCK

HEADER = b"HOSTLOCK 1 slots=%d\n"
HEADER_SIZE = 64
COUNTER_AT = 64
RECORD_BASE = 4096
RECORD_SIZE = 1024
META, MAIN, OPEN, SLOT0, REC0, QUEUE0, WAITING0 = 0, 1, 2, 16, 1 << 21, 1 << 32, 1 << 48
HEAD_SINCE_AT = 72  # CLOCK_MONOTONIC ns at which the first waiter in line reached the front (fifo=False)
# fifo=False: a newcomer may take a free lock ahead of the queue while the first waiter has been first for
# less than this. The releasing process then often goes on without a context switch (flock's throughput),
# yet no waiter is overtaken for longer than the window (flock's waiters can be, without bound).
BARGE_WINDOW_NS = 2_000_000
# Queue tickets live in [QUEUE0, WAITING0): a counter past that was not written by hostlock (a member of a
# shared directory can write the file) and is read as 0; tickets still in use are skipped as ever.
TICKETS = WAITING0 - QUEUE0
# How long the next waiter spins (non-blocking tries, yielding the CPU between them) for the holder to let go
# before it sleeps: long enough to catch a short critical section, too short to be measurable CPU.
SPIN_SECONDS = 0.0002

# F_SETLK reports a conflict as EAGAIN or EACCES (POSIX allows both); contention returns False, any
# other error raises.
CONTENTION = frozenset((errno.EAGAIN, errno.EACCES, getattr(errno, "EWOULDBLOCK", errno.EAGAIN)))
# The filesystem cannot lock at all (some NFS/FUSE mounts): the record mechanism takes over.
NO_KERNEL_LOCKS = frozenset((errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL,
                             getattr(errno, "ENOTSUP", errno.EOPNOTSUPP)))

_FLOCK = struct.Struct("hhqqi")
# Every range at once (length 0: to infinity): conflicts with any holder, waiter or open Lock (OPEN).
# `hostlock gc`, a corrupt file's removal and an adoption take it before they unlink or replace a file.
WHOLE_FILE = _FLOCK.pack(WR, os.SEEK_SET, 0, 0, 0)
_packed: dict = {}


def _pack(kind: int, start: int, length: int = 1) -> bytes:
    key = (kind, start, length)
    data = _packed.get(key)
    if data is None:
        data = _FLOCK.pack(kind, os.SEEK_SET, start, length, 0)
        if start < QUEUE0 or length != 1:
            _packed[key] = data  # cache the fixed ranges, not the ever-growing tickets
    return data


_Q_PROBE = _pack(WR, QUEUE0, 0)
_UNLOCKED = _FLOCK.pack(UN, 0, 0, 0, 0)[:2]
_MAIN_LOCK = {WR: _pack(WR, MAIN), RD: _pack(RD, MAIN)}
_MAIN_UNLOCK = _pack(UN, MAIN)


class LockFile:
    """One open lock file and its byte ranges, as KernelMechanism uses them; each subclass is one kernel API."""

    __slots__ = ("fd", "path", "ticket", "at_head", "detached", "guarded", "linked_at")
    fair = False  # ranges can be tested without taking them, so waiters can queue in FIFO order
    unrolled = False  # the hot path may call OFD fcntl directly

    def __init__(self, fd: int, path: str) -> None:
        self.fd = fd
        self.path = path
        self.ticket: int | None = None  # our place in line while waiting
        self.at_head = False  # the waiter ahead has reached the lock: we wait on the lock itself
        self.detached = False  # a timed-out waiter left it to a thread that keeps its place: reopen
        self.guarded = False  # holds OPEN: gc cannot unlink the file while we have it (ofd only)
        self.linked_at = 0  # CLOCK_MONOTONIC ns when the file was last seen still linked (st_nlink > 0)

    def lock(self, start: int, kind: int, wait: bool) -> bool:
        """Take range `start` as RD or WR: True when taken; False on contention when not waiting."""
        raise NotImplementedError

    def unlock(self, start: int) -> None:
        """Range `start` is no longer held through this file when this returns."""
        raise NotImplementedError

    def conflict(self, start: int, kind: int, length: int = 1) -> tuple[int, int] | None:
        """(type, start) of a lock held by anyone else that would block `kind` on the range, or None."""
        raise NotImplementedError

    def held_starts(self, lo: int, hi: int) -> list[int]:
        """The starts of ranges in [lo, hi) that others hold, lowest first, in a number of calls bounded by
        what is held (never by the range's width, nor by the file's size)."""
        raise NotImplementedError

    def reopen(self) -> LockFile:
        """Another open file of the same lock, whose locks exclude this one's (for a helper thread)."""
        raise NotImplementedError

    def close(self) -> None:
        """Closing drops every range still held through this file (that is what makes locks die with us)."""
        raise NotImplementedError


class OfdFile(LockFile):
    """One open file description of a lock file; its locks are its own, not the process's."""

    __slots__ = ()
    fair = True
    unrolled = True

    def lock(self, start: int, kind: int, wait: bool) -> bool:
        return _attempt(fcntl.fcntl, self.fd, F_OFD_SETLKW if wait else F_OFD_SETLK, _pack(kind, start), wait=wait)

    def unlock(self, start: int) -> None:
        fcntl.fcntl(self.fd, F_OFD_SETLK, _pack(UN, start))

    def conflict(self, start: int, kind: int, length: int = 1) -> tuple[int, int] | None:
        """(type, start) of a lock that would block `kind` on the range, held by anyone else, or None."""
        got = _FLOCK.unpack(fcntl.fcntl(self.fd, F_OFD_GETLK, _pack(kind, start, length)))
        return None if got[0] == UN else (got[0], got[2])

    def held_starts(self, lo: int, hi: int) -> list[int]:
        # F_OFD_GETLK over a span names one lock in it; split the span around it and look again. A lock
        # wider than one byte (held by hand) is found once, at its start.
        found = []
        spans = [(lo, hi)]
        while spans:
            a, b = spans.pop()
            if a >= b:
                continue
            got = self.conflict(a, WR, b - a)
            if got is not None and a <= got[1] < b:
                found.append(got[1])
                spans += [(a, got[1]), (got[1] + 1, b)]
        return sorted(found)

    def reopen(self) -> OfdFile:
        """A new open file description of the same inode (no path lookup, so no race with renames)."""
        return OfdFile(os.open("/proc/self/fd/%d" % self.fd, os.O_RDWR | os.O_CLOEXEC), self.path)

    def close(self) -> None:
        os.close(self.fd)


class FlockFile(LockFile):
    """flock() stand-in for platforms without OFD locks: each range becomes its own small file.

    flock() cannot test a lock without taking it, so `conflict` probes with a non-blocking lock on a
    separate descriptor; and there is no ticket queue, so waiters are not served in FIFO order here.
    """

    __slots__ = ("extra",)

    def __init__(self, fd: int, path: str) -> None:
        super().__init__(fd, path)
        self.extra: dict = {}

    def _fd(self, start: int, create: bool = True) -> int | None:
        if start == MAIN:
            return self.fd
        fd = self.extra.get(start)
        if fd is None:
            from .directory import foreign_file_error, must_adopt, open_directory, open_lock_file

            head, tail = os.path.split(self.path)
            dfd = open_directory(head)[0]  # walked as the main file's was: no symlink planted above it
            try:
                name = "%s.%d" % (tail, start)
                fd = open_lock_file(dfd, name, head, True, create=create)
                # Each range is a file of its own, trusted as the main file is (KernelLocker._open): one its
                # owner may remove would let the next holder lock a fresh file beside ours (a slot twice).
                owner = must_adopt(dfd, fd)
                if owner is not None:
                    os.close(fd)
                    raise foreign_file_error(os.path.join(head, name), owner)
            except FileNotFoundError:
                return None
            finally:
                os.close(dfd)
            self.extra[start] = fd
        return fd

    def lock(self, start: int, kind: int, wait: bool) -> bool:
        op = (fcntl.LOCK_SH if kind == RD else fcntl.LOCK_EX) | (0 if wait else fcntl.LOCK_NB)
        return _attempt(fcntl.flock, self._fd(start), op, wait=wait)

    def unlock(self, start: int) -> None:
        fd = self.extra.get(start) if start != MAIN else self.fd
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def conflict(self, start: int, kind: int, length: int = 1) -> tuple[int, int] | None:
        if length != 1:
            return None  # no queue ranges with flock
        probe = FlockFile(os.open(self.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW), self.path)
        try:
            if probe._fd(start, create=False) is None or probe.lock(start, kind, False):
                return None
            if kind == WR and probe.lock(start, RD, False):
                return (RD, start)
            return (WR, start)
        finally:
            probe.close()

    def held_starts(self, lo: int, hi: int) -> list[int]:
        # Each range is a file of its own (NAME.lock.START), made when first used and taken lowest first: look
        # at those that exist, up to the first missing one.
        found = []
        for start in range(lo, hi):
            if not os.path.lexists("%s.%d" % (self.path, start)):
                break
            if self.conflict(start, WR) is not None:
                found.append(start)
        return found

    def reopen(self) -> FlockFile:
        return FlockFile(os.open(self.path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW), self.path)

    def close(self) -> None:
        for fd in self.extra.values():
            os.close(fd)
        self.extra.clear()
        os.close(self.fd)


class Held:
    """What one acquisition holds, so release() undoes exactly that."""

    __slots__ = ("file", "start", "index", "slot", "rec", "owned_file", "ticket")

    def __init__(self, file: LockFile, start: int, index: int, slot: int | None, rec: int | None,
                 owned_file: bool) -> None:
        self.file = file
        self.start = start      # MAIN or SLOT0+k
        self.index = index      # owner record index
        self.slot = slot
        self.rec = rec          # REC range claimed by a shared holder
        self.owned_file = owned_file  # a reopened description made for this wait: close on release
        self.ticket: int | None = None  # an exclusive holder that queued keeps its place until release


class KernelMechanism:
    """Policy-free kernel locking: try, wait in FIFO order, record owners, inspect."""

    def __init__(self, name: str, file_class: type) -> None:
        self.name = name
        self.file_class = file_class

    def wrap(self, fd: int, path: str, slots: int) -> LockFile:
        f = self.file_class(fd, path)
        head = os.pread(fd, HEADER_SIZE, 0)
        if not head.startswith(b"HOSTLOCK "):
            f.lock(META, WR, True)
            try:
                head = os.pread(fd, HEADER_SIZE, 0)
                if not head.startswith(b"HOSTLOCK "):
                    if head.strip(b"\0"):
                        raise _corrupt(path, head)
                    _pwrite(fd, (HEADER % slots).ljust(HEADER_SIZE, b"\0"), 0, path)
                    head = HEADER % slots
            finally:
                f.unlock(META)
        recorded = _header_slots(head, path)
        if recorded != slots:
            raise ValueError("lock %s is used as %s, not with slots=%d: every user of one name must agree"
                             % (path, "a %d-slot semaphore" % recorded if recorded > 1 else "a lock", slots))
        return f

    # -- acquiring ---------------------------------------------------------------------------------
    def try_acquire(self, f: LockFile, mode: str, slots: int, fifo: bool = True) -> Held | None:
        if f.unrolled and slots == 1 and mode == "exclusive":
            # The hot path, unrolled: ~3 syscalls. Waiters queue on QUEUE ranges: if any are queued, a
            # newcomer does not barge in ahead of them (unless fifo=False and the first waiter is new).
            fd = f.fd
            if fifo and fcntl.fcntl(fd, F_OFD_GETLK, _Q_PROBE)[:2] != _UNLOCKED:
                return None
            try:
                fcntl.fcntl(fd, F_OFD_SETLK, _MAIN_LOCK[WR])
            except OSError as e:
                if e.errno in CONTENTION:
                    return None
                raise
            if not fifo and not _may_barge(fd) and fcntl.fcntl(fd, F_OFD_GETLK, _Q_PROBE)[:2] != _UNLOCKED:
                # Barging, we take first and ask after: the lock is free for the fewest instructions
                # between our release and our next take, as with flock. Not allowed now: hand it back
                # (the first waiter, asleep on the lock, wakes to take it).
                fcntl.fcntl(fd, F_OFD_SETLK, _MAIN_UNLOCK)
                return None
            return Held(f, MAIN, 0, None, None, False)
        if f.fair and f.conflict(QUEUE0, WR, 0) is not None and (fifo or not _may_barge(f.fd)):
            return None
        return self._take(f, mode, slots, wait=False, owned=False)

    def acquire(self, f: LockFile, mode: str, slots: int, deadline: float | None, fifo: bool = True) -> Held | None:
        """Wait in line; None when the deadline passes. The fast path has already failed."""
        if deadline is None:
            return self._queued(f, mode, slots, owned=False, fifo=fifo)
        alarm = _waiting.alarm(deadline) if slots == 1 else None
        if alarm is not None:
            # The main thread waits in fcntl() itself, on its own description, exactly as an untimed wait;
            # the alarm's signal ends the wait at the deadline (see host.waiting).
            try:
                return self._queued(f, mode, slots, owned=False, fifo=fifo, alarm=alarm)
            finally:
                alarm.disarm()
        mine = f.reopen()
        race = Race(undo=self.release)
        race.spawn(self._queued_and_close_on_error, mine, mode, slots, race, fifo)
        got = race.wait(deadline)
        if got is TIMED_OUT:
            with race.mutex:
                if mine.ticket is not None and mine.at_head:
                    # Already first in line: step aside now so the next waiter moves up at once. Further
                    # back we keep our place until the waiter ahead reaches the lock (the helper then
                    # leaves), or those behind us could overtake a writer ahead of us. The helper keeps its
                    # descriptor: closing it under a blocked fcntl would let the number be reused.
                    mine.unlock(WAITING0 + mine.ticket)
                    mine.unlock(QUEUE0 + mine.ticket)
                    mine.ticket = None
            return None
        return got

    def _queued_and_close_on_error(self, f: LockFile, mode: str, slots: int, race: Race, fifo: bool) -> Held | None:
        try:
            held = self._queued(f, mode, slots, owned=True, race=race, fifo=fifo)
        except BaseException:
            f.close()
            raise
        if held is None or held.file is not f:
            f.close()  # gave up, or a semaphore slot was won on another description
        return held

    def _queued(self, f: LockFile, mode: str, slots: int, owned: bool, race: Race | None = None,
                fifo: bool = True, alarm: Alarm | None = None) -> Held | None:
        if not f.fair:
            return self._take(f, mode, slots, wait=True, owned=owned, alarm=alarm)
        meta = _meta(f, alarm)
        if meta is False:
            return None
        try:
            ticket = _claim_ticket(f)
            if ticket is not None:
                _pwrite(f.fd, (ticket + 1).to_bytes(8, "little"), COUNTER_AT, f.path)
        finally:
            if meta:
                f.unlock(META)
        if ticket is None:
            # Every ticket tried is held by something that is not a waiter (ranges held by hand in a file a
            # group member may write): wait on the lock itself, out of order, rather than behind it for good.
            return self._take(f, mode, slots, wait=True, owned=owned, alarm=alarm)
        if race is not None:
            with race.mutex:
                if race.abandoned:
                    f.unlock(WAITING0 + ticket)
                    f.unlock(QUEUE0 + ticket)
                    return None
                f.ticket = ticket
        else:
            f.ticket = ticket
        held = None
        leaving = False
        try:
            if ticket and f.conflict(QUEUE0 + ticket - 1, WR) is not None:
                # Two stages, both asleep in the kernel: first until the waiter ahead holds the lock (or
                # gives up, or dies); then until it lets go, spinning briefly first, so that a short
                # critical section hands over without a scheduler wake-up on the critical path. Only behind a
                # waiter that holds its ticket: a WAITING range held without one is nobody in line.
                if not _wait(f, WAITING0 + ticket - 1, RD, alarm):
                    leaving = True
                    return None
                f.unlock(WAITING0 + ticket - 1)
                if not _spin(f, QUEUE0 + ticket - 1) and not _wait(f, QUEUE0 + ticket - 1, RD, alarm):
                    leaving = True
                    return None
                f.unlock(QUEUE0 + ticket - 1)
            if race is not None:
                with race.mutex:
                    if race.abandoned:
                        return None
                    f.at_head = True
            # First in line from now: fifo=False newcomers may barge in only for BARGE_WINDOW_NS more. Every
            # waiter says so, fifo or not, or a fifo=False newcomer could overtake a fifo waiter without end.
            os.pwrite(f.fd, time.monotonic_ns().to_bytes(8, "little"), HEAD_SINCE_AT)
            held = self._take(f, mode, slots, wait=True, owned=owned, alarm=alarm)
            if held is not None and held.start == MAIN and held.rec is None:
                # An exclusive holder keeps its place in line until it releases: the next waiter then
                # wakes once, into a free lock, instead of waking only to queue on the lock itself.
                held.ticket = ticket
            return held
        finally:
            if race is not None:
                with race.mutex:
                    if f.ticket is not None:
                        f.unlock(WAITING0 + ticket)  # we hold (or left): the next waiter moves up
                        if held is None or held.ticket is None:
                            f.unlock(QUEUE0 + ticket)
            elif leaving:
                # Timed out behind other waiters: keep our place until the waiter ahead is through, or
                # those behind us could overtake it (a writer among them); a thread does that on this
                # description, and the Lock opens a new one.
                _leave_later(f, ticket)
            else:
                f.unlock(WAITING0 + ticket)
                if held is None or held.ticket is None:
                    f.unlock(QUEUE0 + ticket)
            f.ticket = None
            f.at_head = False

    def _take(self, f: LockFile, mode: str, slots: int, wait: bool, owned: bool,
              alarm: Alarm | None = None) -> Held | None:
        if slots == 1:
            kind = RD if mode == "shared" else WR
            if not (_wait(f, MAIN, kind, alarm) if wait else f.lock(MAIN, kind, False)):
                return None
            try:
                if kind == WR:
                    return Held(f, MAIN, 0, None, None, owned)
                index = 1
                while not f.lock(REC0 + index, WR, False):
                    index += 1
                return Held(f, MAIN, index, None, REC0 + index, owned)
            except BaseException:
                f.unlock(MAIN)
                raise
        for k in range(slots):
            if f.lock(SLOT0 + k, WR, False):
                return Held(f, SLOT0 + k, 1 + k, k, None, owned)
        if not wait:
            return None
        return self._any_slot(f, slots)

    def _any_slot(self, f: LockFile, slots: int) -> Held:
        """Sleep until any of the slots frees: one kernel wait per slot, each on its own description."""
        race = Race(undo=self.release)
        # Open every description here, before any thread runs: a thread that started late could
        # otherwise reopen /proc/self/fd/N after N was closed and reused for another file.
        mine = [f.reopen() for _k in range(slots)]

        def wait_slot(k: int) -> Held:
            try:
                mine[k].lock(SLOT0 + k, WR, True)
            except BaseException:
                mine[k].close()
                raise
            return Held(mine[k], SLOT0 + k, 1 + k, k, None, True)

        for k in range(slots):
            race.spawn(wait_slot, k)
        return race.wait(None)

    # -- holding -------------------------------------------------------------------------------------
    def write_record(self, held: Held, data: bytes) -> None:
        if len(data) > RECORD_SIZE:
            data = data[:RECORD_SIZE - 1] + b"\n"
        _pwrite(held.file.fd, data, RECORD_BASE + held.index * RECORD_SIZE, held.file.path)

    def read_record(self, held: Held) -> bytes:
        return os.pread(held.file.fd, RECORD_SIZE, RECORD_BASE + held.index * RECORD_SIZE)

    def release(self, held: Held) -> None:
        f = held.file
        try:
            os.pwrite(f.fd, b"\n", RECORD_BASE + held.index * RECORD_SIZE)
        except OSError:
            pass  # a full disk must not keep the lock held: validity comes from the range, not the text
        if held.rec is not None:
            f.unlock(held.rec)
        if held.start == MAIN and f.unrolled:
            fcntl.fcntl(f.fd, F_OFD_SETLK, _MAIN_UNLOCK)
        else:
            f.unlock(held.start)
        if held.ticket is not None:
            f.unlock(QUEUE0 + held.ticket)  # after the lock itself: the next in line wakes to a free lock
            held.ticket = None
        if held.owned_file:
            f.close()

    # -- inspecting ----------------------------------------------------------------------------------
    def inspect(self, f: LockFile) -> tuple[int, list, list, str | None]:
        """(slots, [(record bytes or None, mode, slot)], queue tickets held, problem) read without taking
        anything.

        Who holds is the kernel's word: its lock tables are looked at whatever the file's bytes say. The
        header, counter and records are text a member of a shared directory may write (or grow sparse to
        any size), so they are read in bounded pieces and never decide that a lock is free: a header
        hostlock did not write is `problem`, reported beside the holders the kernel shows. Tickets are held
        by waiters, and by an exclusive holder that came through the queue (its record names its ticket).
        """
        head = os.pread(f.fd, HEADER_SIZE, 0)
        slots, problem = 1, None
        if head.startswith(b"HOSTLOCK "):
            try:
                slots = _header_slots(head, f.path)
            except OSError as e:  # CorruptLockFile: what wrap() refuses, reported the same way
                problem = str(e)
        elif head.strip(b"\0"):
            problem = str(_corrupt(f.path, head))

        def record(i: int) -> bytes | None:
            data = os.pread(f.fd, RECORD_SIZE, RECORD_BASE + i * RECORD_SIZE)
            return data if data.strip(b"\0\n") else None

        entries: list[tuple[bytes | None, str, int | None]] = []
        # Both kinds of range are looked at whatever the header says: a holder of the other kind must never
        # be reported as free.
        for start in f.held_starts(SLOT0, SLOT0 + MAX_SLOTS):
            entries.append((record(1 + start - SLOT0), "exclusive", start - SLOT0))
        main = f.conflict(MAIN, WR)
        if main and main[0] == WR:
            entries.append((record(0), "exclusive", None))
        elif main:
            readers = f.held_starts(REC0 + 1, QUEUE0)
            entries += [(record(start - REC0), "shared", None) for start in readers]
            if not readers:
                entries.append((None, "shared", None))
        tickets = []
        if f.fair:
            end = QUEUE0 + (_counter(f) or TICKETS)  # a counter read as 0 (wrapped or garbage): look at all
            tickets = [start - QUEUE0 for start in f.held_starts(QUEUE0, end)]
        return slots, entries, tickets, problem


def _wait(f: LockFile, start: int, kind: int, alarm: Alarm | None) -> bool:
    """Sleep in the kernel until range `start` is ours: True; False once the alarm has rung (nothing held)."""
    if alarm is None:
        return f.lock(start, kind, True)
    try:
        alarm.armed = True
        if alarm.rang:
            raise Expired()
        f.lock(start, kind, True)
        alarm.armed = False
    except Expired:
        alarm.armed = False
        # The handler may have run just after the kernel granted the range (between bytecodes): undo it.
        # Unlocking a range this description does not hold changes nothing.
        f.unlock(start)
        return False
    return True


_DETACHED: set = set()  # descriptions of timed-out waiters still keeping their place (see _leave_later)


def _leave_later(f: LockFile, ticket: int) -> None:
    """Leave the line once the waiter ahead of `ticket` is through; then close `f` (dropping our ranges)."""
    f.detached = True
    _DETACHED.add(f)

    def leave() -> None:
        try:
            for start in (WAITING0 + ticket - 1, QUEUE0 + ticket - 1):
                f.lock(start, RD, True)
                f.unlock(start)
        finally:
            if f in _DETACHED:
                _DETACHED.discard(f)
                f.close()

    _waiting.start_thread(leave)


def _close_detached_in_child() -> None:
    # A forked child's copies would keep the parent's place in line after the parent's thread leaves it.
    for f in list(_DETACHED):
        _DETACHED.discard(f)
        try:
            f.close()
        except OSError:
            pass


forks.in_child(_close_detached_in_child)


def _attempt(call: Callable[..., object], *args: object, wait: bool) -> bool:
    """One lock call: False on contention when not waiting, True when taken; any other error raises."""
    try:
        call(*args)
    except OSError as e:
        if not wait and e.errno in CONTENTION:
            return False
        raise
    return True


def _may_barge(fd: int) -> bool:
    """Whether the first waiter (if any) has been first for less than BARGE_WINDOW_NS (0: none has been)."""
    raw = os.pread(fd, 8, HEAD_SINCE_AT)
    since = int.from_bytes(raw, "little") if len(raw) == 8 else 0
    return not since or time.monotonic_ns() - since < BARGE_WINDOW_NS


def _spin(f: LockFile, start: int, kind: int = RD) -> bool:
    """Try a `kind` lock on `start` for up to SPIN_SECONDS without sleeping in the kernel; True if taken.

    nginx's ngx_shmtx does the same: a brief spin catches a release that is about to happen, and yielding
    between tries leaves the CPU to the holder if it shares ours.
    """
    end = time.monotonic() + SPIN_SECONDS
    while True:
        if f.lock(start, kind, False):
            return True
        if time.monotonic() >= end:
            return False
        os.sched_yield()


# META is held for a few syscalls (a ticket's claim); held longer, it is held by hand (a group member may write
# the file): after this long a waiter claims its ticket without it, which only loosens the order of arrivals
# racing for one (the claim itself, a non-blocking lock on the ticket's ranges, never gives a ticket twice).
META_PATIENCE = 0.25
# Tickets tried in a row before giving up on the line (see _claim_ticket).
CLAIM_TRIES = 64


def _meta(f: LockFile, alarm: Alarm | None) -> bool | None:
    """Take META: True; False once the caller's alarm has rung (its deadline); None when it stayed held for
    META_PATIENCE. Spun for first, as a queue range is (_spin): held for a few syscalls, it is usually free
    again within that. Then asleep in the kernel, woken by the release itself (a sleep-and-retry loop here
    cost the contended FIFO row 0.79x -> 0.67x flock), with the main thread's alarm set to the patience's end
    (or the caller's deadline, if sooner); elsewhere (another thread) it retries with backoff."""
    if _spin(f, META, WR):
        return True
    patience = time.monotonic() + META_PATIENCE
    if alarm is None:
        own = _waiting.alarm(patience)
        if own is not None:
            try:
                return True if _wait(f, META, WR, own) else None
            finally:
                own.disarm()
    else:
        user = alarm.deadline
        if user is not None and user <= patience:  # the caller's deadline comes first anyway
            return _wait(f, META, WR, alarm)
        alarm.arm(patience)
        try:
            if _wait(f, META, WR, alarm):
                return True
        finally:
            if user is not None:
                alarm.arm(user)  # the rest of the caller's wait
        return False if user is not None and time.monotonic() >= user else None
    return _poll_meta(f, patience)


def _poll_meta(f: LockFile, end: float) -> bool | None:
    """META by non-blocking tries with backoff until `end` (a thread other than the main one has no alarm)."""
    delay = 0.0001
    while True:
        time.sleep(delay)
        if f.lock(META, WR, False):
            return True
        if time.monotonic() >= end:
            return None
        delay = min(delay * 2, 0.01)


def _claim_ticket(f: LockFile) -> int | None:
    """The first ticket from the counter whose QUEUE and WAITING ranges are both free, now ours; None when
    CLAIM_TRIES in a row were not. A ticket whose WAITING range alone is held is not one anybody queued for
    (a waiter takes both under META): the waiter behind it would sleep on that range for good."""
    ticket = _counter(f)
    for _try in range(CLAIM_TRIES):
        if f.lock(QUEUE0 + ticket, WR, False):
            if f.lock(WAITING0 + ticket, WR, False):
                return ticket
            f.unlock(QUEUE0 + ticket)
        ticket = (ticket + 1) % TICKETS  # in use (or a corrupt counter): skip it rather than share one
    return None


def _counter(f: LockFile) -> int:
    """The next queue ticket, as written in the file; 0 when it is not one hostlock could have written."""
    raw = os.pread(f.fd, 8, COUNTER_AT)
    ticket = int.from_bytes(raw, "little") if len(raw) == 8 else 0
    return ticket if ticket < TICKETS else 0


def _header_slots(head: bytes, path: str) -> int:
    try:
        value = int(head.split(b"slots=", 1)[1].split(b"\n", 1)[0])
        if 1 <= value <= MAX_SLOTS:
            return value
    except (IndexError, ValueError):
        pass
    raise _corrupt(path, head)


def _corrupt(path: str, head: bytes) -> Exception:
    from ..core.errors import CorruptLockFile

    name = os.path.basename(path)[:-5] if path.endswith(".lock") else os.path.basename(path)
    return CorruptLockFile("lock file %s has a corrupt header %r: it is not a hostlock file, or was overwritten."
                           " 'hostlock break --force %s' removes it once nothing has it open and locked"
                           % (path, head[:32], name), path=path)


def _pwrite(fd: int, data: bytes, offset: int, path: str) -> None:
    try:
        if os.pwrite(fd, data, offset) != len(data):
            raise OSError(errno.ENOSPC, "short write")
    except OSError as e:
        from .directory import file_error

        raise file_error("cannot write lock file", path, e) from None


def probe(fd: int) -> str:
    """Which kernel mechanism works on this filesystem: 'ofd', 'flock', or 'record' if none does."""
    candidates: list[tuple[str, type[LockFile]]] = [("ofd", OfdFile)] if HAS_OFD else []
    candidates.append(("flock", FlockFile))
    for name, cls in candidates:
        f = cls(fd, "")
        try:
            if f.lock(MAIN, RD, False):
                f.unlock(MAIN)
            return name
        except OSError as e:
            if e.errno not in NO_KERNEL_LOCKS:
                raise
    return "record"


OFD = KernelMechanism("ofd", OfdFile)
FLOCK = KernelMechanism("flock", FlockFile)
