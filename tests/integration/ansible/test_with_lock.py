"""hostlock.core.with_lock: several tasks (a tasks file or a role) under one host lock, in one task.

The lock's guarantees when the controller dies or the connection drops are tested with the block pattern's
own tests (test_lock_block.py runs each for both playbooks). Here: two runs take turns with timestamps
proving no overlap, a role, nesting, a failure, check mode, and bad input. Real ansible-playbook, local
and over the harness's sshd; every wait is on an event (gate files, lock records).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from harness import hostlock_cli
from harness import wait_for as _wait_for


def _lines(path: Path) -> list[tuple[str, int, float]]:
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        word, number, when = line.split()[:3]
        out.append((word, int(number), float(when)))
    return out


def _live(engine, ansible, lock: str) -> list:
    return [h for h in engine.holders(lock, directory=str(ansible.lockdir)) if not h.stale]


def _finish(*procs: subprocess.Popen | None) -> None:
    for proc in procs:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.parametrize("target", ["loc", "ssh1"])
def test_two_runs_take_turns_under_one_task(ansible, engine, tmp_path, target):
    """Run B's work under with_lock starts only after run A's whole work (a tasks file) has ended."""
    lock, gate = f"turns-{target}", tmp_path / "gate"
    events_a, events_b = tmp_path / "events-a", tmp_path / "events-b"
    evars = dict(target=target, lock=lock, gate=str(gate))
    first = second = None
    try:
        first = ansible.popen("with_lock.yml", extra_vars=dict(evars, events=str(events_a)))
        _wait_for(lambda: [e for e in _lines(events_a) if e[0] == "in"], "run A's work to start", proc=first)
        second = ansible.popen("with_lock.yml", extra_vars=dict(evars, events=str(events_b)))
        _wait_for(lambda: engine.status(lock, directory=str(ansible.lockdir)).waiters > 0, "run B to wait",
                  proc=second)
        assert not _lines(events_b), "run B's work started while run A held the lock"
        gate.touch()
        out_a = first.communicate(timeout=180)[0]
        out_b = second.communicate(timeout=180)[0]
    finally:
        gate.touch()
        _finish(first, second)
    assert first.returncode == 0, out_a
    assert second.returncode == 0, out_b
    a, b = dict((w, t) for w, _n, t in _lines(events_a)), dict((w, t) for w, _n, t in _lines(events_b))
    assert list(a) == ["first", "in", "out"] and list(b) == ["first", "in", "out"]
    print(f"\n{target}: A first +0, A out +{a['out'] - a['first']:.3f}s, B first +{b['first'] - a['first']:.3f}s")
    assert b["first"] >= a["out"], "run B's work overlapped run A's"
    assert not _live(engine, ansible, lock)


def test_a_role_runs_under_the_lock_and_the_lock_is_freed_after(ansible, engine, tmp_path):
    """with_lock_role: the role's tasks run with the lease held (seen from the host), then it is released."""
    lock, events, gate = "role", tmp_path / "events", tmp_path / "gate"
    proc = ansible.popen("with_lock.yml", extra_vars=dict(target="ssh1", lock=lock, events=str(events),
                                                          gate=str(gate), role="with_lock_steps"))
    try:
        _wait_for(lambda: [e for e in _lines(events) if e[0] == "in"], "the role's work to start", proc=proc)
        (holder,) = _live(engine, ansible, lock)
        assert holder.token_id, "the role's work runs without the lease held"
        gate.touch()
        out = proc.communicate(timeout=180)[0]
    finally:
        gate.touch()
        _finish(proc)
    assert proc.returncode == 0, out
    assert [w for w, _n, _t in _lines(events)] == ["first", "in", "out"]
    assert not _live(engine, ansible, lock)


def test_a_path_lock_excludes_flock1_scripts_while_the_tasks_run(ansible, engine, tmp_path):
    """with_lock_path: while the tasks run, /usr/bin/flock on that file is refused; after, it gets it."""
    events, gate, path = tmp_path / "events", tmp_path / "gate", tmp_path / "shared.lock"
    path.touch()
    proc = ansible.popen("with_lock.yml", extra_vars=dict(target="ssh1", lock="unused", path=str(path),
                                                          events=str(events), gate=str(gate)))
    try:
        _wait_for(lambda: [e for e in _lines(events) if e[0] == "in"], "the work to start", proc=proc)
        busy = subprocess.run(["/usr/bin/flock", "-n", str(path), "true"], check=False)
        assert busy.returncode == 1, "flock(1) got the file while the tasks held it"
        gate.touch()
        out = proc.communicate(timeout=180)[0]
    finally:
        gate.touch()
        _finish(proc)
    assert proc.returncode == 0, out
    assert subprocess.run(["/usr/bin/flock", "-n", str(path), "true"], check=False).returncode == 0


def test_nested_locks_keep_both_marks_and_the_inner_release_keeps_the_outer(ansible, engine, tmp_path):
    """An inner with_lock inside an outer one: the inner work carries both leases' marks; after the inner
    release the outer lock is still held (and its work still marked); both are free at the end, and no
    release warns that its lease was already gone (each released its own token)."""
    lock, events = "outer", tmp_path / "events"
    run = ansible.play("with_lock.yml", extra_vars=dict(
        target="loc", lock=lock, events=str(events), gate=str(tmp_path / "unused"),
        steps=str(Path(ansible.command("with_lock.yml")[1]).parent / "tasks" / "with_lock_nested.yml")))
    assert run.rc == 0, run.out
    assert [(w, n) for w, n, _t in _lines(events)] == [("marks", 2), ("marks", 1)], events.read_text()
    assert "not held any more" not in run.out and "no lease" not in run.out, run.out
    assert not _live(engine, ansible, lock) and not _live(engine, ansible, f"{lock}-inner")


@pytest.mark.parametrize("target,steps", [("loc", "absolute"), ("ssh1", "absolute"), ("loc", "relative")])
def test_a_failing_task_releases_the_lock_and_fails_the_run(ansible, engine, tmp_path, target, steps):
    """The release runs after a failure. Also: a relative with_lock_tasks is found beside the playbook."""
    lock, events = f"failing-{target}", tmp_path / "events"
    where = Path(ansible.command("with_lock.yml")[1]).parent if steps == "absolute" else Path()
    run = ansible.play("with_lock.yml", extra_vars=dict(
        target=target, lock=lock, events=str(events), gate=str(tmp_path / "unused"),
        steps=str(where / "tasks" / "with_lock_failing.yml")))
    assert run.rc == 2, run.out
    assert "the work failed halfway" in run.out
    assert [w for w, _n, _t in _lines(events)] == ["first"]
    assert not _live(engine, ansible, lock), "the failure left the lock held"


@pytest.mark.parametrize("timeout", [0, "0.5s"], ids=["zero", "half-a-second"])
def test_a_timeout_ends_the_wait_and_nothing_runs(ansible, engine, tmp_path, timeout):
    """with_lock_timeout bounds the wait, 0 included (fail at once, not wait forever): while a host job holds
    the lock the task fails naming it, and none of the tasks under the lock run."""
    lock, events, gate, held = "busy", tmp_path / "events", tmp_path / "gate", tmp_path / "held"
    holder = subprocess.Popen([*hostlock_cli(), "run", "-d", str(ansible.lockdir), lock, "sh", "-c",
                               f"touch {held}; while [ ! -e {gate} ]; do sleep 0.02; done"])
    try:
        _wait_for(held.exists, "the host job to hold the lock")
        run = ansible.play("with_lock.yml", timeout=120, extra_vars=dict(target="loc", lock=lock, events=str(events),
                                                                         gate=str(gate), timeout=timeout))
    finally:
        gate.touch()
        holder.wait(timeout=60)
    assert run.rc == 2, run.out
    assert "still held" in run.out, run.out
    assert not events.exists(), "a task under the lock ran without it"


def test_check_mode_takes_no_lock_and_runs_the_tasks_in_check_mode(ansible, engine, tmp_path):
    lock, events = "check", tmp_path / "events"
    run = ansible.play("with_lock.yml", "--check", extra_vars=dict(target="loc", lock=lock, events=str(events),
                                                                   gate=str(tmp_path / "unused")))
    assert run.rc == 0, run.out
    assert not events.exists(), "a command ran in check mode"
    assert not _live(engine, ansible, lock)


@pytest.mark.parametrize(
    "extra,says",
    [
        (dict(role="with_lock_steps", steps="x.yml"), "set exactly one of with_lock_tasks"),
        (dict(steps=""), "set exactly one of with_lock_tasks"),
        (dict(lock=""), "set exactly one of with_lock_name"),
        (dict(lease="-3"), "lease"),
        (dict(lease="3 weeks"), "lease"),
    ],
    ids=["tasks-and-role", "neither", "no-lock", "negative-lease", "bad-lease"],
)
def test_bad_input_fails_before_anything_runs_and_takes_no_lock(ansible, engine, tmp_path, extra, says):
    """Fail closed: a setting with_lock cannot honour stops the host's work with one clear message; nothing
    runs and no lock is left held."""
    events = tmp_path / "events"
    evars = dict(target="loc", lock="bad", events=str(events), gate=str(tmp_path / "unused"))
    evars.update(extra)
    run = ansible.play("with_lock_bad.yml", extra_vars=evars)
    assert run.rc == 2, run.out
    assert says in run.out, run.out
    assert "Traceback" not in run.out
    assert not events.exists(), "work ran despite the bad input"
    assert not _live(engine, ansible, "bad")


# Two inventory hosts of one run that are one machine (issue 40 item 6): each host's work logs "in HOST T" and
# "out HOST T"; the lock directory is the same, so the hosts share the lock.
ONE_MACHINE = """\
- name: Two inventory names, one machine
  hosts: "{{ hosts_ }}"
  gather_facts: false
  strategy: "{{ strategy_ }}"
  tasks:
    - name: Work under the lock
      ansible.builtin.include_role:
        name: hostlock.core.with_lock
      vars:
        with_lock_name: one-machine
        with_lock_directory: "{{ lockdir }}"
        with_lock_timeout: 10m
        with_lock_tasks: "{{ workdir }}/one-machine-steps.yml"
"""
ONE_MACHINE_STEPS = """\
- name: Work of one host
  ansible.builtin.shell: >-
    echo "in {{ inventory_hostname }} $(date +%s.%N)" >> {{ workdir }}/one-machine.events;
    sleep 0.5; echo "out {{ inventory_hostname }} $(date +%s.%N)" >> {{ workdir }}/one-machine.events
  changed_when: false
"""


def _one_machine(ansible, hosts: str, strategy: str, *args: str):
    (ansible.work / "one-machine.yml").write_text(ONE_MACHINE)
    (ansible.work / "one-machine-steps.yml").write_text(ONE_MACHINE_STEPS)
    started = time.monotonic()
    run = ansible.play(str(ansible.work / "one-machine.yml"), *args,
                       extra_vars=dict(hosts_=hosts, strategy_=strategy))
    events = ansible.work / "one-machine.events"
    lines = [line.split() for line in events.read_text().splitlines()] if events.exists() else []
    return run, [(w, h, float(t)) for w, h, t in lines], time.monotonic() - started


def _take(run) -> dict:
    """{host: result} of the role's take (its task name carries the role's prefix)."""
    (found,) = [hosts for task, hosts in run.results().items() if task.endswith("Take the lock one-machine")]
    return found


@pytest.mark.parametrize("strategy", ["free", "host_pinned"])
@pytest.mark.parametrize("hosts", ["loc:loc2", "loc:ssh1"])
def test_hosts_of_one_machine_take_turns_where_the_strategy_lets_them(ansible, engine, hosts, strategy):
    """with_lock failed one of them at once ("held by this same playbook run") where locked took turns."""
    run, events, _took = _one_machine(ansible, hosts, strategy)
    assert run.rc == 0, run.out
    assert sorted(h for w, h, _t in events if w == "in") == sorted(hosts.split(":")), events
    first, second = events[:2], events[2:]
    assert [w for w, _h, _t in events] == ["in", "out", "in", "out"], events
    assert first[0][1] == first[1][1] and second[0][1] == second[1][1]
    assert second[0][2] >= first[1][2], f"the second host's work overlapped the first's: {events}"
    assert not _live(engine, ansible, "one-machine")


@pytest.mark.parametrize("hosts", ["loc:loc2", "loc:ssh1"])
def test_under_linear_the_waiting_host_is_refused_at_once_naming_what_works(ansible, engine, hosts):
    """linear runs no host's next task before every host has finished this one: the holder could never release
    the lock while the other waited. The waiter is refused before it runs anything, long before its 10m timeout,
    with the settings that work, and nothing that does not apply (run_once is for a delegated lock)."""
    run, events, took = _one_machine(ansible, hosts, "linear")
    assert run.rc == 2, run.out
    r = _take(run)
    (refused,) = [h for h, res in r.items() if res["_status"] == "failed"]
    (holder,) = [h for h, res in r.items() if res["_status"] == "ok"]
    msg = r[refused]["msg"]
    assert f"held by host {holder} of this same playbook run" in msg, msg
    for works in ("serial: 1", "strategy: free", "hostlock.core.locked"):
        assert works in msg, msg
    assert "run_once" not in msg and "timeout" not in msg, msg
    assert "included by task 'Work under the lock'" in msg, msg
    assert [h for _w, h, _t in events] == [holder, holder], events  # nothing ran on the refused host
    assert took < 300, took  # refused at once, not at the timeout
    assert not _live(engine, ansible, "one-machine")


def test_free_with_fewer_forks_than_waiting_hosts_is_refused_with_the_forks_it_needs(ansible, engine):
    """Under free, waiting hosts that take every fork would leave the holder none for its release."""
    run, events, _took = _one_machine(ansible, "loc:loc2", "free", "--forks", "1")
    assert run.rc == 2, run.out
    failed = [res for res in _take(run).values() if res["_status"] == "failed"]
    assert len(failed) == 1 and "forks 2 or more" in failed[0]["msg"] and "serial: 1" in failed[0]["msg"], failed
    assert len(events) == 2, events
    assert not _live(engine, ansible, "one-machine")


TYPO = """\
- name: with_lock as written
  hosts: loc
  gather_facts: false
  tasks:
    - name: Deploy under the lock
      ansible.builtin.include_role:
        name: hostlock.core.with_lock
      vars:
        with_lock_name: {name}
        with_lock_directory: "{{{{ lockdir }}}}"
        with_lock_tasks: "{{{{ workdir }}}}/typo-steps.yml"
        {extra}
"""


@pytest.mark.parametrize(
    ("name", "extra", "says"),
    [
        ("typo", "with_lock_timout: 1s", "unknown variable with_lock_timout (with_lock takes"),
        ("yes", "with_lock_timeout: 1s", "with_lock_name is the boolean true, not a name"),
        ("0755", "with_lock_timeout: 1s", "with_lock_name is the number 493, not a name"),
    ],
    ids=["misspelt-variable", "boolean-name", "number-name"],
)
def test_a_misspelt_variable_or_a_coerced_name_is_named_and_nothing_runs(ansible, engine, name, extra, says):
    """issue 40 item 5: with_lock_timout: 1s was ignored (the lock waited for without end); name: yes locked "True"."""
    (ansible.work / "typo.yml").write_text(TYPO.format(name=name, extra=extra))
    (ansible.work / "typo-steps.yml").write_text(
        "- name: Step\n  ansible.builtin.file:\n    path: '{{ workdir }}/typo-ran'\n"
        "    state: touch\n    mode: '0644'\n")
    run = ansible.play(str(ansible.work / "typo.yml"))
    assert run.rc == 2 and says in run.out, run.out
    assert "Traceback" not in run.out
    assert not (ansible.work / "typo-ran").exists()
    for lock in ("typo", "True", "493", "yes"):
        assert not _live(engine, ansible, lock)


def test_a_failure_inside_with_lock_shows_its_reason_and_the_users_task_never_the_token(ansible, engine, tmp_path):
    """It showed `fatal: ... "censored"` with an Origin inside the collection. Now: the one-line reason, the task
    that includes the role, and (-v) no token anywhere in the output, for a failed and a successful take."""
    lock, gate, held = "reason", tmp_path / "gate", tmp_path / "held"
    holder = subprocess.Popen([*hostlock_cli(), "run", "-d", str(ansible.lockdir), lock, "sh", "-c",
                               f"touch {held}; while [ ! -e {gate} ]; do sleep 0.02; done"])
    try:
        _wait_for(held.exists, "the host job to hold the lock")
        busy = ansible.play("with_lock.yml", "-v", timeout=120, extra_vars=dict(
            target="loc", lock=lock, events=str(tmp_path / "events"), gate=str(tmp_path / "unused"), timeout=0))
    finally:
        gate.touch()
        holder.wait(timeout=60)
    assert busy.rc == 2, busy.out
    assert "censored" not in busy.out, busy.out
    assert f"lock {lock} in {ansible.lockdir} is still held after" in busy.out, busy.out
    assert "included by task 'Deploy under the lock' at " in busy.out and "with_lock.yml:" in busy.out, busy.out
    ok = ansible.play("with_lock.yml", "-v",
                      extra_vars=dict(target="loc", lock=lock, gate=str(gate), events=str(tmp_path / "events-ok")))
    assert ok.rc == 0, ok.out
    for run in (busy, ok):
        assert not re.search(r"\b[0-9a-f]{12}\.[0-9a-f]{32}\b", run.out), "a lease token in the output"
        found = re.search(r"HOSTLOCK_LEASE_[0-9a-f]+\W+[0-9a-f]{16,}", run.out)
        assert not found, f"a lease's mark in the output: {run.out[max(0, found.start() - 600):found.end()]}"


@pytest.mark.parametrize("target", ["loc", "ssh1"])
def test_a_lease_ended_under_the_block_fails_the_release(ansible, engine, tmp_path, target):
    """Broken on the host mid-block, the heartbeat lease no longer covers the work (another job took the lock):
    the release fails the run naming why, instead of reporting ok (issue 39 item 2's "the recap said ok")."""
    lock, events = f"broken-{target}", tmp_path / "events"
    run = ansible.play("with_lock.yml", extra_vars=dict(
        target=target, lock=lock, events=str(events), gate=str(tmp_path / "unused"), hostlock=hostlock_cli()[0],
        steps=str(Path(ansible.command("with_lock.yml")[1]).parent / "tasks" / "with_lock_broken.yml")))
    assert [w for w, _n, _t in _lines(events)] == ["other"], run.out  # the other job did run under the lock
    assert run.rc == 2, run.out
    assert "heartbeat lease ended while the run lived" in run.out, run.out
    assert re.search(r"failed=1", run.out), run.out
    assert not _live(engine, ansible, lock)
