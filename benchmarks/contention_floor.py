"""Where fifo=False's contended throughput goes: hostlock against a bare barging lock with the same writes.

A one-off ablation behind the "Where the contended gap goes" paragraph of docs/benchmarks.md (not part of
`make bench-engine`): in one run, blocking flock; a bare OFD lock that barges (SETLK, else a plain kernel
SETLKW: no queue) and makes hostlock's two record writes (the owner record after taking, its blanking
before releasing); the same without the writes; and hostlock.Lock(fifo=False). What separates the bare lock
with writes from hostlock is the queue that bounds hostlock's worst wait.

    .venv/bin/python benchmarks/contention_floor.py [RUNS]     # default 5; medians of the ratios to flock
"""

from __future__ import annotations

import argparse
import fcntl
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

from engine import (
    F_OFD_SETLK,
    F_OFD_SETLKW,
    OFD_UNLCK,
    OFD_WRLCK,
    AnyLock,
    BlockingFlock,
    contend,
    make_hostlock_barging,
)

RECORD = b"hostlock1|pid=%d|start=123456789|boot=0123456789abcdef0123456789abcdef|host=bench|uid=0|at=%.6f\n"
RECORD_AT = 4096  # where hostlock's first record lives


class BareBarging:
    """Take the lock if free, else sleep in the kernel for it; optionally hostlock's two record writes."""

    def __init__(self, directory: str, name: str, writes: bool) -> None:
        self.fd = os.open(os.path.join(directory, name + ".bare"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self.writes = writes

    def acquire(self) -> None:
        try:
            fcntl.fcntl(self.fd, F_OFD_SETLK, OFD_WRLCK)
        except OSError:
            fcntl.fcntl(self.fd, F_OFD_SETLKW, OFD_WRLCK)
        if self.writes:
            os.pwrite(self.fd, RECORD % (os.getpid(), time.time()), RECORD_AT)

    def release(self) -> None:
        if self.writes:
            os.pwrite(self.fd, b"\n", RECORD_AT)
        fcntl.fcntl(self.fd, F_OFD_SETLK, OFD_UNLCK)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="?", type=int, default=5, help="runs; medians of the ratios to flock (default 5)")
    runs = ap.parse_args(argv).runs
    rows: dict[str, list[float]] = {}
    candidates: dict[str, Callable[[str, str], AnyLock]] = {
        "bare barging OFD, no writes": lambda d, n: BareBarging(d, n, writes=False),
        "bare barging OFD + 2 record writes": lambda d, n: BareBarging(d, n, writes=True),
        "hostlock.Lock(fifo=False)": make_hostlock_barging,
    }
    for _i in range(runs):
        with tempfile.TemporaryDirectory() as d:
            flock = contend(BlockingFlock, d, 4, 2000, 50_000)[0]
            for label, factory in candidates.items():
                rows.setdefault(label, []).append(contend(factory, d, 4, 2000, 50_000)[0] / flock)
    print(f"4 processes x 2000 cycles, 50 us held; x blocking flock, median of {runs} runs (each run: all rows)")
    for label, ratios in rows.items():
        print(f"  {label:40} {statistics.median(ratios):.2f}x  ({', '.join(f'{r:.2f}' for r in ratios)})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
