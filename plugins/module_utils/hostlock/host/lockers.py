"""The host mechanisms behind the Locker interface (core.model): kernel ranges, or owner files.

A Lock (policy, in api) picks its locker once, in its constructor: from the directory's recorded mechanism
for host locks (here), or from its fleet Backend (fleet.lock.EtcdLocker); from then on it never asks which
mechanism it has. Each locker implements only the mechanism's steps, each with what must hold afterwards;
timeouts, re-entrancy, threads and fork policy stay in api.
"""

from __future__ import annotations

import fcntl
import os
import time

from . import kernel as _kernel
from .directory import foreign_file_error, must_adopt, open_directory, open_lock_file, replace_own
from .waiting import backoff_sleep

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover

    from ..core.model import Builder, Meanwhile
    from .record import RecordHeld, RecordMechanism


def _adopt(dirfd: int, filename: str, directory: str, fd: int, shared: bool) -> bool:
    """Replace another user's idle lock file by a fresh one of ours; False while someone has it open.

    Done as `hostlock gc` removes a file: only while holding an OFD write lock over the whole file, which
    conflicts with every holder, waiter and open Lock (each read-locks its OPEN range), so nobody is using
    the old inode; one that opened it just before sees st_nlink 0 once it holds OPEN, and opens the name
    again. The new file is renamed over the name (atomic: the name never goes missing).
    """
    try:
        fcntl.fcntl(fd, _kernel.F_OFD_SETLK, _kernel.WHOLE_FILE)
    except OSError as e:
        if e.errno in _kernel.CONTENTION:
            return False
        raise
    st, now = os.fstat(fd), os.stat(filename, dir_fd=dirfd, follow_symlinks=False)
    if (st.st_dev, st.st_ino) != (now.st_dev, now.st_ino):
        return True  # replaced meanwhile: look at the name again
    replace_own(dirfd, directory, filename, 0o660 if shared else 0o600, b"", "lock file")
    return True


KERNEL = {"ofd": _kernel.OFD, "flock": _kernel.FLOCK}
# A guarded file cannot be removed by gc; only a person's rm can unlink it, which no check makes safe (rm
# while a holder holds splits the lock whatever the holder checks). So an acquisition checks st_nlink only
# when none has for this long: a file removed by hand is left within 10 ms, and a tight
# acquire/release loop does not pay an fstat (3 us under contention, 7% of flock's throughput) per cycle.
RELINK_CHECK_NS = 10_000_000


class KernelLocker:
    """OFD or flock() ranges in NAME.lock; one open file description per Lock, opened on first use."""

    suffix = ".lock"

    def __init__(self, mechanism: str, directory: str, name: str, slots: int, shared_dir: bool) -> None:
        self.mech = KERNEL[mechanism]
        self.directory, self.name, self.slots, self.shared_dir = directory, name, slots, shared_dir
        self.path = os.path.join(directory, name + self.suffix)
        self.file: _kernel.LockFile | None = None

    def _open(self, deadline: float | None = None) -> _kernel.LockFile | None:
        """The lock file, opened once; an OFD file is guarded (OPEN read-locked) and seen linked after that.

        Another user's file that must be adopted first (must_adopt) is waited for until nobody uses it;
        None when the deadline passes meanwhile.

        `hostlock gc` unlinks a file only while it write-locks the whole file, so the guard keeps every
        file some Lock has open; a file unlinked just before the guard was taken is seen here and reopened.
        """
        attempt = 0
        while self.file is None:
            dirfd = open_directory(self.directory)[0]
            try:
                fd = open_lock_file(dirfd, self.name + self.suffix, self.directory, self.shared_dir)
                owner = must_adopt(dirfd, fd)
                if owner is not None:  # another user's file, which its owner could remove under us
                    try:
                        if self.mech is not _kernel.OFD:
                            raise foreign_file_error(self.path, owner)
                        adopted = _adopt(dirfd, self.name + self.suffix, self.directory, fd, self.shared_dir)
                    finally:
                        os.close(fd)
                    if not adopted and not backoff_sleep(attempt, deadline):
                        return None  # still in use by others when our time ran out
                    attempt += 1
                    continue
            finally:
                os.close(dirfd)
            try:
                f = self.mech.wrap(fd, self.path, self.slots)
                # Not taken: gc holds the whole file (about to unlink it), or a hostile write lock on OPEN;
                # the file then stays unguarded and every acquisition checks st_nlink, as flock files do.
                f.guarded = f.unrolled and f.lock(_kernel.OPEN, _kernel.RD, False)
                if os.fstat(fd).st_nlink == 0:
                    os.close(fd)  # unlinked since we opened it: open the name again
                    continue
                f.linked_at = time.monotonic_ns()
                self.file = f
            except BaseException:
                os.close(fd)
                raise
        return self.file

    def acquire(self, mode: str, fifo: bool, deadline: float | None, record: Builder,
                meanwhile: Meanwhile | None = None) -> _kernel.Held | None:
        """Held, with our owner record written, or None once the deadline has passed. (`meanwhile`: no round
        trip to overlap here; the Lock runs it once this returns.)"""
        mech = self.mech
        while True:
            f = self._open(deadline)
            if f is None:
                return None
            held = mech.try_acquire(f, mode, self.slots, fifo)
            if held is None and (deadline is None or deadline > time.monotonic()):
                held = mech.acquire(f, mode, self.slots, deadline, fifo)
            if held is None:
                if f.detached:  # a timed-out waiter's thread still keeps its place in line on it
                    self.file = None
                return None
            if not f.guarded or time.monotonic_ns() - f.linked_at > RELINK_CHECK_NS:
                if os.fstat(held.file.fd).st_nlink == 0:
                    # Our file was unlinked (by a person; gc cannot while we hold OPEN) while we waited or
                    # idled: a lock on a dead inode excludes no one who opens the name now. Let go and
                    # start over on the current file.
                    mech.release(held)
                    self.close()
                    continue
                f.linked_at = time.monotonic_ns()
            try:
                self.write_record(held, record(held.slot, held.ticket))
            except BaseException:
                mech.release(held)
                raise
            return held

    def release(self, held: _kernel.Held) -> None:
        """The ranges are free (and our record blanked) when this returns."""
        self.mech.release(held)

    def write_record(self, held: _kernel.Held, data: bytes, defer: bool = False) -> None:
        self.mech.write_record(held, data)  # a file's write: now, deferred or not

    def read_record(self, held: _kernel.Held) -> bytes:
        return self.mech.read_record(held)

    def descriptors(self, held: _kernel.Held) -> list[int]:
        """The descriptors whose open file descriptions carry `held`'s kernel locks."""
        f = held.file
        return [f.fd, *getattr(f, "extra", {}).values()]  # FlockFile: one more file per slot range

    def forget(self, held: _kernel.Held | None) -> None:
        """In a forked child: close every descriptor without unlocking (the parent still holds)."""
        if held is not None and held.owned_file:
            held.file.close()
        self.close()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


class RecordLocker:
    """Owner files alone (NAME~owner, NAME~s<k>, NAME~r~<id>), where the filesystem refuses kernel locks."""

    suffix = "~owner"

    def __init__(self, directory: str, name: str, slots: int, shared_dir: bool) -> None:
        from .record import RecordMechanism

        self.mech: RecordMechanism = RecordMechanism()
        self.directory, self.name, self.slots, self.shared_dir = directory, name, slots, shared_dir
        self.path = os.path.join(directory, name + self.suffix)

    def acquire(self, mode: str, fifo: bool, deadline: float | None, record: Builder,
                meanwhile: Meanwhile | None = None) -> RecordHeld | None:
        """Held (the owner file published whole, with our record), or None once the deadline has passed.
        (`meanwhile`: as KernelLocker's.)

        Without kernel locks nothing can wake a waiter: it polls with backoff; `fifo` cannot be honoured.
        """

        attempt = 0
        while True:
            dirfd = open_directory(self.directory)[0]
            try:
                held = self.mech.try_acquire(dirfd, self.directory, self.name, mode, self.slots, record(None, None),
                                             self.shared_dir)
                if held is None and not backoff_sleep(attempt, deadline):
                    self.mech.abandon(dirfd, self.name)
                    return None
            finally:
                os.close(dirfd)
            if held is not None:
                if held.slot is not None:
                    self.write_record(held, record(held.slot, None))
                return held
            attempt += 1

    def release(self, held: RecordHeld) -> None:
        dirfd = open_directory(self.directory)[0]
        try:
            self.mech.release(dirfd, held)
        finally:
            os.close(dirfd)

    def write_record(self, held: RecordHeld, data: bytes, defer: bool = False) -> None:
        self.mech.write_record(held, data)  # a file's write: now, deferred or not

    def read_record(self, held: RecordHeld) -> bytes:
        return self.mech.read_record(held)

    def descriptors(self, held: RecordHeld) -> list[int]:
        """None: an owner file is proof of life by its pid, not by an open descriptor."""
        return []

    def forget(self, held: RecordHeld | None) -> None:
        fds = [h.fd for h in self.mech._pending.values()] + ([held.fd] if held is not None else [])
        from .record import RecordMechanism

        self.mech = RecordMechanism()
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass

    def close(self) -> None:
        pass


def locker(mechanism: str, directory: str, name: str, slots: int, shared_dir: bool) -> KernelLocker | RecordLocker:
    """The locker for a directory's mechanism: chosen once per Lock."""
    if mechanism == "record":
        return RecordLocker(directory, name, slots, shared_dir)
    return KernelLocker(mechanism, directory, name, slots, shared_dir)
