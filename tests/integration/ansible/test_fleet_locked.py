"""hostlock.core.locked and hostlock.core.lock with `fleet`: the controller takes the lock in a real etcd.

Two ansible-playbook runs that share nothing but the fleet URL (each its own local lock directory, as two
control nodes would) exclude each other, or share a semaphore's slots, with every wait on an event: a
wrapped task holds until the test opens its gate, and the test watches etcd for the runs' waiting keys.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import uuid
from pathlib import Path

from test_serialize import _finish, _reap, _wait_for

TASK = "Work under the fleet lock until the test opens the gate"


def _start(ansible, fleet: str, hosts: str, tag: str, log: Path, gate: Path | None, *args: str, lock: str = "restart",
           slots: int = 1, ttl: str = "10", **env: str):
    evars = dict(pattern=hosts, fleet=fleet, lock=lock, slots=slots, ttl=ttl, tag=tag, log=str(log),
                 gate=str(gate) if gate else "")
    return ansible.popen("fleet_locked.yml", *args, extra_vars=evars, **env)


def _entries(log: Path) -> list[dict]:
    """The wrapped tasks' log lines: tag, host, start|end, epoch, pid, fence."""
    out = []
    for line in log.read_text().splitlines():
        tag, host, what, when, pid, fence = line.split()
        out.append(dict(tag=tag, host=host, what=what, when=float(when), pid=int(pid), fence=fence))
    return out


def _most_at_once(entries: list[dict]) -> int:
    """The largest number of wrapped tasks running at one time, from their logged starts and ends."""
    running = peak = 0
    for e in sorted(entries, key=lambda e: (e["when"], e["what"] == "start")):  # an end before a start at a tie
        running += 1 if e["what"] == "start" else -1
        peak = max(peak, running)
    return peak


def _show(entries: list[dict]) -> str:
    t0 = min((e["when"] for e in entries), default=0)
    return "\n".join(f"  +{e['when'] - t0:6.2f}s {e['tag']} {e['host']} {e['what']} fence {e['fence']}"
                     for e in sorted(entries, key=lambda e: e["when"]))


def _results(proc_out: str, record: Path) -> dict:
    assert record.exists(), proc_out
    return json.loads(record.read_text())


def _record(ansible, name: str) -> Path:
    return ansible.work / f"record-{name}.json"


def test_two_runs_with_different_local_dirs_take_turns(ansible, engine, etcd):
    """Run A (host loc) and run B (host loc2, another local lock directory) exclude each other through the
    fleet alone; B's fence is higher than A's, and each wrapped task saw its own fence."""
    log, gate = ansible.work / "turns.log", ansible.work / "gate"
    log.touch()
    other_dir = ansible.work / "other-locks"
    other_dir.mkdir(mode=0o700)
    rec_a, rec_b = _record(ansible, "a"), _record(ansible, "b")
    first = _start(ansible, etcd.url, "loc", "A", log, gate, HOSTLOCK_TEST_RECORD=str(rec_a))
    second = None
    try:
        _wait_for(lambda: "A loc start" in log.read_text(), what="run A's task to start", proc=first)
        second = _start(ansible, etcd.url, "loc2", "B", log, gate, HOSTLOCK_DIR=str(other_dir),
                        HOSTLOCK_TEST_RECORD=str(rec_b))
        _wait_for(lambda: engine.status("restart", fleet=etcd.url).waiters == 1, what="run B to wait in etcd",
                  proc=second)
        holders = engine.status("restart", fleet=etcd.url).holders
        assert [h.pid for h in holders] and "B " not in log.read_text(), _show(_entries(log))
        assert "play 'Work under a fleet lock'" in (holders[0].label or ""), holders[0].as_dict()
        gate.touch()
        out_a, out_b = _finish(first), _finish(second)
    finally:
        gate.touch()
        _reap(first)
        if second is not None:
            _reap(second)
    assert first.returncode == 0, out_a
    assert second.returncode == 0, out_b
    entries = _entries(log)
    print(f"\ntwo runs, one fleet lock (A: loc, B: loc2):\n{_show(entries)}")
    at = {(e["tag"], e["what"]): e for e in entries}
    assert at[("B", "start")]["when"] >= at[("A", "end")]["when"], _show(entries)
    assert _most_at_once(entries) == 1
    res_a = _results(out_a, rec_a)[TASK]["loc"]
    res_b = _results(out_b, rec_b)[TASK]["loc2"]
    assert str(res_a["fence"]) == at[("A", "start")]["fence"] and str(res_b["fence"]) == at[("B", "start")]["fence"]
    assert res_b["fence"] > res_a["fence"], (res_a["fence"], res_b["fence"])
    assert res_b["hostlock"]["event"] == "locked" and res_b["hostlock"]["waited"] > 0, res_b["hostlock"]
    assert engine.status("restart", fleet=etcd.url).holders == [], "a lock was left in etcd"


def test_fleet_semaphore_limits_restarts_across_two_runs_to_two(ansible, engine, etcd):
    """slots: 2 over two runs of two hosts each: two wrapped tasks run, two wait in etcd; never three."""
    log, gate = ansible.work / "sem.log", ansible.work / "gate"
    log.touch()
    runs = []
    try:
        for tag in ("A", "B"):
            runs.append(_start(ansible, etcd.url, "loc:loc2", tag, log, gate, slots=2,
                               HOSTLOCK_TEST_RECORD=str(_record(ansible, tag))))

        def two_in_two_waiting() -> bool:
            st = engine.status("restart", fleet=etcd.url)
            return len(st.holders) == 2 and st.waiters == 2 and log.read_text().count(" start ") == 2

        _wait_for(two_in_two_waiting, what="two restarts to run and two to wait")
        assert log.read_text().count(" start ") == 2, _show(_entries(log))
        labels = [h.label or "" for h in engine.status("restart", fleet=etcd.url).holders]
        assert all("task 'Work under the fleet lock" in label for label in labels), labels
        gate.touch()
        outs = [_finish(p) for p in runs]
    finally:
        gate.touch()
        for p in runs:
            _reap(p)
    for p, out in zip(runs, outs, strict=True):
        assert p.returncode == 0, out
    entries = _entries(log)
    print(f"\nfleet semaphore, slots 2, runs A and B on loc and loc2:\n{_show(entries)}")
    assert len(entries) == 8, _show(entries)
    assert _most_at_once(entries) == 2, _show(entries)
    fences = [e["fence"] for e in entries if e["what"] == "start"]
    assert len(set(fences)) == 4 and "none" not in fences, fences


def test_check_mode_takes_nothing(ansible, engine, etcd):
    """--check: the wrapped task runs in check mode, nothing is written to etcd; a held lock is reported."""
    log = ansible.work / "check.log"
    rec = _record(ansible, "check")
    proc = _start(ansible, etcd.url, "loc", "C", log, None, "--check", HOSTLOCK_TEST_RECORD=str(rec))
    out = _finish(proc)
    assert proc.returncode == 0, out
    info = _results(out, rec)[TASK]["loc"]["hostlock"]
    assert info["event"] == "check" and info["taken"] is False and info["free"] is True, info
    assert not log.exists(), "the command ran in check mode"
    st = engine.status("restart", fleet=etcd.url)
    assert st.holders == [] and st.waiters == 0

    held = engine.Lock("restart", fleet=etcd.url, label="the test holds it")
    held.acquire(timeout=30)
    try:
        rec = _record(ansible, "check-held")
        proc = _start(ansible, etcd.url, "loc", "C", log, None, "--check", HOSTLOCK_TEST_RECORD=str(rec))
        out = _finish(proc)
    finally:
        held.release()
    assert proc.returncode == 0, out
    info = _results(out, rec)[TASK]["loc"]["hostlock"]
    assert info["free"] is False and "the test holds it" in json.dumps(info["holders"]), info


def test_busy_fleet_lock_fails_or_skips_naming_the_holder(ansible, engine, etcd):
    """timeout 0 against a lock the test holds: on_conflict fail fails and skip skips, naming the holder (with
    its host) and how to look; the wrapped task never runs."""
    log = ansible.work / "busy.log"
    held = engine.Lock("restart", fleet=etcd.url, label="the test holds it")
    held.acquire(timeout=30)
    try:
        outcome = {}
        for choice in ("fail", "skip"):
            rec = _record(ansible, choice)
            evars = dict(pattern="loc", fleet=etcd.url, lock="restart", tag="X", log=str(log), gate="", timeout=0,
                         on_conflict=choice)
            proc = ansible.popen("fleet_locked.yml", extra_vars=evars, HOSTLOCK_TEST_RECORD=str(rec))
            out = _finish(proc)
            outcome[choice] = (proc.returncode, _results(out, rec)[TASK]["loc"])
    finally:
        held.release()
    assert not log.exists(), "the wrapped task ran without the lock"
    (rc_fail, failed), (rc_skip, skipped) = outcome["fail"], outcome["skip"]
    assert rc_fail == 2 and failed["_status"] == "failed", failed
    assert rc_skip == 0 and skipped["_status"] == "skipped", skipped
    for result in (failed, skipped):
        assert "the test holds it" in result["msg"] and f"hostlock status --fleet {etcd.url} restart" in result["msg"]
        assert result["hostlock"]["event"] == "conflict" and result["hostlock"]["taken"] is False, result


def test_lock_lost_mid_task_fails_the_task(ansible, engine, etcd):
    """The lock is broken (its etcd lease revoked) while the wrapped task runs: the task fails saying so, with
    its fence, once the wrapped task ended (the controller cannot stop it on the host)."""
    log, gate = ansible.work / "lost.log", ansible.work / "gate"
    log.touch()
    rec = _record(ansible, "lost")
    proc = _start(ansible, etcd.url, "loc", "L", log, gate, HOSTLOCK_TEST_RECORD=str(rec))
    try:
        _wait_for(lambda: "L loc start" in log.read_text(), what="the wrapped task to start", proc=proc)
        broken = engine.break_lock("restart", fleet=etcd.url, force=True)
        assert len(broken) == 1, broken
        gate.touch()
        out = _finish(proc)
    finally:
        gate.touch()
        _reap(proc)
    assert proc.returncode == 2, out
    result = _results(out, rec)[TASK]["loc"]
    assert result["_status"] == "failed" and "was lost" in result["msg"], result
    assert "\n" not in result["msg"] and str(result["fence"]) in result["msg"], result["msg"]
    assert "L loc end" in log.read_text(), "the wrapped task ran to its end"


def _tree(root: int) -> list[int]:
    """root and every process descended from it (ansible-playbook's workers leave its session: setsid)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def _crash(root: int) -> None:
    """SIGKILL root and its whole tree at once, as a crashed control node: freeze it first (SIGSTOP until a
    look finds nobody new), so nothing forks or exits between the looking and the killing. A process that
    ended on its own meanwhile (a worker's short-lived child) is not an error: it is what a crash finds."""
    frozen: set[int] = set()
    while True:
        fresh = [pid for pid in _tree(root) if pid not in frozen]
        if not fresh:
            break
        for pid in fresh:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        frozen.update(fresh)
    for pid in frozen:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_sigkill_of_the_whole_controller_frees_the_lock_within_the_ttl(ansible, engine, etcd):
    """Every process of the run (ansible-playbook, its workers, the task under them) is SIGKILLed mid-task,
    as a crashed control node: nothing releases the lock, its etcd lease (ttl 2 s) ends it; then another
    run takes it."""
    log, gate = ansible.work / "killed.log", ansible.work / "gate"
    log.touch()
    proc = _start(ansible, etcd.url, "loc", "K", log, gate, ttl="2")
    try:
        _wait_for(lambda: "K loc start" in log.read_text(), what="the wrapped task to start", proc=proc)
        assert len(engine.status("restart", fleet=etcd.url).holders) == 1
        _crash(proc.pid)
        killed = time.monotonic()
        proc.wait(60)
        _wait_for(lambda: engine.status("restart", fleet=etcd.url).holders == [], what="the lease to end")
        freed = time.monotonic() - killed
        rec = _record(ansible, "after")
        after = _start(ansible, etcd.url, "loc", "N", log, None, HOSTLOCK_TEST_RECORD=str(rec))
        out = _finish(after)
    finally:
        gate.touch()
        _reap(proc)
    print(f"\ncontroller SIGKILLed mid-task: the fleet lock was free {freed:.2f}s later (ttl 2s)")
    assert after.returncode == 0, out
    assert "K loc end" not in log.read_text() and "N loc end" in log.read_text()


def test_sigkill_of_ansible_playbook_alone_keeps_the_lock_until_the_task_ends(ansible, engine, etcd):
    """`kill -9` of the ansible-playbook process only: its worker (the lock holder, in a session of its own)
    and the wrapped task run on, so the lock is held until the task ends, then released by the worker."""
    log, gate = ansible.work / "parent.log", ansible.work / "gate"
    log.touch()
    proc = _start(ansible, etcd.url, "loc", "P", log, gate, ttl="2")
    try:
        _wait_for(lambda: "P loc start" in log.read_text(), what="the wrapped task to start", proc=proc)
        (holder,) = engine.status("restart", fleet=etcd.url).holders
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(60)
        waiter = engine.Lock("restart", fleet=etcd.url, label="the test waits")
        try:
            waiter.acquire(timeout=0)
            raise AssertionError("the lock was free while the wrapped task still ran")
        except engine.LockTimeout:
            pass
        assert [h.fence for h in engine.status("restart", fleet=etcd.url).holders] == [holder.fence]
        gate.touch()
        waiter.acquire(timeout=120)  # the worker releases once the wrapped task ended
        waiter.release()
    finally:
        gate.touch()
        _reap(proc)
    assert "P loc end" in log.read_text()


def test_fleet_lease_lock_info_and_release_never_contact_the_host(ansible, engine, etcd, tmp_path):
    """lock and lock_info with a fleet (from HOSTLOCK_FLEET) run on the controller only: the play's one host
    has no reachable sshd. The holder shows in lock_info; taking it again in the same run fails at once."""
    ghost = tmp_path / "ghost.ini"
    ghost.write_text("ghost ansible_connection=ssh ansible_host=127.0.0.1 ansible_port=9 ansible_user=nobody\n")
    lock = "lease-" + uuid.uuid4().hex[:8]
    run = ansible.play("fleet_lease.yml", extra_vars=dict(pattern="ghost", lock=lock),
                       ANSIBLE_INVENTORY=str(ghost), HOSTLOCK_FLEET=etcd.url)
    assert run.rc == 0, run.out
    res = {task: hosts["ghost"] for task, hosts in run.results().items()}
    taken = res["Take the fleet lease"]
    assert taken["_status"] == "ok" and taken["acquired"] is True and isinstance(taken["fence"], int), taken
    assert taken["path"].endswith(f"/{lock}/") and taken["fleet"] == etcd.url, taken
    assert taken["token"].startswith("hostlock-etcd.") and taken["token_id"] == engine.token_id(taken["token"])
    (info,) = res["Read the fleet lock"]["locks"]
    assert info["mechanism"] == "etcd" and info["name"] == lock, info
    (holder,) = info["holders"]
    assert "play 'Fleet lease', task 'Take the fleet lease'" in holder["label"] and "[run " in holder["label"], holder
    assert holder["fence"] == taken["fence"], (holder, taken)
    assert lock in [entry["name"] for entry in res["Read every fleet lock"]["locks"]]
    again = res["Take it again in the same run"]
    assert again["_status"] == "failed" and "held by this same playbook run" in again["msg"], again
    assert res["Renew the fleet lease"]["_status"] == "ok"
    released = res["Release the fleet lease"]
    assert released["_status"] == "ok" and released["changed"] is True, released
    assert res["Read the fleet lock after the release"]["locks"][0]["holders"] == []
    assert engine.status(lock, fleet=etcd.url).holders == []


def test_fleet_lease_check_mode(ansible, engine, etcd, tmp_path):
    lock = "check-" + uuid.uuid4().hex[:8]
    run = ansible.play("fleet_lease.yml", "--check", extra_vars=dict(pattern="loc", lock=lock, fleet=etcd.url))
    assert run.rc == 0, run.out
    res = {task: hosts["loc"] for task, hosts in run.results().items()}
    taken = res["Take the fleet lease"]
    assert taken["acquired"] is False and taken["free"] is True and taken["changed"] is True, taken
    assert res["Read the fleet lock"]["locks"][0]["holders"] == []
    assert res["Release the fleet lease"]["_status"] == "skipped"
    assert engine.status(lock, fleet=etcd.url).holders == [] and engine.status(lock, fleet=etcd.url).waiters == 0


def test_wrong_fleet_fails_each_task_with_one_line(ansible, etcd):
    """A fleet nobody answers at, and a URL that is not one: every plugin fails its task with one clear line."""
    from ports import free_port

    for fleet in (f"etcd://127.0.0.1:{free_port()}", "http://not-an-etcd-url"):
        run = ansible.play("fleet_wrong.yml", extra_vars=dict(pattern="loc", fleet=fleet))
        assert run.rc == 0, run.out  # every task ignores its error; the test reads them
        for task, hosts in run.results().items():
            result = hosts["loc"]
            assert result["_status"] == "failed", (task, result)
            msg = result["msg"]
            # ansible-core 2.19 marks every failure "(traceback unavailable)" when no exception was raised
            assert "\n" not in msg and "Traceback" not in msg + str(result.get("exception", "")), (task, result)
            assert len(msg) < 400, msg
            if "directory" in task:
                assert "directory and fleet exclude each other" in msg, msg
            print(f"{fleet} {task}: {msg}")
        assert "Traceback" not in run.out, run.out
