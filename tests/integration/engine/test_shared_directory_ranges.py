"""A member of a shared lock directory's group against root's locks, round three: files and byte ranges a
member can make or hold in a 3770 directory (its temporary names, a flock() semaphore's slot files, the
queue's ranges in root's 0660 lock file, the record mechanism's guard and readers). None may admit a second
holder, deny root the directory, or stall root's waiters. Real users (setpriv into a real group), a real
3770 directory, real processes, held until told.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest
from engine_helpers import LIB, as_member, needs_users, wait_line

import hostlock
from hostlock.core import owner as _owner
from hostlock.host import kernel as _kernel

SYSTEM_PYTHON = "/usr/bin/python3"  # runnable by uid 65534 (the venv's interpreter may live under /root)

# As the member: hold OFD write locks on ranges (start, length) of FILE until told (a line on stdin).
RANGES = textwrap.dedent(r"""
    import fcntl, os, struct, sys
    fd = os.open(sys.argv[1], os.O_RDWR)
    for spec in sys.argv[2:]:
        start, length = (int(x) for x in spec.split(":"))
        fcntl.fcntl(fd, 37, struct.pack("hhqqi", fcntl.F_WRLCK, 0, start, length, 0))  # F_OFD_SETLK
    print("held", flush=True)
    sys.stdin.readline()
""")

# As root: take NAME in DIR (timeout, mechanism as given), say so, hold until told, release.
TAKE = textwrap.dedent(r"""
    import sys, hostlock
    d, name, timeout, mech = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
    print("pid", flush=True)
    sys.stdin.readline()
    try:
        lock = hostlock.Lock(name, directory=d, mechanism=mech)  # reads (or makes) the marker: after the gate
        got = lock.acquire(timeout=timeout)
    except hostlock.HostlockError as e:
        print("error", e, flush=True)
        sys.exit(3)
    print("got" if got else "timeout", flush=True)
    sys.stdin.readline()
    lock.release()
""")


def _member(gid: int, argv: list) -> subprocess.Popen:
    return subprocess.Popen(["setpriv", "--reuid=65534", "--regid=%d" % gid, "--groups=%d" % gid, *argv],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=LIB))


def _taker(shared: str, name: str, timeout: float = 30.0, mech: str = "auto") -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", TAKE, shared, name, str(timeout), mech], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, PYTHONPATH=LIB))
    wait_line(p, "pid")
    return p


def _tell(p: subprocess.Popen) -> None:
    p.stdin.write("\n")
    p.stdin.flush()


def _end(*procs: subprocess.Popen) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                _tell(p)
                _tell(p)
            except BrokenPipeError:
                pass
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _plant(gid: int, shared: str, names: list) -> None:
    r = as_member(gid, [SYSTEM_PYTHON, "-c", "import os, sys\nd = os.open(sys.argv[1], os.O_RDONLY)\n"
                        "for n in sys.argv[2:]: os.close(os.open(n, os.O_CREAT | os.O_WRONLY, 0o660, dir_fd=d))",
                        shared, *names])
    assert r.returncode == 0, r.stderr


@needs_users
@pytest.mark.parametrize("case", ["marker-adopted", "marker-created", "lock-file-adopted"])
def test_a_member_cannot_deny_root_the_directory_by_planting_its_temporary_names(shared_group, case):
    """Root's temporary names held its pid (.hostlock-mechanism.PID, .NAME.PID.new): a member planted them
    for every pid and root's every lock there failed with 'File exists'. Planted here for the very pid of
    the root process that locks, before it locks."""
    shared, gid = shared_group
    if case == "marker-adopted":  # the member locked first: root replaces the member's marker with its own
        r = as_member(gid, ["sh", "-c", "printf 'ofd\\n' > \"$1\"/.hostlock-mechanism", "sh", shared])
        assert r.returncode == 0, r.stderr
    elif case == "lock-file-adopted":  # root replaces the member's idle lock file with its own
        hostlock.Lock("warm", directory=shared).close()
        _plant(gid, shared, ["b.lock"])
    p = _taker(shared, "b", timeout=10)
    try:
        pid = p.pid
        _plant(gid, shared, [".hostlock-mechanism.%d.new" % pid, ".hostlock-mechanism.%d" % pid,
                             ".b.lock.%d.new" % pid])
        _tell(p)
        assert wait_line(p, "", timeout=30).startswith("got"), p.stderr.read() if p.poll() is not None else ""
        assert os.stat(os.path.join(shared, ".hostlock-mechanism")).st_uid == 0
        assert os.stat(os.path.join(shared, "b.lock")).st_uid == 0
    finally:
        _end(p)


@needs_users
def test_a_flock_semaphores_slot_files_a_member_made_are_refused_not_shared(shared_group):
    """flock() keeps each slot in a file of its own. Root checked the owner of NAME.lock only: a member's
    NAME.lock.16 was locked by root, then removed by the member (its file, sticky or not), and the next root
    holder locked a fresh file for the same slot: three holders of a 2-slot semaphore."""
    shared, gid = shared_group
    hostlock.Lock("S", directory=shared, mechanism="flock", slots=2).close()  # root's marker and S.lock
    _plant(gid, shared, ["S.lock.16", "S.lock.17"])
    lock = hostlock.Lock("S", directory=shared, mechanism="flock", slots=2)
    with pytest.raises(hostlock.LockFileError, match=r"S\.lock\.16 belongs to uid 65534"):
        lock.acquire(timeout=0)
    lock.close()
    os.unlink(os.path.join(shared, "S.lock.16"))
    os.unlink(os.path.join(shared, "S.lock.17"))
    first = hostlock.Lock("S", directory=shared, mechanism="flock", slots=2)
    second = hostlock.Lock("S", directory=shared, mechanism="flock", slots=2)
    assert first.acquire(timeout=0) and second.acquire(timeout=0)
    try:
        for slot in ("S.lock.16", "S.lock.17"):  # root's now: the member cannot take them away
            assert os.stat(os.path.join(shared, slot)).st_uid == 0
            r = as_member(gid, ["rm", "-f", os.path.join(shared, slot)])
            assert r.returncode != 0 and os.path.exists(os.path.join(shared, slot)), r
        third = hostlock.Lock("S", directory=shared, mechanism="flock", slots=2)
        with pytest.raises(hostlock.LockTimeout):
            third.acquire(timeout=0)
        third.close()
    finally:
        first.release()
        second.release()


def _queued(shared: str, name: str) -> int:
    return hostlock.status(name, directory=shared).waiters


@needs_users
@pytest.mark.parametrize("squat", ["meta", "waiting-ranges"])
def test_ranges_a_member_holds_in_roots_lock_file_do_not_stall_roots_waiters(shared_group, squat):
    """Root's lock file is 0660 in a shared directory, so a member may hold any range of it. Holding META
    (the ticket counter's guard) made every root waiter that had to queue wait for good, while status said
    'free, 0 waiters'; holding the WAITING ranges of the next tickets made the waiter behind the first
    wait for good."""
    shared, gid = shared_group
    name = "X"
    holder = hostlock.Lock(name, directory=shared)
    assert holder.acquire(timeout=0)
    path = os.path.join(shared, name + ".lock")
    counter = int.from_bytes(open(path, "rb").read()[_kernel.COUNTER_AT:_kernel.COUNTER_AT + 8].ljust(8, b"\0"),
                             "little")
    spec = ["%d:1" % _kernel.META] if squat == "meta" else ["%d:8" % (_kernel.WAITING0 + counter)]
    member = _member(gid, [SYSTEM_PYTHON, "-c", RANGES, path, *spec])
    waiters = []
    try:
        wait_line(member, "held")
        for _waiter in range(2):
            w = _taker(shared, name, timeout=60)
            _tell(w)
            waiters.append(w)
        end = time.monotonic() + 30
        while _queued(shared, name) < 2:  # both in line (or taken a ticket) before the holder lets go
            assert time.monotonic() < end, "the waiters never queued"
            time.sleep(0.01)
        holder.release()
        for w in waiters:
            line = wait_line(w, "", timeout=30)
            assert line.startswith("got"), (line, w.stderr.read() if w.poll() is not None else "")
            _tell(w)  # release, so the next is served
    finally:
        holder.close()
        _end(member, *waiters)


def _record_line(pid: int, uid: int, mode: str) -> str:
    return "HL1|pid=%d|start=%s|boot=%s|host=%s|uid=%d|cmd=x|mode=%s" % (
        pid, _owner.start_time(pid), _owner.BOOT_ID, _owner.HOSTNAME, uid, mode)


@needs_users
@pytest.mark.parametrize("plant", ["guard-naming-pid-1", "reader-with-a-garbage-name", "reader-naming-pid-1",
                                   "owner-naming-pid-1"])
def test_record_files_a_member_plants_do_not_stall_root_for_good(shared_group, plant):
    """The record mechanism trusted a file's record: a member's R~guard naming pid 1 (alive) kept root from
    ever breaking a dead holder's file; a planted R~r~zz, or a reader's name naming pid 1, kept every
    exclusive root holder out. Every holder keeps its file open: one whose process has not never held it."""
    shared, gid = shared_group
    hostlock.Lock("init", directory=shared, mechanism="record").close()
    # A root holder SIGKILLed while holding: its R~owner is stale (its process is proven dead).
    dead = subprocess.Popen([sys.executable, "-c", "import sys, hostlock\nl = hostlock.Lock('R', directory=sys.argv[1])"
                             "\nl.acquire(); print('held', flush=True); sys.stdin.readline()", shared],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=LIB))
    wait_line(dead, "held")
    dead.kill()
    dead.wait()
    boot = _owner.BOOT_ID.replace("-", "")[:8]
    files = {
        "guard-naming-pid-1": ("R~guard", _record_line(1, 65534, "guard")),
        "reader-with-a-garbage-name": ("R~r~zz", "HL1|pid=abc"),
        "reader-naming-pid-1": ("R~r~1~%s~%s~%s~~abcd" % (_owner.start_time(1), boot, _owner.HOSTNAME[:40]),
                                _record_line(1, 65534, "shared")),
        "owner-naming-pid-1": ("R~owner", _record_line(1, 65534, "exclusive")),
    }
    filename, text = files[plant]
    if plant == "owner-naming-pid-1":
        os.unlink(os.path.join(shared, "R~owner"))  # the member's file in place of the dead holder's
    r = as_member(gid, ["sh", "-c", 'printf "%s\\n" "$1" > "$2"', "sh", text, os.path.join(shared, filename)])
    assert r.returncode == 0, r.stderr
    lock = hostlock.Lock("R", directory=shared)
    try:
        assert lock.acquire(timeout=10), os.listdir(shared)
    finally:
        lock.close()
