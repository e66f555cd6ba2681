"""One contender in the stress tests: loops acquire/release and checks exclusion with an independent detector.

The detector uses only O_EXCL files in its own directory, never the lock under test: an exclusive holder
creates `X` (EEXIST means two holders), a reader creates `R.<pid>` and must not see `W`, a writer creates
`W` and must see no `R.*`, a semaphore holder creates `S.<pid>` and must count at most N. A marker left by a
holder that was SIGKILLed inside its critical section is recognised by its dead pid and removed.
"""

from __future__ import annotations

import os
import random
import sys

import hostlock  # installed in .venv (editable), or on PYTHONPATH (make test-pythons)

KILLED = os.environ.get("STRESS_KILLED", "")


def alive(pid: int) -> bool:
    """A killed process releases its kernel locks while still exiting: the test names those it kills."""
    if KILLED and os.path.exists(KILLED):
        with open(KILLED) as f:
            if str(pid) in f.read().split():
                return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def enter(det: str, name: str) -> bool:
    path = os.path.join(det, name)
    while True:
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
            os.write(fd, str(os.getpid()).encode())
            os.close(fd)
            return True
        except FileExistsError:
            try:
                with open(path) as f:
                    pid = int(f.read() or "0")
            except (OSError, ValueError):
                pid = 0
            if pid and not alive(pid):
                try:
                    os.unlink(path)  # left by a holder killed inside its critical section
                except FileNotFoundError:
                    pass
                continue
            if not pid:
                continue  # being written right now by its creator: look again
            return False


def dead_markers(det: str, prefix: str) -> list:
    out = []
    for n in os.listdir(det):
        if n.startswith(prefix):
            try:
                pid = int(n.split(".")[1])
            except (IndexError, ValueError):
                continue
            if alive(pid):
                out.append(n)
            else:
                try:
                    os.unlink(os.path.join(det, n))
                except FileNotFoundError:
                    pass
    return out


def main() -> None:
    lockdir, det, kind, cycles, slots = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    rng = random.Random(os.getpid())
    me = os.getpid()
    for _cycle in range(cycles):
        mode = kind
        if kind == "mixed":
            mode = "exclusive" if rng.random() < 0.3 else "shared"
        lock = hostlock.Lock("stress", mode=mode if kind != "sem" else "exclusive", slots=slots, directory=lockdir,
                             fifo=os.environ.get("STRESS_FIFO", "1") == "1")
        with lock:
            if kind == "sem":
                mine = "S.%d" % me
                open(os.path.join(det, mine), "w").close()
                inside = dead_markers(det, "S.")
                if len(inside) > slots:
                    print("OVERLAP semaphore", inside, flush=True)
                    sys.exit(3)
                os.unlink(os.path.join(det, mine))
            elif mode == "exclusive":
                if not enter(det, "W"):
                    print("OVERLAP two writers", flush=True)
                    sys.exit(3)
                if dead_markers(det, "R."):
                    print("OVERLAP writer beside reader", flush=True)
                    sys.exit(3)
                if rng.random() < 0.05:
                    os.sched_yield()
                os.unlink(os.path.join(det, "W"))
            else:
                mine = "R.%d" % me
                open(os.path.join(det, mine), "w").close()
                if os.path.exists(os.path.join(det, "W")) and enter(det, "W"):
                    os.unlink(os.path.join(det, "W"))  # it was a dead writer's marker
                elif os.path.exists(os.path.join(det, "W")):
                    print("OVERLAP reader beside writer", flush=True)
                    sys.exit(3)
                os.unlink(os.path.join(det, mine))
        lock.close()
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
