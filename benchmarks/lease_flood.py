"""The owner's release latency of a lease, alone and while another user floods its control socket (issue 8).

Rows, interleaved round by round so machine noise hits each alike (needs root, setpriv and /usr/bin/python3;
the attacker runs as uid 65534):
  - quiet: nobody else connects;
  - 500 idle: another user opened 500 connections to the holder (and holds them) just before the release;
  - connect loop: two processes of another user connect and hang up in a tight loop during the release.
Each sample is one hostlock.release() call on a fresh lease (hold() is not timed). Figures for the issue's
note, never asserted:

    .venv/bin/python benchmarks/lease_flood.py [--rounds N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "plugins", "module_utils"))
import hostlock  # noqa: E402 - path set up just above

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-I", "-c"]
# The holder's socket is the file .lease-ID.sock (mode 0600) in the lock directory: another user's connects
# are refused by the kernel (EACCES), so these attackers cost the holder nothing; they still try.
IDLE = r"""
import socket, sys
keep = []
for _ in range(500):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(sys.argv[1])
    except OSError:
        s.close()
        continue
    keep.append(s)
print("READY", flush=True)
sys.stdin.read()
"""
LOOP = r"""
import socket, sys
print("READY", flush=True)
while True:
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(sys.argv[1])
    except OSError:
        pass
    s.close()
"""


def _start(code: str, address: str) -> subprocess.Popen:
    p = subprocess.Popen(NOBODY + [code, address], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "READY"
    return p


def one(kind: str, d: str) -> float:
    token = hostlock.hold("bench", lease=600, directory=d)
    address = os.path.join(d, ".lease-%s.sock" % token.split(".")[0])
    attackers = []
    if kind == "500 idle":
        attackers = [_start(IDLE, address)]
    elif kind == "connect loop":
        attackers = [_start(LOOP, address), _start(LOOP, address)]
    try:
        t0 = time.perf_counter()
        hostlock.release("bench", token, d)
        return time.perf_counter() - t0
    finally:
        for p in attackers:
            p.kill()
            p.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    kinds = ["quiet", "500 idle", "connect loop"]
    samples: dict = {k: [] for k in kinds}
    with tempfile.TemporaryDirectory() as d:
        os.chmod(d, 0o755)  # the attacker reaches the socket file (and is refused by its mode)
        for _round in range(args.rounds):
            for k in kinds:
                samples[k].append(one(k, d))
    print("| owner's release (%d rounds) | median ms | p90 ms | max ms |" % args.rounds)
    print("| --- | --- | --- | --- |")
    for k in kinds:
        s = sorted(samples[k])
        print("| %s | %.2f | %.2f | %.2f |" % (k, statistics.median(s) * 1e3, s[int(len(s) * 0.9) - 1] * 1e3,
                                               s[-1] * 1e3))
    print("load average: %s" % " ".join(open("/proc/loadavg").read().split()[:3]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
