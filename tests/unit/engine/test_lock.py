"""Semantics every mechanism must share: exclusive, shared, semaphores, timeouts, re-entrancy, status."""

from __future__ import annotations

import os
import time

import pytest
from engine_helpers import spawn, wait_line

import hostlock


def test_exclusive_excludes_another_lock_object_in_the_same_process(mechdir):
    a = hostlock.Lock("x", directory=mechdir)
    b = hostlock.Lock("x", directory=mechdir)
    with a:
        assert a.locked
        with pytest.raises(hostlock.LockTimeout) as e:
            b.acquire(timeout=0)
        assert isinstance(e.value, TimeoutError)
        assert e.value.holders and e.value.holders[0].pid == os.getpid()
        assert str(os.getpid()) in str(e.value)
    assert not a.locked
    b.acquire(timeout=0)
    b.release()


def test_exclusive_excludes_another_process(mechdir):
    holder = spawn("""
        import sys, hostlock
        l = hostlock.Lock("x", directory=sys.argv[1]).acquire()
        print("held", flush=True)
        sys.stdin.readline()
    """, mechdir, stdin=__import__("subprocess").PIPE)
    try:
        wait_line(holder, "held")
        with pytest.raises(hostlock.LockTimeout):
            hostlock.Lock("x", directory=mechdir).acquire(timeout=0.2)
        st = hostlock.status("x", mechdir)
        assert [h.pid for h in st.holders] == [holder.pid]
        assert st.holders[0].alive is True and st.holders[0].mode == "exclusive"
        assert st.directory == mechdir and st.mechanism in ("ofd", "flock", "record")
    finally:
        holder.stdin.close()
        holder.wait(10)
    hostlock.Lock("x", directory=mechdir).acquire(timeout=5).release()


def test_timeout_is_honoured(mechdir):
    a = hostlock.Lock("t", directory=mechdir).acquire()
    b = hostlock.Lock("t", directory=mechdir)
    start = time.monotonic()
    with pytest.raises(hostlock.LockTimeout):
        b.acquire(timeout=0.3)
    waited = time.monotonic() - start
    assert waited >= 0.29  # it waited; that it gave up at all is the point (a holds on)
    a.release()
    b.acquire(timeout=2)  # the abandoned wait left the line: we are not stuck behind ourselves
    b.release()


def test_shared_holders_coexist_and_exclude_writers(mechdir):
    readers = [hostlock.Lock("rw", mode="shared", directory=mechdir).acquire(timeout=0) for _i in range(3)]
    st = hostlock.status("rw", mechdir)
    assert len(st.holders) == 3 and {h.mode for h in st.holders} == {"shared"}
    with pytest.raises(hostlock.LockTimeout):
        hostlock.Lock("rw", directory=mechdir).acquire(timeout=0.1)
    for r in readers:
        r.release()
    w = hostlock.Lock("rw", directory=mechdir).acquire(timeout=2)
    with pytest.raises(hostlock.LockTimeout):
        hostlock.Lock("rw", mode="shared", directory=mechdir).acquire(timeout=0.1)
    w.release()


def test_semaphore_admits_exactly_n(mechdir):
    held = [hostlock.Lock("sem", slots=3, directory=mechdir).acquire(timeout=0) for _i in range(3)]
    with pytest.raises(hostlock.LockTimeout):
        hostlock.Lock("sem", slots=3, directory=mechdir).acquire(timeout=0.1)
    st = hostlock.status("sem", mechdir)
    assert st.slots == 3 and sorted(h.slot for h in st.holders) == [0, 1, 2]
    held[1].release()
    again = hostlock.Lock("sem", slots=3, directory=mechdir).acquire(timeout=2)
    assert hostlock.status("sem", mechdir).holders[1].slot == 1 or len(hostlock.status("sem", mechdir).holders) == 3
    for h in (held[0], held[2], again):
        h.release()


def test_semaphore_waiter_wakes_on_any_slot(lockdir):
    held = [hostlock.Lock("sem", slots=2, directory=lockdir).acquire() for _i in range(2)]
    waiter = spawn("""
        import sys, time, hostlock
        l = hostlock.Lock("sem", slots=2, directory=sys.argv[1])
        print("waiting", flush=True)
        l.acquire()
        print("got", hostlock.status("sem", sys.argv[1]).holders and l._held.slot, flush=True)
    """, lockdir)
    wait_line(waiter, "waiting")
    time.sleep(0.2)
    held[1].release()  # the second slot frees, not the first: the waiter must still wake
    line = wait_line(waiter, "got", timeout=5)
    assert line.endswith("1")
    waiter.wait(5)
    held[0].release()


def test_mismatched_slots_are_refused(lockdir):
    hostlock.Lock("m", slots=2, directory=lockdir).acquire().release()
    with pytest.raises(ValueError, match="2-slot semaphore"):
        hostlock.Lock("m", directory=lockdir).acquire(timeout=0)


def test_reentrant_in_the_holding_thread(mechdir):
    a = hostlock.Lock("re", directory=mechdir)
    with a:
        with a:
            assert a.locked
        assert a.locked
    assert not a.locked


def test_release_when_not_held_is_a_noop(mechdir):
    a = hostlock.Lock("n", directory=mechdir)
    a.release()
    assert not a.locked


@pytest.mark.parametrize("kwargs,match", [
    ({"mode": "write"}, "mode must be"),
    ({"slots": 0}, "slots must be"),
    ({"slots": 2, "mode": "shared"}, "semaphore"),
    ({"mechanism": "posix"}, "mechanism must be"),
])
def test_bad_arguments(lockdir, kwargs, match):
    with pytest.raises(ValueError, match=match):
        hostlock.Lock("x", directory=lockdir, **kwargs)


def test_bad_timeout(lockdir):
    with pytest.raises(ValueError):
        hostlock.Lock("x", directory=lockdir).acquire(timeout=-1)


def test_mechanism_mismatch_with_directory_is_refused(lockdir):
    hostlock.Lock("x", directory=lockdir, mechanism="ofd").close()
    with pytest.raises(hostlock.MechanismError, match="would\nnot|would not|not exclude"):
        hostlock.Lock("x", directory=lockdir, mechanism="record")


def test_update_record_names_the_job(mechdir):
    a = hostlock.Lock("job", directory=mechdir, label="nightly").acquire()
    a.update_record(job_pid=os.getpid(), job_cmdline="rsync -a src dst")
    h = hostlock.holders("job", mechdir)[0]
    assert h.job_pid == os.getpid() and h.label == "nightly"
    assert h.verified and h.user
    d = hostlock.status("job", mechdir).as_dict()
    assert d["holders"][0]["job_pid"] == os.getpid() and d["held"] is True
    a.release()
    assert hostlock.holders("job", mechdir) == []


def test_meanwhile_runs_once_and_its_record_change_is_in_the_first_record(mechdir):
    """Lock.acquire(meanwhile=...): run once before acquire returns (host locks have no round trip to overlap
    it with); what it tells update_record() is in the record the lock is taken with."""
    a = hostlock.Lock("mw", directory=mechdir)
    ran = []

    def meanwhile():
        ran.append(a.locked)
        a.update_record(job_pid=os.getpid(), job_cmdline="backup")

    a.acquire(meanwhile=meanwhile)
    assert ran == [False]
    assert hostlock.holders("mw", mechdir)[0].job_pid == os.getpid()
    a.acquire(meanwhile=lambda: ran.append("again"))  # re-entrant: it still runs, once
    assert ran == [False, "again"]
    a.release()
    a.release()
    assert not a.locked


def test_what_meanwhile_raises_acquire_raises_with_the_lock_free(mechdir):
    a = hostlock.Lock("mw", directory=mechdir)

    def boom():
        raise OSError(12, "no memory to fork")

    with pytest.raises(OSError, match="no memory"):
        a.acquire(meanwhile=boom)
    assert not a.locked
    hostlock.Lock("mw", directory=mechdir).acquire(timeout=0).release()  # nobody holds it
    a.acquire(timeout=0).release()  # and the object is usable again


def test_list_locks(mechdir):
    a = hostlock.Lock("one", directory=mechdir).acquire()
    hostlock.Lock("two", directory=mechdir).acquire().release()
    names = {s.name: s.held for s in hostlock.list_locks(mechdir)}
    assert names.get("one") is True
    assert names.get("two", False) is False
    a.release()


def test_status_of_unknown_lock_and_missing_directory(tmp_path):
    assert hostlock.status("nothing", str(tmp_path)).holders == []
    assert hostlock.status("nothing", str(tmp_path / "missing")).holders == []
    assert hostlock.list_locks(str(tmp_path / "missing")) == []


def test_default_directory_env(monkeypatch, tmp_path):
    monkeypatch.setenv("HOSTLOCK_DIR", str(tmp_path))
    assert hostlock.default_directory() == str(tmp_path)
    assert hostlock.Lock("x").directory == str(tmp_path)


def test_default_directory_for_root_is_the_system_directory(monkeypatch):
    monkeypatch.delenv("HOSTLOCK_DIR", raising=False)
    if os.geteuid() == 0:
        assert hostlock.default_directory() == hostlock.SYSTEM_DIRECTORY


def test_lock_file_mode_is_explicit_not_the_umask(lockdir):
    old = os.umask(0)
    try:
        hostlock.Lock("mode", directory=lockdir).acquire().release()
    finally:
        os.umask(old)
    assert oct(os.stat(os.path.join(lockdir, "mode.lock")).st_mode & 0o777) == oct(0o600)


def test_group_shared_directory_gives_group_writable_files(tmp_path):
    d = tmp_path / "shared"
    d.mkdir()
    os.chmod(d, 0o3770)
    hostlock.Lock("g", directory=str(d)).acquire().release()
    assert os.stat(d / "g.lock").st_mode & 0o777 == 0o660


def test_lock_descriptors_are_close_on_exec(lockdir):
    import fcntl

    a = hostlock.Lock("cx", directory=lockdir).acquire()
    assert fcntl.fcntl(a._locker.file.fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
    a.release()
