"""Timed waits (acquire(timeout=...): the CLI's -w, the modules' timeout) sleep in fcntl() in the caller's own
thread, as untimed waits do, and still end at their deadline: in the main thread by the alarm's signal,
elsewhere (other threads, an application that handles the alarm's signal) on a helper thread.

Every test synchronizes on the children's lines and the lock's own status, never on a sleep's length.
"""

from __future__ import annotations

import os
import platform
import signal
import time

import pytest
from engine_helpers import spawn, wait_line

import hostlock

ORDERED = """
    import sys, hostlock
    d, idx, out = sys.argv[1], sys.argv[2], sys.argv[3]
    l = hostlock.Lock("timed", directory=d)
    print("waiting", flush=True)
    with l:
        with open(out, "a") as f:
            f.write(idx + "\\n")
        sys.stdin.readline()  # hold until the test says so
    print("done", flush=True)
"""


def _until_waiters(lockdir: str, n: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if hostlock.status("timed", lockdir).waiters == n:
            return
        time.sleep(0.01)
    raise AssertionError("expected %d waiters: %r" % (n, hostlock.status("timed", lockdir)))


def test_a_timed_out_waiter_behind_another_keeps_its_place_until_that_one_is_through(lockdir, tmp_path):
    """B times out behind C: D (behind B) must still come after C, so B's place is kept until C holds and
    lets go (leaving at once would put D beside C at the lock, in either order)."""
    out = str(tmp_path / "order")
    holder = hostlock.Lock("timed", directory=lockdir).acquire()
    c = spawn(ORDERED, lockdir, "C", out, stdin=-1)
    wait_line(c, "waiting")
    _until_waiters(lockdir, 1)
    b = spawn("""
        import sys, hostlock
        l = hostlock.Lock("timed", directory=sys.argv[1])
        print("waiting", flush=True)
        try:
            l.acquire(timeout=0.3)
        except hostlock.LockTimeout:
            print("timed out", flush=True)
        sys.stdin.readline()  # stay alive: its thread keeps its place in line
    """, lockdir, stdin=-1)
    wait_line(b, "timed out")
    d = spawn(ORDERED, lockdir, "D", out, stdin=-1)
    wait_line(d, "waiting")
    _until_waiters(lockdir, 3)  # C, B's kept place, D
    holder.release()
    for p in (c, d):  # each holds until told: told now, each lets go once it has written its turn
        p.stdin.write("\n")
        p.stdin.flush()
    for p in (c, d):
        assert p.wait(30) == 0, p.stderr.read()
    b.stdin.write("\n")
    b.stdin.close()
    assert b.wait(30) == 0, b.stderr.read()
    with open(out) as f:
        assert f.read().split() == ["C", "D"]
    assert hostlock.status("timed", lockdir).waiters == 0  # B's thread left the line behind C


_FCNTL = {"x86_64": 72, "aarch64": 25, "i686": 55, "armv7l": 55}


@pytest.mark.skipif(platform.machine() not in _FCNTL, reason="fcntl's syscall number is known per arch only")
def test_a_timed_wait_sleeps_in_fcntl_in_the_callers_own_thread(lockdir):
    holder = hostlock.Lock("timed", directory=lockdir).acquire()
    waiter = spawn("""
        import sys, time, hostlock
        l = hostlock.Lock("timed", directory=sys.argv[1])
        print("waiting", flush=True)
        l.acquire(timeout=60)
        print("got", flush=True)
    """, lockdir)
    wait_line(waiter, "waiting")
    _until_waiters(lockdir, 1)
    try:
        deadline = time.monotonic() + 30
        while True:  # the main thread's current system call: fcntl(F_OFD_SETLKW), not a futex on a helper
            with open("/proc/%d/syscall" % waiter.pid) as f:
                number = f.read().split()[0]
            if number == str(_FCNTL[platform.machine()]):
                break
            assert time.monotonic() < deadline, "main thread is in syscall %s, not fcntl" % number
            time.sleep(0.01)
    finally:
        holder.release()
    wait_line(waiter, "got")
    assert waiter.wait(30) == 0


def test_timed_waits_end_in_other_threads_and_beside_an_application_handler(lockdir):
    holder = hostlock.Lock("timed", directory=lockdir).acquire()
    child = spawn("""
        import _thread, signal, sys, hostlock
        from hostlock.host import waiting as _waiting

        def attempt():
            try:
                hostlock.Lock("timed", directory=sys.argv[1]).acquire(timeout=0.2)
                return "acquired"
            except hostlock.LockTimeout:
                return "timeout"

        done = _thread.allocate_lock()
        done.acquire()
        result = []
        _thread.start_new_thread(lambda: (result.append(attempt()), done.release()), ())
        done.acquire()
        print("thread", result[0], flush=True)
        print("main", attempt(), flush=True)
        mine = lambda *_a: None
        signal.signal(_waiting.ALARM_SIGNAL, mine)  # the application's own use of the signal wins
        print("beside a handler", attempt(), signal.getsignal(_waiting.ALARM_SIGNAL) is mine, flush=True)
    """, lockdir)
    try:
        assert wait_line(child, "thread", 30) == "thread timeout"
        assert wait_line(child, "main", 30) == "main timeout"
        assert wait_line(child, "beside a handler", 30) == "beside a handler timeout True"
        assert child.wait(30) == 0, child.stderr.read()
    finally:
        holder.release()
    assert hostlock.status("timed", lockdir).waiters == 0


def test_a_signal_during_a_timed_wait_reaches_the_application_and_leaves_the_line(lockdir):
    holder = hostlock.Lock("timed", directory=lockdir).acquire()
    child = spawn("""
        import signal, sys, hostlock

        class Stop(Exception):
            pass

        def stop(*_a):
            raise Stop()

        signal.signal(signal.SIGUSR1, stop)
        print("waiting", flush=True)
        try:
            hostlock.Lock("timed", directory=sys.argv[1]).acquire(timeout=60)
        except Stop:
            print("stopped", flush=True)
        sys.stdin.readline()
    """, lockdir, stdin=-1)
    try:
        wait_line(child, "waiting")
        _until_waiters(lockdir, 1)
        os.kill(child.pid, signal.SIGUSR1)
        wait_line(child, "stopped")
        _until_waiters(lockdir, 0)  # it left the line while still alive
    finally:
        holder.release()
        child.stdin.close()
    assert child.wait(30) == 0, child.stderr.read()
