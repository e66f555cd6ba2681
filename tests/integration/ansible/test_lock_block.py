"""Issue 9: a block (with an include_tasks) under one hostlock.core.lock lease kept alive by the run's heartbeat.

Real ansible-playbook runs over local and the harness's sshd. Every wait is on an event: the work holds
until the test creates its gate file, and the test waits for event lines, lock records and processes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from harness import held_while_it_runs, hostlock_cli
from harness import wait_for as _wait_for

# The next job, through the host's CLI: records when it started and whether the block's work still ran.
NEXT = (
    "import sys, time\n"
    "try:\n    state = open('/proc/%s/stat' % sys.argv[2]).read().rpartition(')')[2].split()[0]\n"
    "except OSError:\n    state = 'gone'\n"
    "word = 'next' if state in ('gone', 'Z', 'X') else 'next-overlap'\n"
    "open(sys.argv[1], 'a').write('%s %d %.9f\\n' % (word, 0, time.time()))\n"
)


def _events(path: Path) -> dict[str, tuple[int, float]]:
    found = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        word, pid, when = line.split()[:3]
        found[word] = (int(pid), float(when))
    return found


def _live(engine, ansible, lock: str) -> list:
    return [h for h in engine.holders(lock, directory=str(ansible.lockdir)) if not h.stale]


def _heartbeats() -> set[str]:
    """The lease ids of the heartbeats running on this machine (the control node): their abstract sockets
    are named @hostlock-heartbeat/ID.PROOF."""
    names = set()
    with open("/proc/net/unix") as f:
        for line in f.read().splitlines()[1:]:
            parts = line.split()
            if len(parts) >= 8 and parts[7].startswith("@hostlock-heartbeat/"):
                names.add(parts[7].rpartition("/")[2].partition(".")[0])
    return names


# The same work under one lock, written two ways: the block pattern by hand, and the hostlock.core.with_lock
# role (one task). Every guarantee below is tested for both.
BOOKS = ["lock_block.yml", "with_lock.yml"]


def _start(ansible, book: str, target: str, lock: str, events: Path, gate: Path, lease: float = 60) -> subprocess.Popen:
    evars = dict(target=target, lock=lock, events=str(events), gate=str(gate), lease=lease)
    return ansible.popen(book, extra_vars=evars)


@pytest.mark.parametrize("book", BOOKS)
@pytest.mark.parametrize("target", ["loc", "ssh1"])
def test_block_lock_is_renewed_while_the_block_runs_and_released_after(ansible, engine, tmp_path, target, book):
    """The heartbeat keeps a short lease alive across the block's steps; the always: release ends both."""
    lock, events, gate = f"block-{target}", tmp_path / "events", tmp_path / "gate"
    proc = _start(ansible, book, target, lock, events, gate, lease=20)
    try:
        _wait_for(lambda: "in" in _events(events), "the included work to start", proc=proc)
        (holder,) = _live(engine, ansible, lock)
        first_expiry, tid = holder.lease_expires, holder.token_id
        assert tid in _heartbeats(), "no heartbeat on the control node"
        # a renewal moves the lease's end: the heartbeat is at work (every quarter lease)
        _wait_for(lambda: (_live(engine, ansible, lock) or [holder])[0].lease_expires > first_expiry,
                  "the heartbeat to renew the lease", proc=proc)
        gate.touch()
        out, _err = proc.communicate(timeout=180)
    finally:
        gate.touch()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, out
    assert not _live(engine, ansible, lock), "the release left the lock held"
    _wait_for(lambda: tid not in _heartbeats(), "the heartbeat to stop after the release")
    assert list(_events(events)) == ["first", "in", "out"], events.read_text()


@pytest.mark.parametrize("book", BOOKS)
@pytest.mark.parametrize(
    "target,sig",
    [("loc", signal.SIGKILL), ("ssh1", signal.SIGKILL), ("loc", signal.SIGTERM), ("ssh1", signal.SIGINT)],
    ids=["local-SIGKILL", "ssh-SIGKILL", "local-SIGTERM", "ssh-SIGINT"],
)
def test_killed_controller_mid_block_frees_the_lock_after_the_in_flight_work(
    ansible, engine, tmp_path, target, sig, book
):
    """The controller dies mid-block while the block's work (which ignores the signals) runs on the host.

    The heartbeat sees the run end and ends the lease at once (not after its 60 s); the holder on the host
    keeps the lock while the work carrying the block's environment mark runs; the next holder (a host job
    through `hostlock run`) starts only after that work ended: timestamps prove no overlap.
    """
    lock, events, gate = f"killed-{target}-{sig.name.lower()}", tmp_path / "events", tmp_path / "gate"
    proc = _start(ansible, book, target, lock, events, gate)
    nxt = None
    try:
        work_pid = _wait_for(lambda: _events(events).get("in", (0,))[0], "the included work to start", proc=proc)
        (holder,) = _live(engine, ansible, lock)
        tid = holder.token_id
        os.kill(proc.pid, sig)  # the ansible-playbook process only, as `kill PID` at a shell prompt does
        proc.communicate(timeout=120)
        # the run is gone: its heartbeat ended the lease, and the holder now waits for the in-flight work
        _wait_for(lambda: [h for h in _live(engine, ansible, lock) if "in-flight" in (h.job_cmdline or "")],
                  "the holder to wait for the in-flight work after the heartbeat ended the lease")
        _wait_for(lambda: tid not in _heartbeats(), "the heartbeat to exit with its run")
        assert Path(f"/proc/{work_pid}").exists() and "out" not in _events(events), "the work must still run"
        nxt = subprocess.Popen([*hostlock_cli(), "run", "-w", "120", "-d", str(ansible.lockdir), lock,
                                sys.executable, "-c", NEXT, str(events), str(work_pid)])
        _wait_for(lambda: engine.status(lock, directory=str(ansible.lockdir)).waiters > 0 or nxt.poll() is not None,
                  "the next job to wait for the lock")
        assert nxt.poll() is None and "next" not in _events(events), "the next job ran beside the work"
        gate.touch()
        assert nxt.wait(timeout=120) == 0
    finally:
        gate.touch()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if nxt is not None and nxt.poll() is None:
            nxt.kill()
    got = _events(events)
    print(f"\n{target}, controller killed with {sig.name} mid-block: " +
          ", ".join(f"{w} +{t - got['in'][1]:.3f}s" for w, (_p, t) in sorted(got.items(), key=lambda kv: kv[1][1])))
    assert list(got) == ["first", "in", "out", "next"], events.read_text()
    assert got["next"][1] >= got["out"][1], "the next holder started before the killed run's work ended"
    _wait_for(lambda: not _live(engine, ansible, lock), "the lock to be free")


@pytest.mark.parametrize("book", BOOKS)
def test_dropped_connection_frees_the_lock_after_the_lease_and_the_work(ansible, engine, tmp_path, book):
    """sshd and its session daemons die mid-block: renewals cannot reach the host, the lease runs out on its
    own, and the lock is still kept until the block's work on the host has ended."""
    from harness import Sshd

    server = Sshd(tmp_path / "sshd-broken").start()
    lock, events, gate = "dropped", tmp_path / "events", tmp_path / "gate"
    proc = None
    try:
        ansible.inventory.write_text("[ssh]\n" + server.inventory_line("broken", ansible.python) + "\n")
        proc = _start(ansible, book, "broken", lock, events, gate, lease=4)
        work_pid = _wait_for(lambda: _events(events).get("in", (0,))[0], "the included work to start", proc=proc)
        server.drop_connections()
        proc.communicate(timeout=120)
        _wait_for(lambda: [h for h in _live(engine, ansible, lock) if "in-flight" in (h.job_cmdline or "")],
                  "the lease to run out and its holder to wait for the in-flight work")
        assert Path(f"/proc/{work_pid}").exists() and _live(engine, ansible, lock)
        gate.touch()
        _wait_for(lambda: not _live(engine, ansible, lock), "the lock to be free after the work")
        assert "out" in _events(events)
    finally:
        gate.touch()
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        server.stop(sessions=True)


TIMED_OUT_BLOCK = """\
- hosts: {target}
  gather_facts: false
  tasks:
    - name: Work under the lock, one step of which its timeout ends
      environment: "{{{{ block_lock.environment | default({{}}) }}}}"
      block:
        - name: Take the lock
          hostlock.core.lock:
            name: {lock}
            heartbeat: true
            lease: 60
            directory: "{{{{ lockdir }}}}"
          register: block_lock
          no_log: true
        - name: A step Ansible gives up on while its command runs on
          ansible.builtin.command:
            argv: [/bin/sh, -c, '{work}']
          timeout: 15
      always:
        - name: Release the lock
          hostlock.core.lock:
            name: {lock}
            state: released
            token: "{{{{ block_lock.token }}}}"
            directory: "{{{{ lockdir }}}}"
          when: block_lock.token is defined
          register: released
        - name: Say what the release said
          ansible.builtin.debug:
            msg: "RELEASED {{{{ released.msg | default('') }}}}"
"""


@pytest.mark.parametrize("target", ["loc", "ssh1"])
def test_a_release_after_a_step_its_timeout_ended_waits_for_that_steps_work(ansible, engine, tmp_path, target):
    """Ansible's `timeout:` ends a step of the block on the controller while its command runs on, on the host
    (as without the lock); the block's `always:` release then comes while that work carries the lease's mark.
    The lease must end after that work, not free the lock beside it (it did: a host job ran beside it)."""
    lock = f"timed-out-block-{target}"
    events, gate = tmp_path / "events", tmp_path / "gate"
    work = (f'echo "in $$ $(date +%s.%N)" >> {events}; while [ ! -e {gate} ]; do sleep 0.02; done; '
            f'echo "out $$ $(date +%s.%N)" >> {events}')
    playbook = ansible.work / f"{lock}.yml"
    playbook.write_text(TIMED_OUT_BLOCK.format(target=target, lock=lock, work=work))
    directory = str(ansible.lockdir)
    proc = nxt = None
    try:
        proc = ansible.popen(str(playbook))
        work_pid = _wait_for(lambda: _events(events).get("in", (0, 0))[0], "the step's work to start", proc=proc)
        out, _err = proc.communicate(timeout=120)
        assert "Timed out" in out and "RELEASED released lock" in out, out
        if held_while_it_runs(directory, lock, work_pid, "the timed-out step's work", out):
            assert "still run here, and the lock is held until they end" in out, out
        nxt = subprocess.Popen([*hostlock_cli(), "run", "-w", "180", "-d", directory, lock,
                                sys.executable, "-c", NEXT, str(events), str(work_pid)])
        _wait_for(lambda: engine.status(lock, directory=directory).waiters > 0 or nxt.poll() is not None,
                  "the next job to wait for the lock")
        gate.touch()
        assert nxt.wait(timeout=180) == 0
        assert "next-overlap" not in _events(events), events.read_text()
        assert "next" in _events(events), events.read_text()
        _wait_for(lambda: not _live(engine, ansible, lock), "the lock to be free at the end")
    finally:
        gate.touch()
        for p in (proc, nxt):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
