"""`path:` on hostlock.core.lock and hostlock.core.locked: flock(1)'s own lock on a file, tested both ways
against the real /usr/bin/flock, over the local connection and real SSH.

Every wait is on an event: the playbook's shell steps write a line (with its `date +%s.%N`) and hold until
the test creates their gate file; the test finds a blocked lock request in /proc/locks. Timestamps prove
that the task and the flock(1) job never overlap.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from harness import wait_for as _wait_for

FLOCK = shutil.which("flock") or "/usr/bin/flock"
pytestmark = pytest.mark.skipif(not os.access(FLOCK, os.X_OK), reason="util-linux flock(1) not installed")

STEP = 'echo "{word} $$ $(date +%s.%N)" >> {events}; while [ ! -e {gate} ]; do sleep 0.02; done; ' \
       'echo "{word}-end $$ $(date +%s.%N)" >> {events}'


def _events(path: Path) -> dict[str, float]:
    found = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        word, _pid, when = line.split()[:3]
        found[word] = float(when)
    return found


def _blocked_on(path: Path) -> bool:
    """Whether a lock request waits on the file (a '->' line of /proc/locks for its inode)."""
    from hostlock.host import proclocks as _proclocks

    try:
        st = os.stat(path)
    except OSError:
        return False
    return any(lk.waiting for lk in _proclocks.locks_on(st.st_dev, st.st_ino))


def _flock_n(path: Path) -> int:
    return subprocess.run([FLOCK, "-n", str(path), "true"], check=False).returncode


def _host(ansible, target: str) -> str:
    return "loc" if target == "local" else "ssh1"


def _start(ansible, playbook_text: str, name: str) -> subprocess.Popen:
    playbook = ansible.work / f"{name}.yml"
    playbook.write_text(playbook_text)
    return ansible.popen(str(playbook), HOSTLOCK_TEST_RECORD=str(ansible.work / f"{name}.record.json"))


def _finish(proc: subprocess.Popen) -> str:
    out, _err = proc.communicate(timeout=180)
    assert proc.returncode == 0, out
    return out


@pytest.mark.parametrize("target", ["local", "ssh"])
def test_locked_path_waits_for_a_flock_job_and_flock_waits_for_it(ansible, tmp_path, target):
    """A flock(1) holder makes the `locked` task wait; while the task runs, `flock -n FILE true` fails with 1
    and a waiting `flock FILE` job starts only after the task's work ended."""
    lockfile, events = tmp_path / "shared.lock", tmp_path / "events"
    g_job, g_task = tmp_path / "gate-job", tmp_path / "gate-task"
    job = subprocess.Popen([FLOCK, str(lockfile), "sh", "-c", STEP.format(word="job", events=events, gate=g_job)])
    proc = after = None
    try:
        _wait_for(lambda: "job" in _events(events), "the flock(1) job to hold the file")
        proc = _start(ansible, f"""
- hosts: {_host(ansible, target)}
  gather_facts: false
  tasks:
    - name: Work under flock(1)'s lock on the file
      hostlock.core.locked:
        path: {lockfile}
        task:
          ansible.builtin.shell: '{STEP.format(word="task", events=events, gate=g_task)}'
""", f"locked-path-{target}")
        _wait_for(lambda: _blocked_on(lockfile), "the task to wait for the flock(1) job", proc=proc)
        assert "task" not in _events(events), "the task ran while flock(1) held the file"
        g_job.touch()
        assert job.wait(timeout=60) == 0
        _wait_for(lambda: "task" in _events(events), "the task to run once flock(1) let go", proc=proc)
        assert _flock_n(lockfile) == 1, "flock -n got the file while the task holds it"
        after = subprocess.Popen([FLOCK, str(lockfile), "sh", "-c",
                                  f'echo "after $$ $(date +%s.%N)" >> {events}'])
        _wait_for(lambda: _blocked_on(lockfile), "a flock(1) job to wait for the task")
        assert "after" not in _events(events)
        g_task.touch()
        _finish(proc)
        assert after.wait(timeout=60) == 0
    finally:
        g_job.touch()
        g_task.touch()
        for p in (job, proc, after):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    got = _events(events)
    assert list(got) == ["job", "job-end", "task", "task-end", "after"], got
    assert got["job-end"] <= got["task"] and got["task-end"] <= got["after"], got
    assert _flock_n(lockfile) == 0, "the lock was kept after the task"


@pytest.mark.parametrize("target", ["local", "ssh"])
def test_lock_path_lease_excludes_flock_jobs(ansible, tmp_path, target):
    """A `lock` lease on a path (taken, renewed, released; then a heartbeat lease) holds flock(1)'s lock:
    `flock -n FILE true` fails with 1 while it is held and succeeds after the release; a flock(1) holder
    makes the lease task wait (conflict with timeout 0, naming the holder). Bad combinations fail."""
    lockfile, busyfile, events = tmp_path / "lease.lock", tmp_path / "busy.lock", tmp_path / "events"
    gates = {n: tmp_path / f"gate-{n}" for n in ("held", "released", "beat", "busy")}
    busy = subprocess.Popen([FLOCK, str(busyfile), "sh", "-c",
                             STEP.format(word="busy", events=events, gate=gates["busy"])])
    proc = None

    def step(word: str) -> str:
        return STEP.format(word=word, events=events, gate=gates[word])

    try:
        _wait_for(lambda: "busy" in _events(events), "the flock(1) job to hold the busy file")
        proc = _start(ansible, f"""
- hosts: {_host(ansible, target)}
  gather_facts: false
  tasks:
    - name: Take a lease on the file
      hostlock.core.lock:
        path: {lockfile}
        lease: 60
      register: taken
    - name: Hold while the test tries flock -n
      ansible.builtin.shell: '{step("held")}'
    - name: Renew the lease
      hostlock.core.lock:
        path: {lockfile}
        lease: 120
        token: "{{{{ taken.token }}}}"
    - name: Release the lease
      hostlock.core.lock:
        path: {lockfile}
        state: released
        token: "{{{{ taken.token }}}}"
    - name: After the release
      ansible.builtin.shell: '{step("released")}'
    - name: Take a heartbeat lease on the file
      hostlock.core.lock:
        path: {lockfile}
        heartbeat: true
        lease: 8
      register: beat
    - name: Hold across renewals
      ansible.builtin.shell: '{step("beat")}'
    - name: Release the heartbeat lease
      hostlock.core.lock:
        path: {lockfile}
        state: released
        token: "{{{{ beat.token }}}}"
    - name: A file flock(1) holds
      hostlock.core.lock:
        path: {busyfile}
        lease: 60
        timeout: 0
      ignore_errors: true
    - name: Check mode on the busy file
      hostlock.core.lock:
        path: {busyfile}
        lease: 60
      check_mode: true
    - name: Locked in check mode on the busy file
      hostlock.core.locked:
        path: {busyfile}
        task:
          ansible.builtin.command: 'true'
      check_mode: true
    - name: Name and path
      hostlock.core.lock:
        name: x
        path: {lockfile}
        lease: 60
      ignore_errors: true
    - name: Slots on a path
      hostlock.core.lock:
        path: {lockfile}
        lease: 60
        slots: 2
      ignore_errors: true
    - name: A relative path
      hostlock.core.lock:
        path: relative.lock
        lease: 60
      ignore_errors: true
    - name: A lock directory that cannot be made
      hostlock.core.lock:
        name: x
        directory: {tmp_path}/missing/deeper/locks
        lease: 60
      ignore_errors: true
    - name: A locked directory that cannot be made
      hostlock.core.locked:
        name: x
        directory: {tmp_path}/missing/deeper/locks
        task:
          ansible.builtin.command: 'true'
      ignore_errors: true
    - name: Locked with slots on a path
      hostlock.core.locked:
        path: {lockfile}
        slots: 2
        task:
          ansible.builtin.command: 'true'
      ignore_errors: true
""", f"lease-path-{target}")
        _wait_for(lambda: "held" in _events(events), "the lease's first step", proc=proc)
        assert _flock_n(lockfile) == 1, "flock -n got the file while the lease holds it"
        gates["held"].touch()
        _wait_for(lambda: "released" in _events(events), "the release", proc=proc)
        assert _flock_n(lockfile) == 0, "the released lease still holds the file"
        gates["released"].touch()
        _wait_for(lambda: "beat" in _events(events), "the heartbeat lease's step", proc=proc)
        assert _flock_n(lockfile) == 1, "flock -n got the file while the heartbeat lease holds it"
        # Renewed, not just taken: 2.5 leases of 8 s later the file is still held (a renewal that missed
        # the path would have let the lease run out). A lower bound on time, never an upper one.
        started = _events(events)["beat"]
        _wait_for(lambda: time.time() > started + 20, "two and a half leases to pass", limit=60, proc=proc)
        assert _flock_n(lockfile) == 1, "the heartbeat lease on the file ran out: its renewals did not reach it"
        gates["beat"].touch()
        out = _finish(proc)
    finally:
        for g in gates.values():
            g.touch()
        for p in (busy, proc):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    host = _host(ansible, target)
    record = ansible.work / f"lease-path-{target}.record.json"
    assert record.exists(), out
    r = {task: hosts[host] for task, hosts in json.loads(record.read_text()).items()}
    taken = r["Take a lease on the file"]
    assert taken["acquired"] and taken["path"] == str(lockfile) and taken["token"], taken
    assert r["Renew the lease"]["hostlock"]["event"] == "renewed", r["Renew the lease"]
    assert r["Release the lease"]["changed"], r["Release the lease"]
    conflict = r["A file flock(1) holds"]
    # named: the flock(1) job's processes (flock and the shell it runs, both holding the descriptor)
    assert conflict["_status"] == "failed" and f"pid {busy.pid}" in conflict["msg"], conflict
    assert f"hostlock status --path {busyfile}" in conflict["msg"], conflict
    check = r["Check mode on the busy file"]
    assert check["free"] is False and f"pid {busy.pid}" in check["msg"], check
    checked = r["Locked in check mode on the busy file"]["hostlock"]
    assert checked["free"] is False and checked["taken"] is False and checked["path"] == str(busyfile), checked
    assert any(h["pid"] == busy.pid for h in checked["holders"]), checked
    assert "mutually exclusive" in r["Name and path"]["msg"], r["Name and path"]
    assert "slots does not apply to a path lock" in r["Slots on a path"]["msg"], r["Slots on a path"]
    assert "path must be absolute" in r["A relative path"]["msg"], r["A relative path"]
    assert "slots does not apply to a path lock" in r["Locked with slots on a path"]["msg"]
    for task in ("A lock directory that cannot be made", "A locked directory that cannot be made"):
        msg = r[task]["msg"]  # the module's users set its directory: option, not the command's HOSTLOCK_DIR
        assert r[task]["_status"] == "failed" and "directory: option" in msg and "HOSTLOCK_DIR" not in msg, msg
    assert _flock_n(lockfile) == 0
