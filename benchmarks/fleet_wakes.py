"""Wakes per release of a fleet lock: the watch events etcd sends (its etcd_debugging_mvcc_events_total
counter) per release, with N waiter processes queued on one exclusive lock and served in turn.

A waiter watches only the key whose deletion can admit it (etcd's waitDeletes), so each release should send
one event, to the one waiter it admits; a waiter that watched the whole name got one per waiter still queued.

    .venv/bin/python benchmarks/fleet_wakes.py [N]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "plugins", "module_utils"), os.path.join(HERE, "..", "tests")]

import fleet_etcd  # noqa: E402 - tests/ on the path above

import hostlock  # noqa: E402

WAITER = "import sys, hostlock\nlock = hostlock.Lock('w', fleet=sys.argv[1])\nlock.acquire()\nlock.release()\n"


def events_sent(endpoint: str) -> float:
    with urllib.request.urlopen("http://%s/metrics" % endpoint, timeout=10) as r:
        text = r.read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("etcd_debugging_mvcc_events_total"))


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    member = fleet_etcd.start_etcd(tempfile.mkdtemp())
    try:
        env = dict(os.environ, PYTHONPATH=os.path.join(HERE, "..", "plugins", "module_utils"))
        holder = hostlock.Lock("w", fleet=member.url)
        holder.acquire()
        procs = []
        for i in range(n):
            procs.append(subprocess.Popen([sys.executable, "-c", WAITER, member.url], env=env))
            while len(member.etcdctl("get", "--prefix", "hostlock/w/", "--keys-only").stdout.split()) < i + 2:
                time.sleep(0.01)  # queued in this order
        before = events_sent(member.endpoint)
        holder.release()
        for p in procs:
            if p.wait(timeout=120) != 0:
                raise RuntimeError("a waiter failed")
        sent = events_sent(member.endpoint) - before
        print("%d waiters, %d releases: %d watch events sent, %.2f per release" % (n, n + 1, sent, sent / (n + 1)))
    finally:
        member.stop()


if __name__ == "__main__":
    main()
