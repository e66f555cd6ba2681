# GENERATED from lib/hostlock/_waiting.py by `make module-utils`: do not edit; edit lib/hostlock instead.
# SPDX-License-Identifier: GPL-3.0-or-later
"""Waiting with a deadline while the wait itself sleeps in the kernel.

A blocking fcntl() cannot be given a timeout or be cancelled from another thread, so a timed wait runs in
a helper thread on its own open file description and the caller sleeps on a thread lock with a timeout
(a futex: no polling, no CPU). If the caller gives up first, the helper undoes whatever it later gets;
because its locks live on its own file description they can never touch the caller's.
Uses `_thread`, not `threading`: importing threading costs ~6 ms of a 20 ms command-line budget.
"""

from __future__ import annotations

import _thread
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from typing import Any, Callable

TIMED_OUT = object()


class Race:
    """First result wins; results that arrive after the winner, or after the caller gave up, are undone."""

    def __init__(self, undo: Callable[[Any], object]) -> None:
        self.mutex = _thread.allocate_lock()
        self._done = _thread.allocate_lock()
        self._done.acquire()
        self._undo = undo
        self._result: object = None
        self._error: BaseException | None = None
        self._settled = False
        self.abandoned = False

    def offer(self, value: object = None, error: BaseException | None = None) -> None:
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
                import signal

                # Process-directed signals (SIGTERM for a job a CLI supervises) must reach the main
                # thread, never a helper left waiting in the kernel.
                signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
                value = fn(*args)
            except BaseException as e:  # noqa: BLE001 - handed to the waiting caller
                self.offer(None, e)
            else:
                self.offer(value)

        _thread.start_new_thread(run, ())

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
