"""`hostlock run` and `hostlock cron`: run a command while holding a lock, the lock and the job living and
dying together.

Design (what flock(1) gets wrong, see docs/cli.md):
- hostlock stays the parent and holds the lock; the job is forked and exec'd. The engine's descriptors are
  close-on-exec, so neither the job nor anything it starts (a daemon) can keep the lock after we exit.
- The child sets PR_SET_PDEATHSIG(SIGKILL) before exec, then checks its parent is still us: if hostlock
  dies, even by SIGKILL, the job dies too. Outside an interactive terminal the job also gets its own
  process group and a watcher process kills that whole group when hostlock's end of a pipe closes, so
  a `sh -c` job's children do not run on unlocked either.
- Signals are blocked and collected with sigtimedwait(), never handled asynchronously: TERM, INT, HUP, QUIT,
  USR1 and USR2 are forwarded to the job (except keyboard signals the job got from the terminal itself),
  SIGCHLD ends the wait, the timeout is the wait's own deadline. No threads, no handlers, no races.
- Only cheap modules on this path (`_signal`, not `signal`, which imports enum; `_ctypes`, not `ctypes`;
  no subprocess, argparse, re or json).
"""

from __future__ import annotations

import _signal
import os
import sys
import time

from . import _cli_common as c

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from . import Lock

FORWARDED = (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP, _signal.SIGQUIT, _signal.SIGUSR1, _signal.SIGUSR2)
_WAITED = set(FORWARDED) | {_signal.SIGCHLD}
_SI_KERNEL = 0x80  # si_code of a signal the kernel generated, e.g. Ctrl-C on a terminal
_PR_SET_PDEATHSIG = 1
_SHELL = "/bin/sh"  # -c uses /bin/sh like flock(1), never $SHELL: cron entries must not depend on a login shell
DEFAULT_KILL_AFTER = 10.0

RUN_HELP = """\
usage: hostlock run [options] NAME [--] COMMAND [ARG...]
       hostlock run [options] NAME -c 'SHELL COMMAND'
       hostlock run [options] --path FILE [--] COMMAND [ARG...]

Run COMMAND while holding the lock NAME. hostlock stays the parent: signals it gets reach the job, the
job dies if hostlock is killed, and the job (and any daemon it starts) never inherits the lock.
Options are read up to the command or '--'; the command's own arguments pass untouched.

lock options:
  -x, -e, --exclusive      exclusive lock (default)
  -s, --shared             shared lock: any number of shared holders, no exclusive one
  --slots N                N-slot semaphore: at most N holders at once
  -n, --nb, --nonblock     do not wait: if the lock is busy, exit with the conflict code
  -w, --wait DURATION      wait at most DURATION (seconds, fractions allowed, or 250ms, 5m, 1h30m)
  -E, --conflict-exit-code CODE
                           exit code when the lock is busy or the wait times out (default 75)
  -d, --dir DIR            lock directory (default: $HOSTLOCK_DIR, /run/hostlock, per-user dir)
  --mechanism M            auto (default), ofd, flock or record
  --label TEXT             free text shown by 'hostlock status'
  --path FILE              instead of NAME: lock FILE as flock(1) does (flock(2); --mechanism ofd: OFD
                           fcntl locks), excluding flock(1) users of FILE; 'status --path FILE' shows it
job options:
  -c, --command CMD        run CMD with /bin/sh -c
  --time-limit DURATION    the most the job may run: then SIGTERM, exit code 124 (--timeout is
                           refused: in flock(1) it means --wait)
  --kill-after DURATION    SIGKILL this long after the timeout's SIGTERM (default 10s)
  --process-group MODE     auto (default: own group unless in a terminal's foreground), new, same
other:
  -q, --quiet              no message when the lock is busy (like flock -n)
  -v, --verbose            say what happens, on stderr
  -h, --help               show this help

exit status: the job's own status; 128+N if it died of signal N; 124 after --time-limit; the conflict code
(-E, default 75) if the lock was busy; 64 usage; 65 lock error; 66 cannot open the lock file or
directory; 69 cannot execute the command; 71 OS error; 73 read-only or full file system.
"""

CRON_HELP = """\
usage: hostlock cron [options] [--] COMMAND [ARG...]
       hostlock cron [options] -c 'SHELL COMMAND'

The mode for cron entries: run COMMAND unless another copy still runs, and stay silent unless the job
fails. The job's stdout and stderr are captured (in an unlinked temporary file); on failure (non-zero exit,
signal, timeout) they are printed followed by one line with the status, so cron mails only what matters.

  --name NAME              lock name (default: cron-PROGRAM-HASH, from the command; see docs/cli.md)
  --on-conflict MODE       when another copy holds the lock: quiet (default: no output, exit 0),
                           report (one line on stderr, exit 0), fail (one line, exit 75)
  -E, --conflict-exit-code CODE
                           exit code on conflict, overriding the on-conflict default
  -w, --wait DURATION      wait up to DURATION for the other copy (default: do not wait)
  -n, --nb, --nonblock     do not wait (default)
  --time-limit DURATION    the most the job may run: then SIGTERM, SIGKILL after --kill-after (10s)
  --kill-after DURATION
  --syslog                 write one line per run to syslog (/dev/log): started job's result or skip
  --syslog-socket PATH     syslog socket to use (implies --syslog)
  -x, -s, --slots N, -d DIR, --mechanism M, --label TEXT, --process-group MODE, -c CMD, --path FILE:
                           as for run
  -v, --verbose            say what happens, on stderr (cron mails it)
  -h, --help               show this help

exit status: as for run (the job's status, 128+N, 124 after --time-limit), and on conflict 0 (quiet, report)
or 75 (fail), or -E CODE.
"""


class Options:
    """Parsed command line of `run` and `cron`."""

    __slots__ = ("name", "mode", "slots", "wait", "conflict_code", "directory", "mechanism", "label",
                 "command", "shell", "timeout", "kill_after", "pgroup", "quiet", "verbose", "help",
                 "on_conflict", "syslog", "syslog_socket", "_wait_opt", "path")

    def __init__(self) -> None:
        self.name: str | None = None
        self.mode = "exclusive"
        self.slots = 1
        self.wait: float | None = None  # None waits forever
        self.conflict_code: int | None = None
        self.directory: str | None = None
        self.mechanism = "auto"
        self.label: str | None = None
        self.command: list[str] = []
        self.shell: str | None = None
        self.timeout: float | None = None
        self.kill_after = DEFAULT_KILL_AFTER
        self.pgroup = "auto"
        self.quiet = False
        self.verbose = False
        self.help = False
        self.on_conflict = "quiet"
        self.syslog = False
        self.syslog_socket = "/dev/log"
        self._wait_opt = ""
        self.path: str | None = None  # --path FILE: flock(1)'s lock on FILE instead of a named lock


_RUN_SPEC = {
    "-x": ("exclusive", False), "-e": ("exclusive", False), "--exclusive": ("exclusive", False),
    "-s": ("shared", False), "--shared": ("shared", False),
    "--slots": ("slots", True),
    "-n": ("nb", False), "--nb": ("nb", False), "--nonblock": ("nb", False), "--no-wait": ("nb", False),
    "-w": ("wait", True), "--wait": ("wait", True),
    "-E": ("code", True), "--conflict-exit-code": ("code", True),
    "-d": ("dir", True), "--dir": ("dir", True),
    "--mechanism": ("mechanism", True),
    "--label": ("label", True),
    "--path": ("path", True),
    "-c": ("shell", True), "--command": ("shell", True),
    "--time-limit": ("timeout", True),
    "--timeout": ("timeout_refused", True),
    "--kill-after": ("kill_after", True),
    "--process-group": ("pgroup", True),
    "-q": ("quiet", False), "--quiet": ("quiet", False),
    "-v": ("verbose", False), "--verbose": ("verbose", False),
    "-h": ("help", False), "--help": ("help", False),
}
_CRON_SPEC = dict(_RUN_SPEC)
_CRON_SPEC.update({
    "--name": ("name", True),
    "--on-conflict": ("on_conflict", True),
    "--syslog": ("syslog", False),
    "--syslog-socket": ("syslog_socket", True),
})
_MECHANISMS = ("auto", "ofd", "flock", "record")
_PGROUPS = ("auto", "new", "same")
_ON_CONFLICT = ("quiet", "report", "fail")


def parse(args: list[str], cron: bool) -> Options:
    """Parse `run`/`cron` arguments by hand (argparse costs ~12 ms); raises c.UsageError."""
    command = "cron" if cron else "run"
    o = Options()

    def handle(key: str, value: str | None, opt: str) -> None:
        if key == "exclusive":
            o.mode = "exclusive"
        elif key == "shared":
            o.mode = "shared"
        elif key == "slots":
            o.slots = c.count_arg(value or "", opt)
        elif key == "nb" or key == "wait":
            if o._wait_opt and o._wait_opt != opt:
                raise c.UsageError("%s and %s cannot be used together" % (o._wait_opt, opt), command)
            o._wait_opt = opt
            o.wait = 0.0 if key == "nb" else c.duration_arg(value or "", opt)
        elif key == "code":
            o.conflict_code = c.exit_code_arg(value or "", opt)
        elif key == "dir":
            if not value:
                raise c.UsageError("%s needs a directory" % opt, command)
            o.directory = value
        elif key == "mechanism":
            if value not in _MECHANISMS:
                raise c.UsageError("%s: invalid mechanism %r: use %s" % (opt, value, ", ".join(_MECHANISMS)),
                                   command)
            o.mechanism = value
        elif key == "label":
            o.label = value
        elif key == "path":
            if not value:
                raise c.UsageError("%s needs a file" % opt, command)
            o.path = value
        elif key == "shell":
            if o.shell is not None:
                raise c.UsageError("%s given twice" % opt, command)
            o.shell = value
        elif key == "timeout_refused":
            # flock(1)'s --timeout waits for the lock; ours used to limit the job's run time. Accepting
            # either meaning silently would change what a migrated script or an old cron line does.
            raise c.UsageError("%s is ambiguous: flock(1)'s --timeout waits for the lock (use -w/--wait "
                               "%s); to limit the job's run time use --time-limit %s" % (opt, value, value),
                               command)
        elif key == "timeout":
            o.timeout = c.duration_arg(value or "", opt)
            if o.timeout <= 0:
                raise c.UsageError("%s must be more than 0" % opt, command)
        elif key == "kill_after":
            o.kill_after = c.duration_arg(value or "", opt)
        elif key == "pgroup":
            if value not in _PGROUPS:
                raise c.UsageError("%s: invalid mode %r: use %s" % (opt, value, ", ".join(_PGROUPS)), command)
            o.pgroup = value
        elif key == "quiet":
            o.quiet = True
        elif key == "verbose":
            o.verbose = True
        elif key == "help":
            o.help = True
        elif key == "name":
            o.name = value
        elif key == "on_conflict":
            if value not in _ON_CONFLICT:
                raise c.UsageError("%s: invalid mode %r: use %s" % (opt, value, ", ".join(_ON_CONFLICT)), command)
            o.on_conflict = value
        elif key == "syslog":
            o.syslog = True
        elif key == "syslog_socket":
            o.syslog = True
            o.syslog_socket = value or ""

    spec = _CRON_SPEC if cron else _RUN_SPEC
    i, dashdash = c.getopt(args, 0, spec, handle, command)
    if o.help:
        return o
    if not cron and o.path is None:
        if i >= len(args):
            raise c.UsageError("missing lock NAME and COMMAND", command)
        o.name = args[i]
        i += 1
        if not dashdash:  # options may also follow NAME (flock's `flock FILE -c CMD`)
            i, dashdash = c.getopt(args, i, spec, handle, command)
            if o.help:
                return o
    rest = args[i:]
    if o.shell is not None:
        if rest:
            raise c.UsageError("-c takes exactly one shell command; unexpected %s" % c.quote(rest[0]), command)
        if not o.shell.strip():
            raise c.UsageError("-c needs a non-empty shell command", command)
        o.command = [_SHELL, "-c", o.shell]
    elif not rest:
        raise c.UsageError("missing COMMAND (give it after NAME, after '--', or with -c)", command)
    else:
        o.command = rest
    if o.slots > 1 and o.mode == "shared":
        raise c.UsageError("--slots and --shared cannot be used together (a semaphore's slots are exclusive)",
                           command)
    if o.path is not None:
        if o.name is not None and not cron:
            raise c.UsageError("give a lock NAME or --path FILE, not both", command)
        if o.slots > 1 or o.directory is not None or o.mechanism == "record":
            raise c.UsageError("--path locks FILE as flock(1) does: --slots, --dir and --mechanism record do "
                               "not apply", command)
        if cron and o.name is not None:
            raise c.UsageError("give --name or --path, not both", command)
        o.name = o.path
    if cron and o.wait is None:
        o.wait = 0.0  # a cron run that finds the previous one still going is skipped, not queued
    return o


# ---------------------------------------------------------------------------------------------- the job


def _prctl() -> object:
    """libc's prctl(2) as a callable, or None; made in the parent before fork so the child only calls it.

    `_ctypes` directly: `import ctypes` costs ~4 ms more, and importing in the forked child costs more
    than here (copy-on-write faults), on the path every `hostlock run` waits for.
    """
    try:
        import _ctypes

        class _Int(_ctypes._SimpleCData):
            _type_ = "i"

        class _Func(_ctypes.CFuncPtr):
            _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
            _restype_ = _Int

        class _Self:
            _handle = _ctypes.dlopen(None)  # type: ignore[arg-type] # dlopen(NULL): the main program; typeshed wants a path

        return _Func(("prctl", _Self()))  # type: ignore[arg-type] # CFuncPtr reads only _handle: no CDLL needed
    except Exception:
        pass
    try:  # the documented way, should the private one ever change
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except Exception:
        return None


def _exec_child(argv: list[str], parent: int, new_group: bool, mask: object, out_fd: int | None,
                prctl: object) -> None:
    """In the forked child: tie the job to hostlock's life, restore signal state, exec. Never returns."""
    code = c.EX_OSERR
    try:
        if new_group:
            os.setpgid(0, 0)
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, _signal.SIGKILL, 0, 0, 0)  # type: ignore[operator]
        if os.getppid() != parent:
            # hostlock died between fork and prctl: the lock is gone, the job must not start unlocked.
            os._exit(c.EX_OSERR)
        if out_fd is not None:
            os.dup2(out_fd, 1)
            os.dup2(out_fd, 2)
        # Python ignores SIGPIPE and SIGXFSZ and handles SIGINT; a job expects the defaults (as subprocess
        # restores them). A SIGINT ignored by hostlock's own parent (nohup, `cmd &`) stays ignored.
        _signal.signal(_signal.SIGPIPE, _signal.SIG_DFL)
        _signal.signal(_signal.SIGXFSZ, _signal.SIG_DFL)
        if _signal.getsignal(_signal.SIGINT) is not _signal.SIG_IGN:
            _signal.signal(_signal.SIGINT, _signal.SIG_DFL)
        _signal.pthread_sigmask(_signal.SIG_SETMASK, mask)
        _execvp(argv)
    except OSError as exc:
        c.say("cannot execute %s: %s" % (c.quote(argv[0]), exc.strerror or exc))
        code = c.EX_OSERR if exc.errno == c._errno.ENOMEM else c.EX_UNAVAILABLE  # like flock(1)
    except BaseException:  # never let the child fall back into the parent's code
        pass
    finally:
        os._exit(code)


def _execvp(argv: list[str]) -> None:
    """execvp(3): search PATH like the shell. os.execvp would import `warnings` (~1 ms) on every run."""
    file = argv[0]
    if "/" in file:
        os.execv(file, argv)
    path = os.environ.get("PATH")
    dirs = (path if path is not None else os.defpath).split(":")
    first: OSError | None = None
    for d in dirs:
        try:
            os.execv(os.path.join(d or ".", file), argv)
        except OSError as exc:
            # Keep looking past "not here"; remember the first real reason (EACCES...), as execvp(3) does.
            if exc.errno not in (c._errno.ENOENT, c._errno.ENOTDIR) and first is None:
                first = exc
    raise first or FileNotFoundError(c._errno.ENOENT, os.strerror(c._errno.ENOENT), file)


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


def _start_watcher(group: int) -> int:
    """Fork a tiny process that SIGKILLs the job's process group if hostlock dies; returns our pipe end.

    PR_SET_PDEATHSIG reaches only the direct child (and is dropped by a setuid exec, e.g. sudo); this
    covers the rest of the group. The watcher blocks in read() and gets EOF when hostlock's last copy of
    the write end closes, however hostlock ends; a normal exit writes one byte first, meaning "done".
    """
    r, w = os.pipe()  # close-on-exec: the job never holds either end
    pid = os.fork()
    if pid == 0:
        try:
            os.close(w)
            for fd in (0, 1, 2):  # never hold our caller's pipes open (`out=$(hostlock run ...)`)
                try:
                    os.close(fd)
                except OSError:
                    pass
            while True:
                try:
                    data = os.read(r, 1)
                    break
                except InterruptedError:
                    continue
            if not data:
                try:
                    os.killpg(group, _signal.SIGKILL)
                except OSError:
                    pass
        finally:
            os._exit(0)
    os.close(r)
    return w


class Outcome:
    """How the job ended."""

    __slots__ = ("status", "timed_out", "elapsed", "pid", "tty_sigint")

    def __init__(self, status: int, timed_out: bool, elapsed: float, pid: int, tty_sigint: bool) -> None:
        self.status = status  # raw wait status
        self.timed_out = timed_out
        self.elapsed = elapsed
        self.pid = pid
        self.tty_sigint = tty_sigint  # a keyboard SIGINT reached us (and the job) from the terminal

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
        return "%s after %s" % (what, c.format_span(self.elapsed))


def _signame(sig: int) -> str:
    for name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGKILL", "SIGSEGV",
                 "SIGABRT", "SIGPIPE", "SIGALRM", "SIGBUS", "SIGFPE", "SIGILL", "SIGTRAP", "SIGXCPU"):
        if getattr(_signal, name, None) == sig:
            return name
    return "SIG%d" % sig


def supervise(lock: Lock, o: Options, out_fd: int | None = None) -> Outcome:
    """Fork and exec the job, forward signals, enforce --time-limit, reap it; the lock stays held throughout."""
    argv = o.command
    new_group = o.pgroup == "new" or (o.pgroup == "auto" and not _in_terminal_foreground())
    prctl = _prctl()
    if prctl is None and o.verbose:
        c.say("no prctl(PR_SET_PDEATHSIG) here: if hostlock is killed, only the watcher ends the job")
    parent = os.getpid()
    old_mask = _signal.pthread_sigmask(_signal.SIG_BLOCK, _WAITED)
    started = time.monotonic()
    try:
        pid = os.fork()
    except OSError:
        _signal.pthread_sigmask(_signal.SIG_SETMASK, old_mask)
        raise
    if pid == 0:
        _exec_child(argv, parent, new_group, old_mask, out_fd, prctl)
    watcher = -1
    if new_group:
        try:
            os.setpgid(pid, pid)  # also here: no window where a forwarded signal misses the new group
        except OSError:
            pass  # EACCES: the child already exec'd, after its own setpgid
        try:
            watcher = _start_watcher(pid)
        except OSError as exc:
            if o.verbose:
                c.say("no watcher process (%s): if hostlock is killed only the job's first process dies"
                      % exc.strerror)
    cmdline = c.join_command(argv)
    try:
        lock.update_record(job_pid=pid, job_cmdline=cmdline)
    except Exception as exc:  # status would name hostlock instead of the job: say so, keep going
        if o.verbose:
            c.say("cannot record the job's pid in the owner record: %s" % c.describe_error(exc))
    if o.verbose:
        c.say("job started: pid %d%s: %s" % (pid, ", own process group" if new_group else "", cmdline))

    def send(sig: int) -> None:
        try:
            if new_group:
                os.killpg(pid, sig)
            else:
                os.kill(pid, sig)
        except OSError:
            pass

    deadline = started + o.timeout if o.timeout is not None else None
    timed_out = False
    killed = False
    tty_sigint = False
    status = 0
    try:
        while True:
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # cannot happen unless someone reaped it for us
                break
            if done == pid:
                break
            if deadline is None:
                info = _signal.sigwaitinfo(_WAITED)
            else:
                info = _signal.sigtimedwait(_WAITED, max(0.0, deadline - time.monotonic()))
            if info is None:  # the deadline passed
                if not timed_out:
                    timed_out = True
                    if o.verbose:
                        c.say("job ran longer than %s: sending SIGTERM" % c.format_span(o.timeout or 0))
                    send(_signal.SIGTERM)
                    send(_signal.SIGCONT)  # a stopped job must wake up to die
                    deadline = time.monotonic() + o.kill_after
                elif not killed:
                    killed = True
                    if o.verbose:
                        c.say("job still running %s after SIGTERM: sending SIGKILL" % c.format_span(o.kill_after))
                    send(_signal.SIGKILL)
                    deadline = None
                continue
            sig = info.si_signo
            if sig == _signal.SIGCHLD:
                continue
            if not new_group and info.si_code == _SI_KERNEL:
                # From our terminal: the job is in our process group and got this very signal already.
                if sig == _signal.SIGINT:
                    tty_sigint = True
                continue
            sender = info.si_pid
            if sender and (sender == pid or (new_group and _pgid(sender) == pid)):
                continue  # sent by the job itself: forwarding it back could ping-pong forever
            if o.verbose:
                c.say("forwarding %s to the job" % _signame(sig))
            send(sig)
    finally:
        if watcher >= 0:
            try:
                os.write(watcher, b"x")
            except OSError:
                pass
            os.close(watcher)
        # Signals that came after the job ended were meant for it, not for us: drop them, then restore
        # the mask (for callers of main() in a process that goes on).
        while _signal.sigtimedwait(_WAITED, 0) is not None:
            pass
        _signal.pthread_sigmask(_signal.SIG_SETMASK, old_mask)
    return Outcome(status, timed_out, time.monotonic() - started, pid, tty_sigint)


def _pgid(pid: int) -> int:
    try:
        return os.getpgid(pid)
    except OSError:
        return -1


def die_like(outcome: Outcome) -> None:
    """If the terminal's Ctrl-C killed the job, die of SIGINT too, so a calling shell loop stops.

    This is the "wait and cooperative exit" convention shells rely on (bash continues a loop when its
    child *exits* 130, and stops when it is *killed* by SIGINT). Only for a keyboard SIGINT that reached
    hostlock and the job alike; every other case exits with 128+N like flock(1).
    """
    if not (outcome.tty_sigint and os.WIFSIGNALED(outcome.status)
            and os.WTERMSIG(outcome.status) == _signal.SIGINT):
        return
    sys.stdout.flush()
    _signal.signal(_signal.SIGINT, _signal.SIG_DFL)
    _signal.pthread_sigmask(_signal.SIG_UNBLOCK, {_signal.SIGINT})
    os.kill(os.getpid(), _signal.SIGINT)


# ------------------------------------------------------------------------------------------ lock taking


def _mode_text(o: Options) -> str:
    return "%d-slot semaphore" % o.slots if o.slots > 1 else o.mode


def conflict_text(name: str, exc: BaseException, waited: float | None) -> str:
    """'lock NAME is busy: held by pid 12 running job pid 34 (user root, backup.sh, since 02:00:01)'."""
    parts = [h.describe() for h in getattr(exc, "holders", None) or []]
    held = "; ".join(parts[:3]) + ("; and %d more" % (len(parts) - 3) if len(parts) > 3 else "")
    gave_up = "" if not waited else " (waited %s)" % c.format_span(waited)
    return "lock %s is busy%s%s" % (name, gave_up, ": held by " + held if held else "")


def make_lock(o: Options) -> Lock:
    """Build the engine's Lock from the options (validates the name: InvalidName -> exit 64)."""
    if o.path is not None:
        from ._pathlock import PathLock

        return PathLock(o.path, mode=o.mode, ofd=o.mechanism == "ofd")  # type: ignore[return-value]
    from . import Lock

    assert o.name is not None  # the parser sets a name whenever --path is absent
    return Lock(o.name, mode=o.mode, slots=o.slots, directory=o.directory, mechanism=o.mechanism,
                label=o.label)


# ---------------------------------------------------------------------------------------------- run


def main_run(args: list[str]) -> int:
    """hostlock run: exit with the job's status, or a code saying why it did not run."""
    try:
        o = parse(args, cron=False)
    except c.UsageError as exc:
        return c.usage_error(str(exc), "run")
    if o.help:
        c.write_out(RUN_HELP)
        return 0
    from . import LockTimeout

    try:
        lock = make_lock(o)
        if o.verbose:
            c.say("waiting for %s lock %s in %s" % (_mode_text(o), o.name, lock.directory))
        t0 = time.monotonic()
        lock.acquire(timeout=o.wait)
    except LockTimeout as exc:
        if not o.quiet:
            c.say(conflict_text(o.name or "", exc, o.wait))
        return c.CONFLICT_DEFAULT if o.conflict_code is None else o.conflict_code
    except KeyboardInterrupt:
        return 128 + _signal.SIGINT
    except Exception as exc:
        return _lock_failed(o, exc)
    try:
        if o.verbose:
            c.say("got %s lock %s (%s) after %s" % (_mode_text(o), o.name, lock.mechanism,
                                                    c.format_span(time.monotonic() - t0)))
        try:
            outcome = supervise(lock, o)
        except OSError as exc:
            c.say("cannot start the job: %s" % c.describe_error(exc))
            return c.errno_exit_code(exc.errno, c.EX_OSERR)
        if o.verbose:
            c.say("job %s" % outcome.describe())
    finally:
        try:
            lock.release()
        except Exception as exc:  # the lock dies with this process anyway; say it, do not mask the job's status
            if o.verbose:
                c.say("release: %s" % c.describe_error(exc))
    die_like(outcome)
    return outcome.exit_code()


def _lock_failed(o: Options, exc: BaseException) -> int:
    code = c.error_exit_code(exc)
    if code == c.EX_USAGE:
        return c.usage_error(c.describe_error(exc), "run")
    c.say("cannot lock %s: %s" % (o.name, c.describe_error(exc)))
    return code


# ---------------------------------------------------------------------------------------------- cron


def _fnv1a32(data: bytes) -> int:
    """FNV-1a: stable across Python versions and runs (hash() is salted), no hashlib import."""
    h = 0x811C9DC5
    for b in data:
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h


def default_cron_name(o: Options) -> str:
    """cron-PROGRAM-HASH: PROGRAM is the command's base name (first word of a -c command), HASH covers the
    whole command line, so the same entry always maps to the same lock and different entries do not."""
    if o.shell is not None:
        words = o.shell.split()
        program = words[0] if words else "sh"
        key = "sh -c\0" + o.shell
    else:
        program = o.command[0]
        key = "\0".join(o.command)
    program = program.rstrip("/").rsplit("/", 1)[-1] or "job"
    allowed = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._+@-"
    program = "".join(ch if ch in allowed else "_" for ch in program)[:60]
    return "cron-%s-%08x" % (program, _fnv1a32(key.encode("utf-8", "surrogateescape")))


def _capture_file() -> int:
    """An unlinked temporary file for the job's output: unlike a pipe it never fills and blocks the job."""
    flags = os.O_RDWR | os.O_APPEND | os.O_CLOEXEC
    dirs = [os.environ.get("TMPDIR") or "", "/tmp", "/var/tmp", "/dev/shm"]
    last: OSError | None = None
    for d in dirs:
        if not d:
            continue
        if hasattr(os, "O_TMPFILE"):
            try:
                return os.open(d, flags | os.O_TMPFILE, 0o600)
            except OSError as exc:
                last = exc  # EISDIR/EOPNOTSUPP: kernel or fs without O_TMPFILE; fall back to create+unlink
        for _attempt in range(5):
            path = os.path.join(d, ".hostlock-cron-%s" % os.urandom(8).hex())
            try:
                fd = os.open(path, flags | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            except FileExistsError:
                continue
            except OSError as exc:
                last = exc
                break
            os.unlink(path)
            return fd
    raise last or OSError("no temporary directory")


def _copy_out(fd: int) -> None:
    os.lseek(fd, 0, os.SEEK_SET)
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            return
        while chunk:
            chunk = chunk[os.write(1, chunk):]


def _syslog(o: Options, failed: bool, text: str) -> None:
    """One line to syslog over the local datagram socket (`_socket`: `socket` and `logging` cost ~15 ms)."""
    import _socket

    pri = 8 + (3 if failed else 6)  # facility user, severity err or info
    stamp = time.strftime("%b %d %H:%M:%S")
    data = ("<%d>%s hostlock[%d]: %s" % (pri, stamp, os.getpid(), text)).encode("utf-8", "replace")[:2048]
    for kind in (_socket.SOCK_DGRAM, _socket.SOCK_STREAM):
        s = _socket.socket(_socket.AF_UNIX, kind)
        try:
            s.connect(o.syslog_socket)
            s.sendall(data if kind == _socket.SOCK_DGRAM else data + b"\0")
            return
        except OSError as exc:
            if exc.errno == c._errno.EPROTOTYPE and kind == _socket.SOCK_DGRAM:  # a stream-mode syslog daemon
                continue
            c.say("cannot write to syslog (%s): %s" % (o.syslog_socket, exc.strerror or exc))
            return
        finally:
            s.close()


def main_cron(args: list[str]) -> int:
    """hostlock cron: silent on success and (by default) on conflict; the captured output on failure."""
    try:
        o = parse(args, cron=True)
    except c.UsageError as exc:
        return c.usage_error(str(exc), "cron")
    if o.help:
        c.write_out(CRON_HELP)
        return 0
    if o.name is None:
        o.name = default_cron_name(o)
    from . import LockTimeout

    cmdline = c.join_command(o.command)
    try:
        lock = make_lock(o)
        if o.verbose:
            c.say("cron job lock %s in %s" % (o.name, lock.directory))
        lock.acquire(timeout=o.wait)
    except LockTimeout as exc:
        text = conflict_text(o.name, exc, o.wait)
        if o.on_conflict != "quiet" or o.verbose:
            c.say("%s; not running %s" % (text, cmdline))
        if o.syslog:
            _syslog(o, False, "cron %s: skipped, %s" % (o.name, text))
        if o.conflict_code is not None:
            return o.conflict_code
        return c.CONFLICT_DEFAULT if o.on_conflict == "fail" else 0
    except KeyboardInterrupt:
        return 128 + _signal.SIGINT
    except Exception as exc:
        code = c.error_exit_code(exc)
        if code == c.EX_USAGE:
            return c.usage_error(c.describe_error(exc), "cron")
        c.say("cannot lock %s: %s" % (o.name, c.describe_error(exc)))
        if o.syslog:
            _syslog(o, True, "cron %s: cannot lock: %s" % (o.name, c.describe_error(exc)))
        return code
    capture = -1
    try:
        try:
            capture = _capture_file()
        except OSError as exc:  # never lose output: run uncaptured and say why
            c.say("cannot capture the job's output (%s); it goes straight to cron" % (exc.strerror or exc))
        try:
            outcome = supervise(lock, o, capture if capture >= 0 else None)
        except OSError as exc:
            c.say("cannot start %s: %s" % (cmdline, c.describe_error(exc)))
            if o.syslog:
                _syslog(o, True, "cron %s: cannot start: %s" % (o.name, c.describe_error(exc)))
            return c.errno_exit_code(exc.errno, c.EX_OSERR)
    finally:
        try:
            lock.release()
        except Exception:
            pass
    code = outcome.exit_code()
    failed = code != 0
    summary = "cron %s: %s: %s" % (o.name, outcome.describe(), cmdline)
    if failed:
        if capture >= 0:
            _copy_out(capture)
        c.say(summary)
    elif o.verbose:
        c.say(summary)
    if capture >= 0:
        os.close(capture)
    if o.syslog:
        _syslog(o, failed, "%s (job pid %d)" % (summary, outcome.pid))
    return code
