"""The loop of `hostlock run`, `cron` and `flock`: run a job under the lock, forward signals to it, enforce its time
limit, stop it when its fleet lock is lost, reap it, and say how it ended.

The mechanisms are proc/'s (a job never outlives its lock): the job's process and its gate (proc.job), the
watcher that keeps the lock if hostlock dies mid-job (proc.watcher), signals collected with sigtimedwait() and
passed on (proc.forward), the kill of a job's whole tree (proc.jobkill). Here is the policy that ties them to
the command's options (see docs/cli.md and docs/security.md for what flock(1) gets wrong):
- hostlock stays the parent and holds the lock; the job is forked and exec'd, its watcher forked before it.
- Signals are blocked and collected with sigtimedwait(), never handled asynchronously: core.signals.FORWARDED
  (every signal that would end hostlock) is forwarded to the job, except keyboard signals the job got from the
  terminal itself; SIGCHLD ends the wait, the time limit is the wait's own deadline. No threads, no handlers.
- A fleet lock (etcd) has no descriptor to keep: its etcd lease outlives a dead hostlock by at most the
  TTL, and the watcher kills the job at once, so the job is dead long before the lease can expire. When
  the lock is lost while hostlock lives (the engine's keep-alive thread knows first), the job is stopped
  like a timed-out one (SIGTERM, SIGKILL after kill_after): the thread sets the lock's flag and wakes
  this loop with proc.forward.WAKE, sent to this thread alone (`waker`), which then reads `job.abort()`. A
  hostlock that is alive but stopped can do neither, so the watcher also gets the lease's deadline ("v
  DEADLINE GRACE" lines, as renewals move it) and kills the job when it passes while hostlock is stopped.
- Only cheap modules on this path (`_signal`, not `signal`, which imports enum; `_ctypes`, not `ctypes`;
  no subprocess, argparse, re or json). The watcher's killing code (proc.jobkill) is imported only by a
  watcher whose hostlock died, or once a stopped job's first process is gone.
"""
from __future__ import annotations

import _signal
import sys
import time

from ..core import oslite as os
from ..core.signals import ENDING
from ..core.signals import name as _signame
from ..proc import forward
from ..proc.deathsig import prctl_function
from ..proc.job import Job, Started, fork_job, gate_message
from ..proc.watcher import boottime
from . import common as c

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from typing import Callable, Mapping


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


def supervise(job: Job, on_start: Callable[[int], None] | None = None, started: Started | None = None,
              env: Mapping[str, str] | None = None, mask: set[int] | None = None) -> Outcome:
    """Fork and exec the job (or let the process start() forked exec), forward signals, enforce its time
    limit, reap it.

    `on_start(pid)` runs once the job is forked (e.g. to record its pid in the owner record). `env` is added
    to the job's environment as its process execs (what was not known when start() forked it: a fleet
    lock's fence). `mask`: proc.forward.block()'s answer, when the caller blocked them already. The caller
    holds the lock throughout.
    """
    old_mask = forward.block()
    if mask is not None:
        old_mask = mask  # the mask to give back (and the job's), from before the caller blocked them
    if started is None:
        try:
            started = fork_job(job, old_mask, prctl_function())
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
        return time.monotonic() + min(1.0, max(0.05, (until - boottime()) / 4))

    beat = tell() if valid_until is not None else None  # the watcher knows the deadline before the job runs
    try:
        os.write(gate_w, gate_message(env))  # the watcher knows the job: it may exec now
    except OSError:
        pass  # EPIPE: the child is already gone (killed from outside); waitpid tells how
    os.close(gate_w)
    started_at = time.monotonic()
    if on_start is not None:
        on_start(pid)
    if verbose:
        c.say("job started: pid %d%s: %s" % (pid, ", own process group" if new_group else "",
                                             c.join_command(argv)))

    child = forward.Child(pid, new_group, not new_group)  # WAKE among its signals (blocked since waker())
    send = child.send
    abort = job.abort
    deadline = started_at + job.time_limit if job.time_limit is not None else None
    timed_out = False
    aborted = False
    terminated = False  # SIGTERM sent (time limit or abort): the deadline is now SIGKILL's
    killed = False
    sigint = False

    def terminate(why: str) -> float:
        """SIGTERM now (and SIGCONT: a stopped job must wake up to die); returns SIGKILL's deadline."""
        if verbose:
            c.say("%s: sending SIGTERM" % why)
        send(_signal.SIGTERM)
        send(_signal.SIGCONT)
        return time.monotonic() + job.kill_after

    try:
        while True:
            if child.reaped():
                break
            stop_at = None
            if not terminated and abort is not None and job.valid_until is not None:
                # A fleet lock: SIGTERM kill_after before the lease could end, so the SIGKILL that follows
                # lands before etcd can hand the lock on (the deadline is the holder's own: last answered
                # keep-alive + TTL - margin, earlier than etcd's expiry). A job never outlives its lock.
                until = job.valid_until()
                if until is not None:
                    left = until - job.kill_after - boottime()
                    if left <= 0:
                        aborted = terminated = True
                        deadline = terminate("the lock's lease may end within --kill-after: the job must stop")
                        continue
                    stop_at = time.monotonic() + left
            wake_at = deadline if beat is None else beat if deadline is None else min(deadline, beat)
            if stop_at is not None:
                wake_at = stop_at if wake_at is None else min(wake_at, stop_at)
            info = child.next_signal(wake_at)
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
            what = child.judge(info)
            if what == forward.CHILD:
                continue
            if what == forward.WOKEN:  # waker()'s wake() (pthread_kill): abort() decides
                if abort is not None and not aborted and abort():
                    aborted = True
                    if not terminated:  # after a time limit's SIGTERM, its SIGKILL deadline stands
                        terminated = True
                        deadline = terminate("the job must stop (its lock is lost)")
                continue
            if what == forward.TERMINAL:
                # From our terminal: the job is in our process group and got this very signal already.
                if sig == _signal.SIGINT:
                    sigint = True
                continue
            if what == forward.FROM_JOB:
                continue  # sent by the job itself: forwarding it back could ping-pong forever
            if sig == _signal.SIGINT:
                sigint = True
            if verbose:
                c.say("forwarding %s to the job" % _signame(sig))
            send(sig)
        if terminated:
            # Stopped (time limit, lock lost): the job's first process is gone, but the job is its whole tree,
            # as for the watcher (proc.jobkill). What left the group (setsid, a double fork) gets SIGTERM now and
            # SIGKILL at the deadline the group had: the lock is never released, nor handed on, while any of
            # it runs. The watcher is still told nothing: should we die meanwhile, it kills them.
            from ..proc.jobkill import end_the_rest

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
        forward.restore(old_mask)  # signals after the job's end were its: dropped (for a caller that goes on)
    return Outcome(child.status, timed_out, time.monotonic() - started_at, pid, sigint, aborted)


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
