"""`hostlock cron`: the mode for crontab entries. Run the command unless another copy still runs, capture
its output, and stay silent unless it fails (then print the output and one status line, so cron mails
only what matters). The command line is in `cli.options`, the supervisor in `cli.supervise`.
"""

from __future__ import annotations

import _signal
import errno as _errno
import os
import time

from ..core.names import name_chars
from ..proc.forward import block, waker
from . import common as c
from .options import CRON_HELP, Options, job_of, lost_text, make_lock, parse, recorder, where
from .run import signalled_while_waiting, take, with_log
from .supervise import Signalled, supervise, trap_wait_signals, untrap

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from .runlog import RunLog


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
    program = name_chars(program)[:60]
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
    """The captured output to stdout; if stdout is closed or full, say so on stderr (the job's status
    stays the exit status: the job ran, and its failure is what cron must report)."""
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                return
            while chunk:
                chunk = chunk[os.write(1, chunk):]
    except OSError as exc:
        c.say("cannot copy the job's captured output to stdout: %s" % (exc.strerror or exc))


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
            if exc.errno == _errno.EPROTOTYPE and kind == _socket.SOCK_DGRAM:  # a stream-mode syslog daemon
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
    return with_log(o, "cron", lambda log: _cron(o, log))


def _cron(o: Options, log: RunLog | None) -> int:
    from .. import LockTimeout

    cmdline = c.join_command(o.command)
    trapped = trap_wait_signals() if o.fleet is not None else None
    mask = None  # see cli.run
    lock = None
    try:
        try:
            lock = make_lock(o, waker() if o.fleet is not None else None)  # see cli.run
            if o.verbose:
                c.say("cron job lock %s in %s" % (o.name, where(lock)))
            t0 = time.monotonic()
            take(o, lock, log)
            if trapped is not None:
                mask = block()  # see cli.run
        finally:
            untrap(trapped)
    except Signalled as sig:
        return signalled_while_waiting(lock, sig.signum)
    except LockTimeout as exc:
        text = c.conflict_text(o.name or "", exc, o.wait)
        if o.on_conflict != "quiet" or o.verbose:
            c.say("%s; not running %s" % (text, cmdline))
        if o.syslog:
            _syslog(o, False, "cron %s: skipped, %s" % (o.name, text))
        if log is not None:
            log.busy(lock, time.monotonic() - t0, text)
        if o.conflict_code is not None:
            return o.conflict_code
        return c.CONFLICT_DEFAULT if o.on_conflict == "fail" else 0
    except KeyboardInterrupt:
        return signalled_while_waiting(lock, _signal.SIGINT)
    except Exception as exc:
        code = c.error_exit_code(exc)
        if code == c.EX_USAGE:
            return c.usage_error(c.describe_error(exc), "cron")
        c.say("cannot lock %s: %s" % (o.name, c.describe_error(exc)))
        if o.syslog:
            _syslog(o, True, "cron %s: cannot lock: %s" % (o.name, c.describe_error(exc)))
        if log is not None:
            log.failed(lock, c.describe_error(exc))
        return code
    if log is not None:
        log.acquired(lock, time.monotonic() - t0)
    capture = -1
    lost = None  # the line saying the fleet lock was lost, if it was
    try:
        if o.fleet is not None and lock.lost:  # lost before the job could start: never start it unlocked
            text = lost_text(o, lock, None)
            c.say("cron %s: %s: %s" % (o.name, text, cmdline))
            if o.syslog:
                _syslog(o, True, "cron %s: %s" % (o.name, text))
            return c.EX_LOST
        try:
            capture = _capture_file()
        except OSError as exc:  # never lose output: run uncaptured and say why
            c.say("cannot capture the job's output (%s); it goes straight to cron" % (exc.strerror or exc))
        try:
            outcome = supervise(job_of(o, lock, capture if capture >= 0 else None), recorder(lock, o), mask=mask)
        except OSError as exc:
            c.say("cannot start %s: %s" % (cmdline, c.describe_error(exc)))
            if o.syslog:
                _syslog(o, True, "cron %s: cannot start: %s" % (o.name, c.describe_error(exc)))
            if log is not None:
                log.failed(lock, c.describe_error(exc))
            return c.errno_exit_code(exc.errno, c.EX_OSERR)
        if o.fleet is not None and (outcome.aborted or lock.lost):
            lost = lost_text(o, lock, outcome.describe())
    finally:
        try:
            lock.release()
        except Exception:
            pass
    code = c.EX_LOST if lost else outcome.exit_code()  # a lost lock fails the run, whatever the job's status
    if log is not None:
        log.ended(lock, outcome, code, lost)
    failed = code != 0
    summary = "cron %s: %s: %s" % (o.name, lost or outcome.describe(), cmdline)
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
