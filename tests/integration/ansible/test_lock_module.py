"""hostlock.core.lock and lock_info through real ansible-playbook runs, over local and SSH connections."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest
from harness import PLAYBOOKS, hostlock_cli

CONFLICT = 75  # hostlock run's exit status when the lock is busy


@pytest.mark.parametrize("target", ["loc", "ssh1"])
def test_lock_held_across_tasks_keeps_host_jobs_out(ansible, engine, target):
    before = time.time()
    run = ansible.play("lock_across_tasks.yml", extra_vars=dict(target=target, lock="across"))
    assert run.rc == 0, run.out
    r = {task: hosts[target] for task, hosts in run.results().items()}

    predicted = r["Predict in check mode"]
    assert predicted["changed"] and predicted["free"] and not predicted["acquired"], predicted
    assert "token" not in predicted

    taken = r["Take the lock"]
    assert taken["changed"] and taken["acquired"] and taken["token"], taken
    assert taken["directory"] == str(ansible.lockdir)
    assert taken["lease_expires"] >= before + 59.999  # its 60 s lease, counted from when the task ran
    assert [h["pid"] for h in taken["holders"]], taken
    # the default label names the play, the task and the controller
    label = taken["holders"][0]["label"]
    assert "play 'Hold a lock across tasks'" in label and "task 'Take the lock'" in label, label

    blocked = r["Run the host job while the play holds the lock"]
    assert blocked["rc"] == CONFLICT, blocked

    info = r["Read the lock"]["locks"]
    assert len(info) == 1 and info[0]["name"] == "across"
    (holder,) = info[0]["holders"]
    assert holder["lease_expires"] and not holder["stale"] and holder["pid"] == taken["holders"][0]["pid"]

    busy = r["Predict in check mode while held"]
    assert not busy["free"] and not busy["changed"] and "would wait" in busy["msg"], busy

    skipped = r["Try once without waiting, skip on conflict"]
    assert skipped["_status"] == "skipped" and not skipped["acquired"], skipped
    assert str(holder["pid"]) in skipped["msg"], skipped["msg"]

    renewed = r["Renew the lease"]
    assert renewed["changed"] and renewed["lease_expires"] > taken["lease_expires"] + 20, renewed

    released = r["Release the lock"]
    assert released["changed"] and not released["acquired"], released
    assert r["Run the host job after the release"]["rc"] == 0

    again = r["Release again"]
    assert again["_status"] == "ok" and not again["changed"], again
    assert any("released already" in w for w in again["_warnings"]), again

    names = [lock["name"] for lock in r["List every lock"]["locks"]]
    assert "across" in names
    # the lease holder is gone with the release: nothing is left on the host
    assert not [h for h in engine.holders("across", directory=str(ansible.lockdir)) if not h.stale]


def _lease_holder(engine, name: str, directory: str) -> int:
    (holder,) = [h for h in engine.holders(name, directory=directory) if not h.stale]
    return holder.pid


@pytest.mark.parametrize("target", ["loc", "ssh1"])
def test_lease_holder_is_detached(ansible, engine, target):
    """The holder left on the host keeps no pipe or socket of the module: the task (and SSH) end at once."""
    # A play that only takes the lease: it must return long before the lease ends (a play that waited for
    # the holder would run into the timeout below, however busy the machine; no elapsed-time bound).
    playbook = ansible.work / "take.yml"
    playbook.write_text(
        "- hosts: '{{ target }}'\n  gather_facts: false\n  tasks:\n"
        "    - hostlock.core.lock: {name: detached, lease: 900, directory: '{{ lockdir }}'}\n"
    )
    proc = subprocess.run(
        ansible.command(str(playbook), extra_vars=dict(target=target)),
        cwd=ansible.work,
        env=ansible.env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    pid = _lease_holder(engine, "detached", str(ansible.lockdir))
    fds = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
    lockdir = str(ansible.lockdir)
    own_sockets = _lease_sockets()
    stray = {f for f in fds if not (f.startswith(lockdir) or f == "/dev/null" or f in own_sockets)}
    assert not stray, f"lease holder {pid} keeps {stray} open"
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    sid = int(stat[3])
    assert sid == pid or sid != os.getsid(0), "lease holder stayed in a session of the run"
    engine.break_lock("detached", directory=lockdir, force=True)


@pytest.mark.parametrize("target", ["loc", "ssh1"])
def test_module_waits_for_a_host_job_then_names_it(ansible, target):
    job = subprocess.Popen(
        [*hostlock_cli(), "run", "-d", str(ansible.lockdir), "busy", "sleep", "300"],  # outlives the play
        start_new_session=True,
    )
    try:
        _wait_for_holder(ansible.lockdir, "busy")
        run = ansible.play("wait_for_job.yml", extra_vars=dict(target=target, lock="busy", wait=2))
        r = {task: hosts[target] for task, hosts in run.results().items()}
        taken = r["Take the lock held by a host job"]
        assert taken["_status"] == "failed" and not taken["acquired"], taken
        assert taken["waited"] >= 1.9, taken  # its 2 s timeout; that it gave up is the point
        assert "sleep 30" in taken["msg"], taken["msg"]  # the job, not only the supervisor
        assert str(job.pid) in taken["msg"] or "job pid" in taken["msg"], taken["msg"]
        assert taken["holders"] and taken["holders"][0]["job_cmdline"].startswith("sleep"), taken["holders"]
        wrapped = r["Run a task under the lock held by a host job"]
        assert wrapped["_status"] == "skipped" and "sleep 30" in wrapped["msg"], wrapped
        assert "rc" not in wrapped, "the wrapped command ran although the lock was busy"
    finally:
        os.killpg(job.pid, 15)
        job.wait(10)


def _lease_sockets() -> set[str]:
    """The lease holders' own control sockets (.lease-ID.sock in the lock directory; @hostlock-lease/ID where
    the directory cannot take one)."""
    found = set()
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 8 and (fields[7].startswith("@hostlock-lease/") or "/.lease-" in fields[7]):
            found.add(f"socket:[{fields[6]}]")
    return found


def _wait_for_holder(lockdir: Path, name: str, timeout: float = 10) -> None:
    import hostlock

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if [h for h in hostlock.holders(name, directory=str(lockdir)) if not h.stale]:
            return
        time.sleep(0.05)
    pytest.fail(f"nobody took lock {name} in {timeout}s")


def test_bad_input_is_named(ansible):
    playbook = ansible.work / "bad.yml"
    playbook.write_text(
        "- hosts: loc\n  gather_facts: false\n  tasks:\n"
        "    - name: No lease\n      hostlock.core.lock: {name: x}\n      ignore_errors: true\n"
        "    - name: Bad name\n      hostlock.core.lock: {name: ../etc, lease: 5}\n      ignore_errors: true\n"
        "    - name: Shared semaphore\n      hostlock.core.lock: {name: x, lease: 5, slots: 2, mode: shared}\n"
        "      ignore_errors: true\n"
        "    - name: Release without token\n      hostlock.core.lock: {name: never-held, state: released}\n"
    )
    run = ansible.play(str(playbook))
    r = {task: hosts["loc"] for task, hosts in run.results().items()}
    assert r["No lease"]["_status"] == "failed" and "lease" in r["No lease"]["msg"]
    assert r["Bad name"]["_status"] == "failed" and "../etc" in r["Bad name"]["msg"], r["Bad name"]
    assert r["Shared semaphore"]["_status"] == "failed" and "mode=exclusive" in r["Shared semaphore"]["msg"]
    assert r["Release without token"]["_status"] == "ok" and not r["Release without token"]["changed"]


def test_leases_durations_renewal_wrong_secret_and_own_run(ansible, engine):
    """Issue 9 items 3 and 4: a run never waits for itself, a renewal keeps the token, a wrong secret fails."""
    run = ansible.play("leases.yml", "-v")
    assert run.rc == 0, run.out  # the expected failures are ignored
    r = run.results()
    assert r["Check the renewal kept the token usable"]["loc"]["_status"] == "ok", run.out
    released = r["Release with the token of the renewal's result"]["loc"]
    assert released["_status"] == "ok" and released["changed"] and released["released"], released
    # the secret half never shows, even with -v (the playbook registers the token with no_log)
    assert not re.search(re.escape(released["token_id"]) + r"\.[0-9a-f]{32}", run.out), run.out
    assert "VALUE_SPECIFIED_IN_NO_LOG_PARAMETER" not in run.out

    nested = r["Run locked inside the held lease of the same name"]["loc"]
    assert nested["_status"] == "failed" and "never waits for itself" in nested["msg"], nested
    assert nested["hostlock"]["event"] == "self" and "ping" not in nested, nested

    wrong = r["Release with a wrong secret"]["loc"]
    assert wrong["_status"] == "failed" and "refused" in wrong["msg"], wrong
    absurd = r["Take a lease that is too long"]["loc"]
    assert absurd["_status"] == "failed" and "lease" in absurd["msg"] and "too long" in absurd["msg"], absurd

    group = r["Take the group's lock on the first host, for every host of the play"]
    statuses = sorted(h["_status"] for h in group.values())
    assert statuses == ["failed", "ok"], group
    (refused,) = [h for h in group.values() if h["_status"] == "failed"]
    # a lock delegated to one host for the play's hosts, under linear: the holder's release could never come
    assert "would wait for itself" in refused["msg"] and "run_once: true" in refused["msg"], refused
    assert "serial: 1" in refused["msg"] and "strategy: free" in refused["msg"], refused
    once = r["Release the play's lock once"]
    assert [(h["_status"], h["changed"]) for h in once.values()] == [("ok", True)], once
    # the block pattern: the included file runs under the block's lease; the release runs after a failure
    info = r["Read the lock from the included file"]["loc"]["locks"][0]["holders"]
    assert [h["token_id"] for h in info] == [r["Release the block's lock, also after a failure"]["loc"]["token_id"]]
    assert r["Release the block's lock, also after a failure"]["loc"]["changed"]
    assert (ansible.work / "block-events").read_text().split() == ["block", "included"]
    for name in ("lease-one", "group-lock", "group-once", "block-lock"):
        assert not [h for h in engine.holders(name, directory=str(ansible.lockdir)) if not h.stale], name


def test_a_relative_or_missing_directory_is_named_not_used(ansible):
    """`directory: relative` was resolved in the module's working directory (the playbook's, a login's home
    over SSH): tasks from two directories never excluded each other. lock_info on a directory that does not
    exist said every lock was free."""
    playbook = ansible.work / "reldir.yml"
    playbook.write_text(
        "- hosts: loc\n  gather_facts: false\n  tasks:\n"
        "    - name: Lock\n      hostlock.core.lock: {name: x, lease: 5, directory: relative}\n"
        "      ignore_errors: true\n"
        "    - name: Locked\n      hostlock.core.locked:\n        name: x\n        directory: relative\n"
        "        task: {ansible.builtin.command: 'true'}\n      ignore_errors: true\n"
        "    - name: Info\n      hostlock.core.lock_info: {name: x, directory: relative}\n      ignore_errors: true\n"
        "    - name: Info elsewhere\n      hostlock.core.lock_info: {name: x, directory: /nonexistent/hostlock}\n"
        "      ignore_errors: true\n"
        "    - name: Empty name\n      hostlock.core.locked:\n        name: ''\n"
        "        task: {ansible.builtin.command: 'true'}\n      ignore_errors: true\n"
    )
    run = ansible.play(str(playbook))
    r = {task: hosts["loc"] for task, hosts in run.results().items()}
    for task in ("Lock", "Locked", "Info"):
        assert r[task]["_status"] == "failed" and "directory must be absolute (got 'relative')" in r[task]["msg"], r
    assert not (ansible.work / "relative").exists() and not (PLAYBOOKS / "relative").exists()
    assert r["Empty name"]["_status"] == "failed" and "lock name is empty" in r["Empty name"]["msg"], r["Empty name"]
    info = r["Info elsewhere"]
    assert info["_status"] == "failed" and "lock directory /nonexistent/hostlock does not exist" in info["msg"], info
