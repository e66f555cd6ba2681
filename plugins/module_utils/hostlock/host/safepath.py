"""Open a path a user gave (`flock FILE`, `run --path FILE`, `status --path FILE`, `--dir DIR`) without
following a symlink another user could have planted in ANY of its components.

The kernel follows every symlink in a path; O_NOFOLLOW guards only the last component, and
fs.protected_symlinks (0 on some systems) only sticky world-writable directories. So the path is walked
here one component at a time, from `/` (or the current directory for a relative path), each step an
openat() relative to the descriptor of the directory before it: once a directory is held, renaming or
replacing it (or anything above it) cannot redirect the rest of the walk.

A symlink is followed only when nobody else could have put it there or swapped it since:
- it is owned by root or by us, and
- its directory is one no other user can change entries of: owned by root or us and not writable by
  group or others, or sticky and owned by root or us (in a sticky directory only an entry's owner and the
  directory's owner can remove or rename it).
So /bin -> usr/bin, /var/run -> /run, /lib, our own links (flock(1) users lock through them) are
followed; /tmp/x -> /root-only planted by another user, or a root-owned link in a directory another user
can write (who could rename it away and plant their own), are refused with UnsafePath naming the
component. The target of a followed link is walked by the same rules; `..` goes to the parent of the
directory actually held, as the kernel's own walk does.
"""

from __future__ import annotations

import errno
import os
import stat

_O_PATH = getattr(os, "O_PATH", 0)  # Linux: a handle that needs no read permission on the directory
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = (_O_PATH or os.O_RDONLY) | _O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC
MAX_SYMLINKS = 40  # the kernel's own limit (ELOOP after 40)


class UnsafePath(OSError):
    """A component of the path is a symlink another user could have planted: the path is refused."""

    def __init__(self, message: str) -> None:
        super().__init__(errno.ELOOP, message)
        self.message = message

    def __str__(self) -> str:
        return self.message


def _trusted_uids() -> tuple[int, int]:
    return (0, os.geteuid())


def _entries_safe(dir_st: os.stat_result) -> bool:
    """True when no other user can remove, rename or create entries in this directory."""
    if dir_st.st_uid not in _trusted_uids():
        return False
    if not dir_st.st_mode & 0o022:
        return True
    # Sticky: others may add names, but cannot remove or rename the entries of root or us.
    return bool(dir_st.st_mode & stat.S_ISVTX)


def _why_refused(link_st: os.stat_result, dir_st: os.stat_result) -> str | None:
    if link_st.st_uid not in _trusted_uids():
        return "a symlink owned by uid %d, another user" % link_st.st_uid
    if not _entries_safe(dir_st):
        if dir_st.st_uid not in _trusted_uids():
            return "a symlink in a directory owned by uid %d, another user" % dir_st.st_uid
        return "a symlink in a directory other users can write (mode %o)" % stat.S_IMODE(dir_st.st_mode)
    return None


def _components(path: str) -> list[str]:
    # "." stays (as the kernel, "file/." and "file/" must be ENOTDIR); a trailing slash is a trailing ".".
    parts = [p for p in path.split("/") if p]
    if parts and path.endswith("/"):
        parts.append(".")
    return parts


def _open_dir_at(dirfd: int, name: str) -> int:
    return os.open(name, _DIR_FLAGS, dir_fd=dirfd)


def _start(path: str) -> int:
    # A relative path starts at the current directory: the caller chose it, as it chose the path.
    return os.open("/" if path.startswith("/") else ".", _DIR_FLAGS)


def _is_symlink(dirfd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dirfd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _follow(dirfd: int, name: str, shown: str, hops: list) -> str:
    """Check the symlink `name` in `dirfd` and return its target; raises UnsafePath or ELOOP."""
    link_st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
    why = _why_refused(link_st, os.fstat(dirfd))
    if why:
        raise UnsafePath("refusing %s: %s, in a path hostlock must open (it follows no symlink another "
                         "user could have planted or swapped)" % (shown, why))
    hops.append(1)
    if len(hops) > MAX_SYMLINKS:
        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP))
    target = os.readlink(name, dir_fd=dirfd)
    if shown.startswith("/proc/") and "/" not in target and target.endswith("]") and ":[" in target:
        # /proc's magic link to what has no path (`pipe:[N]`, `socket:[N]`, `anon_inode:[...]`): /dev/stdin
        # on a pipe. Walked as a name it would be "No such file"; a lock path is a file, never a pipe.
        raise UnsafePath("%s is %s, a pipe or socket, not a file (refused: a lock path names a file or a "
                         "directory)" % (shown, target))
    return target


def open_path(path: str, flags: int, mode: int = 0o666, follow_last: bool = True,
              parent: list | None = None) -> int:
    """os.open(path, flags, mode) with no symlink followed that another user could have planted.

    Every component is opened relative to the directory before it (O_NOFOLLOW, so the kernel follows
    nothing); a symlink met on the way, the last component included (flock(1) users lock through their
    own links), is followed only by the rules above. Raises UnsafePath (an OSError, ELOOP) naming the
    refused component, or the OSError the walk or the open itself gave. A path that names a directory
    ("/", "a/..") opens it with `flags`. With follow_last=False a symlink as the last component is the
    caller's to refuse: the open gives the error O_NOFOLLOW gives (ELOOP). With `parent`, the os.stat_result
    of the directory the file was opened in (the one the walk reached, links followed) is appended to it.
    """
    if "\0" in path:
        raise ValueError("embedded null byte")
    if not path:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
    hops: list = []
    fd = _start(path)
    pending = _components(path)
    shown = "/" if path.startswith("/") else ""
    try:
        while True:
            if not pending:  # the path names the directory held: open it as asked (EISDIR for writing)
                if _O_PATH and flags & _O_PATH:
                    return os.dup(fd)
                return os.open(".", flags, mode, dir_fd=fd)
            name = pending.pop(0)
            try:
                if pending or name in (".", ".."):
                    nfd = _open_dir_at(fd, name)  # O_NOFOLLOW: a symlink gives ELOOP (ENOTDIR with O_PATH)
                    os.close(fd)
                    fd = nfd
                    shown += "" if name == "." else name + "/"
                    continue
                got = os.open(name, flags | _O_NOFOLLOW, mode, dir_fd=fd)
                if not (_O_PATH and flags & _O_PATH and stat.S_ISLNK(os.fstat(got).st_mode)):
                    if parent is not None:
                        parent.append(os.fstat(fd))
                    return got
                os.close(got)  # O_PATH|O_NOFOLLOW opened the symlink itself: follow it by the rules
            except OSError as exc:
                # A symlink gives ELOOP with O_NOFOLLOW (EMLINK on FreeBSD), ENOTDIR with O_DIRECTORY|O_PATH,
                # EACCES with O_CREAT in a sticky directory (Linux 6): whatever the errno, look at what is there.
                if not (pending or name in (".", "..") or follow_last) or not _is_symlink(fd, name):
                    raise exc from None
            target = _follow(fd, name, shown + name, hops)
            if target.startswith("/"):
                os.close(fd)
                fd = _start("/")
                shown = "/"
            pending[:0] = _components(target)
    finally:
        os.close(fd)


_seen: dict = {}  # path -> (st_dev, st_ino) of the directory a full walk of it reached, in this process


def open_directory(path: str, flags: int) -> int:
    """open_path for a directory opened again and again (the lock directory, at every lock file open).

    After one full walk, the kernel's own walk is used and its result compared with the inode the full
    walk reached: the same directory means no symlink led anywhere else (whichever way the kernel went),
    anything else gets the full walk again. One open and one fstat instead of one per component.
    """
    known = _seen.get(path)
    if known is not None:
        fd = os.open(path, flags | _O_DIRECTORY)
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) == known:
            return fd
        os.close(fd)
    fd = open_path(path, flags | _O_DIRECTORY, follow_last=False)
    st = os.fstat(fd)
    _seen[path] = (st.st_dev, st.st_ino)
    return fd


def stat_path(path: str) -> os.stat_result:
    """os.stat(path) by the same walk (for `status --path`): the inode a lock on `path` would take."""
    fd = open_path(path, _O_PATH or (os.O_RDONLY | os.O_NONBLOCK))
    try:
        return os.fstat(fd)
    finally:
        os.close(fd)
