"""Pruning lock files nobody has used for a while (`hostlock gc`), without ever splitting a lock.

Lock files are never deleted on release: deleting one while a waiter has it open gives two holders (the
waiter locks the old inode, a newcomer creates a new one; filelock #574, portalocker #115). gc deletes a
file only while it holds a write lock over the WHOLE file, which conflicts with every holder, waiter and
queue ticket, and with the OPEN range every Lock read-locks while it has the file open; a Lock that
opened the file just before the unlink sees st_nlink == 0 once it has taken OPEN and opens the name again
(host.lockers.KernelLocker._open). So a name is removed only when nobody holds it, waits for it or has it
open, and its file has not been written (every acquisition writes its owner record) for `older_than`
seconds.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time

from ..core.errors import HostlockError, MechanismError
from ..core.names import validate_name
from .directory import open_directory, open_lock_file, read_marker
from .kernel import CONTENTION, F_OFD_SETLK, WHOLE_FILE


def collect(directory: str, older_than: float, dry_run: bool = False) -> list:
    """Remove (or, with dry_run, list) the free lock files in `directory` unused for `older_than` seconds.

    Returns one dict per lock file: name, path, idle (seconds since last use), and action: "removed",
    "would remove", or "kept" with a reason. Only the OFD mechanism is supported: flock keeps extra range
    files and the record mechanism has no lock files to prune.
    """
    directory = os.path.abspath(directory)
    if not os.path.lexists(directory):
        return []
    dirfd = open_directory(directory)[0]
    try:
        mechanism = read_marker(dirfd, directory)
        if mechanism is None:
            return []
        if mechanism != "ofd":
            raise MechanismError("gc prunes directories on the ofd mechanism; %s uses %r"
                                 % (directory, mechanism), directory=directory)
        shared = bool(os.fstat(dirfd).st_mode & 0o020)
        now = time.time()
        out = []
        for entry in sorted(os.listdir(dirfd)):
            if not entry.endswith(".lock") or entry.startswith("."):
                continue
            try:
                name = validate_name(entry[:-5])
            except ValueError:
                continue
            out.append(_one(dirfd, directory, name, shared, now, older_than, dry_run))
        return out
    finally:
        os.close(dirfd)


def _one(dirfd: int, directory: str, name: str, shared: bool, now: float, older_than: float,
         dry_run: bool) -> dict:
    filename = name + ".lock"
    entry: dict = {"name": name, "path": os.path.join(directory, filename), "idle": None, "action": "kept",
                   "reason": None}
    try:
        fd = open_lock_file(dirfd, filename, directory, shared, create=False)
    except FileNotFoundError:
        entry["reason"] = "gone"
        return entry
    except HostlockError as e:  # a planted symlink or FIFO, another user's file: report, never follow
        entry["reason"] = str(e)
        return entry
    try:
        st = os.fstat(fd)
        entry["idle"] = max(0.0, now - st.st_mtime)
        if entry["idle"] < older_than:
            entry["reason"] = "used recently"
            return entry
        try:
            fcntl.fcntl(fd, F_OFD_SETLK, WHOLE_FILE)
        except OSError as e:
            if e.errno not in CONTENTION:
                raise
            entry["reason"] = "held, waited for or open"
            return entry
        # Holding the whole file: re-check that the name still is this inode and still idle.
        now_st = os.stat(filename, dir_fd=dirfd, follow_symlinks=False)
        if (now_st.st_dev, now_st.st_ino) != (st.st_dev, st.st_ino) or os.fstat(fd).st_mtime != st.st_mtime:
            entry["reason"] = "changed while checking"
            return entry
        if dry_run:
            entry["action"] = "would remove"
            return entry
        try:
            os.unlink(filename, dir_fd=dirfd)
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.EACCES):
                raise
            entry["reason"] = "not permitted: another user's file in a sticky directory"
            return entry
        entry["action"] = "removed"
        return entry
    finally:
        os.close(fd)  # releases the whole-file lock, after the unlink
