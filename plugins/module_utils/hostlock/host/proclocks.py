"""Who holds kernel locks on any file: /proc/locks, completed from /proc/PID/fdinfo.

/proc/locks alone misleads (lslocks shows what it says): an OFD lock shows pid -1, and a flock(2) lock
shows the pid that took it, which may have exited while a child that inherited the descriptor keeps the
lock (`flock L sh -c 'sleep 60 &'`). The kernel also lists every lock in /proc/PID/fdinfo/FD ("lock:"
lines) of each descriptor through which it is held (fs/locks.c show_fd_locks: flock and OFD locks belong
to the open file description, POSIX locks to the process), so the real holders are the processes whose
descriptors of the inode carry lock lines. Processes of other users are unreadable except to root: such
holders stay unknown rather than guessed.
"""

from __future__ import annotations

import os

from ..core import procstat

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from typing import Any

_KINDS = {"FLOCK": "flock", "POSIX": "posix", "OFDLCK": "ofd", "LEASE": "lease", "DELEG": "lease"}
_MODES = {"WRITE": "exclusive", "READ": "shared", "UNLCK": "none", "RW": "exclusive", "NONE": "none"}


class KernelLock:
    """One line of /proc/locks (or of an fdinfo "lock:" line): a lock held, or a waiter blocked on it."""

    __slots__ = ("id", "kind", "mode", "pid", "dev", "inode", "start", "end", "waiting", "holders")

    def __init__(self, id_: int, kind: str, mode: str, pid: int, dev: tuple[int, int], inode: int,
                 start: int, end: int | None, waiting: bool) -> None:
        self.id = id_
        self.kind = kind        # flock, posix, ofd, lease
        self.mode = mode        # exclusive or shared
        self.pid = pid          # as /proc/locks says: -1 for OFD locks; for flock the process that took it
        self.dev = dev          # (major, minor)
        self.inode = inode
        self.start = start
        self.end = end          # inclusive last byte, None for EOF (to the end of the file, ever)
        self.waiting = waiting  # a blocked request ("->"), not a held lock
        self.holders: list[Holder] = []

    def key(self) -> tuple[str, str, int, int | None]:
        return (self.kind, self.mode, self.start, self.end)

    def as_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "mode": self.mode, "start": self.start, "end": self.end,
                "waiting": self.waiting, "proc_locks_pid": None if self.pid < 0 else self.pid,
                "holders": [h.as_json() for h in self.holders]}


class Holder:
    """A process holding (or, for a waiter, requesting) a lock through descriptor `fd`."""

    __slots__ = ("pid", "fd", "uid", "cmdline", "jobs")

    def __init__(self, pid: int, fd: int | None, uid: int | None, cmdline: str,
                 jobs: list[tuple[int, str]]) -> None:
        self.pid = pid
        self.fd = fd
        self.uid = uid
        self.cmdline = cmdline
        self.jobs = jobs  # (pid, cmdline) of its children: the job when the holder is a wrapper

    def describe(self) -> str:
        """For conflict messages: 'pid 12 (flock /x sleep 9; job pid 13: sleep 9)'."""
        text = " ".join(self.cmdline.split())[:80] or "?"
        for pid, cmd in self.jobs[:2]:
            text += "; job pid %d: %s" % (pid, " ".join(cmd.split())[:80] or "?")
        return "pid %d (%s)" % (self.pid, text)

    def as_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "fd": self.fd, "uid": self.uid, "cmdline": self.cmdline,
                "jobs": [{"pid": p, "cmdline": cmd} for p, cmd in self.jobs]}


def parse_line(line: str) -> KernelLock | None:
    """Parse '1: FLOCK  ADVISORY  WRITE 123 fe:00:4567 0 EOF' (or '1: -> FLOCK ...'); None if unknown."""
    words = line.split()
    if len(words) < 8 or not words[0].endswith(":"):
        return None
    try:
        id_ = int(words[0][:-1])
    except ValueError:
        return None
    waiting = words[1] == "->"
    if waiting:
        words = words[1:]
    if len(words) < 8:
        return None
    kind, _advisory, access, pid, where, start, end = words[1:8]
    parts = where.split(":")
    if len(parts) != 3:
        return None
    try:
        dev = (int(parts[0], 16), int(parts[1], 16))
        return KernelLock(id_, _KINDS.get(kind, kind.lower()), _MODES.get(access, access.lower()), int(pid),
                          dev, int(parts[2]), int(start), None if end == "EOF" else int(end), waiting)
    except ValueError:
        return None


def read_locks(path: str = "/proc/locks") -> list[KernelLock]:
    """Every lock and waiter in the system, in /proc/locks order."""
    with open(path, encoding="ascii", errors="replace") as f:
        return [lk for lk in map(parse_line, f) if lk is not None]


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def cmdline_of(pid: int, proc: str = "/proc") -> str:
    """The process's command line as a shell would quote it; '' if gone or unreadable (a kernel thread)."""
    from ..core.text import join_command

    data = _read("%s/%d/cmdline" % (proc, pid))
    if not data:
        return ""
    return join_command([a.decode("utf-8", "backslashreplace") for a in data.rstrip(b"\0").split(b"\0")])


def _ppid_uid(pid: int, proc: str = "/proc") -> tuple[int, int | None]:
    fields = procstat.fields(pid, proc)
    ppid = -1
    if fields:
        try:
            ppid = int(fields[procstat.PPID])
        except ValueError:
            pass
    try:
        uid: int | None = os.stat("%s/%d" % (proc, pid)).st_uid
    except OSError:
        uid = None
    return ppid, uid


def locks_on(st_dev: int, st_ino: int, proc: str = "/proc") -> list[KernelLock]:
    """The locks and waiters on one inode, each with the processes that hold it (see module docstring)."""
    dev = (os.major(st_dev), os.minor(st_dev))
    locks = [lk for lk in read_locks(proc + "/locks") if lk.dev == dev and lk.inode == st_ino]
    if not locks:
        return []
    # Descriptors of this inode, in every process we may look at, and the locks held through each.
    holding: dict[tuple[str, str, int, int | None], list[tuple[int, int]]] = {}
    parents: dict[int, list[int]] = {}
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        pid = int(entry)
        ppid, _uid = _ppid_uid(pid, proc)
        parents.setdefault(ppid, []).append(pid)
        fd_dir = "%s/%d/fd" % (proc, pid)
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue  # gone, or another user's process
        for name in fds:
            try:
                st = os.stat("%s/%s" % (fd_dir, name))
            except OSError:
                continue
            if st.st_ino != st_ino or st.st_dev != st_dev:
                continue
            info = _read("%s/%d/fdinfo/%s" % (proc, pid, name)) or b""
            for raw in info.decode("ascii", "replace").splitlines():
                if raw.startswith("lock:"):
                    lk = parse_line(raw[5:].strip())
                    if lk is not None:
                        holding.setdefault(lk.key(), []).append((pid, int(name)))
    for lk in locks:
        found: list[tuple[int, int | None]] = list(holding.get(lk.key(), []))
        if lk.kind == "posix":  # owned by one process: the one /proc/locks names
            found = [(p, fd) for p, fd in found if p == lk.pid] or [(lk.pid, None)]
        elif lk.waiting:  # a blocked request is not listed in fdinfo; /proc/locks names the waiter
            found = [(lk.pid, None)] if lk.pid > 0 else []
        elif not found and lk.pid > 0:  # holder not readable by us: say what /proc/locks says
            found = [(lk.pid, None)]
        for pid, fd in found:
            _ppid, uid = _ppid_uid(pid, proc)
            jobs = [(child, cmdline_of(child, proc)) for child in sorted(parents.get(pid, []))]
            lk.holders.append(Holder(pid, fd, uid, cmdline_of(pid, proc), jobs))
    return locks


def describe(lk: KernelLock) -> str:
    """'flock exclusive held by pid 12 (fd 3): hostlock flock /x sleep 9; job pid 13: sleep 9'."""
    last = "EOF" if lk.end is None else str(lk.end)
    span = "" if lk.start == 0 and lk.end is None else " bytes %d-%s" % (lk.start, last)
    what = "%s %s%s %s" % (lk.kind, lk.mode, span, "waited for by" if lk.waiting else "held by")
    if not lk.holders:
        return "%s an unknown process (pid %d: not visible to this user)" % (what, lk.pid)
    parts = []
    for h in lk.holders:
        text = "pid %d%s: %s" % (h.pid, " (fd %d)" % h.fd if h.fd is not None else "", h.cmdline or "?")
        for pid, cmd in h.jobs:
            text += "; job pid %d: %s" % (pid, cmd or "?")
        parts.append(text)
    return "%s %s" % (what, " | ".join(parts))
