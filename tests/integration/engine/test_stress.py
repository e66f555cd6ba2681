"""Many real processes contending, with an independent overlap detector (see stress_worker.py)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest

WORKER = os.path.join(os.path.dirname(__file__), "stress_worker.py")


def run_workers(lockdir, det, kind, n, cycles, slots=1, env=None):
    procs = [subprocess.Popen([sys.executable, WORKER, lockdir, det, kind, str(cycles), str(slots)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for _i in range(n)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert len(outs) == len(procs)
    for p, (out, err) in zip(procs, outs):  # noqa: B905 - runs on Python 3.8 too (make test-pythons)
        assert "OVERLAP" not in out, out
        assert p.returncode == 0 and "DONE" in out, (p.returncode, out, err)


@pytest.mark.parametrize("kind,slots", [("exclusive", 1), ("mixed", 1), ("sem", 3)])
def test_kernel_stress_8_processes(mechdir, tmp_path, kind, slots):
    mech = os.path.basename(mechdir)
    cycles = {"ofd": 1500, "flock": 800, "record": 120}[mech]
    det = tmp_path / "det"
    det.mkdir()
    run_workers(mechdir, str(det), kind, 8, cycles, slots)


@pytest.mark.parametrize("kind", ["exclusive", "mixed"])
def test_barging_switch_still_excludes(lockdir, tmp_path, kind):
    """fifo=False lets newcomers overtake a fresh first waiter: order changes, exclusion must not."""
    det = tmp_path / "det"
    det.mkdir()
    run_workers(lockdir, str(det), kind, 8, 1500, env=dict(os.environ, STRESS_FIFO="0"))


def test_sigkill_at_random_points_never_gives_two_holders(mechdir, tmp_path):
    """Workers are SIGKILLed at random moments (inside and outside the lock) and replaced."""
    mech = os.path.basename(mechdir)
    det = tmp_path / "det"
    det.mkdir()
    cycles = 100000 if mech != "record" else 5000
    rng = random.Random(7)

    killed = tmp_path / "killed"
    killed.write_text("")
    env = dict(os.environ, STRESS_KILLED=str(killed))

    def start():
        return subprocess.Popen([sys.executable, WORKER, mechdir, str(det), "exclusive", str(cycles), "1"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)

    procs = [start() for _i in range(6)]
    kills = 0
    deadline = time.monotonic() + 8
    try:
        while time.monotonic() < deadline:
            time.sleep(rng.uniform(0.05, 0.3))
            victim = rng.randrange(len(procs))
            if procs[victim].poll() is None:
                with open(killed, "a") as f:
                    f.write("%d\n" % procs[victim].pid)  # named before the kill: see stress_worker.alive
                procs[victim].send_signal(signal.SIGKILL)
                kills += 1
            out, err = procs[victim].communicate()
            assert "OVERLAP" not in out, out
            procs[victim] = start()
    finally:
        with open(killed, "a") as f:
            f.write("".join("%d\n" % p.pid for p in procs))
        for p in procs:
            p.kill()
        for p in procs:
            out = p.communicate()[0]
            assert "OVERLAP" not in out, out
    assert kills >= 10


def test_killed_holder_frees_the_lock(mechdir):
    from engine_helpers import spawn, wait_line

    import hostlock

    holder = spawn("""
        import sys, time, hostlock
        lock = hostlock.Lock("k", directory=sys.argv[1]).acquire()
        print("held", flush=True)
        time.sleep(60)
    """, mechdir)
    wait_line(holder, "held")
    waiter = hostlock.Lock("k", directory=mechdir)
    with pytest.raises(hostlock.LockTimeout):
        waiter.acquire(timeout=0)
    holder.kill()
    holder.wait()
    # Kernel locks are free at once; the record mechanism frees as soon as the owner is proven dead.
    waiter.acquire(timeout=0 if os.path.basename(mechdir) != "record" else 2)
    waiter.release()
