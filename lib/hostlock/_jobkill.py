"""The watcher's last duty when hostlock died mid-job: kill the job's whole process tree, and return only
once every process of it is gone (a zombie counts as gone: it runs nothing and holds no descriptor).

Imported only then, in the watcher (see `_supervise`), which still holds the lock: the lock is free only
after this returns. What counts as the job:
- every process whose environment carries the job's tag (HOSTLOCK_JOB=..., set by the supervisor and
  inherited by everything the job starts: it survives setsid(), double forks and orphaning, which is how
  a killer of hostlock's whole session, that orphans the job's setsid'd children at once, is answered);
- its process group, when it has its own (every process in it, wherever its parent went);
- every descendant of the job's first process still attached to the tree, in its group or not. The job's
  first process is frozen by PR_SET_PDEATHSIG=SIGSTOP when hostlock dies, so its children stay attached.
A process that left the group, the tree and the tag (e.g. a daemon started with `env -i` and setsid) is
beyond reach: it never held the lock (the lock's descriptors are close-on-exec), and it chose to leave.

The tree is frozen (SIGSTOP) before it is killed, so nothing forks or orphans itself between the looking
and the killing; SIGKILL also ends stopped processes. Polling /proc here is fine: this runs once, after a
crash, never on the path of a normal run.
"""

from __future__ import annotations

import _signal
import os
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from typing import Callable


def _stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, ppid, pgrp, start time in clock ticks) from /proc/PID/stat, or None if it is gone."""
    try:
        fd = os.open("/proc/%d/stat" % pid, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        data = os.read(fd, 1024)
    except OSError:
        return None
    finally:
        os.close(fd)
    return _parse(data)


def _parse(data: bytes) -> tuple[str, int, int, int] | None:
    # The command name may hold spaces and parentheses: the fields start after the last ')'.
    try:
        fields = data.rsplit(b")", 1)[1].split()
        return fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[19])
    except (IndexError, ValueError):
        return None


def _snapshot() -> dict[int, tuple[str, int, int, int]]:
    procs = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _stat(int(name))
            if st is not None:
                procs[int(name)] = st
    return procs


def _alive(st: tuple[str, int, int, int] | None) -> bool:
    return st is not None and st[0] not in ("Z", "X", "x")


def _tagged(pid: int, marker: bytes) -> bool:
    """Whether /proc/PID/environ holds HOSTLOCK_JOB=tag (as it was at exec: what the job inherited)."""
    try:
        fd = os.open("/proc/%d/environ" % pid, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        chunks = [b"\0"]
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    except OSError:
        return False
    finally:
        os.close(fd)
    return marker in b"".join(chunks)


def _members(job: int, new_group: bool, job_start: int | None, known: set[int], tag: bytes = b"") -> set[int]:
    """Live processes of the job now: tagged ones, its group, its first process, descendants of any."""
    procs = _snapshot()
    roots = set(known)
    if tag:
        marker = b"\0HOSTLOCK_JOB=" + tag + b"\0"
        me = os.getpid()
        roots.update(pid for pid, st in procs.items() if pid != me and _alive(st) and _tagged(pid, marker))
    if new_group:
        roots.update(pid for pid, st in procs.items() if st[2] == job)
    st = procs.get(job)
    if st is not None and job_start is not None and st[3] == job_start:
        roots.add(job)
    children: dict[int, list[int]] = {}
    for pid, st in procs.items():
        children.setdefault(st[1], []).append(pid)
    found, stack = set(), list(roots)
    while stack:
        pid = stack.pop()
        if pid in found or pid == os.getpid():
            continue
        found.add(pid)
        stack.extend(children.get(pid, ()))
    return {pid for pid in found if _alive(procs.get(pid))}


def _send(pids: set[int], job: int, new_group: bool, sig: int) -> None:
    if new_group:
        try:
            os.killpg(job, sig)
        except OSError:
            pass
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def _wait(pids: set[int], done: Callable[[tuple[str, int, int, int] | None], bool]) -> None:
    """Until done(state) holds for every pid (gone counts): short naps, growing to 50 ms."""
    nap = 0.001
    while True:
        left = {pid for pid in pids if not done(_stat(pid))}
        if not left:
            return
        pids = left
        time.sleep(nap)
        nap = min(nap * 2, 0.05)


def _stopped(st: tuple[str, int, int, int] | None) -> bool:
    return st is None or not _alive(st) or st[0] in ("T", "t")


def kill_job(job: int, new_group: bool, job_stat: bytes, tag: bytes = b"") -> None:
    """Freeze, then SIGKILL, the job's tree; return once none of it runs."""
    parsed = _parse(job_stat) if job_stat else None
    job_start = parsed[3] if parsed else None
    victims: set[int] = set()
    while True:  # freeze until a look at the frozen tree finds nobody new (nothing frozen can fork)
        fresh = _members(job, new_group, job_start, victims, tag) - victims
        if not fresh:
            break
        victims |= fresh
        _send(fresh, job, new_group, _signal.SIGSTOP)
        _wait(fresh, _stopped)
    while victims:
        _send(victims, job, new_group, _signal.SIGKILL)
        _wait(victims, lambda st: not _alive(st))
        # Anyone of the job still running was unseen (cannot happen once frozen; cheap to be sure).
        victims = _members(job, new_group, None, set(), tag)
