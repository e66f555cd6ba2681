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


def replaceable(owner: int, dst: os.stat_result, strict: bool = True) -> str | None:
    """Why someone we do not trust could remove an entry of `owner`'s in directory `dst`, or rename it away, and put
    another in its place while we rely on it (a lock file: two holders; a lock directory or one above it: a
    new directory beside our held lock), or None. That is anybody, in a directory every user may write
    without the sticky bit; the entry's owner, when it is another user's in a sticky directory others can
    write; the owner of a directory that is another user's (not root's); and the members of a group we are
    not in that may write it. `strict=False` (a path lock, flock(1)'s file) keeps those last two for root
    only: another user who locks a file in a directory someone else owns or a group of theirs may write trusts
    that directory's users, as with flock(1); root's locks must never be another user's to break."""
    me = os.geteuid()
    sticky = dst.st_mode & stat.S_ISVTX
    if dst.st_mode & 0o002 and not sticky:
        return ("its directory is writable by every user, without the sticky bit (mode %o)"
                % stat.S_IMODE(dst.st_mode))
    if sticky and dst.st_mode & 0o022 and owner not in (me, 0, dst.st_uid):
        return "it belongs to uid %d, in a sticky directory others can write" % owner
    if not strict and me != 0:
        return None
    if dst.st_uid not in (0, me):
        return "its directory belongs to uid %d, another user" % dst.st_uid
    if dst.st_mode & 0o020 and not sticky and dst.st_gid != 0 and dst.st_gid not in os.getgroups() \
            and dst.st_gid != os.getegid():
        return ("its directory is writable by group %d, which %s not in (mode %o)"
                % (dst.st_gid, "root is" if me == 0 else "we are", stat.S_IMODE(dst.st_mode)))
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
              parent: list | None = None, entries: bool = False) -> int:
    """os.open(path, flags, mode) with no symlink followed that another user could have planted.

    Every component is opened relative to the directory before it (O_NOFOLLOW, so the kernel follows
    nothing); a symlink met on the way, the last component included (flock(1) users lock through their
    own links), is followed only by the rules above. Raises UnsafePath (an OSError, ELOOP) naming the
    refused component, or the OSError the walk or the open itself gave. A path that names a directory
    ("/", "a/..") opens it with `flags`. With follow_last=False a symlink as the last component is the
    caller's to refuse: the open gives the error O_NOFOLLOW gives (ELOOP). With `parent`, the os.stat_result
    of the directory the file was opened in (the one the walk reached, links followed) is appended to it.
    With `entries` (a lock directory: everything below it is relied on while a lock is held), every directory
    walked into by name, and the last component, must be one nobody we do not trust could rename away and
    replace (`replaceable`): UnsafePath naming it otherwise.
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
                    if entries and name not in (".", ".."):
                        _check_entry(nfd, fd, shown + name)
                    os.close(fd)
                    fd = nfd
                    shown += "" if name == "." else name + "/"
                    continue
                got = os.open(name, flags | _O_NOFOLLOW, mode, dir_fd=fd)
                if not (_O_PATH and flags & _O_PATH and stat.S_ISLNK(os.fstat(got).st_mode)):
                    if parent is not None:
                        parent.append(os.fstat(fd))
                    if entries:
                        try:
                            _check_entry(got, fd, shown + name)
                        except BaseException:
                            os.close(got)
                            raise
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


def _check_entry(fd: int, dirfd: int, shown: str) -> None:
    why = replaceable(os.fstat(fd).st_uid, os.fstat(dirfd))
    if why:
        raise UnsafePath("refusing %s: %s, who could rename it away and put another in its place while a lock "
                         "is held there (two holders); set HOSTLOCK_DIR (or --dir) to a directory whose every "
                         "parent only root or you can change" % (shown, why))


_seen: dict = {}  # path -> (st_dev, st_ino) of the directory a full walk of it reached, in this process


def open_directory(path: str, flags: int) -> int:
    """open_path for a directory opened again and again (the lock directory, at every lock file open), its
    every component one nobody we do not trust could rename away (`entries`).

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
    fd = open_path(path, flags | _O_DIRECTORY, follow_last=False, entries=True)
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
