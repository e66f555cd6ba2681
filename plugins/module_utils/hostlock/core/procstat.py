"""/proc/PID/stat, read and split in one place: a process's state, parent, group and start time; and pidfds.

The command name (field 2) may hold spaces and ')': the fields are split after the last ')'. fields()[0]
is the state (field 3), [1] the parent pid, [2] the process group, [19] the start time in clock ticks
since boot (field 22), which with the pid and the boot id names a process for good; [47] and [48] the bounds
of its initial environment block in its memory (fields 50 and 51, Linux 3.5).
"""

from __future__ import annotations

from . import oslite as os

STATE, PPID, PGRP, START = 0, 1, 2, 19
ENV_START, ENV_END = 47, 48


def read(pid: int, proc: str = "/proc") -> bytes | None:
    """The raw stat line of `pid`, or None when it is gone or unreadable (one read: stat is one line)."""
    try:
        fd = os.open("%s/%d/stat" % (proc, pid), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)


def split(data: bytes | None) -> list[bytes] | None:
    """The fields after the command name (STATE, PPID, PGRP, START index them), or None if malformed."""
    if not data:
        return None
    fields = data.rpartition(b")")[2].split()
    return fields if len(fields) > START else None


def fields(pid: int, proc: str = "/proc") -> list[bytes] | None:
    return split(read(pid, proc))


def start_ticks(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (a pid alone can be reused), or None."""
    f = fields(pid)
    return f[START].decode() if f else None


def pidfd(pid: int) -> int | None:
    """A pidfd for `pid` (Linux >= 5.3, Python >= 3.9): signals and waits through it reach this very process
    even if the pid is reused meanwhile, and it is readable once the process exits. None where unavailable or
    the process is gone."""
    opener = getattr(os, "pidfd_open", None)
    if opener is None:
        return None
    try:
        return opener(pid)
    except OSError:
        return None
