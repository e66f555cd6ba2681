"""Shared by the command line: exit codes, one-line messages, error-to-exit-code mapping, option parsing.

Kept free of argparse/re/json on purpose: `hostlock run` and `hostlock cron` are started once per job and
their whole budget is a few milliseconds above the bare interpreter.
"""

from __future__ import annotations

from ..core import oslite as os
from ..core.errors import (  # exit codes and their mapping: one home (core.errors), used as c.*
    EX_CANTCREAT,
    EX_CONFIG,
    EX_DATAERR,
    EX_FLEET,
    EX_LOST,
    EX_NOINPUT,
    EX_NOPERM,
    EX_OSERR,
    EX_TEMPFAIL,
    EX_TIMEOUT,
    EX_UNAVAILABLE,
    EX_USAGE,
    describe_error,
    errno_exit_code,
    error_exit_code,
)
from ..core.text import join_command, one_line, quote

# What the command line's modules use as c.*: this module's own helpers, and the exit codes, error mapping
# and quoting whose one home is core (re-exported here, not restated).
__all__ = [
    "EX_CANTCREAT",
    "EX_CONFIG",
    "EX_DATAERR",
    "EX_FLEET",
    "EX_LOST",
    "EX_NOINPUT",
    "EX_NOPERM",
    "EX_OSERR",
    "EX_TEMPFAIL",
    "EX_TIMEOUT",
    "EX_UNAVAILABLE",
    "EX_USAGE",
    "describe_error",
    "errno_exit_code",
    "error_exit_code",
    "join_command",
    "quote",
]

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover - typing only, never imported at run time
    from typing import Callable

PROG = "hostlock"
FLOCK_PROG = "hostlock flock"  # how every `hostlock flock` message starts (a `grep 'flock: '` still matches)

FLEET_ENV = "HOSTLOCK_FLEET"  # the default of --fleet; empty or unset: host locks

CONFLICT_DEFAULT = EX_TEMPFAIL


class UsageError(Exception):
    """A bad command line; printed as one line plus a pointer to --help, exit 64."""

    def __init__(self, message: str, command: str = "") -> None:
        super().__init__(message)
        self.command = command


def say(message: str, prog: str = PROG) -> None:
    """One diagnostic line on stderr, unbuffered: never mixed into the job's stdout, never lost on fork."""
    data = ("%s: %s\n" % (prog, one_line(message))).encode("utf-8", "backslashreplace")
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
        value = os.getenv(FLEET_ENV) or ""
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
        from ..fleet.url import mask

        fleet = mask(fleet)  # a password put in the URL by mistake is not repeated
        raise UsageError("%s %s for host locks, not a fleet lock (%s %s): drop %s, or give --fleet '' for a "
                         "host lock" % (" and ".join(present), "is" if len(present) == 1 else "are",
                                        fleet_source(given), fleet, "it" if len(present) == 1 else "them"),
                         command)


def conflict_text(name: str, exc: BaseException, waited: float | None) -> str:
    """'lock NAME is busy: held by pid 12 running job pid 34 (user root, backup.sh, since 02:00:01)'."""
    parts = [h.describe() for h in getattr(exc, "holders", None) or []]
    held = "; ".join(parts[:3]) + ("; and %d more" % (len(parts) - 3) if len(parts) > 3 else "")
    gave_up = "" if not waited else " (waited %s)" % format_span(waited)
    return "lock %s is busy%s%s" % (name, gave_up, ": held by " + held if held else "")


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


def decimal_arg(value: str) -> int | None:
    """An integer written in ASCII decimal digits with an optional sign, or None: what int() reads beyond
    that (other scripts' digits, `_` between digits, surrounding space) is no number on a command line."""
    digits = value[1:] if value[:1] in ("+", "-") else value
    if not digits or not digits.isascii() or not digits.isdigit():
        return None
    return int(value, 10)


def exit_code_arg(value: str, option: str) -> int:
    """Parse an exit code argument (0-255)."""
    code = decimal_arg(value)
    if code is None:
        raise UsageError("%s: invalid exit code %r: use a number from 0 to 255" % (option, value))
    if not 0 <= code <= 255:
        raise UsageError("%s: exit code %d is out of range: use 0 to 255" % (option, code))
    return code


def duration_arg(value: str, option: str) -> float:
    """Parse a duration argument with the engine's parser (seconds, fractions, units)."""
    from ..core.names import parse_duration

    try:
        return parse_duration(value)
    except ValueError as exc:
        raise UsageError("%s: %s" % (option, exc)) from None


def count_arg(value: str, option: str) -> int:
    """Parse a slot count: a whole number from 1 to the engine's MAX_SLOTS (a bad value is usage, exit 64)."""
    from ..core.names import MAX_SLOTS, parse_count

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
