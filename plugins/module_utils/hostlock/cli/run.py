"""`hostlock run`: run a command while holding a lock, the lock and the job living and dying together.

The command line is in `cli.options`, the process supervisor in `cli.supervise` (its docstring has the
design); this module takes the lock, runs the job and turns what happened into the exit status.
"""

from __future__ import annotations

import _signal
import time

from ..core.model import FLEET_TTL
from ..proc.forward import block, waker
from ..proc.job import Started, start
from . import common as c
from .options import RUN_HELP, Options, fence_env, job_of, lost_text, make_lock, parse, recorder, where
from .supervise import Signalled, die_like, supervise, trap_wait_signals, untrap

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from typing import Callable

    from .options import RunLock
    from .runlog import RunLog


def _mode_text(o: Options) -> str:
    return "%d-slot semaphore" % o.slots if o.slots > 1 else o.mode


def main_run(args: list[str]) -> int:
    """hostlock run: exit with the job's status, or a code saying why it did not run."""
    try:
        o = parse(args, cron=False)
    except c.UsageError as exc:
        return c.usage_error(str(exc), "run")
    if o.help:
        c.write_out(RUN_HELP)
        return 0
    early: list[Started] = []  # the job's process, when forked before the lock is held (a fleet lock)
    try:
        return with_log(o, "run", lambda log: _run(o, early, log))
    finally:
        for job in early:
            job.cancel()  # the lock was not taken (or the job could not start): it never runs
        if o.fleet is not None:
            from ..fleet.grant import drop

            drop()  # a grant sent early that no lock took (an error came first): revoked


def with_log(o: Options, command: str, body: Callable[[RunLog | None], int]) -> int:
    """body(log): the run with its RunLog when it keeps metrics or history (cli/runlog.py, loaded only then), else
    None; a RunLog that cannot be opened (an untrusted metrics directory, no journal) ends the run first."""
    log = None
    if o.metrics_dir is not None or o.history:
        from .runlog import begin

        log, code = begin(o, command)
        if log is None:
            return code
    try:
        return body(log)
    finally:
        if log is not None:
            log.close()


def _run(o: Options, early: list[Started], log: RunLog | None) -> int:
    fleet = o.fleet is not None
    if fleet and o.fleet:
        # The lease's grant first: etcd commits it while the lock's modules load (the policy, the fleet engine,
        # the owner record's), instead of after (fleet/grant.py, send_early).
        from ..fleet.grant import send_early

        send_early(o.fleet, FLEET_TTL if o.ttl is None else o.ttl)
    from ..api import Lock
    from ..core.errors import LockTimeout

    trapped = trap_wait_signals() if fleet else None
    mask = None  # with a fleet lock: the signal mask from before the job's signals were blocked, as the wait ended
    lock = None
    try:
        try:
            # A fleet lock's keep-alive thread wakes the supervisor when the lock is lost: armed before the
            # lock (and so the thread) exists.
            lock = make_lock(o, waker() if fleet else None)
            if o.verbose:
                c.say("waiting for %s lock %s in %s" % (_mode_text(o), o.name, where(lock)))
            t0 = time.monotonic()
            if fleet and isinstance(lock, Lock):  # a fleet lock is never --path's PathLock
                # The record the key is queued with names the job's command; its pid comes later (on_start).
                lock.update_record(job_cmdline=c.join_command(o.command))
                lock.acquire(timeout=o.wait, meanwhile=_early_start(o, lock, early))
            else:
                take(o, lock, log)
            if trapped is not None:
                # Blocked before the wait's handlers go: a signal between the two waits for supervise() to
                # forward it to the job, where it would have ended hostlock with its key held for a whole TTL.
                mask = block()
        finally:
            untrap(trapped)  # from here on a signal is the job's (supervise forwards it)
    except Signalled as sig:
        return signalled_while_waiting(lock, sig.signum)
    except LockTimeout as exc:
        if not o.quiet:
            c.say(c.conflict_text(o.name or "", exc, o.wait))
        if log is not None:
            log.busy(lock, time.monotonic() - t0, c.conflict_text(o.name or "", exc, o.wait))
        return c.CONFLICT_DEFAULT if o.conflict_code is None else o.conflict_code
    except KeyboardInterrupt:
        return signalled_while_waiting(lock, _signal.SIGINT)
    except Exception as exc:
        if log is not None:
            log.failed(lock, c.describe_error(exc))
        return _lock_failed(o, exc)
    if log is not None:
        log.acquired(lock, time.monotonic() - t0)
    lost = None  # the line saying the fleet lock was lost, if it was
    try:
        if o.verbose:
            c.say("got %s lock %s (%s%s) after %s" % (
                _mode_text(o), o.name, lock.mechanism,
                ", fence %s" % lock.fence if fleet else "", c.format_span(time.monotonic() - t0)))
        if fleet and lock.lost:  # lost before the job could start: never start it unlocked
            c.say(lost_text(o, lock, None))
            return c.EX_LOST
        try:
            if early:
                outcome = supervise(early[0].job, recorder(lock, o, defer=True), started=early[0],
                                    env=fence_env(lock), mask=mask)
            else:
                outcome = supervise(job_of(o, lock), recorder(lock, o), mask=mask)
        except OSError as exc:
            c.say("cannot start the job: %s" % c.describe_error(exc))
            if log is not None:
                log.failed(lock, c.describe_error(exc))
            return c.errno_exit_code(exc.errno, c.EX_OSERR)
        if fleet and (outcome.aborted or lock.lost):
            lost = lost_text(o, lock, outcome.describe())
            c.say(lost)
        elif o.verbose:
            c.say("job %s" % outcome.describe())
    finally:
        try:
            lock.release()
        except Exception as exc:  # the lock dies with this process anyway; say it, do not mask the job's status
            if o.verbose:
                c.say("release: %s" % c.describe_error(exc))
    if log is not None:
        log.ended(lock, outcome, c.EX_LOST if lost else outcome.exit_code(), lost)
    if lost:
        return c.EX_LOST  # whatever the job's status: its work may have overlapped another holder's
    die_like(outcome)
    return outcome.exit_code()


def take(o: Options, lock: RunLock, log: RunLog | None = None) -> None:
    """Acquire `lock` as the options say (run's and cron's host locks). With --replace the running copy gets --wait
    (default: no time) to end on its own, then is ended (cli/replace.py, loaded only then). Raises LockTimeout
    when the lock stays busy."""
    from ..core.errors import LockTimeout

    try:
        lock.acquire(timeout=0.0 if o.replace and o.wait is None else o.wait)
    except LockTimeout as busy:
        if not o.replace:
            raise
        from .replace import replace

        ended = replace(o, lock, busy)
        if log is not None:
            log.replacing(lock, ended)


def _early_start(o: Options, lock: RunLock, early: list[Started]) -> Callable[[], None]:
    """What a fleet lock's acquire does once its requests (the lease's grant and the queue transaction) are on
    their way to etcd: fork the job's process (held at its gate) and watcher. If that fails, the job is started
    the usual way once the lock is held (and that failure is reported)."""

    def meanwhile() -> None:
        try:
            start(job_of(o, lock), early)
        except OSError as exc:
            if o.verbose:
                c.say("cannot fork the job yet (%s): trying again once the lock is held" % c.describe_error(exc))

    return meanwhile


def signalled_while_waiting(lock: RunLock | None, signum: int) -> int:
    """A waiter ended by signal `signum` (SIGINT: its KeyboardInterrupt): the wait has revoked its lease (its
    key is out of the queue); a lock taken in the instant the signal came is released. Exit 128+N."""
    if lock is not None and getattr(lock, "locked", False):
        # Leaving: a second signal (default action again) must not end us before the release. main() exits
        # with them still blocked, or gives a library caller its mask back.
        from ..core.signals import ENDING

        _signal.pthread_sigmask(_signal.SIG_BLOCK, ENDING)
        try:
            lock.release()
        except Exception:  # noqa: BLE001 - leaving anyway; the lease ends within its TTL
            pass
    return 128 + signum


def _lock_failed(o: Options, exc: BaseException) -> int:
    code = c.error_exit_code(exc)
    if code == c.EX_USAGE:
        return c.usage_error(c.describe_error(exc), "run")
    c.say("cannot lock %s: %s" % (o.name, c.describe_error(exc)))
    return code
