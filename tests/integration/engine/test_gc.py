"""`hostlock gc` / hostlock.prune_unused: unused lock files go, a lock in use is never split or removed."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from engine_helpers import child_env, spawn, wait_line

import hostlock

DAY = 86400.0


def _age(path: str, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def _ofd_dir(tmp_path) -> str:
    d = tmp_path / "locks"
    d.mkdir(mode=0o700)
    hostlock.Lock("init", directory=str(d), mechanism="ofd").close()
    return str(d)


def test_unused_free_locks_go_recent_ones_stay(tmp_path):
    d = _ofd_dir(tmp_path)
    for name in ("old", "new"):
        hostlock.Lock(name, directory=d).acquire().release()
    _age(os.path.join(d, "old.lock"), 10 * DAY)
    dry = {e["name"]: e["action"] for e in hostlock.prune_unused(7 * DAY, d, dry_run=True)}
    assert dry["old"] == "would remove" and dry["new"] == "kept"
    assert os.path.exists(os.path.join(d, "old.lock"))
    done = {e["name"]: e for e in hostlock.prune_unused(7 * DAY, d)}
    assert done["old"]["action"] == "removed" and done["new"]["reason"] == "used recently"
    assert not os.path.exists(os.path.join(d, "old.lock"))
    assert [s.name for s in hostlock.list_locks(d)] == ["new"]
    hostlock.Lock("old", directory=d).acquire(timeout=0).release()  # the name comes back on use


def test_held_and_waited_for_locks_are_never_removed(tmp_path):
    d = _ofd_dir(tmp_path)
    holder = spawn("""
        import sys, hostlock
        lock = hostlock.Lock("busy", directory=sys.argv[1]).acquire()
        print("HELD", flush=True)
        sys.stdin.readline()
    """, d, stdin=subprocess.PIPE)
    wait_line(holder, "HELD")
    waiter = spawn("""
        import sys, hostlock
        print("WAITING", flush=True)
        hostlock.Lock("busy", directory=sys.argv[1]).acquire()
        print("GOT", flush=True)
    """, d)
    wait_line(waiter, "WAITING")
    while hostlock.status("busy", d).waiters == 0:  # the waiter has its ticket
        time.sleep(0.01)
    _age(os.path.join(d, "busy.lock"), 30 * DAY)
    got = {e["name"]: e for e in hostlock.prune_unused(0, d)}
    assert got["busy"]["action"] == "kept" and got["busy"]["reason"] == "held or waited for"
    holder.stdin.write("\n")
    holder.stdin.flush()
    holder.wait(30)
    wait_line(waiter, "GOT")
    waiter.wait(30)
    assert os.path.exists(os.path.join(d, "busy.lock"))


def test_a_process_that_opened_the_file_before_gc_does_not_become_a_second_holder(tmp_path):
    """The split-lock bug of filelock #574: gc unlinks while another process has the old inode open."""
    d = _ofd_dir(tmp_path)
    early = hostlock.Lock("split", directory=d)
    early.acquire().release()  # leaves its description of the file open (the inode gc will unlink)
    _age(os.path.join(d, "split.lock"), 30 * DAY)
    assert {e["name"]: e["action"] for e in hostlock.prune_unused(0, d)}["split"] == "removed"
    early.acquire()  # locks the dead inode first, sees st_nlink == 0, starts over on the current file
    try:
        late = subprocess.run([sys.executable, "-c", "import sys, hostlock\n"
                               "try:\n hostlock.Lock('split', directory=sys.argv[1]).acquire(timeout=0)\n"
                               " print('ACQUIRED')\nexcept hostlock.LockTimeout:\n print('BUSY')", d],
                              env=child_env(), capture_output=True, text=True, timeout=30, check=False)
        assert late.stdout.strip() == "BUSY", late.stdout + late.stderr
    finally:
        early.close()


def test_planted_symlink_and_fifo_are_reported_not_followed(tmp_path):
    d = _ofd_dir(tmp_path)
    target = tmp_path / "precious"
    target.write_text("keep")
    os.symlink(str(target), os.path.join(d, "link.lock"))
    os.mkfifo(os.path.join(d, "fifo.lock"))
    got = {e["name"]: e for e in hostlock.prune_unused(0, d)}
    assert got["link"]["action"] == "kept" and "symlink" in got["link"]["reason"]
    assert got["fifo"]["action"] == "kept" and "not a regular file" in got["fifo"]["reason"]
    assert target.read_text() == "keep" and os.path.islink(os.path.join(d, "link.lock"))


def test_other_mechanisms_are_refused_clearly(tmp_path):
    d = tmp_path / "rec"
    d.mkdir(mode=0o700)
    hostlock.Lock("x", directory=str(d), mechanism="record").close()
    with pytest.raises(hostlock.MechanismError, match="gc prunes directories on the ofd mechanism"):
        hostlock.prune_unused(0, str(d))


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hostlock", *args], env=child_env(), capture_output=True,
                          text=True, timeout=60, check=False)


def test_cli_gc_dry_run_json_and_bad_input(tmp_path):
    import json

    d = _ofd_dir(tmp_path)
    hostlock.Lock("old", directory=d).acquire().release()
    _age(os.path.join(d, "old.lock"), 10 * DAY)
    dry = _cli("gc", "--dry-run", "-d", d)
    assert dry.returncode == 0 and "would remove old (unused for 10d" in dry.stdout, dry.stdout + dry.stderr
    assert "would remove" not in _cli("gc", "--dry-run", "--older-than", "90d", "-d", d).stdout  # > 24.8 days
    doc = json.loads(_cli("gc", "--json", "--older-than", "7d", "-d", d).stdout)
    assert doc["schema"] == "hostlock.gc/1" and doc["dry_run"] is False
    assert {e["name"]: e["action"] for e in doc["locks"]} == {"old": "removed"}
    bad = _cli("gc", "--older-than", "soon", "-d", d)
    assert bad.returncode == 64 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr, bad.stderr
