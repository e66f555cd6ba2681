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
    assert got["busy"]["action"] == "kept" and got["busy"]["reason"] == "held, waited for or open"
    holder.stdin.write("\n")
    holder.stdin.flush()
    holder.wait(30)
    wait_line(waiter, "GOT")
    waiter.wait(30)
    assert os.path.exists(os.path.join(d, "busy.lock"))


def test_a_lock_object_that_has_the_file_open_keeps_it_from_gc(tmp_path):
    """The split-lock bug of filelock #574 cannot start: gc never unlinks a file a Lock still has open.

    Each Lock read-locks the OPEN range while it has the file open; gc needs the whole file.
    """
    d = _ofd_dir(tmp_path)
    early = hostlock.Lock("split", directory=d)
    early.acquire().release()  # keeps its description of the file open, lock released
    _age(os.path.join(d, "split.lock"), 30 * DAY)
    kept = {e["name"]: e for e in hostlock.prune_unused(0, d)}["split"]
    assert kept["action"] == "kept" and kept["reason"] == "held, waited for or open", kept
    early.acquire()
    try:
        assert _other_process_gets(d, "split") == "BUSY"  # still the one file: never two holders
    finally:
        early.close()
    assert {e["name"]: e["action"] for e in hostlock.prune_unused(0, d)}["split"] == "removed"


def test_a_file_removed_by_hand_is_left_for_the_current_one(tmp_path):
    """A person's rm (no lock taken) of an idle file: the next acquisition, 10 ms or more after the last
    check, sees st_nlink == 0 and starts over on the file now at the name."""
    from hostlock.host import lockers as _lockers

    d = _ofd_dir(tmp_path)
    early = hostlock.Lock("byhand", directory=d)
    early.acquire().release()
    os.unlink(os.path.join(d, "byhand.lock"))
    time.sleep(_lockers.RELINK_CHECK_NS / 1e9 * 2)  # a lower bound on elapsed time, not a race
    early.acquire()
    try:
        assert os.path.exists(os.path.join(d, "byhand.lock"))
        assert _other_process_gets(d, "byhand") == "BUSY"
    finally:
        early.close()


def _other_process_gets(d: str, name: str) -> str:
    late = subprocess.run([sys.executable, "-c", "import sys, hostlock\n"
                           "try:\n hostlock.Lock(sys.argv[2], directory=sys.argv[1]).acquire(timeout=0)\n"
                           " print('ACQUIRED')\nexcept hostlock.LockTimeout:\n print('BUSY')", d, name],
                          env=child_env(), capture_output=True, text=True, timeout=30, check=False)
    return late.stdout.strip() or late.stderr


def test_a_foreign_lock_on_the_open_range_neither_hangs_nor_breaks_locking(tmp_path):
    """Anyone who can open the file can write-lock OPEN: the Lock then goes unguarded, checking st_nlink at
    each acquisition as flock files do; gc, which needs the whole file, removes nothing meanwhile."""
    import fcntl
    import struct

    from hostlock.host import kernel as _kernel

    d = _ofd_dir(tmp_path)
    hostlock.Lock("squat", directory=d).acquire().close()
    path = os.path.join(d, "squat.lock")
    squatter = os.open(path, os.O_RDWR)
    try:
        fcntl.fcntl(squatter, _kernel.F_OFD_SETLK, struct.pack("hhqqi", _kernel.WR, 0, _kernel.OPEN, 1, 0))
        lock = hostlock.Lock("squat", directory=d)
        lock.acquire(timeout=0)
        assert lock._locker.file is not None and not lock._locker.file.guarded
        assert _other_process_gets(d, "squat") == "BUSY"
        lock.release()
        os.unlink(path)  # by hand: an unguarded file is checked at every acquisition, however recent the last
        lock._locker.file.linked_at = time.monotonic_ns() + 10**15  # "just checked", so only that rule applies
        lock.acquire(timeout=0)
        try:
            assert _other_process_gets(d, "squat") == "BUSY"
        finally:
            lock.close()
    finally:
        os.close(squatter)


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
