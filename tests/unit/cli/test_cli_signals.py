"""The one set of signals that end a process (hostlock.core.signals.ENDING), checked against the kernel, and its
users: what `run` forwards, what a fleet waiter traps, and a job's process that gets one just before its exec."""

from __future__ import annotations

import os
import resource
import signal

import pytest

from hostlock.cli import supervise
from hostlock.core import signals
from hostlock.proc import forward
from hostlock.proc.job import Job, start

FAULTS = {signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL, signal.SIGABRT, signal.SIGTRAP, signal.SIGSYS}


def _ends_a_process(sig: int) -> bool:
    """Whether `sig`, at its default action, ends a process: asked of the kernel, in a child that sends it to
    itself (no core file: RLIMIT_CORE 0)."""
    pid = os.fork()
    if pid == 0:
        try:
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_SETMASK, set())
            os.kill(os.getpid(), sig)  # a stop is continued by the parent below: not an end
        finally:
            os._exit(0)
    while True:
        _pid, status = os.waitpid(pid, os.WUNTRACED)
        if os.WIFSTOPPED(status):
            os.kill(pid, signal.SIGCONT)
            continue
        return os.WIFSIGNALED(status)


def test_ending_is_every_signal_whose_default_ends_a_process_but_kill_and_the_faults():
    every = signal.valid_signals()
    ends = {sig for sig in every if _ends_a_process(sig)}
    assert signals.ENDING == ends - FAULTS - {signal.SIGKILL}
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
                signal.SIGALRM, signal.SIGPWR, signal.SIGXCPU, signal.SIGRTMIN, signal.SIGRTMIN + 3, signal.SIGRTMAX):
        assert sig in signals.ENDING, signal.Signals(sig).name if sig < signal.SIGRTMIN else sig
    assert not signals.ENDING & {signal.SIGCHLD, signal.SIGCONT, signal.SIGWINCH, signal.SIGTSTP, signal.SIGSTOP}


@pytest.mark.parametrize("sig, name", [
    (signal.SIGTERM, "SIGTERM"), (signal.SIGPWR, "SIGPWR"), (signal.SIGRTMIN, "SIGRTMIN"),
    (signal.SIGRTMIN + 3, "SIGRTMIN+3"), (signal.SIGRTMAX - 2, "SIGRTMAX-2"), (signal.SIGRTMAX, "SIGRTMAX"),
])
def test_names_as_kill_takes_them(sig, name):
    assert signals.name(sig) == name


def test_run_forwards_and_a_fleet_waiter_traps_the_same_set():
    # Python ignores SIGPIPE and SIGXFSZ for itself: left alone, as before.
    assert signals.FORWARDED == signals.ENDING - {signal.SIGPIPE, signal.SIGXFSZ}
    assert forward.WAITED == signals.FORWARDED | {signal.SIGCHLD}  # `run`'s and the `locked` runner's one set
    assert set(supervise.WAIT_SIGNALS) == signals.ENDING - {signal.SIGINT}  # SIGINT: KeyboardInterrupt


@pytest.fixture
def handlers_restored():
    saved = {sig: signal.getsignal(sig) for sig in supervise.WAIT_SIGNALS}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, ())
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1, signal.SIGRTMIN + 2])
def test_a_signal_that_reaches_the_jobs_process_before_its_exec_ends_it_by_that_signal(sig, handlers_restored):
    """The job's process of a fleet lock is forked while the wait's handlers are set (trap_wait_signals). A
    signal forwarded to it just before its exec (here: sent to it at its gate, so it is surely pending there)
    must end it by that signal, as it would end the job: not run hostlock's handler in it (which exited 71)."""
    trapped = supervise.trap_wait_signals()
    try:
        keep: list = []
        start(Job(["sleep", "30"], watch=False), keep)
    finally:
        supervise.untrap(trapped)
    os.kill(keep[0].pid, sig)  # blocked in it until it execs: pending
    outcome = supervise.supervise(keep[0].job, started=keep[0])
    assert os.WIFSIGNALED(outcome.status) and os.WTERMSIG(outcome.status) == sig, outcome.describe()
