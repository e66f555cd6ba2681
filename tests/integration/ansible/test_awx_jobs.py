"""AWX/AAP jobs: each runs in an execution-environment container of its own; fleet locks make them take turns.

Two "jobs" here are two ansible-playbook runs, each in its own mount and PID namespace (`unshare --mount
--pid --fork`, as two jobs' containers are), each with a private tmpfs over the controller lock directory
and the SSH control-socket directory, given the extra variables AWX and AAP inject (awx_job_id, ...). They
share only what two containers share: the managed host (the harness's sshd on 127.0.0.1) and etcd.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid

import pytest
from harness import VENV_BIN
from test_serialize import CALLBACKS, _finish, _in_flight_waiters, _reap, _show, _times, _wait_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare")

# Mount private tmpfs over the given directories, then run the command: sh stays PID 1 of the namespace.
CONTAINER = 'for d in "$1" "$2"; do mount -t tmpfs tmpfs "$d" || exit 70; done; shift 2; "$@"'
JOBS = {
    "A": dict(awx_job_id=101, awx_job_template_name="Deploy web", awx_user_name="alice",
              tower_job_id=101, tower_job_template_name="Deploy web", tower_user_name="alice"),
    "B": dict(awx_job_id=102, awx_job_template_name="Patch hosts", awx_user_name="bob"),
    "C": dict(tower_job_id=103, tower_job_template_name="Audit", tower_user_name="carol"),
}


def _job(ansible, tag: str, log, gate=None, fleet: str | None = None) -> subprocess.Popen:
    """One job's ansible-playbook in a container of its own, on ssh1."""
    ctl, cp = ansible.work / "controller-locks", ansible.work / "cp"
    cp.mkdir(exist_ok=True)
    evars = dict(pattern="ssh1", tag=tag, log=str(log), gate=str(gate) if gate else "", **JOBS[tag])
    cmd = ansible.command("serialized.yml", extra_vars=evars)
    env = dict(ANSIBLE_CALLBACKS_ENABLED=CALLBACKS, HOSTLOCK_SERIALIZE_DIRECTORY=str(ctl),
               HOSTLOCK_SERIALIZE_FLEET=fleet or "")
    wrapped = ["unshare", "--mount", "--pid", "--fork", "--mount-proc", "--propagation", "private",
               "sh", "-c", CONTAINER, "container", str(ctl), str(cp), *cmd]
    return subprocess.Popen(wrapped, cwd=ansible.work, env=ansible.env(**env), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def test_the_controllers_host_locks_coordinate_nothing_between_containers(ansible):
    """The control case: without a fleet, each job locks in its own container's directory: job B takes the
    host's controller lock while job A holds its own. Only the host-side in-flight wait (the same lock set
    id, as the same image gives both containers the same directory path) sees A's task and waits for it at
    B's play start: no lock, and A's later tasks would overlap B's (docs/howto-awx.md)."""
    log, gate = ansible.work / "ee-local.log", ansible.work / "gate-a"
    log.touch()
    first = _job(ansible, "A", log, gate)
    second = None
    try:
        _wait_for(lambda: "A ssh1 start" in log.read_text(), what="job A to start its task", proc=first)
        second = _job(ansible, "B", log)
        _wait_for(lambda: _in_flight_waiters(ansible, "ssh1"), what="job B's in-flight wait on the host",
                  proc=second)
        gate.touch()
        out_a, out_b = _finish(first), _finish(second)
    finally:
        gate.touch()
        _reap(first)
        if second is not None:
            _reap(second)
    assert first.returncode == 0 and second.returncode == 0, out_a + out_b
    assert "is busy" not in out_b, "job B found its container's controller lock taken: " + out_b
    assert "host ssh1: waiting for pid" in out_b, out_b


def test_jobs_in_separate_containers_take_turns_through_the_fleet_and_name_each_other(ansible, engine, etcd):
    fleet = f"{etcd.url}/t{uuid.uuid4().hex[:10]}"
    log, gate = ansible.work / "ee-fleet.log", ansible.work / "gate-a"
    log.touch()
    first = _job(ansible, "A", log, gate, fleet)
    second = third = None
    try:
        _wait_for(lambda: "A ssh1 start" in log.read_text(), what="job A to start its task", proc=first)
        (holder,) = engine.status("ansible-host@ssh1", fleet=fleet).holders
        assert holder.label.startswith("AWX job 101 'Deploy web' by alice (ansible-playbook pid "), holder.label
        info = subprocess.run(
            [str(VENV_BIN / "ansible"), "localhost", "-m", "hostlock.core.lock_info", "-a",
             json.dumps(dict(name="ansible-host@ssh1", fleet=fleet)),
             "-e", f"ansible_python_interpreter={ansible.python}"],
            cwd=ansible.work, env=ansible.env(ANSIBLE_CALLBACKS_ENABLED=None), capture_output=True, text=True,
            check=False)
        assert info.returncode == 0 and "AWX job 101 'Deploy web' by alice" in info.stdout, info.stdout + info.stderr
        second = _job(ansible, "B", log, fleet=fleet)
        _wait_for(lambda: engine.status("ansible-host@ssh1", fleet=fleet).waiters == 1, what="job B to queue",
                  proc=second)
        third = _job(ansible, "C", log, fleet=fleet)
        _wait_for(lambda: engine.status("ansible-host@ssh1", fleet=fleet).waiters == 2, what="job C to queue",
                  proc=third)
        assert " B " not in log.read_text() and " C " not in log.read_text(), _show(log)
        gate.touch()
        out_a, out_b, out_c = _finish(first), _finish(second), _finish(third)
    finally:
        gate.touch()
        for proc in (first, second, third):
            if proc is not None:
                _reap(proc)
    assert (first.returncode, second.returncode, third.returncode) == (0, 0, 0), out_a + out_b + out_c
    times = _times(log)
    print(f"\nthree AWX jobs in separate containers, one host, one etcd:\n{_show(log)}")
    for tag in ("B", "C"):
        assert times[(tag, "ssh1", "start")] >= times[("A", "ssh1", "end")], _show(log)
    first_done = min(("B", "C"), key=lambda tag: times[(tag, "ssh1", "end")])
    other = "C" if first_done == "B" else "B"
    assert times[(other, "ssh1", "start")] >= times[(first_done, "ssh1", "end")], _show(log)
    busy_b = [line for line in out_b.splitlines() if "host ssh1 is busy" in line]
    busy_c = [line for line in out_c.splitlines() if "host ssh1 is busy" in line]
    assert busy_b and "AWX job 101 'Deploy web' by alice" in busy_b[0] and "(first in line)" in busy_b[0], out_b
    assert busy_c and "AWX job 101 'Deploy web' by alice" in busy_c[0] and "(number 2 in line)" in busy_c[0], out_c


def test_a_lock_tasks_default_label_names_the_job_and_keeps_its_run_marker(ansible):
    """hostlock.core.lock on the host, in an AWX job: the holder's label names the job; a template name
    that looks like a run marker stays text (the run's own marker still comes last and is the one read)."""
    evars = dict(target="loc", lock="awx-label", awx_job_id=7, awx_job_template_name="Nightly [run fake]",
                 awx_user_name="carol")
    run = ansible.play("lock_across_tasks.yml", extra_vars=evars)
    assert run.rc == 0, run.out
    label = run.results()["Take the lock"]["loc"]["holders"][0]["label"]
    assert "AWX job 7 'Nightly (run fake)' by carol: play 'Hold a lock across tasks'" in label, label
    assert "[run fake]" not in label and label.rstrip().endswith("]") and "[run " in label, label
