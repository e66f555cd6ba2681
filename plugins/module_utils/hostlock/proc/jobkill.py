"""The watcher's last duty when hostlock died mid-job: kill the job's whole process tree, and return only
once every process of it is gone (a zombie counts as gone: it runs nothing and holds no descriptor).

Imported only then, in the watcher (`proc.watcher`), which still holds the lock: the lock is free only
after this returns. Also by the supervisor when it stopped a job (its time limit, its fleet lock lost) and the
job's first process is gone while others of the job run on (`end_the_rest`): they end too, before the lock
is released or can be handed on. What counts as the job:
- every process whose environment carries the job's tag (HOSTLOCK_JOB=..., set by the supervisor and
  inherited by everything the job starts: it survives setsid(), double forks and orphaning, which is how
  a killer of hostlock's whole session, that orphans the job's setsid'd children at once, is answered);
- its process group, when it has its own (every process in it, wherever its parent went);
- every descendant of the job's first process still attached to the tree, in its group or not. The job's
  first process is frozen by PR_SET_PDEATHSIG=SIGSTOP when hostlock dies, so its children stay attached.
A process that left the group, the tree and the tag (e.g. a daemon started with `env -i` and setsid) is
beyond reach: it never held the lock (the lock's descriptors are close-on-exec), and it chose to leave.

The tree is frozen (SIGSTOP) before it is killed, so nothing forks or orphans itself between the looking
and the killing; SIGKILL also ends stopped processes, and vfork() parents waiting on a frozen child. The
killing repeats until a look finds nobody of the job alive, so a child forked as the freeze landed dies
too. Polling /proc here is fine: this runs once, after a crash, never on the path of a normal run.

A process we may not signal (EPERM: `sudo` or `su` in a job of a user who is not root) can be neither frozen
nor killed. The freeze goes on without it, the rest is killed (its input ends, so it usually ends too), and
the kill still waits until it is gone: the lock is never free while any process of the job runs.
"""

from __future__ import annotations

import _signal
import os
import time

from ..core import procstat
from .marks import carries, environ_of, pids

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from typing import Callable


def _stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, ppid, pgrp, start time in clock ticks) from /proc/PID/stat, or None if it is gone."""
    return _parse(procstat.read(pid))


def _parse(data: bytes | None) -> tuple[str, int, int, int] | None:
    fields = procstat.split(data)
    try:
        return (fields[procstat.STATE].decode(), int(fields[procstat.PPID]), int(fields[procstat.PGRP]),
                int(fields[procstat.START])) if fields else None
    except ValueError:
        return None


def _snapshot() -> dict[int, tuple[str, int, int, int]]:
    procs = {}
    for pid in pids():
        st = _stat(pid)
        if st is not None:
            procs[pid] = st
    return procs


def _alive(st: tuple[str, int, int, int] | None) -> bool:
    return st is not None and st[0] not in ("Z", "X", "x")


def _members(job: int, new_group: bool, job_start: int | None, known: set[int], tag: bytes = b"") -> dict[int, int]:
    """Live processes of the job now, with their start times: tagged ones, its group, its first process,
    descendants of any."""
    procs = _snapshot()
    roots = set(known)
    if tag:
        entry = b"HOSTLOCK_JOB=" + tag
        me = os.getpid()
        # Any uid (proc.marks): a job's `su`/`sudo` is the job too, and we signal only what we may.
        roots.update(pid for pid, st in procs.items() if pid != me and _alive(st) and carries(environ_of(pid), entry))
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
    return {pid: procs[pid][3] for pid in found if _alive(procs.get(pid))}


class _Victim:
    """One process of the job, pinned: a pidfd where the kernel and Python have one (Linux 5.3+, Python
    3.9+), so a signal can only reach this very process; elsewhere its start time, checked again just
    before each signal. A process that died and whose pid was reused is never signalled."""

    __slots__ = ("pid", "start", "fd", "denied")

    def __init__(self, pid: int, start: int, fd: int | None) -> None:
        self.pid, self.start, self.fd = pid, start, fd
        self.denied = False  # EPERM: not ours to signal (another uid, e.g. sudo's)

    @classmethod
    def pin(cls, pid: int, start: int) -> _Victim | None:
        """The process `pid` if it is still the one that started at `start`; else None."""
        fd = procstat.pidfd(pid)  # None: gone (then the check below says so) or no pidfds here
        if not _same(_stat(pid), start):  # checked after the open: the pidfd is this process's
            if fd is not None:
                os.close(fd)
            return None
        return cls(pid, start, fd)

    def signal(self, sig: int) -> None:
        try:
            if self.fd is not None and _pidfd_send is not None:
                _pidfd_send(self.fd, sig)
            elif _same(_stat(self.pid), self.start):
                os.kill(self.pid, sig)
        except PermissionError:
            self.denied = True
        except OSError:
            pass  # gone meanwhile

    def state(self) -> tuple[str, int, int, int] | None:
        """Its /proc state; None once it is gone (or its pid names another process)."""
        st = _stat(self.pid)
        return st if _same(st, self.start) else None

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _same(st: tuple[str, int, int, int] | None, start: int) -> bool:
    return st is not None and st[3] == start


def _pidfd_sender() -> Callable[[int, int], None] | None:
    try:
        import signal  # the crash path only: signal imports enum

        return getattr(signal, "pidfd_send_signal", None)
    except ImportError:  # pragma: no cover
        return None


_pidfd_send = _pidfd_sender()


def _settle(victims: list[_Victim], done: Callable[[tuple[str, int, int, int] | None], bool], sig: int,
            skip_denied: bool = False) -> None:
    """Until done(state) holds for every victim (gone counts), sending `sig` again to those not there yet
    at every look: a SIGCONT undoes a SIGSTOP, and one comes unasked. When hostlock's death orphans the
    job's process group while a member is stopped, the kernel sends the group SIGHUP and SIGCONT; if our
    freeze landed first, a job that ignores SIGHUP ran on while we waited for it to stop (the lock held
    for good: found under load). Resending SIGKILL is harmless. Short naps, growing to 50 ms.
    `skip_denied` (the freeze): do not wait for a process we may not signal; it would never stop, and what
    it waits for (a pipe from a frozen sibling) might never come."""
    nap = 0.001
    while True:
        victims = [v for v in victims if not (done(v.state()) or (skip_denied and v.denied))]
        if not victims:
            return
        time.sleep(nap)
        nap = min(nap * 2, 0.05)
        for v in victims:
            v.signal(sig)


def _pin_all(found: dict[int, int]) -> dict[int, _Victim]:
    """Pin each (pid: start time) found; one already gone, or whose pid names another process, is left out."""
    pinned = {}
    for pid, start in found.items():
        v = _Victim.pin(pid, start)
        if v is not None:
            pinned[pid] = v
    return pinned


def _stopped(st: tuple[str, int, int, int] | None) -> bool:
    """Frozen as far as forking goes: stopped, gone, or in the kernel (D). A process in D with SIGSTOP
    pending stops before it runs another instruction of its own, and a vfork() parent whose child we
    froze before it exec'd stays in D for good (shells vfork every command): waiting for its T hung."""
    return st is None or not _alive(st) or st[0] in ("T", "t", "D")


def _killpg(job: int, sig: int) -> None:
    try:
        os.killpg(job, sig)
    except OSError:
        pass


def end_the_rest(job: int, new_group: bool, tag: bytes, kill_at: float) -> None:
    """A stopped job's first process is gone: give every other process of it (one that left the group with
    setsid, a double fork's orphan; found by tag, group and descent) SIGTERM, those still there at `kill_at`
    (time.monotonic()) SIGKILL, and return once none runs. The group got its SIGTERM already; a second one
    would run a job's TERM trap twice, so only the others get one here."""
    found = _members(job, new_group, None, set(), tag)
    if not found:
        return
    pinned = _pin_all(found)
    try:
        for v in pinned.values():
            st = v.state()
            if not (new_group and st is not None and st[2] == job):
                v.signal(_signal.SIGTERM)
                v.signal(_signal.SIGCONT)  # a stopped one must wake up to die
        nap = 0.001
        while time.monotonic() < kill_at and any(_alive(v.state()) for v in pinned.values()):
            time.sleep(min(nap, max(0.0, kill_at - time.monotonic())))
            nap = min(nap * 2, 0.05)
    finally:
        for v in pinned.values():
            v.close()
    kill_job(job, new_group, b"", tag)  # whatever is left, and anything forked meanwhile: frozen, then killed


def kill_job(job: int, new_group: bool, job_stat: bytes, tag: bytes = b"") -> None:
    """Freeze, then SIGKILL, the job's tree; return once none of it runs."""
    parsed = _parse(job_stat) if job_stat else None
    job_start = parsed[3] if parsed else None
    victims: dict[int, _Victim] = {}
    try:
        while True:  # freeze until a look at the frozen tree finds nobody new (nothing frozen can fork)
            found = _members(job, new_group, job_start, set(victims), tag)
            fresh = _pin_all({pid: start for pid, start in found.items()
                              if pid not in victims or victims[pid].start != start})
            if not fresh:
                break
            for pid in fresh.keys() & victims.keys():  # a pid that now names another process of the job
                victims[pid].close()
            victims.update(fresh)
            if new_group:
                _killpg(job, _signal.SIGSTOP)  # the whole group at once, a fork in progress included
            for v in fresh.values():
                v.signal(_signal.SIGSTOP)
            _settle(list(fresh.values()), _stopped, _signal.SIGSTOP, skip_denied=True)
        while victims:
            if new_group:
                _killpg(job, _signal.SIGKILL)
            for v in victims.values():
                v.signal(_signal.SIGKILL)
            _settle(list(victims.values()), lambda st: not _alive(st), _signal.SIGKILL)
            for v in victims.values():
                v.close()
            # Anyone of the job still running was unseen (a SIGCONT let it fork after the freeze).
            victims = {}  # all closed: never closed twice should the look below raise
            victims = _pin_all(_members(job, new_group, None, set(), tag))
    finally:
        for v in victims.values():
            v.close()
