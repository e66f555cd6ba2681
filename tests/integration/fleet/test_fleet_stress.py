"""Mutual exclusion under stress across "controllers" that share nothing but the fleet URL.

Each contender is a separate process (fleet_stress_worker.py) with its own $HOSTLOCK_DIR and working directory,
as separate control nodes would be; the only thing between them is etcd. Overlaps are caught by detectors that
do not use the lock under test: O_EXCL markers checked live inside the critical section, and a journal of
enter/exit lines (O_APPEND, one write each) replayed here afterwards, fences included.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time

import pytest

import hostlock

WORKER = os.path.join(os.path.dirname(__file__), "fleet_stress_worker.py")
WAIT = 600.0  # bounds a hang only


def replay(journal: str, kind: str, slots: int, killed: frozenset = frozenset()) -> int:
    """Check the journal: holders never overlapped beyond the mode's rule, and fences ordered as arrival order
    requires. Returns the number of critical sections seen. A pid in `killed` that entered and never left
    counts as gone once anyone enters after it (its lease had to end first: the live detector checks that)."""
    inside: dict = {}  # pid -> (mode, fence)
    fences: set = set()
    top_any = top_writer = 0
    entered = 0
    with open(journal) as f:
        for n, line in enumerate(f, 1):
            what, pid, mode, fence_text = line.split()
            fence = int(fence_text)
            if what == "exit":
                assert inside.pop(pid) == (mode, fence), "line %d: exit without its enter" % n
                continue
            entered += 1
            for gone in [p for p in inside if int(p) in killed]:
                del inside[gone]
            assert fence > 0 and fence not in fences, "line %d: fence %d given twice" % (n, fence)
            fences.add(fence)
            modes = [m for m, _f in inside.values()]
            if kind == "slots":
                assert len(modes) < slots, "line %d: %d slot holders inside already" % (n, len(modes))
            elif mode == "exclusive":
                assert not modes, "line %d: a writer entered beside %s" % (n, inside)
                # Arrival order: a writer holds only once every earlier key is gone.
                assert fence > top_any, "line %d: writer's fence %d not above %d" % (n, fence, top_any)
                top_writer = fence
            else:
                assert "exclusive" not in modes, "line %d: a reader entered beside a writer" % n
                assert fence > top_writer, "line %d: reader's fence %d below writer's %d" % (n, fence, top_writer)
            top_any = max(top_any, fence)
            inside[pid] = (mode, fence)
    assert all(int(p) in killed for p in inside), "holders never left: %s" % inside
    return entered


def run_controllers(urls: list, tmp_path, kind: str, cycles: int, slots: int = 1) -> None:
    """One contender per URL in `urls`, each a separate controller; all start on one signal."""
    det = tmp_path / "detector"
    det.mkdir()
    journal = tmp_path / "journal"
    journal.write_text("")
    homes = []
    procs = []
    for i, url in enumerate(urls):
        home = tmp_path / ("controller%d" % i)
        (home / "locks").mkdir(parents=True)
        homes.append(home)
        env = dict(os.environ, HOSTLOCK_DIR=str(home / "locks"), HOME=str(home), TMPDIR=str(home))
        env.pop("HOSTLOCK_FLEET", None)
        procs.append(subprocess.Popen(
            [sys.executable, WORKER, url, str(det), str(journal), kind, str(cycles), str(slots)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
            cwd=str(home)))
    outs = []
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready", p.stderr.read()
        for p in procs:  # all start together: as close to one moment as a line on each pipe gets
            p.stdin.write("go\n")
            p.stdin.flush()
        outs = [p.communicate(timeout=WAIT) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (out, err) in zip(procs, outs):  # noqa: B905 - runs on Python 3.8 too
        assert "OVERLAP" not in out, out
        assert p.returncode == 0 and "DONE" in out, (p.returncode, out, err)
    assert replay(str(journal), kind, slots) == len(procs) * cycles
    for home in homes:  # a fleet lock touches no lock directory
        assert os.listdir(str(home / "locks")) == []


@pytest.mark.parametrize("kind,slots", [("exclusive", 1), ("mixed", 1), ("slots", 3)])
def test_controllers_sharing_only_the_fleet_url_never_overlap(etcd, tmp_path, kind, slots):
    run_controllers([etcd.url] * 6, tmp_path, kind, 40, slots)


@pytest.mark.parametrize("kind,slots", [("exclusive", 1), ("mixed", 1), ("slots", 2)])
def test_controllers_on_a_cluster_each_via_another_member_never_overlap(etcd_cluster, tmp_path, kind, slots):
    """Every controller lists the members in another order, so each talks to another member first: exclusion
    must come from etcd's consensus, not from one member serializing requests."""
    members = [m.endpoint for m in etcd_cluster.members]
    urls = ["etcd://" + ",".join(members[i:] + members[:i]) for i in range(3)]
    run_controllers(urls * 2, tmp_path, kind, 30, slots)


def test_the_journal_replay_catches_an_overlap(tmp_path):
    """The detector itself can fail: a writer entering beside a reader, a stale fence, too many slots."""
    bad = tmp_path / "j"
    bad.write_text("enter 1 shared 5\nenter 2 exclusive 6\nexit 2 exclusive 6\nexit 1 shared 5\n")
    with pytest.raises(AssertionError, match="writer entered beside"):
        replay(str(bad), "mixed", 1)
    bad.write_text("enter 1 exclusive 7\nexit 1 exclusive 7\nenter 2 exclusive 6\nexit 2 exclusive 6\n")
    with pytest.raises(AssertionError, match="not above"):
        replay(str(bad), "exclusive", 1)
    bad.write_text("enter 1 exclusive 7\nenter 2 exclusive 8\nenter 3 exclusive 9\n")
    with pytest.raises(AssertionError, match="slot holders inside"):
        replay(str(bad), "slots", 2)
    good = tmp_path / "g"
    good.write_text("enter 1 shared 5\nenter 2 shared 6\nexit 1 shared 5\nexit 2 shared 6\n"
                    "enter 3 exclusive 7\nexit 3 exclusive 7\n")
    assert replay(str(good), "mixed", 1) == 3


def test_holders_sigkilled_at_random_points_never_give_two_holders(etcd, tmp_path):
    """Contenders are SIGKILLed at random moments (waiting, inside, acquiring, releasing) and replaced: a killed
    holder's lock passes on only when its lease ends (TTL 2 s), and never while it could still act."""
    det = tmp_path / "detector"
    det.mkdir()
    journal = tmp_path / "journal"
    journal.write_text("")
    killed_file = tmp_path / "killed"
    killed_file.write_text("")
    env = dict(os.environ, STRESS_KILLED=str(killed_file), STRESS_TTL="2")
    rng = random.Random(11)

    def start() -> subprocess.Popen:
        home = tmp_path / ("controller-%d" % rng.randrange(1 << 30))
        (home / "locks").mkdir(parents=True)
        p = subprocess.Popen([sys.executable, WORKER, etcd.url, str(det), str(journal), "exclusive", "100000", "1"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=dict(env, HOSTLOCK_DIR=str(home / "locks")), cwd=str(home))
        assert p.stdout.readline().strip() == "ready", p.stderr.read()
        p.stdin.write("go\n")
        p.stdin.flush()
        return p

    def lines() -> int:
        with open(str(journal)) as f:
            return sum(1 for _line in f)

    def kill(p: subprocess.Popen) -> None:
        with open(str(killed_file), "a") as f:
            f.write("%d\n" % p.pid)  # named before the kill: its markers are a dead holder's from now on
        p.kill()
        out, err = p.communicate(timeout=WAIT)
        assert "OVERLAP" not in out, out

    procs = [start() for _i in range(4)]
    kills = 0
    try:
        while kills < 6:
            seen = lines()
            deadline = time.monotonic() + WAIT
            while lines() < seen + 4:  # the lock moves on after the last kill (a lease had to end): an event
                assert time.monotonic() < deadline, "no progress after %d kills" % kills
                assert all(p.poll() is None for p in procs), [p.communicate() for p in procs if p.poll() is not None]
                time.sleep(0.02)
            time.sleep(rng.uniform(0, 0.05))  # fault injection: a random moment in the cycle, not a wait
            victim = rng.randrange(len(procs))
            if kills % 2 == 0:  # every other kill aims at the holder of the moment, as etcd names it
                holders = [h.pid for h in hostlock.status("stress", fleet=etcd.url).holders]
                victim = next((i for i, p in enumerate(procs) if p.pid in holders), victim)
            kill(procs[victim])
            kills += 1
            procs[victim] = start()
    finally:
        for p in procs:
            if p.poll() is None:
                kill(p)
    killed = frozenset(int(x) for x in killed_file.read_text().split())
    assert replay(str(journal), "exclusive", 1, killed) > 6
