"""Owners that vanish: PID reuse, reboots, corrupt records, deleted lock files, fork, threads."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time

import pytest
from engine_helpers import LIB, spawn, wait_line

import hostlock
from hostlock.core import owner as _owner
from hostlock.host import lockers as _lockers

HAVE_UNSHARE = shutil.which("unshare") is not None and os.geteuid() == 0


@pytest.mark.skipif(not HAVE_UNSHARE, reason="needs root and unshare(1) for a private pid namespace")
def test_real_pid_reuse_does_not_keep_a_dead_owner_alive(tmp_path):
    """In a fresh pid namespace, give a new process the dead holder's pid: the lock must be taken over."""
    lockdir = tmp_path / "locks"
    lockdir.mkdir(mode=0o700)
    script = textwrap.dedent("""
        import os, subprocess, sys, time
        sys.path.insert(0, sys.argv[2])
        import hostlock
        d = sys.argv[1]
        hostlock.Lock("init", directory=d, mechanism="record").close()
        holder = subprocess.Popen([sys.executable, "-c",
            "import sys, time; sys.path.insert(0, sys.argv[2]); import hostlock; "
            "l = hostlock.Lock('reuse', directory=sys.argv[1]).acquire(); print('held', flush=True); time.sleep(60)",
            d, sys.argv[2]], stdout=subprocess.PIPE, text=True)
        assert holder.stdout.readline().startswith("held")
        victim = holder.pid
        holder.kill(); holder.wait()
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(victim - 1))
        impostor = subprocess.Popen(["sleep", "30"])
        if impostor.pid != victim:
            print("SKIP pid not reused: got %d want %d" % (impostor.pid, victim)); sys.exit(0)
        h = hostlock.holders("reuse", d)[0]
        assert h.pid == victim and h.alive is False, (h.pid, h.alive)
        l = hostlock.Lock("reuse", directory=d).acquire(timeout=3)
        print("TAKEN over from reused pid", victim)
        impostor.kill()
    """)
    out = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", script,
                          str(lockdir), LIB], check=False, capture_output=True, text=True, timeout=60)
    if "SKIP" in out.stdout:
        pytest.skip(out.stdout.strip())
    assert "TAKEN over" in out.stdout, out.stdout + out.stderr


def _write_owner(lockdir, name, fields):
    line = "HL1" + "".join("|%s=%s" % kv for kv in fields.items()) + "\n"
    with open(os.path.join(lockdir, name + "~owner"), "w") as f:
        f.write(line)


@pytest.fixture
def recdir(tmp_path):
    d = tmp_path / "rec"
    d.mkdir(mode=0o700)
    hostlock.Lock("init", directory=str(d), mechanism="record").close()
    return str(d)


def test_owner_from_another_boot_is_stale(recdir):
    me = _owner._Self.get()
    _write_owner(recdir, "boot", {"pid": os.getpid(), "start": me.start, "boot": "00000000-dead-beef-0000-000000000000",
                                  "host": _owner.HOSTNAME, "mode": "exclusive", "at": time.time()})
    assert hostlock.holders("boot", recdir)[0].alive is False
    hostlock.Lock("boot", directory=recdir).acquire(timeout=2).release()


def test_owner_with_other_start_time_is_stale(recdir):
    _write_owner(recdir, "st", {"pid": os.getpid(), "start": "1", "boot": _owner.BOOT_ID,
                                "host": _owner.HOSTNAME, "mode": "exclusive"})
    hostlock.Lock("st", directory=recdir).acquire(timeout=2).release()


def test_unreadable_or_foreign_owner_fails_closed(recdir):
    """A corrupt record or one from another host is never broken on suspicion."""
    with open(os.path.join(recdir, "junk~owner"), "wb") as f:
        f.write(b"\x00\xffgarbage")
    _write_owner(recdir, "far", {"pid": 1, "start": "1", "boot": "x", "host": "another-host", "mode": "exclusive"})
    for name in ("junk", "far"):
        with pytest.raises(hostlock.LockTimeout):
            hostlock.Lock(name, directory=recdir).acquire(timeout=0.2)
        st = hostlock.status(name, recdir)  # never a crash in status
        assert len(st.holders) == 1
    assert hostlock.status("junk", recdir).holders[0].record_ok is False
    assert hostlock.status("far", recdir).holders[0].alive is None


def test_corrupt_records_in_a_kernel_lock_file_do_not_break_status(lockdir):
    a = hostlock.Lock("c", directory=lockdir).acquire()
    with open(os.path.join(lockdir, "c.lock"), "r+b") as f:
        f.seek(4096)
        f.write(b"HL1|pid=notanumber|\xff\xfe broken")
    st = hostlock.status("c", lockdir)
    assert len(st.holders) == 1  # the kernel says it is held, whatever the text says
    a.release()
    assert hostlock.status("c", lockdir).holders == []


def test_corrupt_header_is_a_clear_error(lockdir):
    with open(os.path.join(lockdir, "h.lock"), "wb") as f:
        f.write(b"not a lock file at all\n")
    with pytest.raises(hostlock.LockFileError, match="corrupt header"):
        hostlock.Lock("h", directory=lockdir).acquire(timeout=0)


def test_deleted_lock_file_does_not_strand_a_waiter(lockdir):
    """A waiter on the old inode must not keep a lock on a file nobody else can open any more."""
    holder = hostlock.Lock("del", directory=lockdir).acquire()
    waiter = spawn("""
        import sys, time, hostlock
        l = hostlock.Lock("del", directory=sys.argv[1])
        print("waiting", flush=True)
        l.acquire()
        print("got", flush=True)
        time.sleep(30)
    """, lockdir)
    wait_line(waiter, "waiting")
    while hostlock.status("del", lockdir).waiters == 0:  # it has opened the file and queued on it
        time.sleep(0.01)
    # Its acquisition comes at least RELINK_CHECK_NS after it opened the file: it checks st_nlink then.
    time.sleep(_lockers.RELINK_CHECK_NS / 1e9 * 2)
    os.unlink(os.path.join(lockdir, "del.lock"))
    holder.release()
    wait_line(waiter, "got")
    try:
        # The waiter moved to the current file: a newcomer sees it there, so there are never two holders.
        with pytest.raises(hostlock.LockTimeout):
            hostlock.Lock("del", directory=lockdir).acquire(timeout=0.2)
        assert [h.pid for h in hostlock.holders("del", lockdir)] == [waiter.pid]
    finally:
        waiter.kill()
        waiter.wait()


def test_forked_child_never_releases_or_shares_the_parents_lock(mechdir):
    lock = hostlock.Lock("fork", directory=mechdir).acquire()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            if lock.locked:
                code = 10  # the child must not think it holds its parent's lock
            lock.release()  # must not unlock the parent's lock
            try:
                lock.acquire(timeout=0)
                code = 11  # and must not share the parent's open file description
            except hostlock.LockTimeout:
                pass
        finally:
            os._exit(code)
    status = os.waitpid(pid, 0)[1]
    assert os.WEXITSTATUS(status) == 0
    assert lock.locked
    with pytest.raises(hostlock.LockTimeout):
        hostlock.Lock("fork", directory=mechdir).acquire(timeout=0)
    lock.release()


def test_threads_exclude_each_other(mechdir):
    import threading

    shared = hostlock.Lock("thr", directory=mechdir)
    counter = {"n": 0, "inside": 0, "overlap": 0}
    cycles = 300 if os.path.basename(mechdir) != "record" else 60

    def work(own: bool) -> None:
        lock = hostlock.Lock("thr", directory=mechdir) if own else shared
        for _cycle in range(cycles):
            with lock:
                counter["inside"] += 1
                if counter["inside"] != 1:
                    counter["overlap"] += 1
                n = counter["n"]
                time.sleep(0)
                counter["n"] = n + 1
                counter["inside"] -= 1

    threads = [threading.Thread(target=work, args=(i % 2 == 0,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert counter["overlap"] == 0 and counter["n"] == 4 * cycles
