"""hostlock.core.locked through real ansible-playbook runs, over local and SSH connections."""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys

import pytest
from harness import Sshd, hostlock_cli
from harness import wait_for as _wait_for


@pytest.mark.parametrize("target", ["loc", "ssh1"])
def test_locked_wraps_and_releases(ansible, engine, target):
    run = ansible.play("locked_tasks.yml", extra_vars=dict(target=target, lock="wrapped"))
    assert run.rc == 0, run.out
    r = {task: hosts[target] for task, hosts in run.results().items()}

    failing = r["Fail inside the lock"]
    assert failing["_status"] == "failed" and failing["rc"] == 3 and failing["stdout"] == "about to fail", failing
    assert failing["hostlock"]["released"] is True and failing["hostlock"]["name"] == "wrapped", failing
    assert not r["Read the lock after the failure"]["locks"][0]["holders"], "lock kept after a failing task"
    assert r["Run the host job after the failure"]["rc"] == 0

    pinged = r["Wrap a plain module"]
    assert pinged["ping"] == "inside" and not pinged["changed"], pinged
    lock = pinged["hostlock"]
    assert lock["released"] and lock["taken"] and lock["waited"] >= 0 and lock["held"] > 0, lock
    assert lock["directory"] == str(ansible.lockdir) and lock["module"] == "ansible.builtin.ping", lock
    assert "payload" not in str(pinged), "the payload must never come back in the result"

    assert r["Wrap a module that takes its arguments from module_defaults"]["ping"] == "from-module-defaults"
    looped = r["Wrap a module in a loop"]["results"]
    assert [x["ping"] for x in looped] == ["one", "two"] and all(x["hostlock"]["released"] for x in looped)

    shaped = r["Wrap a module in the task's own shape, free-form"]
    assert shaped["stdout"] == "from-environment under the lock", shaped
    assert shaped["hostlock"]["module"] == "ansible.legacy.command", shaped

    written = r["Wrap a module that writes a file"]
    assert written["changed"] and written["hostlock"]["released"], written

    checked = r["Wrap a module in check mode with diff"]
    assert checked["changed"], checked
    assert checked["hostlock"]["free"] is True and checked["hostlock"]["taken"] is False, checked
    assert "held" not in checked["hostlock"] and "released" not in checked["hostlock"], checked
    diff = checked["diff"]
    diff = diff[0] if isinstance(diff, list) else diff
    assert "two" in diff["after"] and "two" not in diff["before"], diff
    assert base64.b64decode(r["Read the written file"]["content"]) == b"one\n", "check mode wrote the file"

    copied = r["Wrap an action plugin that transfers files"]  # issue 23: under a heartbeat lease on the host
    assert copied["_status"] in ("ok", "changed") and copied["hostlock"]["released"], copied
    assert (ansible.work / f"{target}-copied.txt").exists()
    absurd = r["Wrap with an absurd timeout"]
    assert absurd["_status"] == "failed" and "timeout" in absurd["msg"] and "too long" in absurd["msg"], absurd

    missing = r["Wrap a module that does not exist"]
    assert missing["_status"] == "failed" and "no.such.module" in missing["msg"], missing
    no_lease = r["Wrap without a lease, which a single task does not need"]
    assert no_lease["_status"] == "ok" and no_lease["hostlock"]["released"], no_lease
    keyword = r["Wrap a controller-side keyword"]
    assert keyword["_status"] == "failed" and "cannot be wrapped" in keyword["msg"], keyword
    assert "hostlock.core.with_lock" in keyword["msg"] and "with_lock_tasks" in keyword["msg"], keyword
    assert not r["Read the lock at the end"]["locks"][0]["holders"]
    assert not [h for h in engine.holders("wrapped", directory=str(ansible.lockdir)) if not h.stale]


# The wrapped work: records its start (with its pid), ignores the signals a controller's death may send
# (so a lock that dies early would show as an overlap), waits for the test's gate file, records its end.
WORK = (
    "trap '' INT TERM HUP; echo \"in $$\" >> {events}; while [ ! -e {gate} ]; do sleep 0.02; done; echo out >> {events}"
)
# The next job, through the host's CLI: records whether the wrapped work's process still existed.
NEXT = (
    "import sys\n"
    "try:\n    state = open('/proc/%s/stat' % sys.argv[2]).read().rpartition(')')[2].split()[0]\n"
    "except OSError:\n    state = 'gone'\n"
    "open(sys.argv[1], 'a').write('next overlap\\n' if state not in ('gone', 'Z', 'X') else 'next\\n')\n"
)


def _work_playbook(ansible, host: str, lock: str, events, gate) -> str:
    playbook = ansible.work / f"work-{lock}.yml"
    playbook.write_text(
        f"- hosts: {host}\n  gather_facts: false\n  tasks:\n"
        "    - name: Work under the lock until the gate opens\n      hostlock.core.locked:\n"
        f"        name: {lock}\n        directory: '{{{{ lockdir }}}}'\n"
        "        task:\n          ansible.builtin.shell: |\n"
        f"            {WORK.format(events=events, gate=gate)}\n"
    )
    return str(playbook)


def _started(events):
    lines = events.read_text().splitlines() if events.exists() else []
    return int(lines[0].split()[1]) if lines and lines[0].startswith("in ") else None


def _prove_no_overlap(ansible, engine, lock, events, gate, work_pid) -> None:
    """The lock is still held while the work runs; the next job starts only after the work ended."""
    assert _live(engine, lock, ansible), "the lock was freed while the wrapped work still runs"
    nxt = subprocess.Popen(
        [
            *hostlock_cli(),
            "run",
            "-w",
            "120",
            "-d",
            str(ansible.lockdir),
            lock,
            sys.executable,
            "-c",
            NEXT,
            str(events),
            str(work_pid),
        ]
    )
    try:
        # the next job may only run after the gate opens: it must not have written anything yet
        assert nxt.poll() is None or events.read_text().splitlines()[1:] == ["out"], events.read_text()
        gate.touch()
        assert nxt.wait(timeout=120) == 0
    finally:
        if nxt.poll() is None:
            nxt.kill()
    lines = events.read_text().splitlines()
    assert lines[0].startswith("in ") and lines[1:] in (["out", "next"], ["next"]), lines
    _wait_for(lambda: not _live(engine, lock, ansible), "the lock to be free after the work")


@pytest.mark.parametrize("pipelining", ["True", "False"])
@pytest.mark.parametrize("target", ["loc", "ssh1"])
def test_locked_runs_the_wrapped_modules_exit_handlers(ansible, target, pipelining):
    """The forked child runs what the wrapped module registered with atexit: under pipelining AnsibleModule
    removes the tmpdir get_url downloads into that way (it was left behind, one per task)."""
    (ansible.work / "source.txt").write_text("payload\n")
    remote_tmp = ansible.work / f"remote-tmp-{target}"
    run = ansible.play("locked_cleanup.yml", extra_vars=dict(target=target), ANSIBLE_PIPELINING=pipelining)
    assert run.rc == 0, run.out
    r = {task: hosts[target] for task, hosts in run.results().items()}
    assert r["Download under the lock"]["changed"] and r["Download under the lock"]["hostlock"]["released"], r
    assert (ansible.work / f"{target}-downloaded.txt").read_text() == "payload\n"
    assert (ansible.work / f"{target}-downloaded-plain.txt").read_text() == "payload\n"
    left = sorted(p.name for p in remote_tmp.glob("*")) if remote_tmp.exists() else []
    assert left == [], f"temporary directories left behind under {remote_tmp}: {left}"
    # AnsiballZ's payload directories (the runner's, the wrapped module's, the plain task's): none is left
    payloads = ansible.work / f"payload-tmp-{target}"
    assert payloads.is_dir() and sorted(p.name for p in payloads.iterdir()) == [], list(payloads.iterdir())


@pytest.mark.parametrize("target", ["loc", "ssh1"])
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM", "SIGKILL"])
def test_locked_lock_lives_as_long_as_the_work_when_the_controller_dies(ansible, engine, tmp_path, target, sig):
    """Ctrl-C (SIGINT to the controller's process group), SIGTERM, SIGKILL mid-task: no overlap, no stall."""
    lock = f"dies-{target}-{sig.lower()}"
    events, gate = tmp_path / "events", tmp_path / "gate"
    proc = ansible.popen(_work_playbook(ansible, target, lock, events, gate))
    try:
        work_pid = _wait_for(lambda: _started(events), "the wrapped work to start")
        signum = getattr(signal, sig)
        if sig == "SIGTERM":
            os.kill(proc.pid, signum)  # `kill PID` of ansible-playbook
        else:
            os.killpg(proc.pid, signum)  # Ctrl-C at the terminal, or kill -9 of the whole run
        proc.communicate(timeout=120)
        _prove_no_overlap(ansible, engine, lock, events, gate, work_pid)
    finally:
        gate.touch()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM", "SIGKILL"])
def test_locked_killed_controller_stops_waiting(ansible, engine, tmp_path, sig):
    """A controller killed while its task waits for the lock over SSH.

    Ctrl-C and SIGTERM: the task gives up on the host and never runs. kill -9: when the ssh ControlPersist
    master outlives the controller it keeps the session open, so the host cannot tell; the task then runs
    once the lock comes free, still under the lock (documented in docs/ansible.md). Either way, no overlap.
    """
    lock = f"waiting-{sig.lower()}"
    events, gate, never = tmp_path / "events", tmp_path / "gate", tmp_path / "never"
    holder = subprocess.Popen(
        [*hostlock_cli(), "run", "-d", str(ansible.lockdir), lock, "sh", "-c",
         f"echo held >> {events}; while [ ! -e {gate} ]; do sleep 0.02; done; echo released >> {events}"]
    )
    proc = None
    try:
        _wait_for(events.exists, "the host job to hold the lock")
        proc = ansible.popen(_work_playbook(ansible, "ssh1", lock, events, never))
        # the task waits on the host: its runner shows up as a process there
        _wait_for(lambda: _waiting_runner(lock), "the locked task to wait on the host")
        os.killpg(proc.pid, getattr(signal, sig))
        proc.communicate(timeout=120)
        if sig != "SIGKILL":
            _wait_for(lambda: not _waiting_runner(lock), "the waiting runner to give up")
        gate.touch()
        assert holder.wait(timeout=60) == 0
        if sig == "SIGKILL":
            # either the host noticed (the master went too) and gave up, or the task runs now, under the lock
            _wait_for(lambda: "in " in events.read_text() or not _waiting_runner(lock), "the orphaned task")
            never.touch()
            _wait_for(lambda: not _waiting_runner(lock), "the orphaned task to end")
        done = subprocess.run([*hostlock_cli(), "run", "-w", "30", "-d", str(ansible.lockdir), lock, "true"],
                              check=False)
        assert done.returncode == 0
        lines = [line.split()[0] for line in events.read_text().splitlines()]
        allowed = [["held", "released"]] + ([["held", "released", "in", "out"]] if sig == "SIGKILL" else [])
        assert lines in allowed, lines
    finally:
        gate.touch()
        never.touch()
        if proc and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if holder.poll() is None:
            holder.kill()


def test_locked_lock_lives_as_long_as_the_work_when_the_connection_breaks(ansible, engine, tmp_path):
    """sshd and its sessions die mid-task (a dropped connection): the work goes on locked, then frees the lock."""
    server = Sshd(tmp_path / "sshd-broken").start()
    lock = "broken"
    events, gate = tmp_path / "events", tmp_path / "gate"
    try:
        ansible.inventory.write_text("[ssh]\n" + server.inventory_line("broken", ansible.python) + "\n")
        proc = ansible.popen(_work_playbook(ansible, "broken", lock, events, gate))
        work_pid = _wait_for(lambda: _started(events), "the wrapped work to start")
        server.drop_connections()
        out, _err = proc.communicate(timeout=120)
        assert "UNREACHABLE" in out or "unreachable=1" in out or proc.returncode in (2, 4), out
        _prove_no_overlap(ansible, engine, lock, events, gate, work_pid)
    finally:
        gate.touch()
        server.stop(sessions=True)


def _waiting_runner(lock: str) -> list[int]:
    """Pids of AnsiballZ_locked processes (the runner on the host) still alive."""
    return [p for p in _pids_matching(b"AnsiballZ_locked") if p != os.getpid()]


def _pids_matching(needle: bytes) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if needle in f.read():
                        found.append(int(entry))
            except OSError:
                pass
    return found


def _live(engine, name, ansible):
    return [h for h in engine.holders(name, directory=str(ansible.lockdir)) if not h.stale]


def test_a_locked_task_of_a_killed_run_is_never_started(ansible, tmp_path):
    """Without the serialize callback a SIGKILLed run's worker goes on: a locked task whose lookup was still
    running took the run's pid from its parent, by then init, so it waited for the lock and ran for a run
    that had died. The worker now sees ansible-playbook is gone and starts nothing."""
    log, gate, seen = tmp_path / "orphan.log", tmp_path / "gate", tmp_path / "seen"
    log.touch()
    run = ansible.popen("locked_slow_lookup.yml", extra_vars=dict(log=str(log), gate=str(gate), seen=str(seen)))
    try:
        _wait_for(seen.exists, what="the worker's lookup to start")
        worker, _lookup = (int(x) for x in seen.read_text().split())
        os.kill(run.pid, signal.SIGKILL)
        run.wait(60)
        gate.touch()  # the lookup ends: the orphaned worker goes on to the locked action
        _wait_for(lambda: not os.path.exists(f"/proc/{worker}") or
                  open(f"/proc/{worker}/stat").read().rsplit(")", 1)[1].split()[0] == "Z",
                  what="the orphaned worker to end", limit=60)
    finally:
        gate.touch()
        try:
            os.killpg(run.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        run.communicate(timeout=30)
    assert "A loc start" not in log.read_text(), log.read_text()
