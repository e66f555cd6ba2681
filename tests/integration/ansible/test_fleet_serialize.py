"""hostlock.core.serialize with `fleet`: two control nodes' runs take turns per host through a real etcd.

The runs share nothing but the fleet URL (each has its own controller lock directory, as separate control
nodes would). Every wait is on an event: a task holds until the test opens its gate, the test watches
etcd for a run's waiting key and /proc for the in-flight wait's process name.
"""

from __future__ import annotations

import hashlib
import os
import signal
import threading
import uuid
from pathlib import Path

from test_serialize import BUSY, CALLBACKS, _finish, _reap, _show, _times, _wait_for, _waiters_for


def _fleet_url(etcd) -> str:
    """The fleet with a key prefix of its own: test sessions running at once never share in-flight marks."""
    return f"{etcd.url}/t{uuid.uuid4().hex[:10]}"


def _start(ansible, ctl_dir: Path, hosts: str, tag: str, log: Path, gate: Path | None = None,
           stubborn: bool = False, **env: str):
    ctl_dir.mkdir(mode=0o700, exist_ok=True)
    evars = dict(pattern=hosts, tag=tag, log=str(log), gate=str(gate) if gate else "", stubborn="1" if stubborn else "")
    env = dict(ANSIBLE_CALLBACKS_ENABLED=CALLBACKS, HOSTLOCK_SERIALIZE_DIRECTORY=str(ctl_dir), **env)
    return ansible.popen("serialized.yml", extra_vars=evars, **env)


def _prefix(fleet: str) -> str:
    return fleet.rsplit("/", 1)[1]


def _in_flight_waiters(fleet: str, host: str) -> list[int]:
    """Pids of the in-flight waits of this fleet's lock set for a host that found work and now wait for it."""
    scope = hashlib.sha256(f"etcd:{_prefix(fleet)}/\0ansible-host@".encode()).hexdigest()[:12]
    return _waiters_for(f"HOSTLOCK_SERIALIZE_HOST={scope}:{host}")


def test_two_control_nodes_take_turns_on_a_shared_host(ansible, engine, etcd):
    """Run A (loc, loc2) and run B (loc2) with different controller lock directories: B waits in etcd for
    loc2 until A's play ends, and never overlaps it; A names the fleet by HOSTLOCK_SERIALIZE_FLEET, B by
    HOSTLOCK_FLEET."""
    fleet = _fleet_url(etcd)
    log, gate = ansible.work / "fleet-overlap.log", ansible.work / "gate-a"
    log.touch()
    first = _start(ansible, ansible.work / "ctl-a", "loc:loc2", "A", log, gate, HOSTLOCK_SERIALIZE_FLEET=fleet)
    second = None
    try:
        _wait_for(lambda: "A loc2 start" in log.read_text(), what="run A to start its task", proc=first)
        second = _start(ansible, ansible.work / "ctl-b", "loc2", "B", log, HOSTLOCK_FLEET=fleet)
        _wait_for(lambda: engine.status("ansible-host@loc2", fleet=fleet).waiters > 0, what="run B to wait for loc2",
                  proc=second)
        assert " B " not in log.read_text(), "run B started while A held loc2"
        assert os.listdir(ansible.work / "ctl-a") == [] and os.listdir(ansible.work / "ctl-b") == [], \
            "a fleet run used its controller lock directory"
        gate.touch()
        out_a, out_b = _finish(first), _finish(second)
    finally:
        gate.touch()
        _reap(first)
        if second is not None:
            _reap(second)
    assert first.returncode == 0, out_a
    assert second.returncode == 0, out_b
    times = _times(log)
    print(f"\ntwo control nodes through a fleet (A: loc, loc2; B: loc2):\n{_show(log)}")
    assert times[("B", "loc2", "start")] >= times[("A", "loc2", "end")], _show(log)
    assert f"host loc2 is busy: held by pid {first.pid}" in out_b, out_b
    assert "got host loc2 after waiting" in out_b and "HOSTLOCK RECAP" in out_b
    assert engine.status("ansible-host@loc2", fleet=fleet).holders == []


def test_killed_control_node_frees_its_hosts_within_the_ttl_and_its_task_is_waited_for(ansible, engine, etcd):
    """Run A is SIGKILLed while its task (which ignores signals, as dpkg would) runs on loc. Its fleet lock
    ends with its etcd lease (ttl 2 s); run B, on another control node, then still waits for A's task on
    the host (the in-flight wait) and starts only after it ended."""
    fleet = _fleet_url(etcd)
    log, gate = ansible.work / "fleet-killed.log", ansible.work / "gate-a"
    log.touch()
    env = dict(HOSTLOCK_SERIALIZE_FLEET=fleet, HOSTLOCK_SERIALIZE_TTL="2")
    first = _start(ansible, ansible.work / "ctl-a", "loc", "A", log, gate, stubborn=True, **env)
    second = None
    try:
        _wait_for(lambda: "A loc start" in log.read_text(), what="run A to start its task", proc=first)
        task_pid = int(log.read_text().split()[4])
        os.kill(first.pid, signal.SIGKILL)
        first.wait(60)
        second = _start(ansible, ansible.work / "ctl-b", "loc", "B", log, **env)
        _wait_for(lambda: _in_flight_waiters(fleet, "loc"), what="run B to wait for A's task on loc", proc=second)
        assert Path(f"/proc/{task_pid}").exists() and " B " not in log.read_text(), _show(log)
        gate.touch()
        out_b = _finish(second)
    finally:
        gate.touch()
        _reap(first)
        if second is not None:
            _reap(second)
    assert second.returncode == 0, out_b
    times = _times(log)
    print(f"\ncontrol node A SIGKILLed mid-task, B through the fleet:\n{_show(log)}")
    assert times[("B", "loc", "start")] >= times[("A", "loc", "end")], _show(log)
    assert "host loc: waiting for pid" in out_b, out_b


def test_fail_fast_through_the_fleet(ansible, etcd):
    fleet = _fleet_url(etcd)
    log, gate = ansible.work / "fleet-fast.log", ansible.work / "gate-a"
    log.touch()
    first = _start(ansible, ansible.work / "ctl-a", "loc", "A", log, gate, HOSTLOCK_FLEET=fleet)
    try:
        _wait_for(lambda: "A loc start" in log.read_text(), what="run A to start its task", proc=first)
        fast = _start(ansible, ansible.work / "ctl-b", "loc", "F", log, HOSTLOCK_FLEET=fleet,
                      HOSTLOCK_SERIALIZE_FAIL_FAST="true")
        out = _finish(fast)
    finally:
        gate.touch()
        _reap(first)
    assert fast.returncode == BUSY, out
    assert "host loc is still held after" in out and f"by pid {first.pid}" in out, out
    assert f"hostlock status --fleet {fleet}" in out, out
    assert " F " not in log.read_text()


def test_check_mode_reports_the_fleet_holder(ansible, etcd):
    fleet = _fleet_url(etcd)
    log, gate = ansible.work / "fleet-check.log", ansible.work / "gate-a"
    log.touch()
    first = _start(ansible, ansible.work / "ctl-a", "loc", "A", log, gate, HOSTLOCK_FLEET=fleet)
    try:
        _wait_for(lambda: "A loc start" in log.read_text(), what="run A to start its task", proc=first)
        evars = dict(pattern="loc", tag="C", log=str(log), gate="")
        check = ansible.popen("serialized.yml", "--check", extra_vars=evars, ANSIBLE_CALLBACKS_ENABLED=CALLBACKS,
                              HOSTLOCK_FLEET=fleet)
        out = _finish(check)
    finally:
        gate.touch()
        _reap(first)
    assert check.returncode == 0, out
    assert f"check mode takes no lock; host loc is held by pid {first.pid}" in out, out


def test_unusable_fleet_ends_the_run_with_one_line(ansible, tmp_path):
    from ports import free_port

    # 76: the fleet is unavailable; 64: not a fleet URL (the hostlock command's codes, docs/cli.md)
    for fleet, code in ((f"etcd://127.0.0.1:{free_port()}", 76), ("http://not-an-etcd-url", 64)):
        log = tmp_path / "never.log"
        proc = _start(ansible, ansible.work / "ctl-a", "loc", "E", log, HOSTLOCK_FLEET=fleet,
                      HOSTLOCK_SERIALIZE_TIMEOUT="3")
        out = _finish(proc)
        assert proc.returncode == code, out
        # a URL that cannot be one is refused when the callback loads (a setting it cannot honour)
        what = "cannot lock" if code == 76 else "invalid setting fleet"
        errors = [line for line in out.splitlines() if f"hostlock.core.serialize: {what}" in line]
        assert len(errors) == 1 and "Traceback" not in out, out
        assert not log.exists(), "the play ran although its hosts were not locked"
        print(f"{fleet}: rc {proc.returncode}: {errors[0]}")


def test_lost_fleet_lock_ends_the_run_before_its_next_task(ansible, engine, etcd):
    """The run's lock on loc is broken (its etcd lease revoked) while the first task runs: the run says so at
    once, lets the running task end (it cannot stop it), starts no further task and ends with 79."""
    fleet = _fleet_url(etcd)
    log, gate = ansible.work / "fleet-lost.log", ansible.work / "gate-a"
    log.touch()
    ctl = ansible.work / "ctl-a"
    ctl.mkdir(mode=0o700)
    proc = ansible.popen("serialized_two.yml", extra_vars=dict(pattern="loc", tag="A", log=str(log), gate=str(gate)),
                         ANSIBLE_CALLBACKS_ENABLED=CALLBACKS, HOSTLOCK_SERIALIZE_DIRECTORY=str(ctl),
                         HOSTLOCK_FLEET=fleet)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        _wait_for(lambda: "A loc start" in log.read_text(), what="the first task to start", proc=proc)
        assert len(engine.break_lock("ansible-host@loc", fleet=fleet, force=True)) == 1
        _wait_for(lambda: any("lost the fleet lock ansible-host@loc" in line for line in lines),
                  what="the run to notice its lost lock")
        gate.touch()
        proc.wait(120)
        reader.join(30)
    finally:
        gate.touch()
        _reap(proc)
    out = "".join(lines)
    assert proc.returncode == 79, out
    assert "A loc end" in log.read_text() and "second" not in log.read_text(), log.read_text()
    assert "ending this run before its next task" in out, out
