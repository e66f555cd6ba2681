"""Shared by the command line: exit codes, one-line messages, error-to-exit-code mapping, option parsing.

Kept free of argparse/re/json on purpose: `hostlock run` and `hostlock cron` are started once per job and
their whole budget is a few milliseconds above the bare interpreter.
"""

from __future__ import annotations

import errno as _errno
import os

from ._text import CONTROL, one_line

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover - typing only, never imported at run time
    from typing import Callable

PROG = "hostlock"

# Exit codes. sysexits(3) values where flock(1) uses them, so scripts written for flock keep working.
EX_OK = 0
EX_USAGE = 64  # bad command line: unknown option, invalid name, missing command
EX_DATAERR = 65  # lock error that is not an open failure: corrupt record, mechanism mismatch
EX_NOINPUT = 66  # cannot open the lock file or the lock directory
EX_UNAVAILABLE = 69  # the command could not be executed
EX_OSERR = 71  # operating-system error (out of memory, out of descriptors, fork failed)
EX_CANTCREAT = 73  # read-only file system, disk full
EX_TEMPFAIL = 75  # default exit code on conflict: "did not run, try later" (lckdo's choice; flock: -E 1)
EX_FLEET = 76  # the fleet (etcd) was unavailable within the wait: unreachable, no quorum, auth refused
EX_NOPERM = 77  # wrong or expired lease token; another user's lock
EX_CONFIG = 78  # a fleet setting that cannot work: TLS/password file missing or open to others, wrong scheme
EX_LOST = 79  # the fleet lock was lost while the job ran: the job was stopped, whatever its own status
EX_TIMEOUT = 124  # the job ran longer than --time-limit (timeout(1)'s code)

FLEET_ENV = "HOSTLOCK_FLEET"  # the default of --fleet; empty or unset: host locks

CONFLICT_DEFAULT = EX_TEMPFAIL


class UsageError(Exception):
    """A bad command line; printed as one line plus a pointer to --help, exit 64."""

    def __init__(self, message: str, command: str = "") -> None:
        super().__init__(message)
        self.command = command


# Control characters from arguments, file names or other processes' command lines, escaped.
_CONTROL = CONTROL


def say(message: str) -> None:
    """One diagnostic line on stderr, unbuffered: never mixed into the job's stdout, never lost on fork."""
    data = ("%s: %s\n" % (PROG, one_line(message))).encode("utf-8", "backslashreplace")
    try:
        while data:
            data = data[os.write(2, data):]
    except OSError:
        pass


def write_out(text: str, fd: int = 1) -> None:
    """Write `text` to stdout (fd 1) without Python's buffers, so output order with the job's is exact."""
    data = text.encode("utf-8", "backslashreplace")
    while data:
        data = data[os.write(fd, data):]


def usage_error(message: str, command: str = "") -> int:
    """Print a usage error (what is wrong and where to look) and return EX_USAGE."""
    where = "%s %s" % (PROG, command) if command else PROG
    say("%s (see '%s --help')" % (message, where))
    return EX_USAGE


def fleet_arg(value: str | None) -> str | None:
    """The fleet in effect: --fleet URL if given, else $HOSTLOCK_FLEET; '' (from either) means host locks."""
    if value is None:
        value = os.environ.get(FLEET_ENV, "")
    return value or None


def fleet_source(given: str | None) -> str:
    """Where the fleet in effect came from, for messages: '--fleet' or '$HOSTLOCK_FLEET'."""
    return "--fleet" if given else "$" + FLEET_ENV


def refuse_host_options(options: dict[str, bool], given: str | None, fleet: str, command: str = "") -> None:
    """UsageError if any option of `options` (name -> present) is present: they are for host locks only.

    A fleet lock has no directory, mechanism or file; such an option beside a fleet (even one that came
    from $HOSTLOCK_FLEET) is a contradiction, never a silent fall-back to a lock only this host sees.
    """
    present = [opt for opt, there in options.items() if there]
    if present:
        from ._fleet import mask

        fleet = mask(fleet)  # a password put in the URL by mistake is not repeated
        raise UsageError("%s %s for host locks, not a fleet lock (%s %s): drop %s, or give --fleet '' for a "
                         "host lock" % (" and ".join(present), "is" if len(present) == 1 else "are",
                                        fleet_source(given), fleet, "it" if len(present) == 1 else "them"),
                         command)


def errno_exit_code(err: int | None, default: int) -> int:
    """Exit code for an errno the way flock(1) maps open failures: 73 read-only/full, 71 resources."""
    if err in (_errno.EROFS, _errno.ENOSPC, _errno.EDQUOT):
        return EX_CANTCREAT
    if err in (_errno.ENOMEM, _errno.EMFILE, _errno.ENFILE, _errno.EAGAIN):
        return EX_OSERR
    return default


def error_exit_code(exc: BaseException) -> int:
    """Exit code of an engine or OS error; LockTimeout is handled by callers (it is -E CODE)."""
    from . import _error as e  # already imported by the package; a plain module lookup

    if isinstance(exc, (e.InvalidName, e.InvalidDuration, e.InvalidFleetURL)):
        return EX_USAGE
    if isinstance(exc, e.FleetConfigError):
        return EX_CONFIG
    if isinstance(exc, e.FleetUnavailable):
        return EX_FLEET
    if isinstance(exc, e.LockLost):
        return EX_LOST
    if isinstance(exc, e.TokenError):
        return EX_NOPERM
    if isinstance(exc, e.CorruptLockFile):
        return EX_DATAERR  # the file exists and opens: it is its content that is wrong
    if isinstance(exc, (e.LockDirectoryError, e.LockFileError)):
        return errno_exit_code(getattr(exc, "errno", None), EX_NOINPUT)
    if isinstance(exc, e.HostlockError):
        err = getattr(exc, "errno", None)
        if err in (_errno.EPERM, _errno.EACCES):  # e.g. breaking another user's lock
            return EX_NOPERM
        return errno_exit_code(err, EX_DATAERR)
    if isinstance(exc, PermissionError):
        return EX_NOPERM
    if isinstance(exc, OSError):
        return errno_exit_code(exc.errno, EX_OSERR)
    return EX_DATAERR


def describe_error(exc: BaseException) -> str:
    """One line for an error, adding the directory or path the engine attached when the text lacks it."""
    text = str(exc) or exc.__class__.__name__
    if isinstance(exc, OSError) and not getattr(exc, "directory", None) and exc.strerror:
        text = "%s%s" % (exc.strerror, ": %s" % exc.filename if exc.filename else "")
    where = getattr(exc, "path", None) or getattr(exc, "directory", None)
    if where and where not in text:
        text = "%s (%s)" % (text, where)
    return text.replace("\n", " ")


def conflict_text(name: str, exc: BaseException, waited: float | None) -> str:
    """'lock NAME is busy: held by pid 12 running job pid 34 (user root, backup.sh, since 02:00:01)'."""
    parts = [h.describe() for h in getattr(exc, "holders", None) or []]
    held = "; ".join(parts[:3]) + ("; and %d more" % (len(parts) - 3) if len(parts) > 3 else "")
    gave_up = "" if not waited else " (waited %s)" % format_span(waited)
    return "lock %s is busy%s%s" % (name, gave_up, ": held by " + held if held else "")


_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789@%+=:,./-_")
_C_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\\": "\\\\", "'": "\\'"}


def quote(arg: str) -> str:
    """Shell-quote one word (what shlex.quote does, without importing re), always on one line: a word with a
    control character (a newline) becomes $'...' with C escapes, as GNU ls shows such names, so a message
    or a status line stays one line and still pastes back into bash, zsh or ksh."""
    if arg and all(c in _SAFE for c in arg):
        return arg
    if any(ord(c) in _CONTROL for c in arg):
        return "$'" + "".join(_C_ESCAPES.get(c) or _CONTROL.get(ord(c), c) for c in arg) + "'"
    return "'" + arg.replace("'", "'\"'\"'") + "'"


def join_command(argv: list[str]) -> str:
    """A command line a person can paste back into a shell: shown by status and in cron reports."""
    return " ".join(quote(a) for a in argv)


def format_time(epoch: float | None) -> str:
    """Local wall-clock time for people; '-' when unknown."""
    if epoch is None:
        return "-"
    import time

    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))


def format_span(seconds: float) -> str:
    """A short duration for people: 850ms, 12s, 5m03s, 2h10m, 3d04h."""
    if seconds < 0:
        seconds = 0.0
    if seconds < 1:
        return "%dms" % round(seconds * 1000)
    if seconds < 60:
        return "%.3gs" % seconds
    s = int(seconds)
    if s < 3600:
        return "%dm%02ds" % (s // 60, s % 60)
    if s < 86400:
        return "%dh%02dm" % (s // 3600, s % 3600 // 60)
    return "%dd%02dh" % (s // 86400, s % 86400 // 3600)


def exit_code_arg(value: str, option: str) -> int:
    """Parse an exit code argument (0-255)."""
    try:
        code = int(value, 10)
    except ValueError:
        raise UsageError("%s: invalid exit code %r: use a number from 0 to 255" % (option, value)) from None
    if not 0 <= code <= 255:
        raise UsageError("%s: exit code %d is out of range: use 0 to 255" % (option, code))
    return code


def duration_arg(value: str, option: str) -> float:
    """Parse a duration argument with the engine's parser (seconds, fractions, units)."""
    from ._names import parse_duration

    try:
        return parse_duration(value)
    except ValueError as exc:
        raise UsageError("%s: %s" % (option, exc)) from None


def count_arg(value: str, option: str) -> int:
    """Parse a slot count: a whole number from 1 to the engine's MAX_SLOTS (a bad value is usage, exit 64)."""
    from ._kernel import MAX_SLOTS  # already imported by the package: a module lookup
    from ._names import parse_count

    try:
        return parse_count(value, "count", MAX_SLOTS)
    except ValueError as e:
        raise UsageError("%s: %s" % (option, e)) from None


# A getopt(3)-like parser: short options may be clustered (-nx) or take a glued value (-w5), long options
# take "--opt value" or "--opt=value", long options may be abbreviated to any unique prefix, and parsing
# stops at "--" or at the first word that is not an option (the command), which is passed on untouched.
#
# An option spec maps each spelling to (key, takes_value); the handler is called once per option met.


def getopt(args: list[str], start: int, spec: dict[str, tuple[str, bool]],
           handle: Callable[[str, str | None, str], None], command: str) -> tuple[int, bool]:
    """Parse options from args[start:]; return (index of the first operand, whether "--" ended them)."""
    i = start
    n = len(args)
    while i < n:
        arg = args[i]
        if arg == "--":
            return i + 1, True
        if arg.startswith("--"):
            name, eq, value = arg.partition("=")
            if name not in spec:
                matches = [k for k in spec if k.startswith(name) and k.startswith("--")]
                keys = {spec[k] for k in matches}
                if len(keys) != 1:
                    if matches:
                        raise UsageError("option %s is ambiguous (%s)" % (name, ", ".join(sorted(matches))), command)
                    raise UsageError("unknown option %s" % name, command)
                name = matches[0]
            key, takes = spec[name]
            if takes:
                if not eq:
                    i += 1
                    if i >= n:
                        raise UsageError("option %s needs a value" % name, command)
                    value = args[i]
                handle(key, value, name)
            else:
                if eq:
                    raise UsageError("option %s takes no value" % name, command)
                handle(key, None, name)
            i += 1
            continue
        if arg.startswith("-") and len(arg) > 1:
            j = 1
            while j < len(arg):
                opt = "-" + arg[j]
                if opt not in spec:
                    raise UsageError("unknown option %s" % opt, command)
                key, takes = spec[opt]
                if takes:
                    value = arg[j + 1:]
                    if not value:
                        i += 1
                        if i >= n:
                            raise UsageError("option %s needs a value" % opt, command)
                        value = args[i]
                    handle(key, value, opt)
                    break
                handle(key, None, opt)
                j += 1
            i += 1
            continue
        return i, False
    return i, False
