"""The process supervisor of `hostlock run`, `cron` and `flock`: fork and exec a job, forward signals to it,
enforce a time limit, reap it; tie its life to the lock's.

It takes an explicit `Job` (argv, environment additions, process group, output descriptor, time limits, the
lock's descriptors) and knows nothing of command lines, so every command that runs a job shares it.

Design (what flock(1) gets wrong, see docs/cli.md and docs/security.md):
- hostlock stays the parent and holds the lock; the job is forked and exec'd. The engine's descriptors are
  close-on-exec, so neither the job nor anything it starts (a daemon) can keep the lock after we exit.
- A watcher process, forked before the job, leaves hostlock's process group and session (setsid), so
  whatever kills hostlock's group or session (kill -9 -PGID, pkill -s SID, timeout(1), a terminal hang-up)
  misses it. It keeps a duplicate of the lock's open file descriptions: the kernel keeps an OFD or flock()
  lock held while any descriptor of the description is open, so when hostlock dies without saying
  "done", the lock stays held until the watcher has killed the job's whole process tree and seen it gone.
  Only then does it exit, and the lock is free. No race is left for a second copy to win.
- The job child sets PR_SET_PDEATHSIG before exec (SIGSTOP with a watcher: the job freezes with its
  children still attached, for the watcher to kill together; SIGKILL without one), and does not exec
  until hostlock has told the watcher its pid (a gate pipe): a job never runs unwatched.
- Signals are blocked and collected with sigtimedwait(), never handled asynchronously: TERM, INT, HUP, QUIT,
  USR1 and USR2 are forwarded to the job (except keyboard signals the job got from the terminal itself),
  SIGCHLD ends the wait, the time limit is the wait's own deadline. No threads, no handlers, no races.
- A fleet lock (etcd) has no descriptor to keep: its etcd lease outlives a dead hostlock by at most the
  TTL, and the watcher kills the job at once, so the job is dead long before the lease can expire. When
  the lock is lost while hostlock lives (the engine's keep-alive thread knows first), the job is stopped
  like a timed-out one (SIGTERM, SIGKILL after kill_after): the thread sets the lock's flag and wakes
  this loop with WAKE, sent to this thread alone (`waker`), which then reads `job.abort()`. A hostlock
  that is alive but stopped can do neither, so the watcher also gets the lease's deadline ("v DEADLINE
  GRACE" lines, as renewals move it) and kills the job when it passes while hostlock is stopped.
- Only cheap modules on this path (`_signal`, not `signal`, which imports enum; `_ctypes`, not `ctypes`;
  no subprocess, argparse, re or json). The watcher's killing code (`cli.jobkill`) is imported only by a
  watcher whose hostlock died. Both children run as little Python as they can before the job runs (each
  object a child touches copies a page of hostlock's): the job's process skips the engine's fork hooks
  (core.forks.exec_fork), and the watcher of a fleet lock times its reads with `_socket` (no `select`).
"""
from __future__ import annotations

import _signal
import _thread
import errno as _errno
import sys
import time

from ..core import forks, procstat
from ..core import oslite as os
from ..core.forks import prctl_function as _prctl
from ..core.signals import ENDING, FORWARDED
from ..core.signals import name as _signame
from . import common as c

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from typing import Callable, Mapping

_WAITED = FORWARDED | {_signal.SIGCHLD}  # every signal that would end hostlock reaches the job (core.signals)
_SI_KERNEL = 0x80  # si_code of a signal the kernel generated, e.g. Ctrl-C on a terminal
_PR_SET_PDEATHSIG = 1
DEFAULT_KILL_AFTER = 10.0
PROCESS_GROUPS = ("auto", "new", "same")
# Another thread's "look at job.abort() now" (see waker), told from anyone else's SIGALRM by its sender: this process.
# Never used for alarm(): nothing here arms one while a job runs.
WAKE = _signal.SIGALRM
_wake_was_blocked = False  # WAKE was blocked before waker() blocked it: the job inherits it blocked, as given


class Job:
    """What to run and how; no command-line options, no lock."""

    __slots__ = ("argv", "env", "new_group", "out_fd", "time_limit", "kill_after", "verbose", "lock_fds", "watch",
                 "abort", "valid_until", "flock_exec")

    def __init__(self, argv: list[str], *, env: dict[str, str] | None = None, new_group: bool = True,
                 out_fd: int | None = None, time_limit: float | None = None,
                 kill_after: float = DEFAULT_KILL_AFTER, verbose: bool = False,
                 lock_fds: tuple[int, ...] | list[int] = (), watch: bool = True,
                 abort: Callable[[], bool] | None = None,
                 valid_until: Callable[[], float | None] | None = None, flock_exec: bool = False) -> None:
        self.argv = argv
        self.env = env  # added to (or replacing entries of) our environment; None: ours unchanged
        self.new_group = new_group  # the job leads its own process group (killed whole with us)
        self.out_fd = out_fd  # the job's stdout and stderr; None: ours
        self.time_limit = time_limit  # seconds the job may run, then SIGTERM; None: no limit
        self.kill_after = kill_after  # seconds from that SIGTERM to SIGKILL
        self.verbose = verbose  # say what happens, on stderr
        # Descriptors whose open file descriptions carry the lock: the watcher keeps duplicates, so the
        # lock outlives a killed hostlock until the job is gone. Never inherited by the job.
        self.lock_fds = tuple(lock_fds)
        # A watcher kills the job's tree if hostlock dies mid-job. False: only PR_SET_PDEATHSIG, which
        # ends the job's first process alone (flock(1)'s behaviour, kept by `hostlock flock` by default).
        self.watch = watch
        # True once the job must stop (its fleet lock was lost): read when WAKE arrives (see waker), then
        # SIGTERM, SIGKILL after kill_after, as for the time limit. None: nothing can abort the job.
        self.abort = abort
        # A lock without a descriptor (a fleet lock) tells until when it is surely held (CLOCK_BOOTTIME): we
        # pass each new deadline on to the watcher, which kills the job if one passes without a later one
        # while hostlock is stopped (the lease then ends with nobody left to stop the job). None: no deadline.
        self.valid_until = valid_until
        # Exec as flock(1) does (`hostlock flock`): execvp(3)'s /bin/sh for a file without #!, and flock's
        # "failed to execute" message. `hostlock run` refuses such a file (69: use -c).
        self.flock_exec = flock_exec

    def tagged(self, tag: str) -> Job:
        """This job with HOSTLOCK_JOB=tag added to its environment."""
        job = Job(self.argv, env=dict(self.env or (), HOSTLOCK_JOB=tag), new_group=self.new_group,
                  out_fd=self.out_fd, time_limit=self.time_limit, kill_after=self.kill_after,
                  verbose=self.verbose, lock_fds=self.lock_fds, watch=self.watch, abort=self.abort,
                  valid_until=self.valid_until, flock_exec=self.flock_exec)
        return job


def waker() -> Callable[[], None]:
    """Block WAKE in this thread (the one that will supervise) and return `wake()`, which any thread may
    call to make supervise() read the job's abort() at once.

    Call it before the threads that will call wake() start (the fleet lock's keep-alive thread): they
    inherit the blocked mask, so no SIGALRM's default action (death) can land in them, and a wake-up that
    comes before supervise() waits stays pending for it. wake() targets this thread alone (pthread_kill).
    """
    global _wake_was_blocked
    _wake_was_blocked = WAKE in _signal.pthread_sigmask(_signal.SIG_BLOCK, {WAKE})
    ident = _thread.get_ident()

    def wake() -> None:
        try:
            _signal.pthread_kill(ident, WAKE)
        except OSError:  # ESRCH: the supervising thread is gone, nothing left to wake
            pass

    return wake


class Signalled(BaseException):
    """A signal that ends a process (SIGTERM, SIGHUP, SIGUSR1, ...: WAIT_SIGNALS) while waiting for a fleet lock:
    raised (as SIGINT raises KeyboardInterrupt) so the wait unwinds and revokes its lease, and the waiter's key
    leaves the queue before hostlock exits."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


WAIT_SIGNALS = sorted(ENDING - {_signal.SIGINT})  # SIGINT: KeyboardInterrupt, which unwinds the wait as well


def _signalled(signum: int, _frame: object) -> None:
    raise Signalled(signum)


def trap_wait_signals() -> dict:
    """While a fleet lock is waited for: WAIT_SIGNALS raise Signalled instead of killing hostlock outright
    (its key would stay in the queue for a whole TTL, and every waiter behind it wait that long). A signal
    ignored at start (nohup) stays ignored. Returns what untrap() restores, before the job is started."""
    old = {}
    for sig in WAIT_SIGNALS:
        if _signal.getsignal(sig) == _signal.SIG_DFL:
            old[sig] = _signal.signal(sig, _signalled)
    return old


def untrap(old: dict | None) -> None:
    for sig, handler in (old or {}).items():
        _signal.signal(sig, handler)


def new_group_for(mode: str) -> bool:
    """--process-group MODE as a decision: auto = a group of its own unless we are a terminal's foreground
    job (there the job must stay in the foreground group to read the terminal and get its Ctrl-C)."""
    return mode == "new" or (mode == "auto" and not _in_terminal_foreground())


def _exec_child(job: Job, parent: int, mask: set[int], prctl: Callable[..., int] | None, gate: int,
                watched: bool) -> None:
    """In the forked child: tie the job to hostlock's life, wait at the gate, restore signal state, exec.
    Never returns. `prctl`: prctl(2) or None, made before the fork (_prctl)."""
    argv = job.argv
    out_fd = job.out_fd
    code = c.EX_OSERR
    try:
        if job.new_group:
            os.setpgid(0, 0)
        if prctl is None and job.verbose:
            c.say("no prctl(PR_SET_PDEATHSIG) here: if hostlock is killed, only the watcher ends the job")
        if prctl is not None:
            # With a watcher, freeze rather than die: a stopped job keeps its children attached (a dead one
            # would orphan them to init, out of the watcher's reach), and the watcher kills them all.
            prctl(_PR_SET_PDEATHSIG, _signal.SIGSTOP if watched else _signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            # hostlock died between fork and prctl: the lock is gone, the job must not start unlocked.
            os._exit(c.EX_OSERR)
        # What the exec needs but the gate's news, made before waiting at it (a fleet lock's job waits there
        # for etcd): every object touched copies one of hostlock's pages, better before the lock is held than
        # after. Python ignores SIGPIPE and SIGXFSZ; a job expects the defaults (as subprocess restores them).
        # Python handles SIGINT, and a fleet lock's wait every other signal that ends a process (forked during
        # that wait, we have its handlers): back to the default too, before the mask lets one in, or a signal
        # forwarded to the job just before its exec would run a handler here (the job's process would exit 71)
        # or be lost with the exec. A signal ignored by hostlock's own caller (nohup, `cmd &`) stays ignored.
        environ = _environ_with(job.env)
        _signal.signal(_signal.SIGPIPE, _signal.SIG_DFL)
        _signal.signal(_signal.SIGXFSZ, _signal.SIG_DFL)
        for sig in FORWARDED:
            handler = _signal.getsignal(sig)
            if handler is not _signal.SIG_DFL and handler is not _signal.SIG_IGN:
                _signal.signal(sig, _signal.SIG_DFL)
        if job.abort is not None and not _wake_was_blocked:
            mask = mask - {WAKE}  # blocked by waker() for us, not the job
        # Wait until hostlock has told the watcher our pid and holds the lock: it writes what to add to our
        # environment and "g", then closes its end. EOF without "g" (hostlock died first, or gave the job up
        # because the lock was not taken): never exec.
        message = _read_gate(gate)
        if not (message == b"g" or message.endswith(b"\0g")):
            os._exit(c.EX_OSERR)
        os.close(gate)
        for item in message[:-1].split(b"\0"):
            if item:
                key, _eq, value = item.partition(b"=")
                environ[key] = value
        if out_fd is not None:
            os.dup2(out_fd, 1)
            os.dup2(out_fd, 2)
        _signal.pthread_sigmask(_signal.SIG_SETMASK, mask)
        execvp(argv, environ=environ, sh_fallback=job.flock_exec)
    except (OSError, ValueError) as exc:
        why = getattr(exc, "strerror", None) or exc
        if job.flock_exec:
            c.say("failed to execute %s: %s" % (argv[0], why), prog=c.FLOCK_PROG)  # flock(1)'s words
        else:
            c.say("cannot execute %s: %s" % (c.quote(argv[0]), why))
        code = c.EX_OSERR if getattr(exc, "errno", None) == _errno.ENOMEM else c.EX_UNAVAILABLE  # like flock(1)
    except BaseException:  # never let the child fall back into the parent's code
        pass
    finally:
        os._exit(code)


def _read_gate(gate: int) -> bytes:
    """All the gate's pipe brings, until EOF."""
    message = b""
    while True:
        try:
            chunk = os.read(gate, 4096)
        except InterruptedError:
            continue
        if not chunk:
            return message
        message += chunk


def execvp(argv: list[str], env: dict[str, str] | None = None, *,
           environ: Mapping[bytes, bytes] | None = None, sh_fallback: bool = False) -> None:
    """execvp(3), with `env` added to our environment (or exactly `environ`, made already as bytes: not
    encoded again for each directory tried): search PATH like the shell (the job's own PATH). With
    `sh_fallback`, a file the kernel cannot execute (ENOEXEC: no #!) is run by /bin/sh, as glibc's
    execvp(3) does, and so flock(1).

    os.execvp would import `warnings` (~1 ms) on every run.
    """
    file = argv[0]
    if not file:  # execvp(3): ENOENT (os.execve would raise ValueError for an empty argv[0])
        raise FileNotFoundError(_errno.ENOENT, os.strerror(_errno.ENOENT), file)
    if environ is None:
        environ = _environ_with(env)
    if "/" in file:
        _execve(file, argv, environ, sh_fallback)
    path = environ.get(b"PATH")
    dirs = (os.fsdecode(path) if path is not None else os.defpath).split(":")
    first: OSError | None = None
    for d in dirs:
        try:
            _execve(_join(d or ".", file), argv, environ, sh_fallback)
        except OSError as exc:
            # Keep looking past "not here"; remember the first real reason (EACCES...), as execvp(3) does.
            if exc.errno not in (_errno.ENOENT, _errno.ENOTDIR) and first is None:
                first = exc
    raise first or FileNotFoundError(_errno.ENOENT, os.strerror(_errno.ENOENT), file)


def _execve(path: str, argv: list[str], environ: Mapping[bytes, bytes], sh_fallback: bool) -> None:
    try:
        os.execve(path, argv, environ)
    except OSError as exc:
        if not sh_fallback or exc.errno != _errno.ENOEXEC:
            raise
    # glibc's maybe_script_execute(): /bin/sh PATH ARGS..., the script's path as the shell's $0
    os.execve("/bin/sh", ["/bin/sh", path, *argv[1:]], environ)


def _environ_with(env: Mapping[str, str] | None) -> dict[bytes, bytes]:
    """Our environment as bytes, with `env` added (or replacing entries): what an exec'd job gets."""
    environ = dict(os.environb())
    for k, v in (env or {}).items():
        environ[os.fsencode(k)] = os.fsencode(v)
    return environ


def _join(directory: str, file: str) -> str:
    """posixpath.join(directory, file), for a file name without '/'."""
    return directory + file if directory.endswith("/") else directory + "/" + file


def _in_terminal_foreground() -> bool:
    """True when hostlock is the foreground job of its controlling terminal (an interactive shell)."""
    try:
        fd = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return False  # no controlling terminal: cron, ssh without -t, systemd, ansible
    try:
        return os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:
        return False
    finally:
        os.close(fd)


def _start_watcher(lock_fds: tuple[int, ...], timed: bool = False) -> tuple[int, int]:
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
                    deadline = _boottime() + grace + 1.0
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
        _close_all_but(keep, chan_fd)
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
        sock.settimeout(None if deadline is None else max(0.0, deadline - _boottime()))
        try:
            return sock.recv(4096)  # EINTR: retried with the time left (PEP 475)
        except (_socket.timeout, BlockingIOError):  # timeout 0: nothing there (EAGAIN) once the deadline passed
            return None

    return read_socket


def _close_all_but(keep: list[int], chan: int) -> None:
    """Close every descriptor of this process but `keep` and `chan`."""
    wanted = set(keep)
    wanted.add(chan)
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:  # no /proc: every possible descriptor (bounded: this is a fallback)
        fds = list(range(min(os.sysconf("SC_OPEN_MAX"), 65536)))
    for fd in fds:
        if fd not in wanted:
            try:
                os.close(fd)
            except OSError:
                pass


def _boottime() -> float:
    """CLOCK_BOOTTIME, the fleet engine's clock (it counts the time a stopped process did not run)."""
    from ..core.clock import boottime

    return boottime()


def _running(pid: int) -> bool:
    """Whether `pid` is there and not stopped or traced (state T or t in /proc/PID/stat)."""
    fields = procstat.fields(pid)
    return fields is not None and fields[procstat.STATE] not in (b"T", b"t", b"Z", b"X")


class Outcome:
    """How the job ended."""

    __slots__ = ("status", "timed_out", "elapsed", "pid", "sigint", "aborted")

    def __init__(self, status: int, timed_out: bool, elapsed: float, pid: int, sigint: bool,
                 aborted: bool = False) -> None:
        self.status = status  # raw wait status
        self.timed_out = timed_out
        self.aborted = aborted  # job.abort() said stop (a lost fleet lock): the job was sent SIGTERM
        self.elapsed = elapsed
        self.pid = pid
        self.sigint = sigint  # a SIGINT reached us from anyone but the job (the terminal, kill, a supervisor)

    def exit_code(self) -> int:
        """flock(1)'s convention: the job's status, 128+N for signal N; 124 after --time-limit."""
        if self.timed_out:
            return c.EX_TIMEOUT
        if os.WIFSIGNALED(self.status):
            return 128 + os.WTERMSIG(self.status)
        return os.WEXITSTATUS(self.status)

    def describe(self) -> str:
        """'exit status 3', 'killed by signal 9 (SIGKILL)', 'timed out ...' for messages."""
        if os.WIFSIGNALED(self.status):
            sig = os.WTERMSIG(self.status)
            what = "killed by signal %d (%s)" % (sig, _signame(sig))
        else:
            what = "exit status %d" % os.WEXITSTATUS(self.status)
        if self.timed_out:
            what = "timed out, %s" % what
        if self.aborted:
            what = "stopped, %s" % what
        return "%s after %s" % (what, c.format_span(self.elapsed))


class Started:
    """A job's process, forked and held at its gate until supervise() lets it exec (or cancel() sends it away);
    its watcher, if any, knows its pid already. See start()."""

    __slots__ = ("job", "pid", "gate", "watcher")

    def __init__(self, job: Job, pid: int, gate: int, watcher: int) -> None:
        self.job = job  # as the process will run it (tagged for its watcher)
        self.pid = pid
        self.gate = gate  # our end of its gate; -1 once opened or closed
        self.watcher = watcher  # our end of the watcher's pipe, -1 without one (or once supervise took it)

    def cancel(self) -> None:
        """The job must not run (the lock was not taken): its process exits without exec'ing, its watcher with
        nothing to do; reaped here. Nothing once supervise() has opened the gate."""
        if self.gate < 0:
            return
        if self.watcher >= 0:
            try:
                os.write(self.watcher, b"x")
            except OSError:
                pass
            os.close(self.watcher)
            self.watcher = -1
        os.close(self.gate)  # EOF without "g": the process leaves (see _exec_child)
        self.gate = -1
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass


def start(job: Job, keep: list[Started]) -> None:
    """Fork the job's watcher and process now, the process held at its gate, and append it to `keep` (before
    any signal can interrupt us); supervise(job, started=...) runs it, Started.cancel() sends it away.

    For a lock that takes round trips to a server (a fleet lock): forked once its requests are on their way
    to etcd (Lock.acquire's `meanwhile`), the forks and the prctl made for the job's process cost no time of
    their own. The job never runs before the gate opens, and never if we die first. Only for jobs without
    lock descriptors: a host lock's watcher must be forked once the lock is held, with duplicates of them
    (supervise() does both then).
    """
    if job.lock_fds:
        raise ValueError("start(): a job with lock descriptors is started by supervise(), once the lock is held")
    prctl = _prctl()
    old_mask = _signal.pthread_sigmask(_signal.SIG_BLOCK, _WAITED)  # the processes are forked with them blocked
    try:
        keep.append(_fork_job(job, old_mask, prctl))
    finally:
        _signal.pthread_sigmask(_signal.SIG_SETMASK, old_mask)


def _fork_job(job: Job, mask: set[int], prctl: Callable[..., int] | None) -> Started:
    """Fork the watcher (if job.watch) and the job's process, told the job's pid; `mask` is the signal mask the
    job is exec'd with. Called with _WAITED blocked: neither child may die of a signal meant for the job (the
    watcher keeps them blocked)."""
    parent = os.getpid()
    watcher = -1
    gate_r = gate_w = -1
    tag = ""
    try:
        try:
            if job.watch:
                watcher = _start_watcher(job.lock_fds, job.valid_until is not None)[0]
                # Every process the job starts inherits this tag, wherever it goes (setsid, double fork):
                # the watcher finds them by it in /proc/PID/environ if it must kill the job.
                tag = "%d.%d" % (parent, time.monotonic_ns())
                job = job.tagged(tag)
        except OSError as exc:
            if job.verbose:
                c.say("no watcher process (%s): if hostlock is killed only the job's first process dies"
                      % exc.strerror)
        # After the watcher's fork: it never holds the gate's write end, whose close (with or without "g")
        # is what the job's process waits for.
        gate_r, gate_w = os.pipe()
        pid = forks.exec_fork()  # it execs the job or exits: no fork hook of the engine runs in it
    except OSError:
        for fd in (watcher, gate_r, gate_w):
            if fd >= 0:
                os.close(fd)
        raise
    if pid == 0:
        os.close(gate_w)
        if watcher >= 0:
            os.close(watcher)  # only hostlock's death may close the watcher's pipe
        _exec_child(job, parent, mask, prctl, gate_r, watcher >= 0)
    os.close(gate_r)
    if job.new_group:
        try:
            os.setpgid(pid, pid)  # also here: no window where a forwarded signal misses the new group
        except OSError:
            pass  # EACCES: the child already exec'd, after its own setpgid
    if watcher >= 0:
        try:
            os.write(watcher, ("%d %d %s\n" % (pid, job.new_group, tag)).encode())
        except OSError:
            pass
    return Started(job, pid, gate_w, watcher)


def _gate_message(env: Mapping[str, str] | None) -> bytes:
    """What opens the gate: NAME=VALUE entries the job gets in its environment (each ended by NUL), then "g"."""
    return b"".join(os.fsencode(k) + b"=" + os.fsencode(v) + b"\0" for k, v in (env or {}).items()) + b"g"


def block_job_signals() -> set[int]:
    """Block, now, the signals supervise() forwards; returns the mask from before, for supervise(mask=...).

    A fleet lock's command calls it as its wait ends, before the wait's handlers go (untrap): a signal that
    comes between the two then waits for supervise() to forward it to the job, where it would have ended
    hostlock with its key held for a whole TTL.
    """
    return _signal.pthread_sigmask(_signal.SIG_BLOCK, _WAITED)


def supervise(job: Job, on_start: Callable[[int], None] | None = None, started: Started | None = None,
              env: Mapping[str, str] | None = None, mask: set[int] | None = None) -> Outcome:
    """Fork and exec the job (or let the process start() forked exec), forward signals, enforce its time
    limit, reap it.

    `on_start(pid)` runs once the job is forked (e.g. to record its pid in the owner record). `env` is added
    to the job's environment as its process execs (what was not known when start() forked it: a fleet
    lock's fence). `mask`: block_job_signals()'s answer, when the caller blocked them already. The caller
    holds the lock throughout.
    """
    old_mask = _signal.pthread_sigmask(_signal.SIG_BLOCK, _WAITED)
    if mask is not None:
        old_mask = mask  # the mask to give back (and the job's), from before the caller blocked them
    if started is None:
        try:
            started = _fork_job(job, old_mask, _prctl())
        except OSError:
            _signal.pthread_sigmask(_signal.SIG_SETMASK, old_mask)
            raise
    job = started.job
    argv = job.argv
    new_group = job.new_group
    verbose = job.verbose
    pid = started.pid
    watcher, started.watcher = started.watcher, -1  # closed by this function's end, whatever happens
    gate_w, started.gate = started.gate, -1
    valid_until = job.valid_until if watcher >= 0 else None
    told = None  # the deadline the watcher knows

    def tell() -> float | None:
        """Pass the lock's current deadline on to the watcher; returns when to do it again (monotonic)."""
        nonlocal valid_until, told
        until = valid_until() if valid_until is not None else None
        if until is None:
            return None
        if until != told:
            try:
                os.write(watcher, b"v %.6f %.3f\n" % (until, job.kill_after))
            except OSError:  # the watcher is gone (it killed the job: we learn it from waitpid)
                valid_until = None
                return None
            told = until
        # Well before the deadline the watcher knows: a renewal moves it every TTL/4 or so.
        return time.monotonic() + min(1.0, max(0.05, (until - _boottime()) / 4))

    beat = tell() if valid_until is not None else None  # the watcher knows the deadline before the job runs
    try:
        os.write(gate_w, _gate_message(env))  # the watcher knows the job: it may exec now
    except OSError:
        pass  # EPIPE: the child is already gone (killed from outside); waitpid tells how
    os.close(gate_w)
    started_at = time.monotonic()
    if on_start is not None:
        on_start(pid)
    if verbose:
        c.say("job started: pid %d%s: %s" % (pid, ", own process group" if new_group else "",
                                             c.join_command(argv)))

    def send(sig: int) -> None:
        try:
            if new_group:
                os.killpg(pid, sig)
            else:
                os.kill(pid, sig)
        except OSError:
            pass

    abort = job.abort
    waited = _WAITED  # WAKE among them: a fleet lock's has been blocked since waker()
    me = os.getpid()
    deadline = started_at + job.time_limit if job.time_limit is not None else None
    timed_out = False
    aborted = False
    terminated = False  # SIGTERM sent (time limit or abort): the deadline is now SIGKILL's
    killed = False
    sigint = False
    status = 0

    def terminate(why: str) -> float:
        """SIGTERM now (and SIGCONT: a stopped job must wake up to die); returns SIGKILL's deadline."""
        if verbose:
            c.say("%s: sending SIGTERM" % why)
        send(_signal.SIGTERM)
        send(_signal.SIGCONT)
        return time.monotonic() + job.kill_after

    try:
        while True:
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # cannot happen unless someone reaped it for us
                break
            if done == pid:
                break
            stop_at = None
            if not terminated and abort is not None and job.valid_until is not None:
                # A fleet lock: SIGTERM kill_after before the lease could end, so the SIGKILL that follows
                # lands before etcd can hand the lock on (the deadline is the holder's own: last answered
                # keep-alive + TTL - margin, earlier than etcd's expiry). A job never outlives its lock.
                until = job.valid_until()
                if until is not None:
                    left = until - job.kill_after - _boottime()
                    if left <= 0:
                        aborted = terminated = True
                        deadline = terminate("the lock's lease may end within --kill-after: the job must stop")
                        continue
                    stop_at = time.monotonic() + left
            wake_at = deadline if beat is None else beat if deadline is None else min(deadline, beat)
            if stop_at is not None:
                wake_at = stop_at if wake_at is None else min(wake_at, stop_at)
            if wake_at is None:
                info = _signal.sigwaitinfo(waited)
            else:
                info = _signal.sigtimedwait(waited, max(0.0, wake_at - time.monotonic()))
            if info is None and beat is not None and time.monotonic() >= beat:
                beat = tell()
                if deadline is None or time.monotonic() < deadline:
                    continue
            if info is None and stop_at is not None and (deadline is None or time.monotonic() < deadline):
                continue  # the lease's stop time (or near it): checked again at the top
            if info is None:  # the deadline passed
                if not terminated:
                    timed_out = terminated = True
                    deadline = terminate("job ran longer than %s" % c.format_span(job.time_limit or 0))
                elif not killed:
                    killed = True
                    if verbose:
                        c.say("job still running %s after SIGTERM: sending SIGKILL" % c.format_span(job.kill_after))
                    send(_signal.SIGKILL)
                    deadline = None
                continue
            sig = info.si_signo
            if sig == _signal.SIGCHLD:
                continue
            if sig == WAKE and info.si_pid == me:  # waker()'s wake() (pthread_kill): abort() decides
                if abort is not None and not aborted and abort():
                    aborted = True
                    if not terminated:  # after a time limit's SIGTERM, its SIGKILL deadline stands
                        terminated = True
                        deadline = terminate("the job must stop (its lock is lost)")
                continue
            if not new_group and info.si_code == _SI_KERNEL:
                # From our terminal: the job is in our process group and got this very signal already.
                if sig == _signal.SIGINT:
                    sigint = True
                continue
            sender = info.si_pid
            if sender and (sender == pid or (new_group and _pgid(sender) == pid)):
                continue  # sent by the job itself: forwarding it back could ping-pong forever
            if sig == _signal.SIGINT:
                sigint = True
            if verbose:
                c.say("forwarding %s to the job" % _signame(sig))
            send(sig)
        if terminated:
            # Stopped (time limit, lock lost): the job's first process is gone, but the job is its whole tree,
            # as for the watcher (cli.jobkill). What left the group (setsid, a double fork) gets SIGTERM now and
            # SIGKILL at the deadline the group had: the lock is never released, nor handed on, while any of
            # it runs. The watcher is still told nothing: should we die meanwhile, it kills them.
            from .jobkill import end_the_rest

            try:
                end_the_rest(pid, new_group, os.fsencode((job.env or {}).get("HOSTLOCK_JOB", "")),
                             time.monotonic() if deadline is None else deadline)
            except OSError as exc:  # /proc unreadable: say so; the job's first process is gone in any case
                c.say("cannot look for the rest of the job's processes: %s" % c.describe_error(exc))
    finally:
        if watcher >= 0:
            try:
                os.write(watcher, b"x")
            except OSError:
                pass
            os.close(watcher)
        # Signals that came after the job ended were meant for it, not for us: drop them, then restore
        # the mask (for callers of main() in a process that goes on).
        while _signal.sigtimedwait(waited, 0) is not None:
            pass
        _signal.pthread_sigmask(_signal.SIG_SETMASK, old_mask)
    return Outcome(status, timed_out, time.monotonic() - started_at, pid, sigint, aborted)


def _pgid(pid: int) -> int:
    try:
        return os.getpgid(pid)
    except OSError:
        return -1


def die_like(outcome: Outcome) -> None:
    """If a SIGINT reached us and the job died of SIGINT, die of SIGINT too, so a calling shell loop stops.

    This is the "wait and cooperative exit" convention shells rely on (bash continues a loop when its
    child *exits* 130, and stops when it is *killed* by SIGINT). flock(1) dies of any SIGINT it gets, so
    a SIGINT from the terminal, from `kill -INT` of the caller's group or of hostlock alone, forwarded to
    the job, ends the caller's loop the same way. A job that handles SIGINT and exits is not killed by it:
    its status is passed on. Every other signal's death is exit 128+N, as flock(1) reports its command's.
    """
    if not (outcome.sigint and os.WIFSIGNALED(outcome.status)
            and os.WTERMSIG(outcome.status) == _signal.SIGINT):
        return
    if sys.stdout is not None:  # None when stdout was closed at start-up
        try:
            sys.stdout.flush()
        except (OSError, ValueError):
            pass
    _signal.signal(_signal.SIGINT, _signal.SIG_DFL)
    _signal.pthread_sigmask(_signal.SIG_UNBLOCK, {_signal.SIGINT})
    os.kill(os.getpid(), _signal.SIGINT)
