"""The `hostlock` command: a better flock(1), with status, leases and a cron mode (manual: docs/cli.md).

This module only dispatches: each subcommand lives in `cli.run` or `cli.cron` (run, cron: the hot path,
hand-parsed in `cli.options`, jobs supervised by `cli.supervise`), `cli.flock` (flock: flock(1)'s command
line, hand-parsed too) or
`cli.admin` (status, list, hold, renew, release, break, gc: argparse, imported only when used), `cli.history`.
"""

from __future__ import annotations

import _signal
import sys

from ..core import oslite as os
from . import common as c

HELP = """\
usage: hostlock COMMAND [options] ...

Host-wide locks for shell commands, cron jobs and Ansible: what flock(1) does, and what it gets wrong.

commands:
  run NAME [--] COMMAND...   run COMMAND holding lock NAME (the lock and the job live and die together)
  run NAME -c 'SHELL CMD'    the same with /bin/sh -c
  flock [options] FILE|DIR COMMAND... | FILE -c CMD | FD
                             util-linux flock(1)'s command line on the same kernel lock (a drop-in)
  cron [--name NAME] -- COMMAND...
                             for crontabs: skip if still running, silent unless the job fails
  status [NAME]              who holds what: holders, their jobs, waiters, stale state (--json)
  status --path FILE         who holds kernel locks (flock, POSIX, OFD) on any file, and their jobs
  status --format openmetrics
                             holders, waiters and hold ages per lock, for Prometheus
  history [NAME]             what happened to a lock, who and when (from the system journal; --json)
  list                       every lock in the directory (--json)
  hold NAME --lease D        take a lock that outlives this command; prints a token
  renew NAME TOKEN           extend a lease (--lease D)
  release NAME TOKEN         release a lease
  break NAME                 remove provably stale state (--force: end live holders too)
  gc [--older-than D]        remove lock files unused for D (default 7d) that nobody holds or waits for

'hostlock COMMAND --help' describes each command; docs/cli.md is the manual.
Lock directory: --dir DIR, else $HOSTLOCK_DIR, else /run/hostlock, else a per-user directory.
"""

_ADMIN = ("status", "list", "hold", "renew", "release", "break", "gc")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `hostlock` command; returns the exit status (see docs/cli.md)."""
    args = sys.argv[1:] if argv is None else list(argv)
    _reserve_standard_fds()
    # A command may block signals until it exits (hold --fleet, once its token is out): a library caller
    # gets its own mask back; the command itself exits with them still blocked (_fast_exit).
    mask = _signal.pthread_sigmask(_signal.SIG_BLOCK, ()) if argv is not None else None
    try:
        code = _dispatch(args)
    except KeyboardInterrupt:
        code = 130
    except BrokenPipeError:  # `hostlock list | head`: not an error worth a traceback
        code = 141
    except OSError as exc:  # e.g. our own output to a full disk (`hostlock status > /dev/full`)
        c.say("cannot write output: %s" % c.describe_error(exc), c.FLOCK_PROG if args[:1] == ["flock"] else c.PROG)
        code = c.errno_exit_code(exc.errno, c.EX_OSERR)
    if mask is None:
        _fast_exit(code)
    else:
        _signal.pthread_sigmask(_signal.SIG_SETMASK, mask)
    return code


def _reserve_standard_fds() -> None:
    """Hold /dev/null (close-on-exec) on any of fds 0-2 our caller closed (`hostlock run L cmd >&-`).

    Otherwise the next file we open lands there: a diagnostic meant for stderr would be written into the
    lock file. Close-on-exec, so the job still finds the stream closed, as its caller meant.
    """
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            try:
                got = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
            except OSError:
                return
            if got != fd:  # a lower fd was free after all: keep ours where it belongs
                os.dup2(got, fd, inheritable=False)
                os.close(got)


def _fast_exit(code: int) -> None:
    """Exit without the interpreter's teardown, which costs ~3 ms of a 20 ms `hostlock run NAME true`.

    Only when running as the command (main() without argv): library callers get a return value. Every
    lock is already released and every output flushed here; nothing registers atexit handlers.
    """
    try:
        for stream in (sys.stdout, sys.stderr):  # None when the stream was closed at start-up
            if stream is not None:
                stream.flush()
    except BrokenPipeError:
        code = code or 141
    except (OSError, ValueError):
        pass
    os._exit(code)


def _dispatch(args: list[str]) -> int:
    if not args:
        c.say("missing command: run, flock, cron, status, list, history, hold, renew, release, break or gc "
              "(see 'hostlock --help')")
        return c.EX_USAGE
    command, rest = args[0], args[1:]
    if command == "run":
        from .run import main_run

        return main_run(rest)
    if command == "flock":
        from .flock import main_flock

        return main_flock(rest)
    if command == "cron":
        from .cron import main_cron

        return main_cron(rest)
    if command == "history":
        from .history import main_history

        return main_history(rest)
    if command in _ADMIN:
        from .admin import main_admin

        return main_admin(command, rest)
    if command in ("-h", "--help", "help"):
        c.write_out(HELP)
        return 0
    if command in ("-V", "--version", "version"):
        from .. import __version__

        c.write_out("hostlock %s\n" % __version__)
        return 0
    if command.startswith("-"):
        return c.usage_error("unknown option %s: options follow the command, e.g. 'hostlock run -n NAME CMD'"
                             % command)
    return c.usage_error("unknown command %r: use run, flock, cron, status, list, history, hold, renew, release, "
                         "break or gc" % command)
