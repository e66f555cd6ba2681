"""hostlock.core.serialize: concurrent ansible-playbook runs, real processes, real signals.

Every wait here is on an event: a task holds until the test creates its gate file, and the test waits
for log lines, lock waiters and processes, never for a sleep to be long enough.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from harness import hostlock_cli

CALLBACKS = "record,hostlock.core.serialize"
WAIT_TASK = "hostlock.core.serialize: wait for earlier runs' tasks on this host"
BUSY = 75


def _env(ansible, **extra):
    env = dict(ANSIBLE_CALLBACKS_ENABLED=CALLBACKS, HOSTLOCK_SERIALIZE_DIRECTORY=str(ansible.ctl_lockdir))
    env.update(extra)
    return env


def _start(ansible, hosts: str, tag: str, log: Path, gate: Path | None = None, stubborn: bool = False,
           **env) -> subprocess.Popen:
    evars = dict(pattern=hosts, tag=tag, log=str(log), gate=str(gate) if gate else "", stubborn="1" if stubborn else "")
    return ansible.popen("serialized.yml", extra_vars=evars, **_env(ansible, **env))


def _times(log: Path) -> dict[tuple[str, str, str], float]:
    """{(tag, host, start|end): epoch} from the playbook's log."""
    found = {}
    for line in log.read_text().splitlines():
        tag, host, what, when = line.split()[:4]
        found[(tag, host, what)] = float(when)
    return found


def _wait_for(predicate, timeout: float = 120, what: str = "condition", proc: subprocess.Popen | None = None) -> None:
    """Poll for an event (a generous safety net, not a timing assumption)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"ansible-playbook exited ({proc.returncode}) before {what}:\n{proc.stdout.read()}")
        time.sleep(0.05)
    pytest.fail(f"timed out after {timeout}s waiting for {what}")


def _finish(proc: subprocess.Popen, timeout: float = 180) -> str:
    out, _err = proc.communicate(timeout=timeout)
    return out


def _show(log: Path) -> str:
    times = _times(log)
    if not times:
        return "  (empty log)"
    t0 = min(times.values())
    return "\n".join(
        f"  +{when - t0:6.2f}s  {tag} {host} {what}"
        for (tag, host, what), when in sorted(times.items(), key=lambda kv: kv[1])
    )


def _waiting_for(engine, ansible, host: str) -> bool:
    """True once some run waits for this host's controller lock."""
    return engine.status(f"ansible-host@{host}", directory=str(ansible.ctl_lockdir)).waiters > 0


def _mark(ansible, host: str) -> str:
    """The host's in-flight mark in this test's lock set (the controller directory and prefix): parallel tests
    never mix."""
    scope = hashlib.sha256(f"{ansible.ctl_lockdir}\0ansible-host@".encode()).hexdigest()[:12]
    return f"HOSTLOCK_SERIALIZE_HOST={scope}:{host}"


def _waiters_for(mark: str) -> list[int]:
    """Pids of the in-flight waits (hostlock.core.serialize_host) that found processes whose environment holds
    `mark` and now wait for them to end: such a wait names itself `hl-wait PID` (its comm), PID the first it
    found. They run on this machine, locally or over the harness's sshd."""
    names, marked = {}, set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                names[int(entry.name)] = (entry / "comm").read_text().strip()
                if mark.encode() in (entry / "environ").read_bytes().split(b"\0"):
                    marked.add(int(entry.name))
            except OSError:
                continue
    return sorted(pid for pid, name in names.items()
                  if name.startswith("hl-wait ") and name[8:].isdigit() and int(name[8:]) in marked)


def _in_flight_waiters(ansible, host: str) -> list[int]:
    """Pids of this test's in-flight waits for a host that found work and now wait for it to end."""
    return _waiters_for(_mark(ansible, host))


def _reap(proc: subprocess.Popen) -> None:
    """End what a killed run left behind (its workers and tasks share its process group)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.communicate(timeout=30)
    except ValueError:  # stdout already closed by an earlier communicate
        pass


def test_overlapping_runs_take_turns(ansible, engine):
    log, gate = ansible.work / "overlap.log", ansible.work / "gate-a"
    log.touch()
    first = _start(ansible, "loc:loc2", "A", log, gate)
    try:
        _wait_for(lambda: "A loc2 start" in log.read_text(), what="run A to start its task", proc=first)
        second = _start(ansible, "loc2", "B", log)
        _wait_for(lambda: _waiting_for(engine, ansible, "loc2"), what="run B to wait for loc2", proc=second)
        assert " B " not in log.read_text(), "run B started while A held loc2"
        gate.touch()
        out_a, out_b = _finish(first), _finish(second)
    finally:
        gate.touch()
        _reap(first)
    assert first.returncode == 0, out_a
    assert second.returncode == 0, out_b
    times = _times(log)
    print(f"\noverlapping runs (A: loc, loc2; B: loc2):\n{_show(log)}")
    assert times[("B", "loc2", "start")] >= times[("A", "loc2", "end")], _show(log)
    assert f"host loc2 is busy: held by pid {first.pid}" in out_b, out_b
    assert "got host loc2 after waiting" in out_b
    assert "HOSTLOCK RECAP" in out_b and "serialize" in out_b


def test_disjoint_runs_overlap(ansible):
    log, gate = ansible.work / "disjoint.log", ansible.work / "gate-a"
    log.touch()
    first = _start(ansible, "loc", "A", log, gate)
    try:
        _wait_for(lambda: "A loc start" in log.read_text(), what="run A to start its task", proc=first)
        second = _start(ansible, "loc2", "B", log)  # no gate: it runs to its end while A holds loc
        out_b = _finish(second)
        assert second.returncode == 0, out_b
        assert "A loc end" not in log.read_text(), "A's task ended before the test let it: the test proves nothing"
        assert first.poll() is None
        gate.touch()
        out_a = _finish(first)
    finally:
        gate.touch()
        _reap(first)
    assert first.returncode == 0, out_a
    print(f"\ndisjoint runs (A: loc; B: loc2):\n{_show(log)}")
    times = _times(log)
    assert times[("B", "loc2", "end")] < times[("A", "loc", "end")], _show(log)
    assert "is busy" not in out_b


def test_fail_fast_and_timeout_end_the_run(ansible):
    log, gate = ansible.work / "fast.log", ansible.work / "gate-a"
    log.touch()
    first = _start(ansible, "loc", "A", log, gate)
    try:
        _wait_for(lambda: "A loc start" in log.read_text(), what="run A to start its task", proc=first)
        fast = _start(ansible, "loc", "F", log, HOSTLOCK_SERIALIZE_FAIL_FAST="true")
        out_fast = _finish(fast)
        started = time.monotonic()
        slow = _start(ansible, "loc", "T", log, HOSTLOCK_SERIALIZE_TIMEOUT="1")
        out_slow = _finish(slow)
        slow_took = time.monotonic() - started
        assert first.poll() is None and "A loc end" not in log.read_text(), "A must still hold loc"
    finally:
        gate.touch()
        _reap(first)
    assert fast.returncode == BUSY, out_fast
    assert f"host loc is still held after 0.0s by pid {first.pid}" in out_fast, out_fast
    assert slow.returncode == BUSY, out_slow
    assert "still held after 1." in out_slow and "HOSTLOCK_SERIALIZE_TIMEOUT" in out_slow, out_slow
    assert " F " not in log.read_text() and " T " not in log.read_text(), "a refused run ran its task"
    print(f"\nfail_fast and timeout=1 ended their runs with {BUSY} (timeout run took {slow_took:.2f}s)")


@pytest.mark.parametrize(
    "host,sig",
    [("loc", signal.SIGKILL), ("ssh1", signal.SIGKILL), ("loc", signal.SIGTERM), ("ssh1", signal.SIGINT)],
    ids=["local-SIGKILL", "ssh-SIGKILL", "local-SIGTERM", "ssh-SIGINT"],
)
def test_killed_run_mid_task_never_overlaps_the_next(ansible, engine, host, sig):
    """Issue 9 item 2: run A is killed while its task runs on the host; run B must not start its task
    on that host before A's task has ended there. A's task ignores SIGHUP/SIGINT/SIGTERM (as dpkg
    mid-install would), so it outlives its run whichever signal ends ansible-playbook."""
    log, gate = ansible.work / "killed.log", ansible.work / "gate-a"
    log.touch()
    first = _start(ansible, host, "A", log, gate, stubborn=True)
    second = None
    try:
        _wait_for(lambda: f"A {host} start" in log.read_text(), what="run A to start its task", proc=first)
        task_pid = int(log.read_text().split()[4])  # A's task on the host (the harness's hosts are this machine)
        os.kill(first.pid, sig)  # the ansible-playbook process only, as `kill PID` at a shell prompt does
        first.wait(60)
        second = _start(ansible, host, "B", log)
        _wait_for(lambda: _in_flight_waiters(ansible, host) or second.poll() is not None, what="run B to wait or end")
        in_flight = Path(f"/proc/{task_pid}").exists()
        if in_flight:  # A's task outlived its run: B waits for it
            assert Path(f"/proc/{task_pid}").exists() and f"B {host} start" not in log.read_text(), _show(log)
            gate.touch()
        else:  # B did not wait: then A's task must have ended with its run (the gate is still closed)
            assert not Path(f"/proc/{task_pid}").exists(), f"B ran while A's task {task_pid} still ran:\n{_show(log)}"
        out_b = _finish(second)
    finally:
        gate.touch()
        _reap(first)
        if second is not None:
            _reap(second)
    assert second.returncode == 0, out_b
    times = _times(log)
    print(f"\n{host}, run A killed with {sig.name} mid-task (A's task {'outlived' if in_flight else 'died with'} "
          f"its run):\n{_show(log)}")
    if in_flight:
        assert times[("B", host, "start")] >= times[("A", host, "end")], _show(log)
        assert f"host {host}: waiting for pid" in out_b, out_b
    assert in_flight, "A's task outlives its run here: the case under test"


def test_waits_left_by_killed_runs_never_wait_for_each_other(ansible):
    """Run B is SIGKILLed while its in-flight wait runs on the host (the wait goes on, orphaned); run C
    must still start once A's task ends: B's and C's waits must not wait for each other."""
    log, gate = ansible.work / "waiters.log", ansible.work / "gate-a"
    log.touch()
    first = _start(ansible, "loc", "A", log, gate, stubborn=True)
    second = third = None
    try:
        _wait_for(lambda: "A loc start" in log.read_text(), what="run A to start its task", proc=first)
        os.kill(first.pid, signal.SIGKILL)
        first.wait(60)
        second = _start(ansible, "loc", "B", log)
        _wait_for(lambda: len(_in_flight_waiters(ansible, "loc")) == 1, what="run B's wait", proc=second)
        os.kill(second.pid, signal.SIGKILL)
        second.wait(60)
        third = _start(ansible, "loc", "C", log)
        _wait_for(lambda: len(_in_flight_waiters(ansible, "loc")) == 2, what="C to wait beside B", proc=third)
        gate.touch()
        out_c = _finish(third)
    finally:
        gate.touch()
        for proc in (first, second, third):
            if proc is not None:
                _reap(proc)
    assert third.returncode == 0, out_c
    times = _times(log)
    assert times[("C", "loc", "start")] >= times[("A", "loc", "end")], _show(log)
    assert not [k for k in times if k[0] == "B"], _show(log)


def test_host_var_opts_out_of_the_in_flight_wait(ansible):
    """hostlock_serialize_wait_in_flight=false (for hosts without /proc) skips the wait: then, and only
    then, the next run starts beside a killed run's task (the control case of the test above)."""
    log, gate = ansible.work / "optout.log", ansible.work / "gate-a"
    log.touch()
    first = _start(ansible, "loc", "A", log, gate, stubborn=True)
    try:
        _wait_for(lambda: "A loc start" in log.read_text(), what="run A to start its task", proc=first)
        os.kill(first.pid, signal.SIGKILL)
        first.wait(60)
        run = ansible.play(
            "serialized.yml", "-e", "hostlock_serialize_wait_in_flight=false",
            extra_vars=dict(pattern="loc", tag="B", log=str(log), gate=""), **_env(ansible),
        )
        assert "A loc end" not in log.read_text()
    finally:
        gate.touch()
        _reap(first)
    assert run.rc == 0, run.out
    waits = run.results()[WAIT_TASK]
    assert waits["loc"]["_status"] == "skipped", waits
    assert "B loc end" in log.read_text()


@pytest.mark.parametrize("value", ["flase", "maybe", "0.5", "[]"])
def test_a_host_var_that_is_not_a_boolean_fails_the_host_before_its_first_task(ansible, value):
    """Fail closed: the bool filter would read a typo of hostlock_serialize_wait_in_flight as false and skip
    the wait; instead the host fails before its first task, with one line naming the variable."""
    log = ansible.work / "typo.log"
    log.touch()
    run = ansible.play("serialized.yml", "-e", f"hostlock_serialize_wait_in_flight={value}",
                       extra_vars=dict(pattern="loc", tag="B", log=str(log), gate=""), **_env(ansible))
    assert run.rc == 2, run.out
    assert "hostlock_serialize_wait_in_flight must be true or false" in run.out, run.out
    assert "Traceback" not in run.out
    assert "B loc start" not in log.read_text(), "the play's task ran"


@pytest.mark.parametrize("value", ["yes", "True", "1", "on"])
def test_a_host_var_that_says_true_keeps_the_wait(ansible, value):
    log = ansible.work / "yes.log"
    log.touch()
    run = ansible.play("serialized.yml", "-e", f"hostlock_serialize_wait_in_flight={value}",
                       extra_vars=dict(pattern="loc", tag="B", log=str(log), gate=""), **_env(ansible))
    assert run.rc == 0, run.out
    waits = run.results()[WAIT_TASK]
    assert waits["loc"]["_status"] != "skipped", waits
    assert "B loc end" in log.read_text()


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_run_killed_mid_wait_runs_nothing(ansible, engine, sig):
    """A run killed while it waits for a busy host leaves nothing behind and never runs its task."""
    log, gate = ansible.work / "midwait.log", ansible.work / "gate-a"
    log.touch()
    first = _start(ansible, "loc", "A", log, gate)
    try:
        _wait_for(lambda: "A loc start" in log.read_text(), what="run A to start its task", proc=first)
        waiting = _start(ansible, "loc", "W", log)
        _wait_for(lambda: _waiting_for(engine, ansible, "loc"), what="run W to wait for loc", proc=waiting)
        os.kill(waiting.pid, sig)
        waiting.wait(60)
        assert waiting.returncode != 0
        assert not _waiting_for(engine, ansible, "loc"), "the killed run still waits"
        third = _start(ansible, "loc", "C", log)
        _wait_for(lambda: _waiting_for(engine, ansible, "loc"), what="run C to wait for loc", proc=third)
        gate.touch()
        out_c = _finish(third)
    finally:
        gate.touch()
        _reap(first)
    assert third.returncode == 0, out_c
    times = _times(log)
    assert not [k for k in times if k[0] == "W"], f"the killed run ran its task:\n{_show(log)}"
    assert times[("C", "loc", "start")] >= times[("A", "loc", "end")], _show(log)


def test_in_flight_wait_honours_fail_fast(ansible):
    """A task a killed run left running makes a fail_fast run end with 75, before its own task."""
    log, gate = ansible.work / "inflight-fast.log", ansible.work / "gate-a"
    log.touch()
    first = _start(ansible, "loc", "A", log, gate)
    try:
        _wait_for(lambda: "A loc start" in log.read_text(), what="run A to start its task", proc=first)
        os.kill(first.pid, signal.SIGKILL)
        first.wait(60)
        fast = _start(ansible, "loc", "F", log, HOSTLOCK_SERIALIZE_FAIL_FAST="true")
        out = _finish(fast)
    finally:
        gate.touch()
        _reap(first)
    assert fast.returncode == BUSY, out
    assert "host loc still runs an earlier run's task" in out, out
    assert " F " not in log.read_text()


def test_scope_playbook_holds_later_plays_hosts_from_the_start(ansible, engine):
    log, gate = ansible.work / "scope.log", ansible.work / "gate-a"
    log.touch()
    evars = dict(first="loc", second="loc2", tag="A", log=str(log), gate=str(gate))
    held_by = {}
    for scope in ("play", "playbook"):
        run = ansible.popen("two_plays.yml", extra_vars=evars, **_env(ansible, HOSTLOCK_SERIALIZE_SCOPE=scope))
        try:
            _wait_for(lambda pid=run.pid: _in_first_play(engine, ansible, pid), what="play 1 to hold loc", proc=run)
            pids = [h.pid for h in engine.holders("ansible-host@loc2", directory=str(ansible.ctl_lockdir))]
            held_by[scope] = run.pid in pids
            gate.touch()
            out = _finish(run)
        finally:
            gate.touch()
            _reap(run)
        gate.unlink()
        assert run.returncode == 0, out
    assert held_by == {"play": False, "playbook": True}, held_by
    assert log.read_text().count("A loc2 second") == 2


def _in_first_play(engine, ansible, pid: int) -> bool:
    held = [h.pid for h in engine.holders("ansible-host@loc", directory=str(ansible.ctl_lockdir))]
    return pid in held and bool(_procs_with_arg(b"hold"))


def _procs_with_arg(arg: bytes) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if arg in (entry / "cmdline").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def test_json_stdout_callback_gets_a_clean_stdout(ansible, engine):
    """Issue 9 item 7: serialize writes through Ansible's display to stderr; stdout stays the stdout
    callback's (here a one-document JSON callback), even while it waits and prints its recap."""
    log, gate = ansible.work / "json.log", ansible.work / "gate-a"
    log.touch()
    first = _start(ansible, "loc", "A", log, gate)
    try:
        _wait_for(lambda: "A loc start" in log.read_text(), what="run A to start its task", proc=first)
        cmd = ansible.command("serialized.yml", extra_vars=dict(pattern="loc", tag="J", log=str(log), gate=""))
        env = ansible.env(**_env(ansible, ANSIBLE_STDOUT_CALLBACK="jsonout"))
        second = subprocess.Popen(cmd, cwd=ansible.work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, start_new_session=True)
        _wait_for(lambda: _waiting_for(engine, ansible, "loc"), what="run J to wait for loc", proc=None)
        gate.touch()
        out, err = second.communicate(timeout=180)
    finally:
        gate.touch()
        _reap(first)
    assert second.returncode == 0, out + err
    doc = json.loads(out)  # nothing but the stdout callback's document
    assert [r["status"] for r in doc["results"] if r["task"].startswith("Work")] == ["ok"], doc
    assert "host loc is busy" in err and "HOSTLOCK RECAP" in err, err


def _many_hosts_inventory(path: Path, count: int) -> Path:
    path.write_text("[many]\n" + "".join(f"m{i:05d}\n" for i in range(count)))
    return path


def test_ten_thousand_hosts_under_ulimit_1024(ansible, engine):
    """Issue 9 item 6: descriptors stay bounded; 10,000 hosts in one play under `ulimit -n 1024`."""
    inventory = _many_hosts_inventory(ansible.work / "many.ini", 10_000)
    cmd = " ".join(f"'{a}'" for a in ansible.command("many_hosts.yml"))
    env = ansible.env(**_env(ansible, ANSIBLE_INVENTORY=str(inventory), HOSTLOCK_SERIALIZE_WAIT_IN_FLIGHT="false"))
    run = subprocess.run(["bash", "-c", f"ulimit -n 1024 && exec {cmd}"], cwd=ansible.work, env=env,
                         capture_output=True, text=True, timeout=900, check=False)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    assert "Too many open files" not in run.stdout + run.stderr
    assert "ansible-host@.bucket-" in run.stderr, "a play this large takes bucket locks"
    # and those bucket locks exclude a small play on one of its hosts while they are held
    bucket = [n for n in engine.list_locks(directory=str(ansible.ctl_lockdir)) if ".bucket-" in str(n)]
    assert bucket, "no bucket lock was taken"


def test_local_error_is_not_try_again(ansible, tmp_path):
    """A lock directory that cannot be used is a local error: its own exit code, never 75."""
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    run = ansible.play(
        "serialized.yml",
        extra_vars=dict(pattern="loc", tag="E", log=str(tmp_path / "e.log"), gate=""),
        **_env(ansible, HOSTLOCK_SERIALIZE_DIRECTORY=str(not_a_dir)),
    )
    assert run.rc not in (0, BUSY), run.out
    assert "hostlock.core.serialize: cannot lock" in run.out, run.out
    assert not (tmp_path / "e.log").exists(), "the play ran although its hosts were not locked"


def test_killed_run_frees_controller_locks_at_once_and_its_lease_later(ansible, engine):
    """The controller's host lock ends with the killed run; the lease it took on the host outlives it, until
    the lease runs out. "Outlives" is judged against the lease's own expiry (its record): a check that ended
    after it proves nothing either way (a machine slow enough for a whole lease to pass), so the run is made
    again with a lease four times longer; a lock found free before its lease's expiry fails at once."""
    for attempt, lease in enumerate((3, 12, 48)):
        if _killed_run_frees_controller_locks(ansible, engine, lease, attempt):
            return
    pytest.fail("even a 48 s lease ran out before the check after the run's death ended")


def _killed_run_frees_controller_locks(ansible, engine, lease: int, attempt: int) -> bool:
    """One try of the test above: False when the lease ran out before a check ended (no conclusion)."""
    marker = ansible.work / f"marker-{attempt}"
    name = f"killed-{attempt}"
    run = ansible.popen(
        "killed.yml",
        extra_vars=dict(target="loc", lock=name, lease=lease, marker=str(marker)),
        **_env(ansible),
    )
    try:
        _wait_for(marker.exists, what="the run to take its lease", proc=run)
        live: list = []

        def listed() -> list:  # the lease's holder, as status lists it (seen to follow the marker by a moment)
            live[:] = [h for h in engine.holders(name, directory=str(ansible.lockdir)) if not h.stale]
            return live

        # Taken before the marker was made, the lease has surely run out a lease's length after it.
        ran_out = marker.stat().st_mtime + lease + 1
        _wait_for(lambda: listed() or time.time() >= ran_out, what="the lease's holder to be listed", proc=run)
        if not live:
            return False  # it ran out before status could list it
        expires = live[0].lease_expires
        ctl = engine.Lock("ansible-host@loc", directory=str(ansible.ctl_lockdir))
        with pytest.raises(engine.LockTimeout):
            ctl.acquire(timeout=0)  # the run holds its host
        os.kill(run.pid, signal.SIGKILL)
        run.wait(10)
        ctl.acquire(timeout=30)  # free once the process is gone (kernel lock)
        ctl.release()
        # the lease on the host outlives the run, and ends with its lease
        blocked = subprocess.run(
            [*hostlock_cli(), "run", "-n", "-q", "-d", str(ansible.lockdir), name, "true"], check=False
        )
        if blocked.returncode != BUSY and time.time() >= expires:
            return False
        assert blocked.returncode == BUSY
        _wait_for(
            lambda: not [h for h in engine.holders(name, directory=str(ansible.lockdir)) if not h.stale],
            timeout=lease + 60,
            what="the lease to end",
        )
        return True
    finally:
        _reap(run)  # the workers and `sleep 60` the killed run left behind


def test_recap_and_leases_left_held(ansible, engine):
    run = ansible.play("recap.yml", extra_vars=dict(target="loc", lock="recap"), **_env(ansible))
    try:
        assert run.rc == 0, run.out
        out = run.out
        assert "HOSTLOCK RECAP" in out, out
        assert "lock recap-wrapped" in out and "uses=1" in out, out
        assert "lock recap-forgotten is still held by a lease of this run" in out.replace("\n", " "), out
        assert "recap-released is still held" not in out
    finally:
        engine.break_lock("recap-forgotten", directory=str(ansible.lockdir), force=True)


def test_check_mode_takes_no_controller_lock(ansible):
    log, gate = ansible.work / "check.log", ansible.work / "gate-a"
    log.touch()
    first = _start(ansible, "loc", "A", log, gate)
    try:
        _wait_for(lambda: "A loc start" in log.read_text(), what="run A to start its task", proc=first)
        checked = ansible.play(
            "serialized.yml", "--check", extra_vars=dict(pattern="loc", tag="C", log=str(log), gate=""),
            **_env(ansible),
        )
    finally:
        gate.touch()
        _reap(first)
    assert checked.rc == 0, checked.out
    assert f"check mode takes no lock; host loc is held by pid {first.pid}" in checked.out, checked.out


# -- fail closed: a setting the callback cannot honour stops the run before its first task (issue 23) ------
BAD_SETTINGS = [
    ("timeout", "30x"), ("timeout", "-1"), ("timeout", "abc"), ("timeout", "nan"), ("timeout", "1_0"),
    ("scope", "bogus"), ("wait_in_flight", "maybe"), ("fail_fast", "sometimes"), ("recap", "2"),
    ("ttl", "0"), ("ttl", "soon"), ("prefix", "bad/prefix"), ("fleet", "http://127.0.0.1:1"),
    ("directory", ""), ("directory", "locks"), ("directory", "./locks"),
]


@pytest.mark.parametrize("given", ["env", "ini"])
@pytest.mark.parametrize("name,value", BAD_SETTINGS, ids=[f"{n}={v}" for n, v in BAD_SETTINGS])
def test_a_setting_that_cannot_be_honoured_stops_the_run_before_its_first_task(ansible, name, value, given):
    log = ansible.work / "bad.log"
    log.touch()
    env = {}
    if given == "env":
        env[f"HOSTLOCK_SERIALIZE_{name.upper()}"] = value
    else:
        (ansible.work / "ansible.cfg").write_text(f"[defaults]\n\n[hostlock_serialize]\n{name} = {value}\n")
        if name == "directory":
            env["HOSTLOCK_SERIALIZE_DIRECTORY"] = None  # the tests' own, which would win over the file's
    proc = _start(ansible, "loc", "X", log, **env)
    out = _finish(proc)
    assert proc.returncode == 64, out
    assert log.read_text() == "", "a task ran under a setting the callback could not honour"
    lines = [line for line in out.splitlines() if "hostlock.core.serialize" in line]
    assert len(lines) == 1 and f"invalid setting {name}" in lines[0] and "no play was run" in lines[0], out
    assert "Failed to load callback plugin" not in out and "Traceback" not in out, out


@pytest.mark.parametrize("value", ["30m", "1h30m", "90", "forever", "FOREVER"])
def test_timeouts_read_as_everywhere_in_the_collection(ansible, value):
    log = ansible.work / "good.log"
    log.touch()
    (ansible.work / "ansible.cfg").write_text(f"[defaults]\n\n[hostlock_serialize]\ntimeout = {value}\n")
    proc = _start(ansible, "loc", "G", log)
    out = _finish(proc)
    assert proc.returncode == 0, out
    assert "G loc start" in log.read_text() and "G loc end" in log.read_text()


# -- the in-flight marker: honoured only from the run's own user (issue 22 item 3) --------------------------
HOLD = "import sys; print('ready', flush=True); sys.stdin.readline()"
UNDUMPABLE = "import ctypes; ctypes.CDLL(None).prctl(4, 0, 0, 0, 0); " + HOLD  # PR_SET_DUMPABLE 0


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv")
@pytest.mark.parametrize("kind", ["plain", "undumpable", "run-marker-too"])
def test_another_users_process_with_the_marker_neither_stalls_nor_delays_the_run(ansible, kind):
    """A neighbour starts a process carrying the host's marker (the scope is the same on every default
    installation): root's run must not wait for it, whatever it does to look like root's."""
    argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "env", _mark(ansible, "loc")]
    if kind == "run-marker-too":
        argv.append("HOSTLOCK_SERIALIZE_RUN=earlier")
    argv += ["/usr/bin/python3", "-c", UNDUMPABLE if kind == "undumpable" else HOLD]
    squatter = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert squatter.stdout.readline().startswith("ready")
        if kind == "undumpable":  # its /proc files now belong to root: only its status tells its uid
            assert os.stat(f"/proc/{squatter.pid}/environ").st_uid == 0
        log = ansible.work / "squat.log"
        log.touch()
        proc = _start(ansible, "loc", "R", log, HOSTLOCK_SERIALIZE_TIMEOUT="1h")
        out = _finish(proc)
        assert proc.returncode == 0, out
        assert "waiting for pid" not in out, out
        assert squatter.poll() is None  # it was there all along
    finally:
        squatter.kill()
        squatter.wait()


def test_the_runs_own_earlier_work_is_waited_for_and_shown_inert(ansible):
    """Root's own marked process (an earlier run's task left behind) is waited for; its command line, which
    holds escape sequences, reaches the controller's terminal as one inert line."""
    gate = ansible.work / "gate-left"
    left = subprocess.Popen(["env", _mark(ansible, "loc"), "HOSTLOCK_SERIALIZE_RUN=earlier", "/bin/sh", "-c",
                             'while [ ! -e "$1" ]; do sleep 0.05; done', "\x1b[2J\x1b[Hfake\rline", str(gate)])
    log = ansible.work / "own.log"
    log.touch()
    proc = _start(ansible, "loc", "W", log)
    try:
        _wait_for(lambda: _in_flight_waiters(ansible, "loc"), what="the run to wait for the left task", proc=proc)
        assert "W loc start" not in log.read_text()
        gate.touch()
        out = _finish(proc)
    finally:
        gate.touch()
        left.wait(30)
        _reap(proc)
    assert proc.returncode == 0, out
    (line,) = [x for x in out.splitlines() if f"waiting for pid {left.pid}" in x]
    assert "\x1b" not in out and "\r" not in line and "?[2J?[Hfake?line" in line, repr(line)


# -- the wait module on its own: whose processes it waits for (issue 42 item 1) -------------------------------
WAIT_ALONE = "Wait for the processes carrying the mark"  # playbooks/serialize_host.yml
THIS_RUN = "HOSTLOCK_SERIALIZE_RUN=this-run"
NOBODY = ["setpriv", "--regid=65534", "--clear-groups"]


def _holders(cases: dict) -> dict:
    """{case: process} for {case: (argv prefix, environment entries)}: each says ready, then holds until a line
    reaches its stdin."""
    procs = {}
    try:
        for case, (prefix, entries) in cases.items():
            procs[case] = subprocess.Popen([*prefix, "env", *entries, "/usr/bin/python3", "-c", HOLD],
                                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for proc in procs.values():
            assert proc.stdout.readline().startswith("ready")
    except BaseException:
        for proc in procs.values():
            proc.kill()
            proc.wait()
        raise
    return procs


def test_the_wait_module_waits_only_for_other_runs_processes_of_its_own_uid(ansible):
    """hostlock.core.serialize_host alone: of the processes carrying the host's mark it waits for exactly those
    not of this run whose real and effective uid are both its own; a longer mark, or the mark under another
    name, is not the mark. One scan with timeout 0 names them and fails (rc 75); without a timeout it calls
    itself after the first of them, and ends once they have, while the others still run."""
    mark = _mark(ansible, "loc")
    counted = {
        "another run's": ([], [mark, "HOSTLOCK_SERIALIZE_RUN=earlier"]),
        "no run's": ([], [mark]),
        "a run whose id starts with ours": ([], [mark, THIS_RUN + "x"]),
    }
    ignored = {
        "this run's": ([], [mark, THIS_RUN]),
        "a longer mark": ([], [mark + "x", "HOSTLOCK_SERIALIZE_RUN=earlier"]),
        "the mark under another name": ([], ["X" + mark]),
    }
    if os.geteuid() == 0 and shutil.which("setpriv"):
        ignored.update({
            "another user's": ([*NOBODY, "--reuid=65534"], [mark]),
            "another real uid": ([*NOBODY, "--ruid=65534"], [mark]),
            "another effective uid": ([*NOBODY, "--euid=65534"], [mark]),
        })
    procs = _holders({**counted, **ignored})
    waiting = None
    try:
        want = {procs[case].pid: case for case in counted}
        evars = dict(pattern="loc", mark=mark, unless=THIS_RUN)
        once = ansible.play("serialize_host.yml", extra_vars=dict(evars, timeout=0))
        result = once.results()[WAIT_ALONE]["loc"]
        assert result["_status"] == "failed" and result["rc"] == BUSY and result["msg"] == "still running", result
        shown = {int(line.split()[3].rstrip(":")): line for line in result["stdout"].splitlines()}
        assert sorted(shown) == sorted(want), {pid: want.get(pid, "not counted") for pid in shown}
        assert all(line.endswith(": /usr/bin/python3 -c " + HOLD) for line in shown.values()), shown

        record = ansible.work / "record-wait.json"
        waiting = ansible.popen("serialize_host.yml", extra_vars=evars, HOSTLOCK_TEST_RECORD=str(record))
        _wait_for(lambda: _waiters_for(mark), what="the wait to find them", proc=waiting)
        (waiter,) = _waiters_for(mark)
        assert Path(f"/proc/{waiter}/comm").read_text() == f"hl-wait {min(want)}\n"
        for case in counted:
            procs[case].communicate("\n", timeout=30)
        out = _finish(waiting)
        assert waiting.returncode == 0, out
        result = json.loads(record.read_text())[WAIT_ALONE]["loc"]
        assert result["_status"] == "ok" and result["rc"] == 0 and not result["changed"], result
        lines = result["stdout"].splitlines()
        assert sorted(int(line.split()[3].rstrip(":")) for line in lines[:-1]) == sorted(want), lines
        assert lines[-1] == "earlier runs' tasks ended", lines
        assert [case for case in ignored if procs[case].poll() is not None] == [], "an ignored process ended"
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()
        if waiting is not None:
            _reap(waiting)


def test_a_killed_runs_worker_never_starts_its_task_after_the_run_died(ansible):
    """SIGKILL ends ansible-playbook, not its workers: one busy on the controller (here a lookup that waits
    for a gate) went on and started its task on the host after the run had died, and after the next run
    had found nothing of it there and begun: an overlap. The workers now die with ansible-playbook."""
    log, gate, seen = ansible.work / "orphan.log", ansible.work / "gate-lookup", ansible.work / "seen"
    log.touch()
    run = ansible.popen("serialized_slow_lookup.yml", extra_vars=dict(pattern="loc", tag="A", log=str(log),
                                                                      gate=str(gate), seen=str(seen)),
                        **_env(ansible))
    try:
        _wait_for(seen.exists, what="the worker's lookup to start", proc=run)
        worker, lookup = (int(x) for x in seen.read_text().split())
        os.kill(run.pid, signal.SIGKILL)  # ansible-playbook alone, as the OOM killer would
        run.wait(60)
        _wait_for(lambda: not Path(f"/proc/{worker}").exists() or
                  Path(f"/proc/{worker}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z",
                  timeout=30, what="the killed run's worker to die with it")
        gate.touch()  # the lookup (an orphan now) ends; a living worker would go on to the task
        _wait_for(lambda: not Path(f"/proc/{lookup}").exists(), timeout=30, what="the lookup to end")
    finally:
        gate.touch()
        _reap(run)
    assert "A loc start" not in log.read_text(), log.read_text()


def test_scope_playbook_keeps_its_hosts_when_a_later_play_adds_one_that_sorts_first(ansible, engine):
    """A host known only when its play starts (its pattern is a fact) whose lock sorts before those held:
    the run released what it held, to take every lock in order, and a waiting run got in between two plays.
    A lock that is free is now taken out of order (no wait, so no deadlock), and nothing held is let go."""
    log, gate = ansible.work / "late.log", ansible.work / "gate-late"
    log.touch()
    first = ansible.popen("late_host.yml", extra_vars=dict(tag="A", log=str(log), gate=str(gate)),
                          **_env(ansible, HOSTLOCK_SERIALIZE_SCOPE="playbook"))
    second = None
    try:
        _wait_for(lambda: bool(_procs_with_arg(b"hold")), what="run A to hold loc2 in its first play", proc=first)
        second = _start(ansible, "loc2", "B", log)
        _wait_for(lambda: _waiting_for(engine, ansible, "loc2"), what="run B to wait for loc2", proc=second)
        gate.touch()
        out_a, out_b = _finish(first), _finish(second)
    finally:
        gate.touch()
        _reap(first)
        if second is not None:
            _reap(second)
    assert first.returncode == 0 and second.returncode == 0, out_a + out_b
    lines = log.read_text().split("\n")
    third = next(i for i, line in enumerate(lines) if line.startswith("A loc2 third"))
    b_start = next(i for i, line in enumerate(lines) if line.startswith("B loc2 start"))
    assert third < b_start, log.read_text()
    assert "releasing those to take every lock in order" not in out_a, out_a


def test_check_mode_locks_a_play_that_changes_hosts_for_real(ansible):
    """--check took no lock, but a task with check_mode: false runs for real: it ran on a host another run
    was working on. Such a play is now locked as a real run's (here: fail_fast, so it gives up, 75)."""
    log, gate = ansible.work / "check-real.log", ansible.work / "gate-a"
    log.touch()
    first = _start(ansible, "loc", "A", log, gate)
    try:
        _wait_for(lambda: "A loc start" in log.read_text(), what="run A to start its task", proc=first)
        checked = ansible.play("check_mode_false.yml", "--check",
                               extra_vars=dict(pattern="loc", tag="C", log=str(log)),
                               **_env(ansible, HOSTLOCK_SERIALIZE_FAIL_FAST="true"))
    finally:
        gate.touch()
        _reap(first)
    assert checked.rc == BUSY, checked.out
    assert "check mode, but play 'Work for real, even under --check' has a task with check_mode: false" in checked.out
    assert "C loc start" not in log.read_text(), log.read_text()


# -- the wait only where an earlier holder may have left work (issue 40 item 9) ------------------------------

def _waited_on(run) -> dict[str, str]:
    """{host: status} of the run's in-flight wait task; empty when the play had none."""
    return {h: r["_status"] for h, r in run.results().get(WAIT_TASK, {}).items()}


def _play(ansible, hosts: str, tag: str, log: Path, **env):
    return ansible.play("serialized.yml", extra_vars=dict(pattern=hosts, tag=tag, log=str(log), gate=""),
                        **_env(ansible, **env))


def _entry(ansible, host: str) -> Path:
    return ansible.ctl_lockdir / f".serialize={os.geteuid()}=ansible-host@{host}"


def test_a_clean_end_lets_the_next_run_skip_the_wait_and_a_killed_one_does_not(ansible):
    """The wait costs a module run per host per play; a run whose hosts' last holder ended cleanly runs none.
    A clean run, then one killed mid-task: the next run waits for the killed run's task (and only on the
    host it was killed on), then the run after it skips again."""
    log, gate = ansible.work / "handover.log", ansible.work / "gate-a"
    log.touch()
    first = _play(ansible, "loc:loc2", "A", log)
    assert first.rc == 0, first.out
    assert _waited_on(first) != {}, "nothing was known of these hosts: the first run waits"
    assert _entry(ansible, "loc").read_bytes() == b"clean\n"
    second = _play(ansible, "loc:loc2", "B", log)
    assert second.rc == 0 and _waited_on(second) == {}, second.out
    killed = _start(ansible, "loc", "K", log, gate, stubborn=True)
    third = None
    try:
        _wait_for(lambda: "K loc start" in log.read_text(), what="run K to start its task", proc=killed)
        os.kill(killed.pid, signal.SIGKILL)
        killed.wait(60)
        third = _start(ansible, "loc:loc2", "C", log)
        _wait_for(lambda: _in_flight_waiters(ansible, "loc"), what="run C to wait for K's task", proc=third)
        assert "C loc start" not in log.read_text()
        gate.touch()
        out = _finish(third)
    finally:
        gate.touch()
        _reap(killed)
        if third is not None:
            _reap(third)
    assert third.returncode == 0, out
    times = _times(log)
    assert times[("C", "loc", "start")] >= times[("K", "loc", "end")], _show(log)
    assert "host loc: waiting for pid" in out and "host loc2: waiting" not in out, out
    fourth = _play(ansible, "loc:loc2", "D", log)
    assert fourth.rc == 0 and _waited_on(fourth) == {}, fourth.out


def test_only_the_hosts_that_need_it_wait(ansible):
    log = ansible.work / "partial.log"
    log.touch()
    assert _play(ansible, "loc", "A", log).rc == 0
    run = _play(ansible, "loc:loc2", "B", log)
    assert run.rc == 0, run.out
    assert _waited_on(run) == {"loc": "skipped", "loc2": "ok"}, run.results()


def test_an_async_job_left_with_poll_0_is_waited_for_by_the_next_run(ansible):
    """A run that ends cleanly but left a job running on the host (async, poll 0): the next run waits for it."""
    log, gate = ansible.work / "async.log", ansible.work / "gate-async"
    log.touch()
    assert _play(ansible, "loc", "A", log).rc == 0  # the host is known clean now
    left = ansible.play("serialized_async.yml", extra_vars=dict(pattern="loc", tag="J", log=str(log), gate=str(gate)),
                        **_env(ansible))
    assert left.rc == 0, left.out
    _wait_for(lambda: "J loc start" in log.read_text(), what="the async job to start")
    nxt = _start(ansible, "loc", "B", log)
    try:
        _wait_for(lambda: _in_flight_waiters(ansible, "loc"), what="the next run to wait for the job", proc=nxt)
        assert "B loc start" not in log.read_text()
        gate.touch()
        out = _finish(nxt)
    finally:
        gate.touch()
        _reap(nxt)
    assert nxt.returncode == 0, out
    times = _times(log)
    assert times[("B", "loc", "start")] >= times[("J", "loc", "end")], _show(log)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make files of another owner")
@pytest.mark.parametrize("what", ["our entry, planted by another user", "another user's newer entry"])
def test_another_user_cannot_make_a_run_skip_the_wait(ansible, what):
    """Only bytes of our own uid say clean; a newer entry of anyone's means someone held the host since."""
    log = ansible.work / "planted.log"
    log.touch()
    if what.startswith("our entry"):
        planted = _entry(ansible, "loc")
    else:
        assert _play(ansible, "loc", "A", log).rc == 0
        planted = ansible.ctl_lockdir / ".serialize=65534=ansible-host@loc"
    planted.write_bytes(b"clean\n")
    os.chown(planted, 65534, 65534)
    run = _play(ansible, "loc", "B", log)
    assert run.rc == 0, run.out
    assert _waited_on(run) == {"loc": "ok"}, run.results()
