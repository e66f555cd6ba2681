"""The engine in one minute: real processes contending for an exclusive lock, a shared lock and a
3-slot semaphore, with the holders and waiters listed while they run (`make demo-engine`).

Every worker prints when it gets in and out; the observer prints `hostlock status` snapshots. Watch that
an exclusive lock has one holder, readers share, a waiting writer makes new readers queue behind it, and
the semaphore never has more than 3 holders, each named with pid, command and mode.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "plugins", "module_utils"))
import hostlock  # noqa: E402

T0 = time.monotonic()


def say(text: str) -> None:
    # One write per line: several processes share this terminal.
    os.write(1, ("%6.2fs  %s\n" % (time.monotonic() - T0, text)).encode())


def worker(directory: str, name: str, who: str, mode: str, slots: int, hold: float, delay: float) -> None:
    time.sleep(delay)
    lock = hostlock.Lock(name, mode=mode, slots=slots, directory=directory, label="demo " + who)
    say("%-10s wants %s (%s)" % (who, name, mode if slots == 1 else "1 of %d slots" % slots))
    with lock:
        say("%-10s GOT   %s" % (who, name))
        time.sleep(hold)
    say("%-10s left  %s" % (who, name))


def show(directory: str, name: str) -> None:
    st = hostlock.status(name, directory)
    # A holder caught between taking the lock and writing its record has no pid yet: shown as "?".
    holders = ", ".join("%s pid %s" % (h.label or "?", "?" if h.pid is None else h.pid) for h in st.holders)
    holders = holders or "nobody"
    say("  status %-6s holders: %s; waiting: %d" % (name, holders, st.waiters))


def run(directory: str, name: str, plan: list, watch: float) -> None:
    pids = []
    for who, mode, slots, hold, delay in plan:
        pid = os.fork()
        if pid == 0:
            try:
                worker(directory, name, who, mode, slots, hold, delay)
            finally:
                os._exit(0)
        pids.append(pid)
    end = time.monotonic() + watch
    while time.monotonic() < end:
        time.sleep(0.5)
        show(directory, name)
    for pid in pids:
        os.waitpid(pid, 0)


def main() -> int:
    directory = tempfile.mkdtemp(prefix="hostlock-demo-")
    say("lock directory: %s (mechanism: %s)" % (directory, hostlock.Lock("x", directory=directory).mechanism))
    say("== exclusive: three jobs, one at a time, in arrival order")
    run(directory, "backup", [("job-A", "exclusive", 1, 1.0, 0.0), ("job-B", "exclusive", 1, 1.0, 0.1),
                              ("job-C", "exclusive", 1, 1.0, 0.2)], 3.2)
    say("== shared: two readers together; a writer waits; a later reader queues behind the writer")
    run(directory, "config", [("reader-1", "shared", 1, 1.5, 0.0), ("reader-2", "shared", 1, 1.5, 0.1),
                              ("writer", "exclusive", 1, 1.0, 0.3), ("reader-3", "shared", 1, 0.5, 0.6)], 3.2)
    say("== semaphore: five jobs, at most three at once")
    run(directory, "builds", [("build-%d" % i, "exclusive", 3, 1.0, 0.05 * i) for i in range(1, 6)], 2.2)
    say("== a holder killed with SIGKILL frees the lock at once")
    pid = os.fork()
    if pid == 0:
        with hostlock.Lock("deploy", directory=directory, label="demo victim"):
            time.sleep(60)
        os._exit(0)
    while not hostlock.holders("deploy", directory):
        time.sleep(0.01)
    show(directory, "deploy")
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    start = time.monotonic()
    with hostlock.Lock("deploy", directory=directory).acquire(timeout=5):
        say("got deploy %.1f ms after the SIGKILL" % ((time.monotonic() - start) * 1000))
    return 0


if __name__ == "__main__":
    sys.exit(main())
