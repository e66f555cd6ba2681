"""The watcher: a process, forked before the job, that keeps the job's lock until the job's whole tree is gone
when the process supervising it dies (`hostlock run`'s, see cli/supervise.py).

It leaves its parent's process group and session (setsid), so whatever kills the supervisor's group or session
(kill -9 -PGID, pkill -s SID, timeout(1), a terminal hang-up) misses it. It keeps a duplicate of the lock's open
file descriptions: the kernel keeps an OFD or flock() lock held while any descriptor of the description is open,
so when the supervisor dies without saying "done", the lock stays held until the watcher has killed the job's
whole process tree (proc.jobkill) and seen it gone. Only then does it exit, and the lock is free. No race is left
for a second copy to win. A fleet lock has no descriptor to keep: the watcher gets the lease's deadline instead
("v DEADLINE GRACE" lines, as renewals move it) and kills the job when it passes while the supervisor is stopped.

Until it must act it runs as little Python as it can: each object it touches copies one of its parent's pages
(copy-on-write), CPU taken from hostlock and etcd while a job starts; a fleet lock's watcher times its reads with
`_socket` (no `select`).
"""

from __future__ import annotations

import _signal

from ..core import oslite as os
from ..core import procstat

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from typing import Callable


def start_watcher(lock_fds: tuple[int, ...], timed: bool = False) -> tuple[int, int]:
    """Fork the watcher; returns (our end of its channel, its pid). See the module docstring for why.

    hostlock writes the job's pid and a newline once the job is forked, for a fleet lock "v DEADLINE GRACE"
    lines as the lease's deadline moves, and "x" when the job has ended; the watcher gets EOF without "x"
    only when hostlock died, however (its last copy of the write end closes).

    `timed` (a fleet lock's watcher, which must also wake at a deadline): the channel is a socket pair, whose
    reads take a timeout in `_socket` itself, which the etcd client has loaded already. A pipe would need
    `select`, a shared library on many builds: loading it in the watcher took ~0.4 ms of CPU from a two-core
    machine's etcd and hostlock while a fleet lock's job started. Otherwise a pipe.
    """
    # Duplicates made before fork: the engine's fork hook closes the Lock's own descriptors in a child.
    keep = [os.dup(fd) for fd in lock_fds]
    chan: object  # the watcher's end: a pipe's descriptor, or a socket
    try:
        if timed:
            import _socket

            ours, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM)  # close-on-exec, like pipe()
            w, chan = ours.detach(), theirs
        else:
            chan, w = os.pipe()  # close-on-exec: the job never holds either end
        try:
            pid = os.fork()
        except OSError:
            _close(chan)
            os.close(w)
            raise
        if pid == 0:
            os.close(w)  # only hostlock's death may close the last write end
            _watch(chan, keep)
    finally:
        for fd in keep:
            os.close(fd)
    _close(chan)
    return w, pid


def _close(chan: object) -> None:
    """Close a watcher's end of its channel: a descriptor (pipe) or a socket object."""
    if isinstance(chan, int):
        os.close(chan)
    else:
        chan.close()  # type: ignore[attr-defined]


def _watch(chan: object, keep: list[int]) -> None:
    """The watcher process: wait for hostlock's news; if it dies mid-job, kill the job, then let go.

    For a fleet lock, also if hostlock lets the lease's deadline pass without reporting a later one while
    it is not running (stopped): see `Job.valid_until`.

    Until it must act it runs as little Python as it can: each object it touches copies one of hostlock's
    pages (copy-on-write), CPU taken from hostlock and etcd while a job starts. So it lets go of our caller's
    standard streams at once (`out=$(hostlock run ...)` must not wait for it), and of the other descriptors it
    inherited only when it acts (hostlock died, or a deadline passed): until then hostlock holds them as well.
    (Listing them took ~0.3 ms of CPU at its start.)
    """
    parent = os.getppid()  # hostlock: while our channel is open, it is alive, so this pid is still its
    try:
        os.setsid()  # out of hostlock's group and session, and without a controlling terminal (no SIGHUP)
        chan_fd = chan if isinstance(chan, int) else chan.fileno()  # type: ignore[attr-defined]
        for fd in (0, 1, 2):
            if fd != chan_fd and fd not in keep:  # either can be one when hostlock started without them
                try:
                    os.close(fd)
                except OSError:
                    pass
        read = _reader(chan)
        data = b""
        first = b""  # "PID NEWGROUP TAG": the job is forked, not yet exec'd
        job_stat = b""
        deadline = None  # a fleet lock's "surely ours until" (CLOCK_BOOTTIME), as hostlock last reported it
        grace = 0.0
        deferred = False
        while True:
            chunk = read(deadline)
            if chunk is None:
                # No later deadline came in time: hostlock is not keeping the lease alive. If it is running
                # it knows (its lock is lost): it stops the job itself, SIGTERM then SIGKILL after its grace.
                # Stopped (SIGSTOP, a debugger) or still there after that grace, it cannot: we kill the job
                # now, before etcd can give the lock to anyone else.
                if not deferred and _running(parent):
                    deferred = True
                    deadline = boottime() + grace + 1.0
                    continue
                break
            if not chunk:
                break  # hostlock died
            data += chunk
            if data.endswith(b"x"):
                return  # the job ended under hostlock's eye: nothing to do
            while b"\n" in data:
                line, data = data.split(b"\n", 1)
                if not first:
                    first = line
                    job_stat = procstat.read(int(line.split()[0])) or b""  # its start time: proof against pid reuse
                elif line.startswith(b"v "):  # "v DEADLINE GRACE": the lease was renewed up to DEADLINE
                    words = line.split()
                    deadline, grace, deferred = float(words[1]), float(words[2]), False
        # Acting now, for as long as the job takes to die: hold nothing but the channel and the lock (not another
        # lock of this process, nor a descriptor our caller passed to hostlock).
        from .daemon import close_all_but  # only now: a run whose hostlock lives never loads it

        close_all_but([*keep, chan_fd])
        if first:
            from .jobkill import kill_job

            words = first.split()
            job, group = int(words[0]), words[1] == b"1"
            try:
                kill_job(job, group, job_stat, words[2] if len(words) > 2 else b"")
            except BaseException:  # e.g. the library was removed under us: the cruder kill beats none
                os.killpg(job, _signal.SIGKILL) if group else os.kill(job, _signal.SIGKILL)
    except BaseException:
        pass
    finally:
        os._exit(0)  # only now does the lock's last descriptor close


def _reader(chan: object) -> Callable[[float | None], bytes | None]:
    """read(deadline): what the channel brings next (b"" at EOF), or None once CLOCK_BOOTTIME `deadline`
    passes first (None: no deadline). Timed reads need a socket (see _start_watcher)."""
    if isinstance(chan, int):
        def read_pipe(deadline: float | None) -> bytes | None:
            if deadline is not None:
                raise ValueError("a deadline needs the watcher's socket channel")
            while True:
                try:
                    return os.read(chan, 4096)
                except InterruptedError:
                    continue

        return read_pipe
    import _socket

    sock: _socket.socket = chan  # type: ignore[assignment]

    def read_socket(deadline: float | None) -> bytes | None:
        sock.settimeout(None if deadline is None else max(0.0, deadline - boottime()))
        try:
            return sock.recv(4096)  # EINTR: retried with the time left (PEP 475)
        except (_socket.timeout, BlockingIOError):  # timeout 0: nothing there (EAGAIN) once the deadline passed
            return None

    return read_socket


def boottime() -> float:
    """CLOCK_BOOTTIME, the fleet engine's clock (it counts the time a stopped process did not run); core.clock is
    loaded on first use: a host lock's run never reads it."""
    from ..core.clock import boottime as clock

    return clock()


def _running(pid: int) -> bool:
    """Whether `pid` is there and not stopped or traced (state T or t in /proc/PID/stat)."""
    fields = procstat.fields(pid)
    return fields is not None and fields[procstat.STATE] not in (b"T", b"t", b"Z", b"X")
