"""One contender in the fleet stress tests: a separate "controller" that shares nothing with the others but the
fleet URL (its own $HOSTLOCK_DIR, its own working directory), looping acquire/release on one fleet lock.

Two detectors, both independent of the lock under test:
- live, in the critical section, with O_EXCL files in a directory of their own: an exclusive holder creates `W`
  (EEXIST means two writers) and must see no `R.*`; a reader creates `R.<pid>` and must not see `W`; a slot
  holder creates `S.<pid>` and must count at most N;
- a journal: every holder appends `enter`/`exit` lines with its pid, mode and fence to one file opened O_APPEND
  (each line one write(2), so lines never interleave), checked afterwards by the test.
Prints OVERLAP and exits 3 on a live overlap, DONE on success.
"""

from __future__ import annotations

import os
import random
import sys
import time

import hostlock


def note(journal: int, what: str, mode: str, fence: int | None) -> None:
    os.write(journal, ("%s %d %s %s\n" % (what, os.getpid(), mode, fence)).encode())


KILLED = os.environ.get("STRESS_KILLED", "")


def alive(pid: int) -> bool:
    """Whether a marker's owner still runs: the test names every process it SIGKILLs before the kill."""
    if KILLED:
        with open(KILLED) as f:
            if str(pid) in f.read().split():
                return False
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def enter_writer(det: str, me: int) -> str | None:
    """Create `W` holding our pid (link(2) of a finished file: never seen empty); a marker of a holder that was
    killed inside (its lease ended since, or we would not hold) is removed. Another live writer: overlap."""
    marker, tmp = os.path.join(det, "W"), os.path.join(det, "tmp.%d" % me)
    with open(tmp, "w") as f:
        f.write(str(me))
    try:
        while True:
            try:
                os.link(tmp, marker)
                return None
            except FileExistsError:
                try:
                    with open(marker) as f:
                        other = int(f.read())
                except (OSError, ValueError):
                    continue  # removed meanwhile: try again
                if alive(other):
                    return "two writers (pid %d is inside)" % other
                try:
                    os.unlink(marker)
                except FileNotFoundError:
                    pass
    finally:
        os.unlink(tmp)


DWELL = 0.002  # time spent inside: widens the window an overlap would show in (a dwell, never a wait)


def live_check(det: str, kind: str, mode: str, slots: int) -> str | None:
    """Enter the detector's own critical section; the overlap it saw, or None (and leave it again)."""
    me = os.getpid()
    if kind == "slots":
        mine = os.path.join(det, "S.%d" % me)
        open(mine, "x").close()
        time.sleep(DWELL)
        inside = [n for n in os.listdir(det) if n.startswith("S.")]
        os.sched_yield()
        os.unlink(mine)
        return "more than %d slot holders: %s" % (slots, inside) if len(inside) > slots else None
    if mode == "exclusive":
        seen = enter_writer(det, me)
        if seen:
            return seen
        time.sleep(DWELL)
        readers = [n for n in os.listdir(det) if n.startswith("R.")]
        os.sched_yield()
        os.unlink(os.path.join(det, "W"))
        return "writer beside readers %s" % readers if readers else None
    mine = os.path.join(det, "R.%d" % me)
    open(mine, "x").close()
    time.sleep(DWELL)
    writer = os.path.exists(os.path.join(det, "W"))
    os.sched_yield()
    os.unlink(mine)
    return "reader beside a writer" if writer else None


def main() -> None:
    url, det, journal_path, kind, cycles, slots = sys.argv[1:7]
    cycles_n, slots_n = int(cycles), int(slots)
    rng = random.Random(os.getpid())
    journal = os.open(journal_path, os.O_WRONLY | os.O_APPEND)
    print("ready", flush=True)
    sys.stdin.readline()  # every contender starts on the same line from the test
    for _i in range(cycles_n):
        mode = "exclusive"
        if kind == "mixed":
            mode = "exclusive" if rng.random() < 0.3 else "shared"
        lock = hostlock.Lock("stress", mode=mode, slots=slots_n if kind == "slots" else 1, fleet=url,
                             ttl=float(os.environ.get("STRESS_TTL", "10")))
        with lock:
            note(journal, "enter", mode, lock.fence)
            seen = live_check(det, kind, mode, slots_n)
            lock.check()  # never act on a lost lock: a loss here is a failure of the test, not an overlap
            note(journal, "exit", mode, lock.fence)
        if seen:
            print("OVERLAP", seen, flush=True)
            sys.exit(3)
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
