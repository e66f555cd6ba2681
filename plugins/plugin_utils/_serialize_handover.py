# Copyright: (c) 2025, hostlock maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""PRIVATE to this collection: what the last holder of a host's controller lock left there, clean or not.

The in-flight wait costs a module run per host per play. It is needed only on a host whose lock's earlier
holder may have left work running there: a run that was killed, or one that saw a task of its own end
without its end on the host (unreachable, timed out, an async job left with poll 0). So every run that
takes a host's lock replaces its entry for that lock, in the controller lock directory, with `dirty` before
any task runs, and a run that ends its hold cleanly writes `clean` there while it still holds the lock.
The next run skips the wait on a host only when:

- its own uid's entry for the host's lock says `clean`: a regular file of this uid (bytes only this uid, or
  root, can write), in the lock directory the engine already refuses unless it is ours or root's and, when
  others may write to it, sticky (nobody else can remove or replace our entry); and
- no other entry for that lock or its bucket lock (any uid's: a run of another user, a large play) changed
  at or after it: each run's entry is a new file (a new inode, its ctime set by the kernel, which nobody
  can set back), so a later holder of the lock, whoever it is, leaves a newer ctime.

Whatever is missing, unreadable, of another owner or not exactly `clean` means "wait", never "skip": a
fresh directory (a reboot empties /run), another user's planted file, a run of an older version. With a
fleet the lock lives in etcd and no file here can say who held it last, so fleet runs always wait.
"""

from __future__ import annotations

import errno
import os
import stat

from ansible_collections.hostlock.core.plugins.module_utils.hostlock.host.directory import open_directory

# `=` is never part of a lock name, and a leading dot keeps the entries out of `hostlock list` and `gc`.
PREFIX = ".serialize="
CLEAN = b"clean\n"
DIRTY = b"dirty\n"
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


def entry_name(uid: int, lock: str) -> str:
    return f"{PREFIX}{uid}={lock}"


class HandoverError(OSError):
    """An entry of ours that says clean could not be replaced: a later run might skip a wait it needs."""


class Handover:
    """The entries of one controller lock directory, seen from this uid."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.uid = os.geteuid()
        self._dirfd: int | None = None

    def _fd(self) -> int:
        if self._dirfd is None:
            self._dirfd, _shared = open_directory(self.directory)  # trusted, or LockDirectoryError
        return self._dirfd

    def close(self) -> None:
        if self._dirfd is not None:
            os.close(self._dirfd)
            self._dirfd = None

    def clean(self, locks: dict[str, tuple[str, ...]]) -> set[str]:
        """Of these locks (each with the other locks whose holders also touch its host, its bucket lock),
        those whose last holder was a run of ours that ended its hold cleanly."""
        dirfd = self._fd()
        found: dict[str, float] = {}
        mine = {}
        for lock in locks:
            ctime = self._own_clean(dirfd, lock)
            if ctime is not None:
                mine[lock] = ctime
        if not mine:
            return set()
        wanted = {name for lock in mine for name in (lock, *locks[lock])}
        for entry in os.listdir(dirfd):
            if not entry.startswith(PREFIX):
                continue
            owner, _sep, lock = entry[len(PREFIX):].partition("=")
            if lock not in wanted or owner == str(self.uid) and lock in mine:
                continue
            try:
                st = os.lstat(entry, dir_fd=dirfd)
            except OSError:
                continue  # gone since the listing: its owner replaced it, and the replacement is listed
            found[lock] = max(found.get(lock, 0), st.st_ctime_ns)
        return {lock for lock, ctime in mine.items()
                if all(found.get(name, -1) < ctime for name in (lock, *locks[lock]))}

    def _own_clean(self, dirfd: int, lock: str) -> int | None:
        """The ctime of our entry for `lock` if it is a regular file of ours saying clean, else None."""
        try:
            fd = os.open(entry_name(self.uid, lock), os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC | _O_NONBLOCK,
                         dir_fd=dirfd)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != self.uid:
                return None
            return st.st_ctime_ns if os.read(fd, 16) == CLEAN else None
        finally:
            os.close(fd)

    def taken(self, locks: list[str], tag: str) -> None:
        """Say `dirty` for each lock just taken, before any task runs: a run killed from here on leaves
        that. Raises HandoverError if an entry of ours saying clean stays in place."""
        for lock in locks:
            self._write(lock, DIRTY, tag)

    def ended_clean(self, lock: str, tag: str) -> None:
        """Say `clean` for a lock still held, whose host has no work of ours left that we know of."""
        try:
            self._write(lock, CLEAN, tag)
        except OSError:
            pass  # the entry stays `dirty` (or missing): the next run waits, which is never wrong

    def _write(self, lock: str, data: bytes, tag: str) -> None:
        """Replace our entry with a new file (a new inode and ctime) holding `data`."""
        dirfd = self._fd()
        final = entry_name(self.uid, lock)
        tmp = f"{final}={tag}"  # the run's random id: nobody can make this name first
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC, 0o644, dir_fd=dirfd)
            try:
                os.fchmod(fd, 0o644)  # others read it (a newer entry makes our clean one stale); only we write
                if os.write(fd, data) != len(data):
                    raise OSError(errno.EIO, "short write")
            finally:
                os.close(fd)
            os.rename(tmp, final, src_dir_fd=dirfd, dst_dir_fd=dirfd)
        except OSError as e:
            try:
                os.unlink(tmp, dir_fd=dirfd)
            except OSError:
                pass
            if data == DIRTY and self._own_clean(dirfd, lock) is not None:
                raise HandoverError(e.errno, f"cannot replace {os.path.join(self.directory, final)}: "
                                    f"{e.strerror}; a later run could skip waiting for this run's tasks") from None
