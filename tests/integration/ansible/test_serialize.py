"""hostlock.core.serialize: concurrent ansible-playbook runs, real processes, real signals."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import hostlock_cli

CALLBACKS = "record,hostlock.core.serialize"
BUSY = 75


def _env(ansible, **extra):
    env = dict(ANSIBLE_CALLBACKS_ENABLED=CALLBACKS, HOSTLOCK_SERIALIZE_DIRECTORY=str(ansible.ctl_lockdir))
    env.update(extra)
    return env


def _start(ansible, hosts: str, tag: str, log: Path, nap: float, **env) -> subprocess.Popen:
    return ansible.popen(
        "serialized.yml", extra_vars=dict(pattern=hosts, tag=tag, log=str(log), nap=nap), **_env(ansible, **env)
    )


def _times(log: Path) -> dict[tuple[str, str, str], float]:
    """{(tag, host, start|end): epoch} from the playbook's log."""
    found = {}
    for line in log.read_text().splitlines():
        tag, host, what, when = line.split()
        found[(tag, host, what)] = float(when)
    return found


def _wait_for(predicate, timeout: float = 60, what: str = "condition", proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"ansible-playbook exited ({proc.returncode}) before {what}:\n{proc.stdout.read()}")
        time.sleep(0.05)
    pytest.fail(f"timed out after {timeout}s waiting for {what}")


def _finish(proc: subprocess.Popen, timeout: float = 120) -> str:
    out, _err = proc.communicate(timeout=timeout)
    return out


def _show(log: Path) -> str:
    times = _times(log)
    t0 = min(times.values())
    return "\n".join(
        f"  +{when - t0:6.2f}s  {tag} {host} {what}"
        for (tag, host, what), when in sorted(times.items(), key=lambda kv: kv[1])
    )


def test_overlapping_runs_take_turns(ansible):
    log = ansible.work / "overlap.log"
    log.touch()
    first = _start(ansible, "loc:loc2", "A", log, nap=3)
    _wait_for(lambda: "A loc2 start" in log.read_text(), what="run A to start its task", proc=first)
    second = _start(ansible, "loc2", "B", log, nap=0.5)
    out_a, out_b = _finish(first), _finish(second)
    assert first.returncode == 0, out_a
    assert second.returncode == 0, out_b
    times = _times(log)
    print(f"\noverlapping runs (A: loc, loc2; B: loc2):\n{_show(log)}")
    assert times[("B", "loc2", "start")] >= times[("A", "loc2", "end")], _show(log)
    assert f"host loc2 is busy: held by pid {first.pid}" in out_b, out_b
    assert "got host loc2 after waiting" in out_b
    assert "HOSTLOCK RECAP" in out_b and "serialize" in out_b


def test_disjoint_runs_overlap(ansible):
    log = ansible.work / "disjoint.log"
    log.touch()
    first = _start(ansible, "loc", "A", log, nap=3)
    _wait_for(lambda: "A loc start" in log.read_text(), what="run A to start its task", proc=first)
    second = _start(ansible, "loc2", "B", log, nap=0.5)
    out_a, out_b = _finish(first), _finish(second)
    assert first.returncode == 0 and second.returncode == 0, out_a + out_b
    times = _times(log)
    print(f"\ndisjoint runs (A: loc; B: loc2):\n{_show(log)}")
    assert times[("B", "loc2", "end")] < times[("A", "loc", "end")], _show(log)
    assert "is busy" not in out_b


def test_fail_fast_and_timeout_end_the_run(ansible):
    log = ansible.work / "fast.log"
    log.touch()
    first = _start(ansible, "loc", "A", log, nap=4)
    try:
        _wait_for(lambda: "A loc start" in log.read_text(), what="run A to start its task", proc=first)
        started = time.monotonic()
        fast = _start(ansible, "loc", "F", log, nap=0, HOSTLOCK_SERIALIZE_FAIL_FAST="true")
        out_fast = _finish(fast)
        fast_took = time.monotonic() - started
        started = time.monotonic()
        slow = _start(ansible, "loc", "T", log, nap=0, HOSTLOCK_SERIALIZE_TIMEOUT="1")
        out_slow = _finish(slow)
        slow_took = time.monotonic() - started
    finally:
        _finish(first)
    assert fast.returncode == BUSY, out_fast
    assert f"host loc is still held after 0.0s by pid {first.pid}" in out_fast, out_fast
    assert slow.returncode == BUSY, out_slow
    assert "still held after 1." in out_slow and "HOSTLOCK_SERIALIZE_TIMEOUT" in out_slow, out_slow
    assert slow_took >= 1.0
    assert " F " not in log.read_text() and " T " not in log.read_text(), "a refused run ran its task"
    print(f"\nfail_fast ended the run in {fast_took:.2f}s, timeout=1 in {slow_took:.2f}s (exit {BUSY})")


def test_killed_run_frees_controller_locks_at_once_and_its_lease_later(ansible, engine):
    marker = ansible.work / "marker"
    lease = 3
    run = ansible.popen(
        "killed.yml",
        extra_vars=dict(target="loc", lock="killed", lease=lease, marker=str(marker)),
        **_env(ansible),
    )
    try:
        _wait_for(marker.exists, what="the run to take its lease", proc=run)
        time.sleep(0.3)  # the `sleep 60` task is running now
        ctl = engine.Lock("ansible-host@loc", directory=str(ansible.ctl_lockdir))
        with pytest.raises(engine.LockTimeout):
            ctl.acquire(timeout=0)  # the run holds its host
        os.kill(run.pid, signal.SIGKILL)
        run.wait(10)
        killed = time.monotonic()
        ctl.acquire(timeout=1)  # free as soon as the process is gone (kernel lock)
        freed_after = time.monotonic() - killed
        ctl.release()
        # the lease on the host outlives the run, and ends with its lease
        blocked = subprocess.run(
            [*hostlock_cli(), "run", "-n", "-q", "-d", str(ansible.lockdir), "killed", "true"], check=False
        )
        assert blocked.returncode == BUSY
        _wait_for(
            lambda: not [h for h in engine.holders("killed", directory=str(ansible.lockdir)) if not h.stale],
            timeout=lease + 5,
            what="the lease to end",
        )
        lease_freed_after = time.monotonic() - killed
        assert lease_freed_after <= lease + 2
        print(
            f"\ncontroller lock free {freed_after * 1000:.1f} ms after SIGKILL; host lease free after "
            f"{lease_freed_after:.1f}s (lease {lease}s)"
        )
        assert freed_after < 0.5
    finally:
        try:
            os.killpg(run.pid, signal.SIGKILL)  # the workers and `sleep 60` the killed run left behind
        except ProcessLookupError:
            pass
        run.communicate(timeout=10)


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
    log = ansible.work / "check.log"
    log.touch()
    first = _start(ansible, "loc", "A", log, nap=3)
    try:
        _wait_for(lambda: "A loc start" in log.read_text(), what="run A to start its task", proc=first)
        checked = ansible.play(
            "serialized.yml", "--check", extra_vars=dict(pattern="loc", tag="C", log=str(log), nap=0), **_env(ansible)
        )
    finally:
        _finish(first)
    assert checked.rc == 0, checked.out
    assert f"check mode takes no lock; host loc is held by pid {first.pid}" in checked.out, checked.out
