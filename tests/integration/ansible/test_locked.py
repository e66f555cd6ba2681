"""hostlock.core.locked through real ansible-playbook runs, over local and SSH connections."""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import time

import pytest
from conftest import Sshd, hostlock_cli


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
    assert lock["released"] and lock["waited"] >= 0 and lock["held"] > 0, lock
    assert lock["directory"] == str(ansible.lockdir)

    assert r["Wrap a module that takes its arguments from module_defaults"]["ping"] == "from-module-defaults"
    looped = r["Wrap a module in a loop"]["results"]
    assert [x["ping"] for x in looped] == ["one", "two"] and all(x["hostlock"]["released"] for x in looped)

    copied = r["Wrap an action plugin"]
    assert copied["changed"] and copied["dest"].endswith("-copied.txt"), copied

    checked = r["Wrap an action plugin in check mode with diff"]
    assert checked["changed"] and checked["hostlock"]["free"] is True, checked
    assert "token" not in checked["hostlock"]
    diff = checked["diff"]
    diff = diff[0] if isinstance(diff, list) else diff
    assert "two" in diff["after"] and "one" in diff["before"], diff
    assert base64.b64decode(r["Read the copied file"]["content"]) == b"one\n", "check mode wrote the file"

    missing = r["Wrap a module that does not exist"]
    assert missing["_status"] == "failed" and "no.such.module" in missing["msg"], missing
    no_lease = r["Wrap without a lease"]
    assert no_lease["_status"] == "failed" and "lease" in no_lease["msg"], no_lease
    keyword = r["Wrap a controller-side keyword"]
    assert keyword["_status"] == "failed" and "cannot be wrapped" in keyword["msg"], keyword
    assert not r["Read the lock at the end"]["locks"][0]["holders"]
    assert not [h for h in engine.holders("wrapped", directory=str(ansible.lockdir)) if not h.stale]


def test_locked_lease_frees_the_lock_when_the_connection_breaks(ansible, engine, tmp_path):
    """sshd dies while the wrapped module runs: the release cannot reach the host, the lease ends the lock."""
    server = Sshd(tmp_path / "sshd-broken").start()
    try:
        ansible.inventory.write_text("[ssh]\n" + server.inventory_line("broken", ansible.python) + "\n")
        playbook = ansible.work / "break.yml"
        playbook.write_text(
            "- hosts: broken\n  gather_facts: false\n  tasks:\n"
            "    - name: Sleep under the lock\n      hostlock.core.locked:\n"
            "        name: broken\n        lease: 4\n        directory: '{{ lockdir }}'\n"
            "        task: {module: ansible.builtin.command, args: {cmd: sleep 20}}\n"
        )
        proc = ansible.popen(str(playbook))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not _live(engine, "broken", ansible):
            time.sleep(0.05)
        assert _live(engine, "broken", ansible), "the play never took the lock"
        time.sleep(0.5)  # the wrapped `sleep 20` runs now
        server.stop(sessions=True, keep=_live(engine, "broken", ansible))
        out, _err = proc.communicate(timeout=60)
        assert "UNREACHABLE" in out or "unreachable=1" in out or proc.returncode == 4, out
        # the release could not run: the lease still holds the lock, until it ends
        broke_at = time.monotonic()
        while _live(engine, "broken", ansible) and time.monotonic() - broke_at < 10:
            time.sleep(0.1)
        assert not _live(engine, "broken", ansible), "the lease did not free the lock"
        done = subprocess.run([*hostlock_cli(), "run", "-n", "-d", str(ansible.lockdir), "broken", "true"], check=False)
        assert done.returncode == 0
    finally:
        server.stop(sessions=True)
        for pid in _pids_of("sleep 20"):
            os.kill(pid, signal.SIGKILL)


def _live(engine, name, ansible):
    return [h for h in engine.holders(name, directory=str(ansible.lockdir)) if not h.stale]


def _pids_of(cmdline: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if f.read().replace(b"\0", b" ").strip() == cmdline.encode():
                        found.append(int(entry))
            except OSError:
                pass
    return found
