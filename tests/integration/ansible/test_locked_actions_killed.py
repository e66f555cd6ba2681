"""A run killed while a `locked` task with its own action plugin works on the host (issue 23): the lease taken in
the task's first module run keeps the lock until the work that task started there has ended, and no longer.

Two places the work can be: in the very step that took the lease (copy with remote_src: its first step is the
copy module, whose `validate` command is the work) and in a later step (copy of content: the first step is a
stat, the work is the copy module's `validate`). Real ansible-playbook, local and over the real sshd, killed
with Ctrl-C (SIGINT to its process group) or SIGKILL of its pid. Every wait is on an event: the work writes a
line and holds until the test creates its gate file. Timestamps prove that the next holder ran after it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from harness import NEXT, held_while_it_runs, hostlock_cli, wait_for

# copy's validate command: the work. It traps nothing, so a signal or hangup that reached it would end it
# before its `out` line; it must not change the file it validates (exit 0).
WORK = """#!/bin/sh
events=$2; gate=$3
echo "in $$ $(date +%s.%N)" >> "$events"
while [ ! -e "$gate" ]; do sleep 0.02; done
echo "out $$ $(date +%s.%N)" >> "$events"
"""
CELLS = [(host, step, how) for host in ("loc", "ssh1") for step in ("first", "later") for how in ("ctrl-c", "sigkill")]


def _events(path: Path) -> list[tuple[str, int, float]]:
    lines = path.read_text().splitlines() if path.exists() else []
    return [(line.split()[0], int(line.split()[1]), float(line.split()[2])) for line in lines]


def _playbook(ansible, host: str, lock: str, step: str, events: Path, gate: Path) -> str:
    src = ansible.work / "source.txt"
    src.write_text("work\n")
    validate = f"{ansible.work}/work.sh %s {events} {gate}"
    if step == "first":  # remote_src: the copy module is the task's first (and only) module run
        copy = f"src: {src}, remote_src: true"
    else:  # content: a stat first, then the copy module
        copy = "content: \"work\\n\""
    playbook = ansible.work / f"{host}-{step}.yml"
    playbook.write_text(
        f"- hosts: {host}\n  gather_facts: false\n  tasks:\n"
        "    - hostlock.core.locked:\n"
        f"        name: {lock}\n        directory: '{{{{ lockdir }}}}'\n"
        f"        task: {{ansible.builtin.copy: {{{copy}, dest: '{ansible.work}/{host}-{step}.txt', mode: '0644', "
        f"validate: '{validate}'}}}}\n"
    )
    return str(playbook)


@pytest.mark.parametrize("host,step,how", CELLS, ids=["-".join(c) for c in CELLS])
def test_a_killed_run_keeps_the_lock_until_the_work_its_task_started_ends(ansible, engine, tmp_path, host, step, how):
    lock = f"killed-{host}-{step}-{how}"
    events, gate = tmp_path / "events", tmp_path / "gate"
    work = ansible.work / "work.sh"
    work.write_text(WORK)
    work.chmod(0o755)
    directory = str(ansible.lockdir)
    proc = nxt = None
    try:
        proc = ansible.popen(_playbook(ansible, host, lock, step, events, gate))
        work_pid = wait_for(lambda: next((e[1] for e in _events(events) if e[0] == "in"), 0), "the work to start",
                            proc=proc)
        if how == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=120)
        nxt = subprocess.Popen([*hostlock_cli(), "run", "-w", "180", "-d", directory, lock,
                                sys.executable, "-c", NEXT, str(events), str(work_pid)])
        wait_for(lambda: engine.status(lock, directory=directory).waiters > 0 or nxt.poll() is not None,
                 "the next job to wait for the lock")
        gate.touch()
        assert nxt.wait(timeout=180) == 0
        words = [e[0] for e in _events(events)]
        if step == "first":
            # The step that took the lease left the run's session on the host (as every `locked` module run
            # does): nothing of the controller's end reaches it, and it runs to its end under the lock.
            assert words == ["in", "out", "next"], f"{lock}: {words}"
            got = {e[0]: e[2] for e in _events(events)}
            assert got["next"] >= got["out"], f"{lock}: the next holder started before the work ended"
        else:
            # A later step is Ansible's own module run: Ctrl-C (local: the run's process group) or the hangup
            # of its `ssh -tt` terminal may end it, as they would end the task without the lock; it may also
            # run to its end. Either way the lock is held until it is gone.
            assert words in (["in", "out", "next"], ["in", "next"]), f"{lock}: {words}"
        wait_for(lambda: engine.status(lock, directory=directory).state == "free", "the lock to be free at the end")
    finally:
        gate.touch()
        for p in (proc, nxt):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


TIMEOUT_CELLS = [(host, kind) for host in ("loc", "ssh1") for kind in ("script", "copy-validate")]


@pytest.mark.parametrize("host,kind", TIMEOUT_CELLS, ids=["-".join(c) for c in TIMEOUT_CELLS])
def test_a_task_its_timeout_ends_keeps_the_lock_until_its_work_ends(ansible, engine, tmp_path, host, kind):
    """Ansible's task keyword `timeout:` ends a wrapped `script` (or a `copy` whose `validate` runs) on the
    controller while its work runs on, on the host, as it would without the lock. The lease must then not be
    released but end after that work, as a dead run's does: released, it let the next holder in beside it."""
    lock = f"timeout-{host}-{kind}"
    events, gate = tmp_path / "events", tmp_path / "gate"
    work = ansible.work / "work.sh"
    work.write_text(WORK)
    work.chmod(0o755)
    if kind == "script":
        wrapped = f"ansible.builtin.script: '{work} x {events} {gate}'"
    else:
        wrapped = (f"ansible.builtin.copy: {{content: \"work\\n\", dest: '{ansible.work}/{lock}.txt', mode: '0644', "
                   f"validate: '{work} %s {events} {gate}'}}")
    playbook = ansible.work / f"{lock}.yml"
    playbook.write_text(
        f"- hosts: {host}\n  gather_facts: false\n  tasks:\n"
        "    - hostlock.core.locked:\n"
        f"        name: {lock}\n        directory: '{{{{ lockdir }}}}'\n"
        f"        task: {{{wrapped}}}\n"
        "      timeout: 15\n"  # long enough to reach the work on a loaded machine; the test waits for its end
    )
    directory = str(ansible.lockdir)
    proc = nxt = None
    try:
        proc = ansible.popen(str(playbook))
        work_pid = wait_for(lambda: next((e[1] for e in _events(events) if e[0] == "in"), 0), "the work to start",
                            proc=proc)
        out, _err = proc.communicate(timeout=120)  # the task's timeout ends the run's wait; the work holds on
        assert proc.returncode != 0 and "Timed out" in out, out
        # The work runs on, as without the lock, unless the run's end ended it (Ansible's own, now and then: a
        # zombie here, whose parent is gone). While it runs, nobody else may hold the lock.
        held_while_it_runs(directory, lock, work_pid, "the timed-out task's work", out)
        nxt = subprocess.Popen([*hostlock_cli(), "run", "-w", "180", "-d", directory, lock,
                                sys.executable, "-c", NEXT, str(events), str(work_pid)])
        wait_for(lambda: engine.status(lock, directory=directory).waiters > 0 or nxt.poll() is not None,
                 "the next job to wait for the lock")
        gate.touch()
        assert nxt.wait(timeout=180) == 0
        words = [e[0] for e in _events(events)]
        # Ended with the run (over SSH the hangup of its terminal may end it too), the work is gone before its
        # `out`. Either way the next holder starts only once it is gone (NEXT writes `next-overlap` otherwise).
        assert words in (["in", "out", "next"], ["in", "next"]), f"{lock}: {words}"
        wait_for(lambda: engine.status(lock, directory=directory).state == "free", "the lock to be free at the end")
    finally:
        gate.touch()
        for p in (proc, nxt):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
