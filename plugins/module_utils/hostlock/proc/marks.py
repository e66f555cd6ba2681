"""Processes carrying a mark in their environment: `/proc/PID/environ` (the environment a process was exec'd
with, which its children inherit wherever they go: setsid, double forks, orphaning).

Three users, one scan:
- a lease's in-flight work (lease.py): a lease that runs out keeps its lock until no process carrying its mark
  is left. Anyone can start a process with any environment, so only a process whose real AND effective uid
  are the lease holder's counts (`uid`): another user (one a block `become_user`s to, say) who copies the mark
  into a process of their own cannot keep the holder's lock. The uids come from /proc/PID/status, which tells
  them even for a process that made itself undumpable (its /proc files then belong to root);
- the serialize callback's wait on a host (plugins/modules/serialize_host.py): an earlier run's tasks, the
  host's mark `unless` this run's, by the same uid rule (the module's own uid), with a timeout;
- a job's tag (jobkill.py): the watcher finds the processes of the job it must kill. `uid=None` there: a job
  may run `su`/`sudo`, whose processes are the job's too; the watcher can signal only what its user may.
"""

from __future__ import annotations

from ..core import oslite as os
from ..core import procstat

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from typing import Callable, Container


def _read(path: str) -> bytes | None:
    """The whole of a /proc file, or None when it is unreadable or its process is gone."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        chunks: list[bytes] = []
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)


def environ_of(pid: int) -> bytes | None:
    """/proc/PID/environ as it was at exec, or None when it is unreadable (another user's, unless we are root)
    or the process is gone."""
    return _read("/proc/%d/environ" % pid)


def carries(environ: bytes | None, entry: bytes) -> bool:
    """Whether the environment block holds exactly `entry` (KEY=VALUE) as one of its entries."""
    return environ is not None and (b"\0" + entry + b"\0") in (b"\0" + environ + b"\0")


def shown_cmdline(pid: int, limit: int = 200) -> str:
    """The command line of `pid` to show on one line: its words joined by spaces (core.owner.cmdline), cut to
    `limit` characters, each that is not printable ASCII as '?' (it is another process's text: never a
    terminal's escape sequence); '' when it is gone or unreadable."""
    from ..core.owner import cmdline

    return "".join(c if " " <= c <= "~" else "?" for c in (cmdline(pid) or "")[:limit])


def uids(pid: int) -> tuple[int, int] | None:
    """(real, effective) uid of `pid` from /proc/PID/status, or None when it is gone or unreadable."""
    data = _read("/proc/%d/status" % pid) or b""
    for line in data.split(b"\n"):
        if line.startswith(b"Uid:"):
            words = line.split()
            try:
                return int(words[1]), int(words[2])
            except (IndexError, ValueError):
                return None
    return None


def pids() -> list[int]:
    """Every process of this pid namespace, as /proc lists them; OSError without /proc."""
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def marked(entry: bytes, uid: int | None, *, unless: bytes | None = None, skip: Container[int] = ()) -> list[int]:
    """Pids whose environment holds `entry` (KEY=VALUE) and not `unless`, whose real and effective uid are both
    `uid` (None: any uid, see the module's docstring), other than those in `skip`. A process we cannot read, or
    that is gone meanwhile, is not counted."""
    found: list[int] = []
    try:
        every = pids()
    except OSError:  # no /proc: nothing we could see
        return found
    for pid in every:
        if pid in skip:
            continue
        environ = environ_of(pid)
        if not carries(environ, entry) or (unless is not None and carries(environ, unless)):
            continue
        # Read after the environment: a pid that was reused in between is another process, whose uid counts.
        if uid is not None and uids(pid) != (uid, uid):
            continue
        found.append(pid)
    return found


def ancestors() -> set[int]:
    """Our pid and those of our parents up to init: a process asking about a mark's work is not that work (an
    Ansible task in a lease's own block carries its mark, and so may the shell that started it)."""
    seen = set()
    pid = os.getpid()
    while pid > 1 and pid not in seen:
        seen.add(pid)
        fields = procstat.fields(pid)
        if fields is None:
            break
        try:
            pid = int(fields[procstat.PPID])
        except ValueError:
            break
    return seen


def wait_unmarked(entry: bytes, uid: int | None, poll: float = 0.2, *, unless: bytes | None = None,
                  timeout: float | None = None, seen: Callable[[list[int]], None] | None = None) -> bool:
    """Return True once no process but us carries `entry` and not `unless` (marked(), same uid rule); at once
    without /proc. False when `timeout` seconds (None: no end) are up and some are left, after one last scan.
    `seen` is called once, with the pids of the first scan that found any, before any wait.

    Waits on pidfds (Linux 5.3+, Python 3.9+) of the processes found, then scans again: their children inherit
    the mark and are found by the next scan. Without pidfds it scans every `poll` seconds.
    """
    import select
    import time

    own = (os.getpid(),)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        found = marked(entry, uid, unless=unless, skip=own)
        if not found:
            return True
        if seen is not None:
            seen(found)
            seen = None
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            return False
        fds = []
        for pid in found:
            fd = procstat.pidfd(pid)  # None on an old kernel, or it just ended: the next scan tells
            if fd is not None:
                fds.append(fd)
        try:
            if fds and len(fds) == len(found):
                waiter = select.poll()
                for fd in fds:
                    waiter.register(fd, select.POLLIN)  # a pidfd is readable once its process has exited
                waiter.poll(None if left is None else int(left * 1000) + 1)  # ms, rounded up
            else:
                time.sleep(poll if left is None else min(poll, left))
        finally:
            for fd in fds:
                os.close(fd)
