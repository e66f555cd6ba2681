"""The signals someone sends to end a process, as one set: what `hostlock run` forwards to its job, what ends a
fleet waiter cleanly, and what the engine holds while a waiter leaves etcd's queue.

Why one set: a signal a fleet waiter does not trap kills it with its key still queued, and every waiter behind it
waits a whole TTL; one the engine does not hold while that key is taken out can cut the clean-up short; one the
supervisor does not forward ends hostlock instead of the job. `kill -s`, `timeout -s`, systemd's KillSignal= and
a shell's `trap` can name any signal, real-time ones included, so the set is every signal whose default action
ends the process, except:
- SIGKILL, which no process can catch;
- the faults a program raises in itself (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTRAP, SIGSYS): they say
  hostlock is broken, and must end it where it stands, with its core dump.
"""

from __future__ import annotations

import _signal

# Default action: ignore (CHLD, CONT, URG, WINCH) or stop (STOP, TSTP, TTIN, TTOU). Not endings.
_NOT_ENDING = {_signal.SIGCHLD, _signal.SIGCONT, _signal.SIGURG, _signal.SIGWINCH, _signal.SIGSTOP, _signal.SIGTSTP,
               _signal.SIGTTIN, _signal.SIGTTOU}
_FAULTS = {_signal.SIGSEGV, _signal.SIGBUS, _signal.SIGFPE, _signal.SIGILL, _signal.SIGABRT, _signal.SIGTRAP,
           _signal.SIGSYS}
ENDING = frozenset(_signal.valid_signals()) - _NOT_ENDING - _FAULTS - {_signal.SIGKILL}
# What a process that runs a job for us (`hostlock run`'s supervisor, the `locked` module's runner) passes on to
# it instead of dying: every ending signal but the two Python ignores for itself, as flock(1) and a shell leave
# them to the process they are sent to.
FORWARDED = ENDING - {_signal.SIGPIPE, _signal.SIGXFSZ}

_NAMES = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGKILL", "SIGSEGV", "SIGABRT", "SIGPIPE",
          "SIGALRM", "SIGBUS", "SIGFPE", "SIGILL", "SIGTRAP", "SIGXCPU", "SIGXFSZ", "SIGVTALRM", "SIGPROF", "SIGIO",
          "SIGPWR", "SIGSYS", "SIGSTKFLT", "SIGCHLD", "SIGCONT", "SIGSTOP", "SIGTSTP", "SIGTTIN", "SIGTTOU",
          "SIGURG", "SIGWINCH")


def name(sig: int) -> str:
    """SIGTERM, SIGRTMIN+3, ...: a signal's name as kill(1) takes it (SIG<number> for one it has none for)."""
    for n in _NAMES:
        if getattr(_signal, n, None) == sig:
            return n
    low, high = getattr(_signal, "SIGRTMIN", 0), getattr(_signal, "SIGRTMAX", -1)
    if low <= sig <= high:
        up, down = sig - low, high - sig
        if up <= down:
            return "SIGRTMIN+%d" % up if up else "SIGRTMIN"
        return "SIGRTMAX-%d" % down if down else "SIGRTMAX"
    return "SIG%d" % sig
