"""Waiting with a deadline while the wait itself sleeps in the kernel.

A blocking fcntl() cannot be given a timeout. In the main thread (the CLI's -w, the modules' timeout) the
caller blocks in fcntl() itself, as an untimed wait does, and an Alarm ends the wait at the deadline: a
per-process timer thread sends the main thread a signal, fcntl() fails with EINTR, and our handler raises
Expired there. So a timed handoff costs what an untimed one does: no thread start, no reopened file, no
second wake-up on the critical path. Elsewhere (other threads, a signal the application already uses) a
timed wait runs in a helper thread on its own open file description (Race) and the caller sleeps on a
thread lock with a timeout; if the caller gives up first, the helper undoes whatever it later gets.
Uses `_thread` and `_signal`, not `threading`/`signal`: importing those costs ~6 ms of a 20 ms command-line
budget.
"""

from __future__ import annotations

import _signal
import _thread
import time

from ..core import forks

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from typing import Any, Callable

TIMED_OUT = object()
# The signal that ends a timed wait in the main thread: a real-time signal no program of ours uses, taken
# only while its disposition is the default (an application that handles it keeps it: we use Race then).
# Its default action is to terminate, so once our handler is installed it stays (a late signal is ignored).
ALARM_SIGNAL = _signal.SIGRTMAX - 3


class Expired(Exception):
    """Raised by the alarm's signal handler inside a blocking fcntl() whose deadline has passed."""


class Alarm:
    """Ends blocking calls of the main thread at a deadline; one per process, its timer thread shared.

    Generations make a late signal harmless: the handler acts only on a signal sent for the current arming.
    The timer thread is woken only when a new deadline is earlier than the one it sleeps towards, so waits
    that keep the same timeout cost it nothing.
    """

    def __init__(self) -> None:
        self.mutex = _thread.allocate_lock()
        self._wake = _thread.allocate_lock()
        self._wake.acquire()  # released = "look again": a binary semaphore only arm() posts
        self.deadline: float | None = None
        self._sleeping_until: float | None = None
        self.gen = 0
        self.fired_gen = -1
        self.armed = False  # True only around a blocking call that may be ended by Expired
        self.busy = False
        self.target = 0
        start_thread(self._run)

    def arm(self, deadline: float) -> None:
        with self.mutex:
            self.gen += 1
            self.deadline = deadline
            self.target = _thread.get_ident()
            self.busy = True
            until = self._sleeping_until
            if (until is None or deadline < until) and self._wake.locked():
                self._wake.release()

    def disarm(self) -> None:
        with self.mutex:
            self.deadline = None
            self.armed = False
            self.busy = False

    @property
    def rang(self) -> bool:
        return self.fired_gen == self.gen

    def _run(self) -> None:
        while True:
            with self.mutex:
                deadline = self.deadline
                if deadline is not None and deadline <= time.monotonic():
                    self.deadline = None
                    self.fired_gen = self.gen
                    # Sent under the mutex: arm()/disarm() cannot slip in between the decision and the signal.
                    _signal.pthread_kill(self.target, ALARM_SIGNAL)
                    continue
                self._sleeping_until = deadline
            if deadline is None:
                self._wake.acquire()
            else:
                self._wake.acquire(True, max(0.0, deadline - time.monotonic()))
            with self.mutex:
                self._sleeping_until = None

    def ring(self, _sig: int, _frame: object) -> None:
        """The signal handler (main thread, between bytecodes or as fcntl() returns EINTR)."""
        if self.armed and self.rang:
            self.armed = False
            raise Expired()


_alarm: Alarm | None = None


def alarm(deadline: float) -> Alarm | None:
    """The process's Alarm armed for `deadline`, or None when the caller must use Race instead (not the main
    thread, a subinterpreter, the application handles ALARM_SIGNAL itself, or a wait is already armed)."""
    global _alarm
    a = _alarm
    if a is not None and a.busy:
        return None  # a timed wait inside a signal handler that interrupted another: the thread path
    try:
        current = _signal.getsignal(ALARM_SIGNAL)
        if current != _signal.SIG_DFL and (a is None or current != a.ring):
            return None
        # signal() is also the test for "main thread": it raises ValueError anywhere else.
        _signal.signal(ALARM_SIGNAL, current)
        if ALARM_SIGNAL in _signal.pthread_sigmask(_signal.SIG_BLOCK, ()):
            return None  # blocked here: it could never end the wait
        if a is None:
            a = _alarm = Alarm()
            _signal.signal(ALARM_SIGNAL, a.ring)
    except (ValueError, OSError, RuntimeError):
        return None
    a.arm(deadline)
    return a


def start_thread(fn: Callable[[], object]) -> None:
    """Start `fn` on a thread that never takes a signal: process-directed ones (SIGTERM for a job a CLI
    supervises, an application's own) must reach the main thread. It is created with every signal blocked,
    so none can land on it before it runs either (one did, under load, and the main thread slept on)."""
    old = _signal.pthread_sigmask(_signal.SIG_BLOCK, _signal.valid_signals())
    try:
        _thread.start_new_thread(fn, ())
    finally:
        _signal.pthread_sigmask(_signal.SIG_SETMASK, old)


def _forget_alarm() -> None:
    global _alarm
    _alarm = None  # its timer thread did not survive fork: the child starts its own when it needs one


forks.in_child(_forget_alarm)


class Race:
    """First result wins; results that arrive after the winner, or after the caller gave up, are undone."""

    def __init__(self, undo: Callable[[Any], object]) -> None:
        self.mutex = _thread.allocate_lock()
        self._done = _thread.allocate_lock()
        self._done.acquire()
        self._undo = undo
        self._result: Any = None
        self._error: BaseException | None = None
        self._settled = False
        self.abandoned = False

    def offer(self, value: Any = None, error: BaseException | None = None) -> None:
        with self.mutex:
            take = not self._settled and not self.abandoned
            if take:
                self._settled = True
                self._result, self._error = value, error
                self._done.release()
        if not take and error is None and value is not None:
            self._undo(value)

    def spawn(self, fn: Callable[..., object], *args: object) -> None:
        def run() -> None:
            try:
                value = fn(*args)
            except BaseException as e:  # noqa: BLE001 - handed to the waiting caller
                self.offer(None, e)
            else:
                self.offer(value)

        start_thread(run)

    def wait(self, deadline: float | None) -> Any:
        """The winning value, TIMED_OUT, or the winner's exception re-raised in the caller."""
        try:
            if deadline is None:
                self._done.acquire()
            else:
                self._done.acquire(True, max(0.0, deadline - time.monotonic()))
        except BaseException:  # Ctrl-C while waiting: give up, and undo a result that raced in
            with self.mutex:
                settled, self.abandoned = self._settled, True
            if settled and self._error is None and self._result is not None:
                self._undo(self._result)
            raise
        with self.mutex:
            settled = self._settled
            if not settled:
                self.abandoned = True
        if not settled:
            return TIMED_OUT
        if self._error is not None:
            raise self._error
        return self._result


def backoff_sleep(attempt: int, deadline: float | None) -> bool:
    """Sleep before the next poll; False once the deadline has passed."""
    delay = min(0.05, 0.0005 * (2 ** min(attempt, 10)))
    if deadline is not None:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        delay = min(delay, left)
    time.sleep(delay)
    return True
