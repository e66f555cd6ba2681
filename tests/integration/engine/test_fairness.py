"""Waiters are served in arrival order, writers are not starved, and waiting costs no CPU."""

from __future__ import annotations

import os
import signal
import time

import pytest
from engine_helpers import spawn, wait_line

import hostlock
from hostlock.host import kernel as _kernel

WAITER = """
    import sys, time, hostlock
    d, idx, mode, out = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    l = hostlock.Lock("fifo", mode=mode, directory=d)
    print("waiting", flush=True)
    with l:
        with open(out, "a") as f:
            f.write(idx + "\\n")
        time.sleep(0.05)
    print("done", flush=True)
"""


def _queued(lockdir, n, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if hostlock.status("fifo", lockdir).waiters >= n:
            return
        time.sleep(0.01)
    raise AssertionError("waiters never queued: %r" % hostlock.status("fifo", lockdir))


def test_waiters_are_served_in_arrival_order(lockdir, tmp_path):
    out = str(tmp_path / "order")
    holder = hostlock.Lock("fifo", directory=lockdir).acquire()
    procs = []
    for i in range(6):
        p = spawn(WAITER, lockdir, str(i), "exclusive", out)
        wait_line(p, "waiting")
        _queued(lockdir, i + 1)
        procs.append(p)
    holder.release()
    for p in procs:
        p.wait(30)
    with open(out) as f:
        assert f.read().split() == [str(i) for i in range(6)]


def test_a_waiting_writer_is_not_starved_by_new_readers(lockdir, tmp_path):
    out = str(tmp_path / "order")
    reader = hostlock.Lock("fifo", mode="shared", directory=lockdir).acquire()
    writer = spawn(WAITER, lockdir, "w", "exclusive", out)
    wait_line(writer, "waiting")
    _queued(lockdir, 1)
    # Only readers hold the lock, yet a new reader must queue behind the waiting writer.
    with pytest.raises(hostlock.LockTimeout):
        hostlock.Lock("fifo", mode="shared", directory=lockdir).acquire(timeout=0.2)
    late = spawn(WAITER, lockdir, "r", "shared", out)
    wait_line(late, "waiting")
    _queued(lockdir, 2)
    reader.release()
    writer.wait(10)
    late.wait(10)
    with open(out) as f:
        assert f.read().split() == ["w", "r"]


def test_semaphore_waiters_in_order(lockdir, tmp_path):
    out = str(tmp_path / "order")
    held = [hostlock.Lock("fifo", slots=2, directory=lockdir).acquire() for _i in range(2)]
    code = WAITER.replace('hostlock.Lock("fifo", mode=mode, directory=d)',
                          'hostlock.Lock("fifo", slots=2, directory=d)')
    procs = []
    for i in range(4):
        p = spawn(code, lockdir, str(i), "exclusive", out)
        wait_line(p, "waiting")
        _queued(lockdir, i + 1)
        procs.append(p)
    held[0].release()
    time.sleep(0.02)
    held[1].release()
    for p in procs:
        p.wait(30)
    with open(out) as f:
        order = f.read().split()
    assert order[:2] in (["0", "1"], ["1", "0"]) and sorted(order[2:]) == ["2", "3"]


@pytest.mark.parametrize("timed", [False, True])
def test_waiting_uses_no_cpu_and_wakes_on_release(lockdir, timed):
    holder = hostlock.Lock("cpu", directory=lockdir).acquire()
    waiter = spawn("""
        import sys, time, hostlock
        l = hostlock.Lock("cpu", directory=sys.argv[1])
        print("waiting", flush=True)
        l.acquire(timeout=None if sys.argv[2] == "0" else 60)
        print("got %.6f" % time.time(), flush=True)
    """, lockdir, "1" if timed else "0")
    wait_line(waiter, "waiting")
    time.sleep(0.2)

    def cpu_ticks():
        with open("/proc/%d/stat" % waiter.pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])

    before = cpu_ticks()
    time.sleep(1.0)
    spent = cpu_ticks() - before
    assert spent <= 2, "a waiter burned %d clock ticks in 1 s: it polls" % spent  # 2 ticks = 20 ms slack
    released = time.time()
    holder.release()
    line = wait_line(waiter, "got")
    assert float(line.split()[1]) - released < 1.0
    waiter.wait(5)


def test_a_barging_newcomer_cannot_overtake_a_fifo_waiter_for_long(lockdir, tmp_path):
    """fifo=False may take a free lock ahead of the first waiter only in its first BARGE_WINDOW_NS.

    The window is measured from the time the first waiter wrote when it reached the front; a fifo=True
    waiter must write it too, or a stream of fifo=False newcomers could overtake it for ever.
    """
    out = str(tmp_path / "order")
    holder = hostlock.Lock("fifo", directory=lockdir).acquire()
    waiter = spawn(WAITER, lockdir, "w", "exclusive", out)
    wait_line(waiter, "waiting")
    _queued(lockdir, 1)
    path = hostlock.status("fifo", lockdir).path
    deadline = time.monotonic() + 10
    while _head_since(path) == 0:  # written once the waiter is first in line, before it sleeps on the lock
        assert time.monotonic() < deadline, "the first waiter never said when it reached the front"
        time.sleep(0.01)
    time.sleep(2 * _kernel.BARGE_WINDOW_NS / 1e9)  # a lower bound: the window has passed, however busy
    # Stopped, the waiter cannot take the lock when it is freed; it still holds its place in line.
    os.kill(waiter.pid, signal.SIGSTOP)
    try:
        holder.release()
        newcomer = hostlock.Lock("fifo", fifo=False, directory=lockdir)
        with pytest.raises(hostlock.LockTimeout):
            newcomer.acquire(timeout=0)
    finally:
        os.kill(waiter.pid, signal.SIGCONT)
    assert waiter.wait(10) == 0
    with open(out) as f:
        assert f.read().split() == ["w"]


def _head_since(path):
    with open(path, "rb") as f:
        f.seek(_kernel.HEAD_SINCE_AT)
        return int.from_bytes(f.read(8), "little")
