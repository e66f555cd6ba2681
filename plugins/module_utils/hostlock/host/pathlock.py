"""Locks on a caller's path with flock(1)'s protocol: the lock `hostlock flock` and `hostlock run --path`
take, so both exclude and are excluded by util-linux flock(1) and any program locking that file alike.

flock(1)'s protocol (util-linux sys-utils/flock.c): open the path O_RDONLY|O_CREAT (a directory read-only),
or write-only for an exclusive OFD lock, then flock(2) (or F_OFD_SETLK[W] on a byte range). The file is
never truncated or written. One difference: a file hostlock creates is 0600, where flock(1) makes it 0666
less the umask (0644 for most): flock(2) needs only an open descriptor, so any user who can open the file can
hold a lock on it (LOCK_SH on a read-only descriptor) and stall its owner's jobs for as long as they like.
To share a path lock with other users, create the file with the mode you mean first; an existing file is
opened as it is. Unlike named locks, the caller owns the path's safety; two dangers are closed without
changing what a correct flock script sees:
- a FIFO would block open() forever (filelock #549): opened non-blocking, then refused;
- a symlink another user could have planted or swapped, in any component of the path, is refused
  (host.safepath), so root cannot be made to create or lock a file elsewhere; flock(1) follows them all.
"""

from __future__ import annotations

import _signal
import errno
import fcntl
import os
import stat

from ..core.errors import LockFileError, LockTimeout
from . import safepath as _safepath

F_OFD_SETLK = getattr(fcntl, "F_OFD_SETLK", 37)  # missing before Python 3.9; the same on every arch
F_OFD_SETLKW = getattr(fcntl, "F_OFD_SETLKW", 38)
_FCNTL_TYPE = {fcntl.LOCK_EX: fcntl.F_WRLCK, fcntl.LOCK_SH: fcntl.F_RDLCK, fcntl.LOCK_UN: fcntl.F_UNLCK}
# A file we create is ours alone to lock (see the docstring): not 0666, as flock(1) makes it.
CREATE_MODE = 0o600
# flock(2) says EWOULDBLOCK; F_OFD_SETLK may say EACCES, meaning the same.
CONFLICT = frozenset((errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES))


def _open(path: str, flags: int, mode: int, parent: list | None = None) -> int:
    try:
        return _safepath.open_path(path, flags, mode, parent=parent)
    except _safepath.UnsafePath as exc:
        raise LockFileError(str(exc), path=path, errno=errno.ELOOP) from None


def _replaceable(st: os.stat_result, dst: os.stat_result | None) -> str | None:
    """Why a lock on this file would not hold, or None: someone we do not trust could remove it and create
    another under the name while we hold this one, and the next locker would lock that one, beside us (two
    holders): host.safepath.replaceable, the rule for every entry hostlock relies on (in a sticky directory
    others can write, fs.protected_regular refuses the open of another user's file, and so flock(1))."""
    if not stat.S_ISREG(st.st_mode) or dst is None:  # None: the path named a directory ("/", "a/..")
        return None
    why = _safepath.replaceable(st.st_uid, dst, strict=False)
    return None if why is None else "%s, who could remove it and make another while we hold this one (two " \
        "holders)" % why


def open_path(path: str, flags: int) -> tuple[int, int]:
    """Open `path` as flock(1) does; returns (fd, flags used). Raises OSError, or LockFileError for a FIFO
    or a symlink another user could have planted in any component of the path (host.safepath: flock(1)
    follows them all). The descriptor is close-on-exec (callers decide who inherits it)."""
    fl = (flags or os.O_RDONLY) | os.O_NOCTTY | os.O_CREAT
    parent: list = []  # the directory the walk opened the file in (where a followed link led)
    try:
        fd = _open(path, fl | os.O_NONBLOCK, CREATE_MODE, parent)
    except IsADirectoryError:
        # Linux refuses O_CREAT on a directory; POSIX allows neither O_RDWR nor O_WRONLY there.
        fl = os.O_RDONLY | os.O_NOCTTY
        fd = _open(path, fl | os.O_NONBLOCK, 0)
    st = os.fstat(fd)
    if stat.S_ISFIFO(st.st_mode):
        os.close(fd)
        raise LockFileError("it is a FIFO (refused: opening it would block)", path=path, errno=errno.ENXIO)
    why = _replaceable(st, parent[-1] if parent else None)
    if why:
        os.close(fd)
        raise LockFileError(why + ". Lock a file in a directory only you (or root) can change entries of",
                            path=path, errno=errno.EACCES)
    # Whoever inherits this open file description must not see the O_NONBLOCK added for the open.
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    return fd, fl


def lock_fd(fd: int, op: int, block: bool, ofd: bool = False, start: int = 0, length: int = 0) -> None:
    """flock(2), or an OFD fcntl lock on [start, start+length) (length 0: to EOF); OSError on failure."""
    if not ofd:
        fcntl.flock(fd, op | (0 if block else fcntl.LOCK_NB))
        return
    import struct

    arg = struct.pack("hhqqi", _FCNTL_TYPE[op], os.SEEK_SET, start, length, 0)
    fcntl.fcntl(fd, F_OFD_SETLKW if block else F_OFD_SETLK, arg)


def unlock_fd(fd: int, ofd: bool = False, start: int = 0, length: int = 0) -> None:
    """Drop the lock on the open file description now, whoever else still has a copy of the descriptor
    (a watcher process winding down must not hold it past us); errors are moot, the lock goes at exit."""
    try:
        lock_fd(fd, fcntl.LOCK_UN, False, ofd, start, length)
    except OSError:
        pass


# setitimer() takes no more (Python keeps times in int64 nanoseconds: 9.2e9 s); flock(1) takes up to time_t's end.
_TIMER_MAX = 1e9


class _TimedOut(Exception):
    """Raised by the SIGALRM handler: interrupts the blocking lock call (PEP 475 retries EINTR otherwise)."""


def _alarm(_sig: int, _frame: object) -> None:
    raise _TimedOut()


def lock_with_timeout(fd: int, op: int, timeout: float | None, ofd: bool = False, start: int = 0,
                      length: int = 0) -> bool:
    """Lock, waiting at most `timeout` seconds (None: forever, 0: not at all); False on conflict/timeout.

    The kernel's own wait queue does the waiting (woken on release, never polled); an interval timer
    (SIGALRM, as flock(1) does) interrupts it. Main thread only, like any signal handler.
    """
    if timeout is not None and timeout <= 0:
        try:
            lock_fd(fd, op, False, ofd, start, length)
            return True
        except OSError as exc:
            if exc.errno in CONFLICT:
                return False
            raise
    if timeout is None or timeout >= _TIMER_MAX:
        lock_fd(fd, op, True, ofd, start, length)  # a wait of decades is a wait without end
        return True
    old = _signal.signal(_signal.SIGALRM, _alarm)
    _signal.setitimer(_signal.ITIMER_REAL, timeout)
    try:
        lock_fd(fd, op, True, ofd, start, length)
        return True
    except _TimedOut:
        return False
    finally:
        _signal.setitimer(_signal.ITIMER_REAL, 0)
        _signal.signal(_signal.SIGALRM, old)


class PathLock:
    """A flock(1)-compatible lock on a path, with the part of Lock's interface `hostlock run` drives
    (`cli.options.RunLock`). Conflicts raise LockTimeout naming the holders found in /proc (`host.proclocks`)."""

    def __init__(self, path: str, mode: str = "exclusive", ofd: bool = False) -> None:
        self.path = path
        self.name = path
        self.directory = os.path.dirname(os.path.abspath(path))
        self.mode = mode
        self.ofd = ofd
        self.mechanism = "ofd (path)" if ofd else "flock (path)"
        self.fd = -1

    def acquire(self, timeout: float | None = None) -> None:
        op = fcntl.LOCK_SH if self.mode == "shared" else fcntl.LOCK_EX
        flags = os.O_WRONLY if self.ofd and op == fcntl.LOCK_EX else 0
        try:
            fd, _fl = open_path(self.path, flags)
        except LockFileError:
            raise
        except OSError as exc:
            raise LockFileError("cannot open lock file %s: %s" % (self.path, exc.strerror), path=self.path,
                                errno=exc.errno) from None
        try:
            got = lock_with_timeout(fd, op, timeout, self.ofd)
        except BaseException:
            os.close(fd)
            raise
        if not got:
            os.close(fd)
            raise LockTimeout("%s is busy" % self.path, holders=self._holders(), path=self.path)
        self.fd = fd

    def _holders(self) -> list:
        from . import proclocks as _proclocks

        try:
            st = _safepath.stat_path(self.path)
            return [h for lk in _proclocks.locks_on(st.st_dev, st.st_ino) if not lk.waiting for h in lk.holders]
        except OSError:
            return []

    def release(self) -> None:
        if self.fd >= 0:
            unlock_fd(self.fd, self.ofd)  # now, though hostlock's watcher process may still share the fd
            os.close(self.fd)
            self.fd = -1

    def descriptors(self) -> list[int]:
        """The locked descriptor, for the supervisor's watcher (see Lock.descriptors)."""
        return [self.fd] if self.fd >= 0 else []

    def update_record(self, job_pid: int | None = None, job_cmdline: str | None = None, *,
                      defer: bool = False) -> None:
        """No owner record for a path lock: `status --path` reads holders and jobs from /proc."""
        return None

    # A host lock on a path: no lease to lose, no fence, no deadline (as Lock's host locks answer).
    fence = None
    lost = False
    valid_until = None

    def check(self) -> None:
        """Never lost: the kernel holds it until the descriptor closes."""
        return None
