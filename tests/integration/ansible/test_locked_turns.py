"""hostlock.core.locked among the hosts of one run, and a run killed with SIGKILL while its task waits.

Real ansible-playbook runs on the local connection; timestamps prove that no two holders overlapped.
"""

from __future__ import annotations

import os
import signal
import subprocess

from harness import hostlock_cli
from harness import wait_for as _wait_for

TURNS = """\
- name: Take turns on one lock
  hosts: many
  gather_facts: false
  tasks:
    - name: Work under the shared lock
      hostlock.core.locked:
        name: shared
        directory: "{{ lockdir }}"
        timeout: 5m
        task:
          ansible.builtin.shell: >-
            echo "start $(date +%s.%N) {{ inventory_hostname }}" >> {{ log }};
            sleep 0.1;
            echo "end $(date +%s.%N) {{ inventory_hostname }}" >> {{ log }}
"""


def _intervals(log) -> list[tuple[float, float, str]]:
    starts, ends = {}, {}
    for line in log.read_text().splitlines():
        what, when, host = line.split()
        (starts if what == "start" else ends)[host] = float(when)
    assert set(starts) == set(ends), (starts, ends)
    return sorted((starts[h], ends[h], h) for h in starts)


def test_hosts_of_one_run_take_turns_on_one_lock(ansible, tmp_path):
    """20 inventory aliases of one machine, 10 forks, one lock name: every host runs, one at a time (they
    used to fail at once with "held by this same playbook run")."""
    hosts = [f"a{i:02d}" for i in range(20)]
    inventory = tmp_path / "many.ini"
    inventory.write_text("[many]\n" + "".join(
        f"{h} ansible_connection=local ansible_python_interpreter={ansible.python}\n" for h in hosts))
    playbook = tmp_path / "turns.yml"
    playbook.write_text(TURNS)
    log = tmp_path / "turns.log"
    run = ansible.play(str(playbook), "-i", str(inventory), "-f", "10", extra_vars=dict(log=str(log)))
    assert run.rc == 0, run.out
    spans = _intervals(log)
    assert sorted(h for _s, _e, h in spans) == hosts, spans
    for (_s1, end1, h1), (start2, _e2, h2) in zip(spans, spans[1:], strict=False):
        assert start2 >= end1, f"{h2} started at {start2} before {h1} ended at {end1}"


WAIT_THEN_WORK = """\
- name: Wait for the lock, then work
  hosts: loc
  gather_facts: false
  tasks:
    - name: Work under the lock
      hostlock.core.locked:
        name: {lock}
        directory: "{{{{ lockdir }}}}"
        task:
          ansible.builtin.shell: echo "in $$" >> {events}
"""


def _runners() -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if b"AnsiballZ_locked" in f.read():
                        found.append(int(entry))
            except OSError:
                pass
    return found


def test_sigkill_of_ansible_playbook_while_a_local_task_waits_runs_nothing(ansible, tmp_path):
    """kill -9 of the ansible-playbook pid: its worker lives on and keeps reading the module's stdout, so
    only the run's own process tells the waiting module that nobody will use its result: it gives up and
    the wrapped task never runs, even when the lock comes free."""
    lock, events, gate = "orphaned", tmp_path / "events", tmp_path / "gate"
    holder = subprocess.Popen([*hostlock_cli(), "run", "-d", str(ansible.lockdir), lock, "sh", "-c",
                               f"echo held >> {events}; while [ ! -e {gate} ]; do sleep 0.02; done; "
                               f"echo released >> {events}"])
    playbook = tmp_path / "wait.yml"
    playbook.write_text(WAIT_THEN_WORK.format(lock=lock, events=events))
    proc = None
    try:
        _wait_for(events.exists, "the host job to hold the lock")
        proc = ansible.popen(str(playbook))
        _wait_for(_runners, "the locked task to wait on the host")
        os.kill(proc.pid, signal.SIGKILL)  # the ansible-playbook process alone: its worker survives it
        proc.wait(timeout=60)
        _wait_for(lambda: not _runners(), "the waiting module to notice its run is gone and give up")
        gate.touch()
        assert holder.wait(timeout=60) == 0
        done = subprocess.run([*hostlock_cli(), "run", "-w", "30", "-d", str(ansible.lockdir), lock, "true"],
                              check=False)
        assert done.returncode == 0
        assert [line.split()[0] for line in events.read_text().splitlines()] == ["held", "released"]
    finally:
        gate.touch()
        if proc is not None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        holder.kill()
        holder.wait()
