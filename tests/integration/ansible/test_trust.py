"""Real ansible-playbook runs against what another user on the host can write or copy (issue 39 items 2, 7, 8).

A label another user chose never makes a root run believe it holds a lock; a user a block's step runs as can
copy the lease's in-flight mark but never keeps root's lock with it; a lease whose holder cannot bind its own
socket fails the take, before the block runs anything.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from engine_helpers import LIB, SYSTEM_PYTHON, needs_users

NOBODY = 65534


@pytest.fixture
def shared(tmp_path):
    """A root:group 3770 directory as the cli role makes /run/hostlock, with uid 65534 a member."""
    import grp
    import uuid

    name = "hla%s" % uuid.uuid4().hex[:10]
    subprocess.run(["groupadd", name], check=True, capture_output=True)
    top = tempfile.mkdtemp(prefix="hostlock-ans-", dir="/tmp")
    try:
        os.chmod(top, 0o755)
        d = os.path.join(top, "locks")
        os.mkdir(d)
        gid = grp.getgrnam(name).gr_gid
        os.chown(d, 0, gid)
        os.chmod(d, 0o3770)
        yield d, gid
    finally:
        shutil.rmtree(top, ignore_errors=True)
        subprocess.run(["groupdel", name], check=False, capture_output=True)


def _as_member(gid: int, *argv: str, **kw) -> subprocess.Popen:
    return subprocess.Popen(["setpriv", "--reuid=%d" % NOBODY, "--regid=%d" % gid, "--groups=%d" % gid, *argv],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _wait(predicate, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting for " + what
        time.sleep(0.05)


def _out(run: subprocess.Popen) -> str:
    if run.poll() is None:
        run.kill()
    return run.communicate()[0]


MEMBER_HOLDS = (
    "import sys\nsys.path.insert(0, sys.argv[1])\nimport hostlock\n"
    "l = hostlock.Lock('B', directory=sys.argv[2], label=sys.argv[3]).acquire()\n"
    "print('held', flush=True)\nsys.stdin.readline()\n"
)

SAME_RUN = """
- hosts: loc
  gather_facts: false
  tasks:
    - name: Take a lease of the run
      hostlock.core.lock: {name: A, lease: 300, directory: "{{ d }}"}
      register: a
      no_log: true
    - name: Let the member copy the run's label
      ansible.builtin.shell: "touch {{ gate }}.ready; while [ ! -e {{ gate }}.go ]; do sleep 0.05; done"
      changed_when: false
    - name: Take B, which the member holds under the copied label
      FORM
      register: b
    - name: Release the run's lease
      hostlock.core.lock: {name: A, state: released, token: "{{ a.token }}", directory: "{{ d }}"}
"""

FORMS = {
    "locked": "hostlock.core.locked: {name: B, directory: \"{{ d }}\", timeout: 120, task: {ansible.builtin.command: "
              "\"true\"}}",
    "lock": "hostlock.core.lock: {name: B, lease: 60, timeout: 120, directory: \"{{ d }}\"}",
}


@needs_users
@pytest.mark.parametrize("form", sorted(FORMS))
def test_a_label_copied_from_roots_run_never_claims_it(ansible, engine, shared, form):
    """A member copies `[run ID]` from a lock root's run holds into its own label on B: root's task on B
    failed at once "held by this same playbook run (... user nobody ...)" and the play stopped. It waits."""
    d, gid = shared
    engine.Lock("B", directory=d).acquire(timeout=0).release()  # root's file (else root waits to adopt the member's)
    gate = ansible.work / "gate"
    playbook = ansible.work / "same_run.yml"
    playbook.write_text(SAME_RUN.replace("FORM", FORMS[form]))
    run = subprocess.Popen(ansible.command(str(playbook), extra_vars=dict(d=d, gate=str(gate))), cwd=ansible.work,
                           env=ansible.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    member = None
    try:
        _wait(lambda: Path(str(gate) + ".ready").exists() or run.poll() is not None, "the run's lease")
        assert run.poll() is None, _out(run)
        (a,) = [h for h in engine.holders("A", d) if h.alive]
        label = a.label
        assert label and "[run " in label, a.as_dict()
        member = _as_member(gid, SYSTEM_PYTHON, "-c", MEMBER_HOLDS, LIB, d, label)
        assert member.stdout.readline().strip() == "held", member.stderr.read()
        Path(str(gate) + ".go").touch()
        _wait(lambda: engine.status("B", d).waiters >= 1 or run.poll() is not None, "root's task to wait for B")
        assert run.poll() is None, _out(run)  # still running: it waits, it did not fail at once
        (m,) = [h for h in engine.holders("B", d) if h.alive]
        assert m.uid == NOBODY and m.label == label, m.as_dict()
        member.stdin.write("\n")
        member.stdin.flush()
        out = run.communicate(timeout=300)[0]
        assert run.returncode == 0 and "same playbook run" not in out, out
    finally:
        for p in (run, member):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


IN_FLIGHT = """
- hosts: loc
  gather_facts: false
  tasks:
    - name: Work under the lock, a step of which runs as another user
      ansible.builtin.include_role:
        name: hostlock.core.with_lock
      vars:
        with_lock_name: W
        with_lock_directory: "{{ d }}"
        with_lock_tasks: "{{ tasks }}"
"""

STEPS = """
- name: Start a process of another user that carries the lease's mark, as that user could
  ansible.builtin.shell: >-
    setpriv --reuid=65534 --regid=65534 --clear-groups setsid -f sleep 600 < /dev/null > /dev/null 2>&1;
    touch {{ started }}
  changed_when: false
"""


@needs_users
def test_another_users_process_with_the_in_flight_mark_never_keeps_roots_lock(ansible, engine, tmp_path):
    """Inside root's with_lock block a step's process of another uid carries the lease's in-flight mark (a
    `become_user` step, or that user copying the mark they can read there into a process of their own). Root's
    release counted every uid's marked processes and kept the lock until they ended; only the holder's own uid
    counts (as serialize's wait already did)."""
    lockdir = tmp_path / "w"
    lockdir.mkdir(mode=0o700)
    steps = ansible.work / "steps.yml"
    steps.write_text(STEPS)
    playbook = ansible.work / "in_flight.yml"
    playbook.write_text(IN_FLIGHT)
    started = ansible.work / "started"
    run = ansible.play(str(playbook), extra_vars=dict(d=str(lockdir), tasks=str(steps), started=str(started)))
    marked = []
    try:
        assert run.rc == 0, run.out
        for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
            try:
                env = Path("/proc/%d/environ" % pid).read_bytes()
                uid = int(Path("/proc/%d/status" % pid).read_text().split("Uid:")[1].split()[0])
            except (OSError, IndexError, ValueError):
                continue
            if b"HOSTLOCK_LEASE_" in env and uid == NOBODY:
                marked.append(pid)
        assert marked, "the step's process of another user is not running with the mark"
        st = engine.status("W", str(lockdir))
        assert not [h for h in st.holders if h.alive], st.as_dict()  # free while that process runs on
    finally:
        for pid in marked:
            try:
                os.kill(pid, 9)
            except OSError:
                pass


WITH_LOCK_FULL = """
- hosts: loc
  gather_facts: false
  tasks:
    - name: Work under the lock
      ansible.builtin.include_role:
        name: hostlock.core.with_lock
      vars:
        with_lock_name: F
        with_lock_directory: "{{ d }}"
        with_lock_tasks: "{{ tasks }}"
"""


@needs_users
def test_a_lease_that_cannot_bind_its_socket_fails_the_take_and_runs_nothing(ansible, engine, shared, tmp_path):
    """A member used up the directory's inodes: the holder listened on an abstract name, the member bound the
    socket file, the heartbeat stopped at its first renewal and another root job held the lock while the
    block ran, with an ok recap. Now the take fails with one line and the block runs nothing."""
    _d, gid = shared
    small = os.path.join(os.path.dirname(_d), "small")
    os.mkdir(small)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "nr_inodes=64,mode=3770,gid=%d" % gid, "tmpfs", small], check=True)
    try:
        engine.Lock("F", directory=small).acquire(timeout=0).release()
        r = subprocess.run(["setpriv", "--reuid=%d" % NOBODY, "--regid=%d" % gid, "--groups=%d" % gid, "sh", "-c",
                            "i=0; while touch %s/f$i 2>/dev/null; do i=$((i+1)); done" % small],
                           capture_output=True, text=True, timeout=60, check=False)
        assert r.returncode == 0, r.stderr
        ran = ansible.work / "ran"
        steps = ansible.work / "steps.yml"
        steps.write_text("- name: A step\n  ansible.builtin.file: {path: %s, state: touch}\n" % ran)
        playbook = ansible.work / "full.yml"
        playbook.write_text(WITH_LOCK_FULL)
        run = ansible.play(str(playbook), extra_vars=dict(d=small, tasks=str(steps)))
        assert run.rc != 0 and not ran.exists(), run.out
        assert "control socket" in run.out and "No space" in run.out, run.out
        assert not [h for h in engine.holders("F", small) if h.alive]
    finally:
        subprocess.run(["umount", "-l", small], check=False)
