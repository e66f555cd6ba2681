"""`hostlock flock`: util-linux flock(1)'s command line, on the same kernel lock of the same file.

A correct flock(1) script must behave the same with `alias flock='hostlock flock'`, so this module follows
util-linux `sys-utils/flock.c` step by step: the same getopt string ("+sexnoFuw:E:hV?") and long options,
the same open flags (O_RDONLY|O_CREAT, 0666; O_RDONLY for a directory; O_WRONLY for an exclusive --fcntl
lock), flock(2) or OFD fcntl locks on that descriptor, the descriptor inherited by the command unless -o,
the same exit codes and the same streams (--verbose chatter on stdout, errors on stderr).

What hostlock adds is what no correct script can observe (docs/cli.md, "hostlock flock"):
- it stays the parent and forwards every signal that would end it (core.signals.FORWARDED) to the command
  (flock(1) dies and leaves the command running with the lock);
- the command dies with hostlock (PR_SET_PDEATHSIG), even when hostlock is SIGKILLed;
- a FIFO at the lock path is refused instead of blocking forever in open();
- a symlink another user planted in a sticky world-writable directory is refused (fs.protected_symlinks'
  rule, enforced even where the sysctl is off).
Other symlinks are followed, as flock(1) does: both must lock the same inode to exclude each other.

Only cheap modules here, like `hostlock run` (the supervisor and this parser are the whole hot path).
"""

from __future__ import annotations

import _signal
import errno
import fcntl
import os
import time

from ..core.errors import LockFileError
from ..host import pathlock as _pathlock
from . import common as c

PROG = c.FLOCK_PROG
_TIME_T_END = 2.0 ** 63  # seconds a timer can take (time_t): flock(1) sets none for -w past it, nor for inf
DEFAULT_CONFLICT = 1  # flock(1)'s, not hostlock run's 75: scripts test for it
_PATH_BSHELL = "/bin/sh"  # flock.c: $SHELL, else _PATH_BSHELL

HELP = """\
usage: hostlock flock [options] <file>|<directory> <command> [<argument>...]
       hostlock flock [options] <file>|<directory> -c <command>
       hostlock flock [options] <file descriptor number>

flock(1)'s command line on the same kernel lock of the same file: it excludes and is excluded by
util-linux flock and any program locking that file with flock(2) (or OFD fcntl locks with --fcntl).
hostlock stays the parent: signals it gets reach the command, and the command dies with it.

options:
 -s, --shared             get a shared lock
 -x, -e, --exclusive      get an exclusive lock (default)
 -u, --unlock             remove a lock
 -n, --nb, --nonblocking  fail rather than wait
 -w, --wait, --timeout <secs>
                          wait for a limited amount of time (fractions allowed; 0 is -n)
 -E, --conflict-exit-code <number>
                          exit code after conflict or timeout (default 1)
 -o, --close              close the lock's descriptor before running the command (the command and
                          its children do not keep the lock; hostlock holds it until the command ends)
 -c, --command <command>  run a single command string through $SHELL (default /bin/sh), after the file
 -F, --no-fork            execute the command without forking (no supervision: flock(1) exactly)
     --fcntl              use fcntl(F_OFD_SETLK) rather than flock()
     --start <offset>     starting offset for lock (implies --fcntl)
     --length <number>    number of bytes to lock (implies --fcntl; 0 means to the end of the file)
     --verbose            increase verbosity (on stdout, as flock(1))
 -h, --help               display this help
 -V, --version            display version

hostlock's own (not in flock(1)):
     --process-group <mode>
                          same (default, as flock(1)): the command stays in the caller's process group;
                          new: its own group, which hostlock's death kills whole (children that would run
                          on unlocked after 'hostlock flock -o' is killed) and which gets forwarded
                          signals once, not also from a kill of the caller's group; auto: new unless
                          in a terminal's foreground

exit status: the command's status; 128+N if it died of signal N; on conflict or timeout 1 (or -E);
64 usage; 65 lock error; 66 cannot open the lock file; 69 cannot execute the command; 71 OS error;
73 read-only file system or disk full. 'hostlock status --path FILE' shows who holds the lock.
"""

# getopt_long(argc, argv, "+sexnoFuw:E:hV?", long_options): -c/--command is NOT among them (flock(1) only
# recognises it right after the file), and '?' is an option that means "usage error".
_SPEC = {
    "-s": ("shared", False), "--shared": ("shared", False),
    "-e": ("exclusive", False), "-x": ("exclusive", False), "--exclusive": ("exclusive", False),
    "-u": ("unlock", False), "--unlock": ("unlock", False),
    "-n": ("nb", False), "--nonblocking": ("nb", False), "--nb": ("nb", False),
    "-o": ("close", False), "--close": ("close", False),
    "-F": ("nofork", False), "--no-fork": ("nofork", False),
    "-w": ("wait", True), "--timeout": ("wait", True), "--wait": ("wait", True),
    "-E": ("code", True), "--conflict-exit-code": ("code", True),
    "--verbose": ("verbose", False),
    "--fcntl": ("fcntl", False),
    "--start": ("start", True),
    "--length": ("length", True),
    "-h": ("help", False), "--help": ("help", False),
    "-V": ("version", False), "--version": ("version", False),
    "-?": ("usage", False),
    # hostlock's own, long only: flock(1) refuses any other long option (exit 64), so no correct flock
    # script passes one, and none of flock's abbreviations (--n, --no, --ver, ...) becomes ambiguous.
    "--process-group": ("pgroup", True),
}
_PGROUPS = ("same", "new", "auto")

LOCK_EX, LOCK_SH, LOCK_UN = fcntl.LOCK_EX, fcntl.LOCK_SH, fcntl.LOCK_UN


class _Exit(Exception):
    """Leave main_flock with this exit code (flock.c's exit()/errx() calls)."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class Options:
    """flock(1)'s settings, named as in flock.c's main()."""

    __slots__ = ("type", "block", "timeout", "conflict_code", "do_close", "no_fork", "verbose", "fcntl",
                 "start", "length", "filename", "fd", "command", "shell", "pgroup")

    def __init__(self) -> None:
        self.type = LOCK_EX
        self.block = 0  # LOCK_NB once -n (or -w 0) is given
        self.timeout: float | None = None
        self.conflict_code = DEFAULT_CONFLICT
        self.do_close = False
        self.no_fork = False
        self.verbose = False
        self.fcntl = False
        self.start = 0
        self.length = 0
        self.filename: str | None = None
        self.fd = -1
        self.command: list[str] = []
        self.shell: str | None = None  # the -c string, for status and messages
        self.pgroup = "same"  # the caller's process group, as with flock(1)


def warn(message: str) -> None:
    """flock.c's warnx(): 'PROG: message' on stderr, unbuffered."""
    data = ("%s: %s\n" % (PROG, c.one_line(message))).encode("utf-8", "backslashreplace")
    try:
        while data:
            data = data[os.write(2, data):]
    except OSError:
        pass


def _usage(message: str) -> _Exit:
    warn(message)
    warn("try 'hostlock flock --help' for more information")
    return _Exit(c.EX_USAGE)


_C_SPACE = " \t\n\v\f\r"  # isspace() in the C locale: what strtod() and strtol() skip before a number


def _c_number(value: str) -> str | None:
    """`value` without the leading white space strtod()/strtol() skip, or None when Python's float()/int()
    would read more than C does: trailing space, `_` between digits, digits that are not ASCII."""
    text = value.lstrip(_C_SPACE)
    if not text or not text.isascii() or "_" in text or text != text.rstrip():
        return None
    return text


def _timeout_arg(value: str) -> float:
    """strtotimeval_or_err(): what strtod() reads whole (decimal, hex, inf, nan), else a usage error. Whether
    a timer can be set for it (not negative, not NaN, not past time_t) is take_lock's question, as in flock.c."""
    text = _c_number(value)
    seconds = None
    if text is not None:
        try:
            seconds = float(text)
        except ValueError:
            try:
                seconds = float.fromhex(text) if text.lower().lstrip("+-").startswith("0x") else None
            except ValueError:
                pass
    if seconds is None:
        raise _Exit(_bad("invalid timeout value: '%s'" % value))
    return seconds


def _int32_arg(value: str, what: str) -> int:
    """strtos32_or_err(): a base-10 integer strtol() reads whole and an int32 holds, else a usage error."""
    text = _c_number(value)  # strtol() skips leading space; the number itself is cli.common's rule
    number = c.decimal_arg(text) if text is not None else None
    if number is None:
        raise _Exit(_bad("%s: '%s'" % (what, value)))
    if not -(1 << 31) <= number < 1 << 31:
        raise _Exit(_bad("%s: '%s': %s" % (what, value, os.strerror(errno.ERANGE))))
    return number


def _bad(message: str) -> int:
    warn(message)
    return c.EX_USAGE


_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50, "E": 1 << 60}


def _size_arg(value: str, what: str) -> int:
    """strtosize_or_err(): a byte count with an optional K/M/G/T/P/E suffix (KiB = K = 1024, KB = 1000)."""
    text = value.strip()
    digits = text
    unit = ""
    for i, ch in enumerate(text):
        if not "0" <= ch <= "9":  # ASCII only: str.isdigit() takes "²", which int() refuses
            digits, unit = text[:i], text[i:]
            break
    base = 1024
    u = unit.upper()
    if u.endswith("IB"):
        u = u[:-2]
    elif u.endswith("B") and len(u) == 2:
        u, base = u[:-1], 1000
    if not digits or u not in _SIZE_UNITS:
        raise _Exit(_bad("%s: '%s'" % (what, value)))
    power = "KMGTPE".find(u) + 1 if u else 0
    size = int(digits, 10) * base ** power
    if size >= 1 << 63:
        raise _Exit(_bad("%s: '%s'" % (what, value)))
    return size


def parse(args: list[str]) -> Options:
    """flock.c's main() up to the lock: options, then FILE COMMAND..., FILE -c CMD, or FD."""
    o = Options()
    if not args:
        raise _usage("not enough arguments")

    def handle(key: str, value: str | None, opt: str) -> None:
        if key == "shared":
            o.type = LOCK_SH
        elif key == "exclusive":
            o.type = LOCK_EX
        elif key == "unlock":
            o.type = LOCK_UN
        elif key == "close":
            o.do_close = True
        elif key == "nofork":
            o.no_fork = True
        elif key == "nb":
            o.block = fcntl.LOCK_NB
        elif key == "wait":
            o.timeout = _timeout_arg(value or "")
        elif key == "code":
            code = _int32_arg(value or "", "invalid exit code")
            if not 0 <= code <= 255:
                raise _Exit(_bad("exit code out of range (expected 0 to 255)"))
            o.conflict_code = code
        elif key == "fcntl":
            o.fcntl = True
        elif key == "start":
            o.start = _size_arg(value or "", "invalid as start offset")
            o.fcntl = True
        elif key == "length":
            o.length = _size_arg(value or "", "invalid as length of lock range")
            o.fcntl = True
        elif key == "verbose":
            o.verbose = True
        elif key == "pgroup":
            if value not in _PGROUPS:
                raise _Exit(_bad("%s: invalid mode '%s': use %s" % (opt, value, ", ".join(_PGROUPS))))
            o.pgroup = value
        elif key == "version":
            from .. import __version__

            c.write_out("hostlock flock (hostlock %s; flock(1) from util-linux compatible)\n" % __version__)
            raise _Exit(0)
        elif key == "help":
            c.write_out(HELP)
            raise _Exit(0)
        else:
            raise _usage("invalid option -- '?'")

    try:
        i, _dashdash = c.getopt(args, 0, _SPEC, handle, "flock")
    except c.UsageError as exc:
        raise _usage(str(exc)) from None
    if o.no_fork and o.do_close:
        raise _Exit(_bad("the --no-fork and --close options are incompatible"))
    rest = args[i:]
    if len(rest) > 1:
        if rest[1] in ("-c", "--command"):
            if len(rest) != 3:
                raise _Exit(_bad("%s requires exactly one command argument" % rest[1]))
            shell = os.environ.get("SHELL") or _PATH_BSHELL
            o.command = [shell, "-c", rest[2]]
            o.shell = rest[2]
        else:
            o.command = rest[1:]
        o.filename = rest[0]
    elif rest:
        o.fd = _int32_arg(rest[0], "bad file descriptor")
    else:
        raise _Exit(_bad("requires file descriptor, file or directory"))
    return o


def open_file(filename: str, flags: int) -> tuple[int, int]:
    """flock.c's open_file() (shared with `run --path`: host.pathlock.open_path); exits 66/71/73 with flock(1)'s
    message. The descriptor is close-on-exec here; run_command decides whether the command inherits it."""
    try:
        return _pathlock.open_path(filename, flags)
    except LockFileError as exc:  # a FIFO or a planted symlink (docs/security.md)
        warn("cannot open lock file %s: %s" % (filename, exc))
        raise _Exit(c.EX_NOINPUT) from None
    except OSError as exc:
        warn("cannot open lock file %s: %s" % (filename, os.strerror(exc.errno or 0)))
        if exc.errno in (errno.ENOMEM, errno.EMFILE, errno.ENFILE):
            raise _Exit(c.EX_OSERR) from None
        if exc.errno in (errno.EROFS, errno.ENOSPC):
            raise _Exit(c.EX_CANTCREAT) from None
        raise _Exit(c.EX_NOINPUT) from None


def take_lock(o: Options, fd: int, flags: int) -> int:
    """flock.c's lock loop: returns the descriptor holding the lock (it may be reopened read-write)."""
    wait: float | None = None  # forever
    if o.block:
        wait = 0.0
    elif o.timeout is not None:
        if not 0 <= o.timeout < _TIME_T_END:  # also NaN: flock.c's timer_settime() refuses them all
            warn("cannot set up timer: %s" % os.strerror(errno.EINVAL))
            raise _Exit(c.EX_OSERR)
        wait = o.timeout  # -w 0 is -n
    t0 = time.monotonic()
    while True:
        try:
            if _pathlock.lock_with_timeout(fd, o.type, wait, o.fcntl, o.start, o.length):
                break
            if o.verbose:
                warn("failed to get lock" if not wait else "timeout while waiting to get lock")
            raise _Exit(o.conflict_code)
        except OSError as exc:
            err = exc.errno
            if err in (errno.EIO, errno.EBADF) and not flags & os.O_RDWR and o.type != LOCK_SH \
                    and o.filename and os.access(o.filename, os.R_OK | os.W_OK):
                # Probably NFSv4, where flock() is emulated by fcntl() and needs a writable
                # descriptor: reopen read-write and try again, as flock(1) does.
                os.close(fd)
                fd, flags = open_file(o.filename, os.O_RDWR)
                if flags & os.O_RDWR:
                    continue
            warn("%s: %s" % (o.filename if o.filename else o.fd, os.strerror(err or 0)))
            raise _Exit(c.EX_OSERR if err in (errno.ENOLCK, errno.ENOMEM) else c.EX_DATAERR) from None
    if o.verbose:
        took = time.monotonic() - t0
        c.write_out("%s: getting lock took %d.%06d seconds\n" % (PROG, int(took), int(took * 1e6) % 1000000))
    return fd


def _reap_watcher() -> None:
    """Wait for the watcher process (--process-group new) to exit: it was forked while we held the lock's
    descriptor and shares it, so until it is gone the lock would outlive us. It exits at once: supervise
    has told it the job is done. (A zombie holds no descriptors; reaping is only the way to wait.)"""
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return
        except InterruptedError:
            continue


def run_command(o: Options, fd: int) -> int:
    """Run the command holding the lock: exec it (-F), or fork, supervise and pass its status on."""
    if o.verbose:
        c.write_out("%s: executing %s\n" % (PROG, o.command[0]))
    # flock.c: "Clear any inherited settings" (a SIGCHLD ignored by our parent would lose the status).
    _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)
    if o.no_fork:
        from ..proc.job import execvp

        os.set_inheritable(fd, True)  # the exec'd command is the holder now
        # Python ignores SIGPIPE and SIGXFSZ; an ignored signal stays ignored across exec, and the command
        # expects the defaults (`hostlock flock -F f yes | head` must end `yes` by SIGPIPE).
        _signal.signal(_signal.SIGPIPE, _signal.SIG_DFL)
        _signal.signal(_signal.SIGXFSZ, _signal.SIG_DFL)
        try:
            execvp(o.command, sh_fallback=True)
        except (OSError, ValueError) as exc:
            warn("failed to execute %s: %s" % (o.command[0], getattr(exc, "strerror", None) or exc))
            return c.EX_OSERR if getattr(exc, "errno", None) == errno.ENOMEM else c.EX_UNAVAILABLE
    from ..proc.job import Job, new_group_for
    from .supervise import die_like, supervise

    # Without -o the command inherits the locked descriptor, as with flock(1): a background child it
    # leaves behind keeps the lock. With -o it does not, and hostlock (alive until the command ends, and
    # taking the command with it if killed) holds the lock alone.
    os.set_inheritable(fd, not o.do_close)
    # Default: like flock(1), the command stays in the caller's process group (job control, kill -- -PGID).
    # --process-group new: its own group, killed whole if hostlock dies, and signals to the caller's
    # group reach the command once (forwarded), not twice.
    # With a group of its own the command dies whole with hostlock, killed by the watcher, which (with -o,
    # where hostlock holds the lock alone) keeps the lock until the command is gone.
    new_group = new_group_for(o.pgroup)
    job = Job(o.command, new_group=new_group, watch=new_group, lock_fds=(fd,) if o.do_close else (),
              flock_exec=True, say=lambda message: c.say(message, prog=c.FLOCK_PROG))
    try:
        outcome = supervise(job)
    except OSError as exc:
        warn("fork failed: %s" % (exc.strerror or exc))
        return c.EX_OSERR
    if job.watch:
        _reap_watcher()
    die_like(outcome)
    return outcome.exit_code()


def main_flock(args: list[str]) -> int:
    """hostlock flock: flock(1)'s exit status in every case (docs/cli.md has the table)."""
    for arg in args:  # the options before FILE; flock(1) has no --fleet, so this changes no valid command line
        if arg == "--fleet" or arg.startswith("--fleet="):
            return _bad("--fleet does not apply: flock locks FILE on this host (a fleet lock is "
                        "'hostlock run --fleet URL NAME COMMAND')")
        if arg == "--" or not arg.startswith("-"):
            break
    try:
        o = parse(args)
        # Like flock(1), a keyboard SIGINT while waiting kills us (Python would raise KeyboardInterrupt).
        if _signal.getsignal(_signal.SIGINT) is not _signal.SIG_IGN:
            _signal.signal(_signal.SIGINT, _signal.SIG_DFL)
        if o.filename is not None:
            # For fcntl(F_OFD_SETLK), an exclusive lock requires a descriptor open for writing.
            flags = os.O_WRONLY if o.fcntl and o.type == LOCK_EX else 0
            fd, flags = open_file(o.filename, flags)
        else:
            fd, flags = o.fd, 0
        if o.command and os.environ.get("HOSTLOCK_FLEET_PASSWORD") is not None:
            # hostlock's own credential: run and cron keep it from their jobs, and so does flock.
            from ..core.errors import FleetConfigError
            from ..fleet.url import take_credentials

            try:
                take_credentials()
            except FleetConfigError as e:
                warn(str(e))
                return c.EX_OSERR
        fd = take_lock(o, fd, flags)
        if not o.command:
            return 0  # the FD form: the lock stays with the caller's descriptor
        return run_command(o, fd)
    except _Exit as exc:
        return exc.code
