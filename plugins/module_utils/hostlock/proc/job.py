"""A job's process: forked, tied to the life of the process holding its lock, held at a gate until that
process holds the lock and has told the watcher its pid, then exec'd.

`Job` is an explicit spec (argv, environment additions, process group, output descriptor, time limits, the lock's
descriptors) that knows nothing of command lines, so every command that runs a job shares it.
- The engine's descriptors are close-on-exec, so neither the job nor anything it starts (a daemon) can keep
  the lock after its holder exits.
- The job's process sets PR_SET_PDEATHSIG before exec (SIGSTOP with a watcher: the job freezes with its
  children still attached, for the watcher to kill together; SIGKILL without one), and does not exec until
  its holder has told the watcher its pid (a gate pipe): a job never runs unwatched.
- It is forked with proc.forward's signals blocked (a signal meant for the job must not end its holder in
  between), and restores the signal state it must exec with.
- It runs as little Python as it can before the job runs (each object a child touches copies a page of its
  parent's): it skips the engine's fork hooks (core.forks.exec_fork), and its prctl is made before the fork.
  Only cheap modules on this path (`_signal`, not `signal`, which imports enum; no subprocess).
"""

from __future__ import annotations

import _signal
import errno as _errno
import time

from ..core import forks
from ..core import oslite as os
from ..core.errors import EX_OSERR, EX_UNAVAILABLE
from ..core.signals import FORWARDED
from ..core.text import quote
from .deathsig import die_with_parent, prctl_function
from .forward import WAKE, block, wake_was_blocked
from .watcher import start_watcher

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from typing import Callable, Mapping

DEFAULT_KILL_AFTER = 10.0
PROCESS_GROUPS = ("auto", "new", "same")


class Job:
    """What to run and how; no command-line options, no lock."""

    __slots__ = ("argv", "env", "new_group", "out_fd", "time_limit", "kill_after", "verbose", "lock_fds", "watch",
                 "abort", "valid_until", "flock_exec", "say")

    def __init__(self, argv: list[str], *, env: dict[str, str] | None = None, new_group: bool = True,
                 out_fd: int | None = None, time_limit: float | None = None,
                 kill_after: float = DEFAULT_KILL_AFTER, verbose: bool = False,
                 lock_fds: tuple[int, ...] | list[int] = (), watch: bool = True,
                 abort: Callable[[], bool] | None = None,
                 valid_until: Callable[[], float | None] | None = None, flock_exec: bool = False,
                 say: Callable[[str], None] | None = None) -> None:
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
        # How a diagnostic line reaches the user (the command's stderr, with its name first): what went wrong
        # before the exec, and with `verbose` what happens. None: nothing is said.
        self.say = say

    def tell(self, message: str) -> None:
        if self.say is not None:
            self.say(message)

    def tagged(self, tag: str) -> Job:
        """This job with HOSTLOCK_JOB=tag added to its environment."""
        job = Job(self.argv, env=dict(self.env or (), HOSTLOCK_JOB=tag), new_group=self.new_group,
                  out_fd=self.out_fd, time_limit=self.time_limit, kill_after=self.kill_after,
                  verbose=self.verbose, lock_fds=self.lock_fds, watch=self.watch, abort=self.abort,
                  valid_until=self.valid_until, flock_exec=self.flock_exec, say=self.say)
        return job


def new_group_for(mode: str) -> bool:
    """--process-group MODE as a decision: auto = a group of its own unless we are a terminal's foreground
    job (there the job must stay in the foreground group to read the terminal and get its Ctrl-C)."""
    return mode == "new" or (mode == "auto" and not _in_terminal_foreground())


def _exec_child(job: Job, parent: int, mask: set[int], prctl: Callable[..., int] | None, gate: int,
                watched: bool) -> None:
    """In the forked child: tie the job to hostlock's life, wait at the gate, restore signal state, exec.
    Never returns. `prctl`: prctl(2) or None, made before the fork (deathsig.prctl_function)."""
    argv = job.argv
    out_fd = job.out_fd
    code = EX_OSERR
    try:
        if job.new_group:
            os.setpgid(0, 0)
        if prctl is None and job.verbose:
            job.tell("no prctl(PR_SET_PDEATHSIG) here: if hostlock is killed, only the watcher ends the job")
        # With a watcher, freeze rather than die: a stopped job keeps its children attached (a dead one would
        # orphan them to init, out of the watcher's reach), and the watcher kills them all. If hostlock died
        # between fork and prctl, the lock is gone: the job must not start unlocked.
        die_with_parent(prctl, parent, _signal.SIGSTOP if watched else _signal.SIGKILL, EX_OSERR)
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
        if job.abort is not None and not wake_was_blocked():
            mask = mask - {WAKE}  # blocked by waker() for us, not the job
        # Wait until hostlock has told the watcher our pid and holds the lock: it writes what to add to our
        # environment and "g", then closes its end. EOF without "g" (hostlock died first, or gave the job up
        # because the lock was not taken): never exec.
        message = _read_gate(gate)
        if not (message == b"g" or message.endswith(b"\0g")):
            os._exit(EX_OSERR)
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
            job.tell("failed to execute %s: %s" % (argv[0], why))  # flock(1)'s words
        else:
            job.tell("cannot execute %s: %s" % (quote(argv[0]), why))
        code = EX_OSERR if getattr(exc, "errno", None) == _errno.ENOMEM else EX_UNAVAILABLE  # like flock(1)
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
    prctl = prctl_function()
    old_mask = block()  # the processes are forked with them blocked
    try:
        keep.append(fork_job(job, old_mask, prctl))
    finally:
        _signal.pthread_sigmask(_signal.SIG_SETMASK, old_mask)


def fork_job(job: Job, mask: set[int], prctl: Callable[..., int] | None) -> Started:
    """Fork the watcher (if job.watch) and the job's process, told the job's pid; `mask` is the signal mask the
    job is exec'd with. Called with proc.forward.WAITED blocked: neither child may die of a signal meant for the
    job (the watcher keeps them blocked)."""
    parent = os.getpid()
    watcher = -1
    gate_r = gate_w = -1
    tag = ""
    try:
        try:
            if job.watch:
                watcher = start_watcher(job.lock_fds, job.valid_until is not None)[0]
                # Every process the job starts inherits this tag, wherever it goes (setsid, double fork):
                # the watcher finds them by it in /proc/PID/environ if it must kill the job.
                tag = "%d.%d" % (parent, time.monotonic_ns())
                job = job.tagged(tag)
        except OSError as exc:
            if job.verbose:
                job.tell("no watcher process (%s): if hostlock is killed only the job's first process dies"
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


def gate_message(env: Mapping[str, str] | None) -> bytes:
    """What opens the gate: NAME=VALUE entries the job gets in its environment (each ended by NUL), then "g"."""
    return b"".join(os.fsencode(k) + b"=" + os.fsencode(v) + b"\0" for k, v in (env or {}).items()) + b"g"
