"""Signals meant for a job, passed on to it: one mechanism for `hostlock run`'s supervisor (cli/supervise.py) and
the `locked` module's runner (module_utils/_runner.py).

The process that holds the lock must outlive the job, so a signal that would end it is the job's: every
signal of core.signals.FORWARDED (each one whose default action ends a process, but SIGKILL, the faults and
the two Python ignores itself) is blocked before the job is forked and collected with sigtimedwait(), never
handled asynchronously: no handler runs between two lines of the lock's code, none is lost in a race with
the job's exit, and SIGCHLD (blocked with them) ends the wait. What is not passed on:
- a signal the job sent us itself (sent back, it could ping-pong forever);
- a keyboard signal from our terminal when the job is in our process group: it got that very signal already;
- WAKE (SIGALRM) from this very process: another thread's "look at the job's abort() now" (see waker).
"""

from __future__ import annotations

import _signal
import _thread
import time

from ..core import oslite as os
from ..core.signals import FORWARDED

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from signal import struct_siginfo
    from typing import Callable

WAITED = FORWARDED | {_signal.SIGCHLD}  # every signal that would end us reaches the job (core.signals)
_SI_KERNEL = 0x80  # si_code of a signal the kernel generated, e.g. Ctrl-C on a terminal
# Another thread's "look at job.abort() now" (see waker), told from anyone else's SIGALRM by its sender: this process.
# Never used for alarm(): nothing here arms one while a job runs.
WAKE = _signal.SIGALRM
_wake_was_blocked = [False]  # WAKE was blocked before waker() blocked it: the job inherits it blocked, as given

# What judge() says of a signal that came.
CHILD, WOKEN, TERMINAL, FROM_JOB, FORWARD = "child", "woken", "terminal", "from-job", "forward"


def waker() -> Callable[[], None]:
    """Block WAKE in this thread (the one that will supervise) and return `wake()`, which any thread may
    call to make the supervisor read the job's abort() at once.

    Call it before the threads that will call wake() start (the fleet lock's keep-alive thread): they
    inherit the blocked mask, so no SIGALRM's default action (death) can land in them, and a wake-up that
    comes before the supervisor waits stays pending for it. wake() targets this thread alone (pthread_kill).
    """
    _wake_was_blocked[0] = WAKE in _signal.pthread_sigmask(_signal.SIG_BLOCK, {WAKE})
    ident = _thread.get_ident()

    def wake() -> None:
        try:
            _signal.pthread_kill(ident, WAKE)
        except OSError:  # ESRCH: the supervising thread is gone, nothing left to wake
            pass

    return wake


def wake_was_blocked() -> bool:
    """Whether WAKE was blocked already when waker() blocked it (then the job keeps it blocked, as given)."""
    return _wake_was_blocked[0]


def block() -> set[int]:
    """Block, now, the signals a job gets (and SIGCHLD); returns the mask from before, for restore(). Before the
    job's fork: its process inherits them blocked (it restores the mask it is given before it execs or runs),
    and no signal meant for it can end us in between."""
    return _signal.pthread_sigmask(_signal.SIG_BLOCK, WAITED)


def restore(mask: set[int]) -> None:
    """Once the job has ended: drop the signals that came after (they were meant for it, not for us), then give
    the mask back (for a caller that goes on)."""
    while _signal.sigtimedwait(WAITED, 0) is not None:
        pass
    _signal.pthread_sigmask(_signal.SIG_SETMASK, mask)


class Child:
    """A forked job's process, its signals passed on to it, its end waited for. Used with WAITED blocked."""

    __slots__ = ("pid", "group", "shares_group", "me", "status")

    def __init__(self, pid: int, group: bool, shares_group: bool) -> None:
        self.pid = pid
        self.group = group  # it leads a process group of its own: signals go to the whole group
        self.shares_group = shares_group  # it is in our process group (a terminal's signals reach it too)
        self.me = os.getpid()
        self.status = 0  # its wait status, once reaped

    def send(self, sig: int) -> None:
        try:
            if self.group:
                os.killpg(self.pid, sig)
            else:
                os.kill(self.pid, sig)
        except OSError:
            pass

    def reaped(self) -> bool:
        """Whether it has ended (reaped now, its status kept in `status`)."""
        try:
            done, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:  # cannot happen unless someone reaped it for us
            return True
        if done == self.pid:
            self.status = status
            return True
        return False

    def next_signal(self, until: float | None) -> struct_siginfo | None:
        """The next signal of WAITED (its siginfo), or None once time.monotonic() reaches `until` (None: no
        deadline)."""
        if until is None:
            return _signal.sigwaitinfo(WAITED)
        return _signal.sigtimedwait(WAITED, max(0.0, until - time.monotonic()))

    def judge(self, info: struct_siginfo) -> str:
        """What a signal that came is: CHILD (SIGCHLD: look at the job), WOKEN (waker's wake), TERMINAL (our
        terminal's, which the job in our group got already), FROM_JOB (the job's own), or FORWARD."""
        sig = info.si_signo
        if sig == _signal.SIGCHLD:
            return CHILD
        sender = info.si_pid
        if sig == WAKE and sender == self.me:
            return WOKEN
        if self.shares_group and info.si_code == _SI_KERNEL:
            return TERMINAL
        if sender and (sender == self.pid or (self.group and _pgid(sender) == self.pid)):
            return FROM_JOB
        return FORWARD

    def wait(self, tick: tuple[float, Callable[[], object]] | None = None) -> list[int]:
        """Until the job ends: pass on every signal judge() says to, and call tick's function every tick's
        seconds (a lease's renewal). Returns the signals passed on, in order."""
        got = []
        every, call = tick if tick is not None else (0.0, None)
        beat = time.monotonic() + every if call is not None else None
        while not self.reaped():
            info = self.next_signal(beat)
            if info is None:
                if call is not None:
                    call()
                    beat = time.monotonic() + every
                continue
            if self.judge(info) == FORWARD:
                got.append(info.si_signo)
                self.send(info.si_signo)
        return got


def _pgid(pid: int) -> int:
    try:
        return os.getpgid(pid)
    except OSError:
        return -1
