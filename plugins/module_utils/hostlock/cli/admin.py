"""`hostlock status|list|hold|renew|release|break|gc`: the operator's and the scripts' view of the locks.

Not on the hot path, so argparse and json are fine here (imported only when these commands run).
The JSON shapes are a stable interface, versioned by their "schema" key and documented in docs/cli.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from .. import (
    STATUS_SCHEMA,
    Holder,
    LockStatus,
    LockTimeout,
    break_lock,
    default_directory,
    hold,
    list_locks,
    parse_duration,
    release,
    renew,
    status,
    token_id,
)
from ..core.model import MECHANISM_CHOICES
from . import common as c

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from typing import Any, NoReturn

PATH_SCHEMA = "hostlock.path-status/1"
LEASE_SCHEMA = "hostlock.lease/1"
BREAK_SCHEMA = "hostlock.break/1"
GC_SCHEMA = "hostlock.gc/1"

_EPILOG = ("exit status: 0 ok; 64 usage; 65 lock error; 66 cannot open the lock directory or file; "
           "71 OS error; 73 read-only or full file system; 75 (or -E CODE) lock busy; 76 the fleet (etcd) "
           "unavailable; 77 wrong or expired token, or another user's lock")


class _Parser(argparse.ArgumentParser):
    """argparse with hostlock's conventions: a one-line error on stderr and exit 64 (EX_USAGE), not 2."""

    def error(self, message: str) -> NoReturn:
        c.say("%s: %s (see '%s --help')" % (self.prog.split(" ", 1)[-1], message, self.prog))
        raise SystemExit(c.EX_USAGE)

    def _print_message(self, message: str, file: Any = None) -> None:
        # argparse drops a failed write (a full or broken stdout) and exits 0: --help said nothing, silently.
        # Written as all of hostlock's own output is, a failure is one line and exit 73 (cli.main).
        if message:
            c.write_out(message, 1 if file is None or file is sys.stdout else 2)


def _parser(command: str, description: str) -> _Parser:
    return _Parser(prog="hostlock " + command, description=description, epilog=_EPILOG,
                   formatter_class=argparse.RawDescriptionHelpFormatter)


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _lease(text: str) -> float:
    """A lease's length: a duration > 0 (a lease of 0 would end before it began)."""
    try:
        return parse_duration(text, "lease", positive=True)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _age(text: str) -> float:
    """An age, not a wait: may exceed the longest wait (MAX_DURATION), up to ten years."""
    try:
        return parse_duration(text, "age", limit=3650 * 86400.0)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _exit_code(text: str) -> int:
    try:
        return c.exit_code_arg(text, "-E")
    except c.UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _slots(text: str) -> int:
    try:
        return c.count_arg(text, "--slots")
    except c.UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument("-d", "--dir", metavar="DIR", help="lock directory (default: $HOSTLOCK_DIR, "
                   "/run/hostlock, or a per-user directory)")


def _add_fleet(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fleet", metavar="URL", help="fleet locks on etcd: etcd://HOST:PORT[,HOST:PORT...][/PREFIX] "
                   "(default: $HOSTLOCK_FLEET; '' = host locks; docs/fleet.md)")


def _add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output (schema in docs/cli.md)")


def _build(command: str) -> argparse.ArgumentParser:
    if command in ("status", "list"):
        p = _parser(command, "Show holders (with the job each runs), waiters and stale state of %s."
                    % ("lock NAME, or of every lock" if command == "status" else "every lock in the directory"))
        if command == "status":
            p.add_argument("name", nargs="?", metavar="NAME", help="the lock (default: every lock)")
            p.add_argument("--path", metavar="FILE", help="instead of a named lock: who holds kernel locks "
                           "(flock(2), POSIX, OFD) on FILE, e.g. one flock(1) locks, and the job each runs")
        _add_dir(p)
        _add_fleet(p)
        _add_json(p)
        p.add_argument("--format", choices=("text", "json", "openmetrics"), help="text (default), json (= --json), "
                       "or openmetrics: holders, waiters and hold ages per lock, for Prometheus (docs/cli.md)")
        p.add_argument("-w", "--wide", action="store_true", help="do not shorten command lines")
    elif command == "hold":
        p = _parser(command, "Take lock NAME for a lease that outlives this command: a detached holder process "
                    "keeps it until 'hostlock release', the lease's end, or its death. Prints the token "
                    "that renew and release need.")
        p.add_argument("name", metavar="NAME")
        p.add_argument("--lease", type=_lease, required=True, metavar="DURATION",
                       help="how long the lease lasts unless renewed (e.g. 90, 30s, 10m, 1h30m)")
        g = p.add_mutually_exclusive_group()
        g.add_argument("-x", "-e", "--exclusive", dest="mode", action="store_const", const="exclusive",
                       default="exclusive", help="exclusive lock (default)")
        g.add_argument("-s", "--shared", dest="mode", action="store_const", const="shared", help="shared lock")
        p.add_argument("--slots", type=_slots, default=1, metavar="N", help="N-slot semaphore")
        w = p.add_mutually_exclusive_group()
        w.add_argument("-n", "--nb", "--nonblock", dest="wait", action="store_const", const=0.0,
                       help="do not wait if the lock is busy")
        w.add_argument("-w", "--wait", dest="wait", type=_duration, metavar="DURATION",
                       help="wait at most DURATION (default: wait as long as it takes)")
        p.add_argument("-E", "--conflict-exit-code", type=_exit_code, default=c.CONFLICT_DEFAULT, metavar="CODE",
                       help="exit code when the lock is busy (default %(default)s)")
        p.add_argument("--mechanism", choices=MECHANISM_CHOICES, default="auto")
        p.add_argument("--label", metavar="TEXT", help="free text shown by 'hostlock status'")
        _add_dir(p)
        _add_fleet(p)
        _add_json(p)
    elif command in ("renew", "release"):
        what = "Extend the lease on" if command == "renew" else "Release the lease on"
        p = _parser(command, "%s lock NAME. TOKEN is what 'hostlock hold' printed; '-' reads it from "
                    "stdin (keeps it out of ps)." % what)
        p.add_argument("name", metavar="NAME")
        p.add_argument("token", metavar="TOKEN")
        if command == "renew":
            p.add_argument("--lease", type=_lease, metavar="DURATION",
                           help="new length from now (default: the lease's original length)")
        _add_dir(p)
        _add_fleet(p)
        _add_json(p)
    elif command == "gc":
        p = _parser(command, "Remove the files of locks nobody holds or waits for and nobody has used for "
                    "--older-than (default 7d), so 'list' shows what is in use. A name that is removed comes "
                    "back on its next use. Never removes a held, waited-for, or recently used lock.")
        p.add_argument("--older-than", type=_age, default=7 * 86400.0, metavar="DURATION",
                       help="unused for at least this long (default 7d)")
        p.add_argument("-n", "--dry-run", action="store_true", help="only say what would be removed")
        _add_dir(p)
        p.add_argument("--fleet", metavar="URL", help=argparse.SUPPRESS)  # refused with a reason, not unknown
        _add_json(p)
    else:  # break
        p = _parser(command, "Remove provably stale state of lock NAME (dead holders, ended leases) and say "
                    "what was removed. --force also ends live holders: your own, or anyone's as root.")
        p.add_argument("name", metavar="NAME")
        p.add_argument("--force", action="store_true", help="also end live holders (leases, processes); "
                       "with --fleet: revoke the holders' etcd leases")
        _add_dir(p)
        _add_fleet(p)
        _add_json(p)
    return p


def main_admin(command: str, args: list[str]) -> int:
    """Run one admin subcommand; engine errors become one line and their documented exit code."""
    try:
        ns = _build(command).parse_args(args)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else c.EX_USAGE
    try:
        if ns.dir is not None and not ns.dir:
            raise c.UsageError("-d needs a directory (an empty one is no directory: unset, it would be "
                               "$HOSTLOCK_DIR or /run/hostlock)")
        _check_fleet(command, ns)
        return _COMMANDS[command](ns)
    except BrokenPipeError:
        raise  # `hostlock list | head`: cli.main ends quietly (141), as for any of hostlock's own output
    except c.UsageError as exc:
        return c.usage_error(str(exc), command)
    except LockTimeout as exc:
        c.say(c.conflict_text(ns.name, exc, getattr(ns, "wait", None)))
        return ns.conflict_exit_code
    except Exception as exc:
        code = c.error_exit_code(exc)
        if code == c.EX_USAGE:
            return c.usage_error(c.describe_error(exc), command)
        name = getattr(ns, "name", None)
        c.say("%s%s: %s" % (command, " %s" % name if name else "", c.describe_error(exc)))
        return code


def _check_fleet(command: str, ns: argparse.Namespace) -> None:
    """Settle host or fleet (ns.fleet_url), refusing options of the other kind before any I/O (64).

    gc and status --path work on this host's files alone: they refuse a fleet given with --fleet, and
    ignore $HOSTLOCK_FLEET (nothing of theirs is in etcd; a fleet key ends with its lease).
    """
    given = getattr(ns, "fleet", None)
    if command == "gc" or getattr(ns, "path", None) is not None:
        ns.fleet_url = None
        if given:
            raise c.UsageError("--fleet does not apply: %s" % (
                "gc removes a lock directory's unused files (an etcd key ends with its lease)" if command == "gc"
                else "--path shows the kernel locks on a file of this host"))
        return
    ns.fleet_url = c.fleet_arg(given)
    if ns.fleet_url is not None:
        c.refuse_host_options({"--dir": getattr(ns, "dir", None) is not None,
                               "--mechanism": getattr(ns, "mechanism", "auto") != "auto"}, given, ns.fleet_url)


# ------------------------------------------------------------------------------------------ status/list


def _state(st: LockStatus) -> str:
    return st.state


def lock_json(st: LockStatus) -> dict[str, Any]:
    """One lock in the documented JSON shape: the engine's one serializer."""
    return st.to_json()


def _json_text(obj: object) -> str:
    import json

    return json.dumps(obj, indent=2, sort_keys=False) + "\n"


def _print_json(obj: object) -> None:
    c.write_out(_json_text(obj))


def _lease_text(expires: float | None, now: float) -> str:
    if expires is None:
        return "-"
    if expires <= now:
        return "ended %s ago" % c.format_span(now - expires)
    return "%s (in %s)" % (time.strftime("%H:%M:%S", time.localtime(expires)), c.format_span(expires - now))


def _shorten(text: str, width: int, wide: bool) -> str:
    return text if wide or len(text) <= width else text[:width - 3] + "..."


def table(statuses: list[LockStatus], wide: bool, fleet: bool = False) -> str:
    """The people's view: one row per holder (a free lock gets one row), columns sized to fit.

    Fleet locks add HOST (a pid means nothing without it) and FENCE (the holder's fencing token).
    """
    now = time.time()
    rows = [["LOCK", "STATE", "MODE", "PID", "USER", "SINCE", "LEASE", "WAIT", "JOB"]]
    if fleet:
        rows[0][3:3] = ["HOST"]
        rows[0][-2:-2] = ["FENCE"]
    for st in statuses:
        state = _state(st)
        if not st.holders:
            rows.append([st.name, state, "-", "-", "-", "-", "-", str(st.waiters), "-"])
            if fleet:
                rows[-1][3:3] = ["-"]
                rows[-1][-2:-2] = ["-"]
            continue
        for i, h in enumerate(st.holders):
            mode = h.mode or "?"
            if h.slot is not None:
                mode = "slot %d/%d" % (h.slot + 1, st.slots)
            if h.job_pid:
                job = "%d %s" % (h.job_pid, h.job_cmdline or "?")
            elif h.job_cmdline:  # a fleet holder's job in its first 0.1 s (its pid is written then)
                job = h.job_cmdline
            elif h.label:
                job = "[%s]" % h.label
            else:
                job = h.cmdline or "?"
            if h.label and (h.job_pid or h.job_cmdline):
                job += " [%s]" % h.label
            since = "-"
            if h.acquired_at:
                since = "%s (%s)" % (time.strftime("%H:%M:%S", time.localtime(h.acquired_at)),
                                     c.format_span(now - h.acquired_at))
            rows.append([
                st.name if i == 0 else "",
                ("forged" if h.forged else "stale" if h.stale else state) if i == 0 or h.stale or h.forged else "",
                mode,
                str(h.pid) if h.pid is not None else "?",
                h.user or (str(h.uid) if h.uid is not None else "?"),
                since,
                _lease_text(h.lease_expires, now),
                str(st.waiters) if i == 0 else "",
                _shorten(job, 60, wide),
            ])
            if fleet:
                fence = getattr(h, "fence", None)
                rows[-1][3:3] = [h.hostname or "?"]
                rows[-1][-2:-2] = [str(fence) if fence is not None else "-"]
    rows = [[c.one_line(cell) for cell in r] for r in rows]  # a label or command line with a newline: one row
    widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
    lines = []
    for r in rows:
        lines.append("  ".join(r[k].ljust(widths[k]) for k in range(len(r) - 1)) + "  " + r[-1])
    return "\n".join(line.rstrip() for line in lines) + "\n"


def _directory(ns: argparse.Namespace) -> str:
    return ns.dir if ns.dir else default_directory()


def _missing_dir(ns: argparse.Namespace, directory: str) -> int:
    """66 and one line for an explicit --dir that is not a directory: a typo, not "no locks" (status, list,
    gc, break); 0 otherwise. The default directory may not exist yet: nobody has locked anything."""
    if not ns.dir or os.path.isdir(directory):
        return 0
    what = "is not a directory" if os.path.exists(directory) else "does not exist"
    c.say("lock directory %s %s" % (directory, what))
    return c.EX_NOINPUT


def _where(ns: argparse.Namespace) -> dict[str, Any]:
    """The engine's keyword for where the lock lives: fleet=URL, or directory=DIR."""
    return {"fleet": ns.fleet_url} if ns.fleet_url else {"directory": _directory(ns)}


def _where_json(ns: argparse.Namespace) -> dict[str, Any]:
    """The JSON documents' "directory" (null for a fleet) and, for a fleet, "fleet": the URL."""
    if ns.fleet_url:
        return {"directory": None, "fleet": ns.fleet_url}
    return {"directory": _directory(ns)}


def _format(ns: argparse.Namespace) -> str:
    """--format, with --json its synonym (both given must agree)."""
    if ns.json and ns.format not in (None, "json"):
        raise c.UsageError("--json and --format %s cannot be used together" % ns.format)
    return "json" if ns.json else ns.format or "text"


def _openmetrics(statuses: list[LockStatus]) -> int:
    """status --format openmetrics: one sample per lock in each family (core/metrics.py, as lock_info's figures)."""
    from ..core.metrics import lock_families, render

    c.write_out(render(lock_families(statuses), openmetrics=True))
    return 0


def cmd_status(ns: argparse.Namespace) -> int:
    """status [NAME] / list: the table, or {"schema", "directory", "locks": [...]}, or OpenMetrics."""
    name = getattr(ns, "name", None)
    ns.json = _format(ns) == "json"
    if getattr(ns, "path", None) is not None:
        if name:
            raise c.UsageError("give a lock NAME or --path FILE, not both")
        if ns.format == "openmetrics":
            raise c.UsageError("--format openmetrics shows named locks: not --path (use --json)")
        return cmd_status_path(ns)
    if ns.fleet_url:
        return cmd_status_fleet(ns)
    directory = _directory(ns)
    exists = os.path.isdir(directory)
    missing = _missing_dir(ns, directory)
    if missing:
        return missing
    if name:
        statuses = [status(name, directory=directory)]
    else:
        statuses = sorted(list_locks(directory=directory), key=lambda s: s.name)
    if ns.format == "openmetrics":
        return _openmetrics(statuses)
    if ns.json:
        _print_json({"schema": STATUS_SCHEMA, "directory": directory, "locks": [lock_json(s) for s in statuses]})
        return 0
    out = "directory: %s%s\n" % (directory, "" if exists else " (does not exist yet)")
    if statuses:
        out += table(statuses, ns.wide)
    else:
        out += "no locks\n"
    stale = [s.name for s in statuses if _state(s) == "stale" or any(h.stale for h in s.holders)]
    if stale:
        out += "stale: %s (remove with 'hostlock break NAME')\n" % ", ".join(stale)
    for s in statuses:
        for what in [s.problem] + [h.problem for h in s.holders if h.problem and h.problem != s.problem]:
            if what:
                out += "%s: %s: %s\n" % ("refused" if s.state == "refused" else "warning", s.name, what)
    c.write_out(out)
    return 0


def cmd_status_fleet(ns: argparse.Namespace) -> int:
    """status [NAME] / list with a fleet: the same table with HOST and FENCE, or the same JSON shape."""
    name = getattr(ns, "name", None)
    if name:
        statuses = [status(name, fleet=ns.fleet_url)]
    else:
        statuses = sorted(list_locks(fleet=ns.fleet_url), key=lambda s: s.name)
    if ns.format == "openmetrics":
        return _openmetrics(statuses)
    if ns.json:
        _print_json({"schema": STATUS_SCHEMA, **_where_json(ns), "locks": [lock_json(s) for s in statuses]})
        return 0
    prefix = statuses[0].path.rsplit("/", 2)[0] + "/" if statuses else ns.fleet_url
    out = "fleet: %s\n" % prefix
    out += table(statuses, ns.wide, fleet=True) if statuses else "no locks\n"
    for s in statuses:
        if s.problem:
            out += "warning: %s: %s\n" % (s.name, s.problem)
    c.write_out(out)
    return 0


def cmd_status_path(ns: argparse.Namespace) -> int:
    """status --path FILE: the kernel locks on FILE's inode, their holders and jobs (from /proc)."""
    from ..host import proclocks as _proclocks
    from ..host import safepath as _safepath

    path = ns.path
    try:
        # The inode `flock`/`run --path` would lock: symlinks followed by the same rules (host.safepath).
        st = _safepath.stat_path(path)
    except _safepath.UnsafePath as exc:
        c.say("cannot stat %s: %s" % (c.one_line(path), exc))
        return c.EX_NOINPUT
    except OSError as exc:
        c.say("cannot stat %s: %s" % (path, exc.strerror))
        return c.errno_exit_code(exc.errno, c.EX_NOINPUT)
    try:
        locks = _proclocks.locks_on(st.st_dev, st.st_ino)
    except OSError as exc:
        c.say("cannot read /proc/locks: %s" % exc.strerror)
        return c.EX_OSERR
    if ns.json:
        _print_json({"schema": PATH_SCHEMA, "path": path,
                     "device": "%02x:%02x" % (os.major(st.st_dev), os.minor(st.st_dev)), "inode": st.st_ino,
                     "locks": [lk.as_json() for lk in locks]})
        return 0
    out = "%s (device %02x:%02x, inode %d)\n" % (path, os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    if not locks:
        out += "no kernel locks\n"
    for lk in locks:
        out += "  %s\n" % _shorten(c.one_line(_proclocks.describe(lk)), 200, ns.wide)
    c.write_out(out)
    return 0


# ------------------------------------------------------------------------------------------ leases


def _token(ns: argparse.Namespace) -> str:
    token = ns.token
    if token == "-":
        token = sys.stdin.readline().strip() if sys.stdin is not None else ""  # None: stdin closed (<&-)
        if not token:
            raise c.UsageError("no token on stdin")
    return token


def _lease_of(name: str, where: dict[str, Any], token_hint: str | None = None) -> float | None:
    """Expiry of our lease, read back from status (hold() returns only the token)."""
    try:
        st = status(name, **where)
    except Exception:
        return None
    mine = [h for h in st.holders if h.lease_expires is not None and h.uid == os.getuid()]
    if token_hint:
        try:
            tid = token_id(token_hint)  # a fleet token's public id is not a substring of it
        except Exception:
            tid = None
        exact = [h for h in mine if h.token_id and (h.token_id == tid or h.token_id in token_hint)]
        mine = exact or mine
    return max((h.lease_expires for h in mine if h.lease_expires is not None), default=None)


def cmd_hold(ns: argparse.Namespace) -> int:
    """hold: print the token on stdout (alone, so TOKEN=$(hostlock hold ...) works), or JSON.

    With a fleet the lease is one etcd lease with TTL = --lease: no holder process is left behind.
    """
    where = _where(ns)
    if ns.fleet_url:
        return _hold_fleet(ns, where)
    if ns.slots > 1 and ns.mode == "shared":
        raise c.UsageError("--slots and --shared cannot be used together: a semaphore's slots are exclusive")
    token = hold(ns.name, lease=ns.lease, mode=ns.mode, slots=ns.slots, timeout=ns.wait, label=ns.label,
                 mechanism=ns.mechanism, **where)
    try:
        c.write_out(_hold_output(ns, where, token))
    except BaseException:
        # Nobody got the token (a full or broken stdout, a signal): nobody could release the lease or renew
        # it, so give it back now. A non-zero exit never leaves a lease held.
        try:
            release(ns.name, token, **where)
        except Exception:  # noqa: BLE001 - gone already; the write's error is what to report
            pass
        raise
    return 0


def _hold_output(ns: argparse.Namespace, where: dict[str, Any], token: str) -> str:
    if ns.json:
        return _json_text({"schema": LEASE_SCHEMA, "name": ns.name, **_where_json(ns), "token": token,
                           "lease": ns.lease, "lease_expires": _lease_of(ns.name, where, token)})
    return token + "\n"


def _hold_fleet(ns: argparse.Namespace, where: dict[str, Any]) -> int:
    """hold --fleet: a waiter's key sits in etcd's queue, so every way this command ends before its token is
    out (any signal that ends a process, core.signals: SIGINT, SIGTERM, SIGUSR1, SIGALRM...; timeout(1); -w
    running out) takes that key, or the lease it got, with it: exit 128+N, nothing held, and the next waiter is
    served at the next handoff, not a TTL later.
    Once the token is written the hold is done: a signal after that no longer undoes it (it is blocked)."""
    import _signal

    from ..core.signals import ENDING as stops
    from .supervise import Signalled, trap_wait_signals, untrap

    trapped = trap_wait_signals()  # each raises Signalled (SIGINT: KeyboardInterrupt) and unwinds
    token = None
    try:
        try:
            token = hold(ns.name, lease=ns.lease, mode=ns.mode, slots=ns.slots, timeout=ns.wait, label=ns.label,
                         **where)
            out = _hold_output(ns, where, token)
            # Commit point: from here a signal stays pending until exit (never a token printed for a lease
            # that is then released); one that came before is taken here and undoes the hold.
            _signal.pthread_sigmask(_signal.SIG_BLOCK, stops)
            pending = _signal.sigpending() & stops
            if not pending:
                c.write_out(out)
                return 0
            signum = min(pending)
        except Signalled as sig:
            signum = sig.signum
        except KeyboardInterrupt:
            signum = _signal.SIGINT
        _signal.pthread_sigmask(_signal.SIG_BLOCK, stops)  # the release below is not interrupted in turn
        if token is not None:
            try:
                release(ns.name, token, **where)
            except Exception:  # noqa: BLE001 - leaving anyway: the lease ends by itself (--lease)
                pass
        return 128 + signum
    finally:
        untrap(trapped)  # only handlers: the signals stay blocked until exit, so none lands in between


def cmd_renew(ns: argparse.Namespace) -> int:
    """renew: print the new expiry."""
    expires = renew(ns.name, _token(ns), lease=ns.lease, **_where(ns))
    if ns.json:
        _print_json({"schema": LEASE_SCHEMA, "name": ns.name, **_where_json(ns), "lease_expires": expires})
    else:
        c.write_out("lease on %s renewed until %s\n" % (ns.name, c.format_time(expires)))
    return 0


def cmd_release(ns: argparse.Namespace) -> int:
    """release: silent on success, like rm."""
    release(ns.name, _token(ns), **_where(ns))
    if ns.json:
        _print_json({"schema": LEASE_SCHEMA, "name": ns.name, **_where_json(ns), "released": True})
    return 0


# ------------------------------------------------------------------------------------------ break


def cmd_break(ns: argparse.Namespace) -> int:
    """break: say what was removed or ended and exactly what the kernel still holds (exit 75 if anything)."""
    if ns.fleet_url:
        return cmd_break_fleet(ns)
    directory = _directory(ns)
    missing = _missing_dir(ns, directory)
    if missing:
        return missing
    removed = break_lock(ns.name, directory=directory, force=ns.force)  # waits for ended holders to exit
    _journal_broken(ns.name, directory, removed)
    st = status(ns.name, directory=directory)
    remaining = st.holders  # stale ones too: until they are gone the lock is not free
    left = {h.pid for h in remaining}
    if ns.json:
        _print_json({"schema": BREAK_SCHEMA, "name": ns.name, "directory": directory,
                     "removed": [h.to_json() for h in removed if h.pid not in left],
                     "remaining": [h.to_json() for h in remaining], "problem": st.problem})
    else:
        out = []
        for h in removed:
            if h.pid in left:
                out.append("signalled %s, but it still holds the lock" % h.describe())
            elif h.alive is False:
                out.append("removed stale holder %s (proven dead)" % h.describe())
            elif h.verified is False and h.record_ok:
                out.append("removed a record naming %s, which does not have its file open: planted or forged, "
                           "nobody's lock; nothing was signalled" % h.describe())
            else:
                out.append("ended %s holder %s" % ("expired" if h.lease_expired else "live", h.describe()))
        if not removed:
            out.append("nothing to remove from %s" % ns.name)
        signalled = {h.pid for h in removed}
        for h in remaining:
            if h.forged or h.problem:
                # The file the record was read from (a planted NAME~r~... is not NAME~owner, which may be the
                # live holder's own: removing that would let a second holder in).
                why = "%s; remove %s after checking who made it" % (h.problem, h.path or st.path)
            elif h.pid in signalled:
                why = "it did not exit after SIGTERM"
            elif h.verified is not True and (h.lease_expired or ns.force):
                why = "not proven to hold the lock (%s), so not signalled" % (
                    "it does not have the lock file open, or its uid differs" if h.verified is False else
                    "its process cannot be examined from here")
            else:
                why = "use --force to end it"
            out.append("still held by %s (%s)" % (h.describe(), why))
        if st.problem and not remaining:
            out.append("refused: %s%s" % (st.problem, "" if ns.force or not st.corrupt else " (add --force)"))
        c.write_out("".join(c.one_line(line) + "\n" for line in out))
    if remaining:
        return c.EX_TEMPFAIL
    if st.problem:  # the same codes `run` gives for this path: a corrupt file, or something planted there
        return c.EX_DATAERR if st.corrupt else c.EX_NOINPUT
    return 0


def _journal_broken(name: str, where: str, removed: list[Holder]) -> None:
    """A `broken` event in the journal for each holder break removed or ended (cli/journal.py), when this host
    has a journal: break is rare and never on a lock's path, so it records without being asked."""
    if not removed:
        return
    from .journal import JournalUnavailable, check, send

    try:
        check()
    except JournalUnavailable:
        return  # no journal here: nothing to record in
    for h in removed:
        try:
            send("broken", name, "lock %s broken: %s" % (name, h.describe(fleet=h.fence is not None)), directory=where,
                 holder_pid=h.pid, holder_job_pid=h.job_pid, result="dead" if h.alive is False else "ended")
        except JournalUnavailable as exc:
            c.say(str(exc))
            return


def cmd_break_fleet(ns: argparse.Namespace) -> int:
    """break --fleet: nothing in etcd is ever stale (a dead holder's key ends with its lease), so only
    --force acts: it revokes the holders' leases, which frees the lock at once; each holder's hostlock
    learns it from its keep-alive and stops its job (exit 79). Then says who holds the lock now: a
    waiter may already have taken it (exit 75, as for any remaining holder)."""
    removed = break_lock(ns.name, fleet=ns.fleet_url, force=ns.force)
    from ..fleet.url import mask

    _journal_broken(ns.name, mask(ns.fleet_url), removed)
    st = status(ns.name, fleet=ns.fleet_url)
    remaining = st.holders

    def ident(h: Holder) -> object:
        return getattr(h, "fence", None) or (h.hostname, h.pid)  # a fence names one key, on any host

    left = {ident(h) for h in remaining}
    if ns.json:
        _print_json({"schema": BREAK_SCHEMA, "name": ns.name, **_where_json(ns),
                     "removed": [h.to_json() for h in removed if ident(h) not in left],
                     "remaining": [h.to_json() for h in remaining], "problem": st.problem})
    else:
        out = ["revoked the etcd lease of %s" % h.describe(fleet=True) for h in removed]
        if not removed:
            out.append("nothing to remove from %s%s" % (ns.name, "" if ns.force else
                                                        " (nothing in etcd is stale: a dead holder's key ends "
                                                        "with its lease)"))
        revoked = {ident(h) for h in removed}
        for h in remaining:
            why = "its lease is still there after the revoke" if ident(h) in revoked else (
                "a new holder" if ns.force else "use --force to revoke its lease")
            out.append("still held by %s (%s)" % (h.describe(fleet=True), why))
        c.write_out("".join(c.one_line(line) + "\n" for line in out))
    return c.EX_TEMPFAIL if remaining else 0


def cmd_gc(ns: argparse.Namespace) -> int:
    """gc: one line per removed (or, --dry-run, removable) name; --json lists every file and why."""
    from ..host.gc import collect

    directory = _directory(ns)
    missing = _missing_dir(ns, directory)
    if missing:
        return missing
    entries = collect(directory, ns.older_than, ns.dry_run)
    if ns.json:
        _print_json({"schema": GC_SCHEMA, "directory": directory, "older_than": ns.older_than,
                     "dry_run": ns.dry_run, "locks": entries})
        return 0
    pruned = [e for e in entries if e["action"] != "kept"]
    out = "".join("%s %s (unused for %s)\n" % (e["action"], e["name"], c.format_span(e["idle"])) for e in pruned)
    out += "%s: %d of %d lock file(s) %s\n" % (
        directory, len(pruned), len(entries), "removable" if ns.dry_run else "removed")
    c.write_out(out)
    return 0


_COMMANDS = {
    "status": cmd_status,
    "list": cmd_status,
    "hold": cmd_hold,
    "renew": cmd_renew,
    "release": cmd_release,
    "break": cmd_break,
    "gc": cmd_gc,
}
