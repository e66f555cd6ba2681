"""A member of a shared lock directory's group against root's locks (issue 22): no two holders, no
redirected signal, no directory-wide failure from garbage. Real users (setpriv into a real group), a real
3770 directory, real processes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from engine_helpers import HOLD, LIB, VICTIM, as_member, end_holder, needs_users, root_holder, victim_signals, wait_line

import hostlock
from hostlock.core import holder as _holder
from hostlock.core import owner as _owner

SYSTEM_PYTHON = "/usr/bin/python3"  # runnable by uid 65534 (the venv's interpreter may live under /root)


def _member_holder(gid: int, shared: str, name: str, *extra: str) -> subprocess.Popen:
    p = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=%d" % gid, "--groups=%d" % gid, SYSTEM_PYTHON, "-c",
                          HOLD, shared, name, *extra], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=LIB))
    wait_line(p, "held")
    return p


def _member_locks_first(gid: int, shared: str, name: str) -> None:
    """As the member: lock NAME once, so the member creates (and owns) NAME.lock and the marker."""
    end_holder(_member_holder(gid, shared, name))
    assert os.stat(os.path.join(shared, name + ".lock")).st_uid == 65534


ATTACKS = {
    "rm": "rm -f {f}",
    "mv-over": "printf x > {d}/.x && mv -f {d}/.x {f}",
    "rename-away": "mv -f {f} {d}/.away",
    "ln-over": "printf x > {d}/.x && ln -f {d}/.x {f}",
}


@needs_users
@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_a_member_cannot_remove_or_replace_the_file_root_holds(shared_group, attack):
    """The member created B.lock; root's lock adopts it, so the member can no longer take the name away."""
    shared, gid = shared_group
    _member_locks_first(gid, shared, "B")
    holder = root_holder(shared, "B")
    try:
        path = os.path.join(shared, "B.lock")
        assert os.stat(path).st_uid == 0  # root's now: only root (and the directory's owner) may remove it
        r = as_member(gid, ["sh", "-c", ATTACKS[attack].format(f=path, d=shared)])
        assert r.returncode != 0, "the member %s root's lock file: %s" % (attack, r)
        with pytest.raises(hostlock.LockTimeout):  # so root's second job does not run beside the first
            hostlock.Lock("B", directory=shared).acquire(timeout=0)
        assert hostlock.status("B", shared).state == "held"
    finally:
        end_holder(holder)


@needs_users
def test_root_waits_for_a_members_file_in_use_then_adopts_it(shared_group):
    """A member holding its own file: root does not lock that file under it; it waits, then replaces it."""
    shared, gid = shared_group
    member = _member_holder(gid, shared, "M")
    try:
        with pytest.raises(hostlock.LockTimeout):
            hostlock.Lock("M", directory=shared).acquire(timeout=0.2)
        assert os.stat(os.path.join(shared, "M.lock")).st_uid == 65534
    finally:
        end_holder(member)
    with hostlock.Lock("M", directory=shared).acquire(timeout=30):
        assert os.stat(os.path.join(shared, "M.lock")).st_uid == 0
        r = as_member(gid, ["rm", "-f", os.path.join(shared, "M.lock")])
        assert r.returncode != 0
        with pytest.raises(hostlock.LockTimeout):
            hostlock.Lock("M", directory=shared).acquire(timeout=0)


@needs_users
@pytest.mark.parametrize("attack", ["replace", "remove"])
def test_a_member_cannot_change_the_mechanism_under_roots_lock(shared_group, attack):
    shared, gid = shared_group
    _member_locks_first(gid, shared, "C")
    marker = os.path.join(shared, ".hostlock-mechanism")
    assert not os.path.lexists(marker)  # a member records no mechanism for a directory of root's
    holder = root_holder(shared, "C")
    try:
        assert os.stat(marker).st_uid == 0  # recorded by root's first lock: the kernel's answer
        with open(marker) as f:
            assert f.read().strip() == "ofd"
        cmd = ("printf 'record\\n' > %s/.m && mv -f %s/.m %s" % (shared, shared, marker) if attack == "replace"
               else "rm -f %s" % marker)
        r = as_member(gid, ["sh", "-c", cmd])
        assert r.returncode != 0, r
        with open(marker) as f:
            assert f.read().strip() == "ofd"
        with pytest.raises(hostlock.LockTimeout):
            hostlock.Lock("C", directory=shared).acquire(timeout=0)
    finally:
        end_holder(holder)


@needs_users
def test_a_hard_link_to_roots_lock_file_is_refused_and_break_never_follows_it(shared_group):
    shared, gid = shared_group
    holder = root_holder(shared, "A")
    try:
        r = as_member(gid, ["ln", os.path.join(shared, "A.lock"), os.path.join(shared, "Q.lock")])
        assert r.returncode == 0, r.stderr  # 0660 root:group: fs.protected_hardlinks lets a member link it
        st = hostlock.status("Q", shared)
        assert st.holders == [] and "2 links" in st.problem, st.as_dict()
        assert hostlock.break_lock("Q", shared, force=True) == []
        with pytest.raises(hostlock.LockFileError, match="2 links"):
            hostlock.Lock("Q", directory=shared).acquire(timeout=0)
        assert holder.poll() is None  # A's holder was not ended through Q
        with pytest.raises(hostlock.LockFileError):  # nor is A trusted while a second name leads to it
            hostlock.Lock("A", directory=shared).acquire(timeout=0)
    finally:
        end_holder(holder)


@needs_users
def test_a_forged_record_naming_a_process_that_only_has_the_file_open_is_never_acted_on(shared_group):
    """Kernel mechanism: the member holds W and writes a record naming root's process (uid 0, lease over),
    which has W.lock open as a waiter has. Having the file open proves nothing: the process must hold the lock."""
    shared, gid = shared_group
    with hostlock.Lock("W", directory=shared):
        pass
    path = os.path.join(shared, "W.lock")
    victim = subprocess.Popen([sys.executable, "-c", "import os, sys; fd = os.open(sys.argv[1], os.O_RDONLY)\n"
                               + VICTIM, path], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert victim.stdout.readline().startswith("ready")
    member = None
    try:
        assert _holder.holds_open(victim.pid, os.stat(path).st_dev, os.stat(path).st_ino)
        line = "HL1" + "".join("|%s=%s" % kv for kv in dict(
            pid=victim.pid, start=_owner.start_time(victim.pid), boot=_owner.BOOT_ID, host=_owner.HOSTNAME,
            uid=0, cmd="forged", mode="exclusive", at=time.time() - 60, lease=time.time() - 30).items())
        member = _member_holder(gid, shared, "W", line)
        (h,) = hostlock.status("W", shared).holders
        assert h.pid == victim.pid and h.uid == 0 and h.verified is False and not h.stale, h.as_dict()
        assert hostlock.break_lock("W", shared) == []
        assert hostlock.break_lock("W", shared, force=True) == []
        assert victim_signals(victim) == "signals []"
        assert victim.poll() is None
    finally:
        if member is not None:
            end_holder(member)
        victim.kill()
        victim.wait()


@needs_users
@pytest.mark.parametrize("garbage", [b"\xff" * 8, (2**63 - 1).to_bytes(8, "little"), b"\x00" * 7 + b"\x01"])
def test_garbage_in_the_ticket_counter_fails_no_listing_and_no_waiter(shared_group, garbage):
    shared, gid = shared_group
    for name in ("G", "other"):
        with hostlock.Lock(name, directory=shared):
            pass
    r = as_member(gid, [SYSTEM_PYTHON, "-c", "import os, sys; fd = os.open(sys.argv[1], os.O_RDWR); "
                        "os.pwrite(fd, bytes.fromhex(sys.argv[2]), 64)", os.path.join(shared, "G.lock"),
                        garbage.hex()])
    assert r.returncode == 0, r.stderr
    names = [s.name for s in hostlock.list_locks(shared)]
    assert names == ["G", "other"], names
    assert hostlock.status("G", shared).state == "free"
    holder = root_holder(shared, "G")
    try:
        waiter = subprocess.Popen([sys.executable, "-c", "import sys, hostlock; "
                                   "hostlock.Lock('G', directory=sys.argv[1]).acquire(timeout=60); print('got')",
                                   shared], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=dict(os.environ, PYTHONPATH=LIB))
        deadline = time.monotonic() + 30
        while hostlock.status("G", shared).waiters < 1:  # queued behind root's holder, with a ticket
            assert waiter.poll() is None and time.monotonic() < deadline, waiter.communicate()
            time.sleep(0.02)
    finally:
        end_holder(holder)
    out, err = waiter.communicate(timeout=60)
    assert waiter.returncode == 0 and out.strip() == "got", err


@needs_users
def test_a_rewritten_slot_count_admits_no_second_holder(shared_group):
    shared, gid = shared_group
    holder = root_holder(shared, "S")
    try:
        r = as_member(gid, [SYSTEM_PYTHON, "-c", "import os, sys; fd = os.open(sys.argv[1], os.O_RDWR); "
                            "os.pwrite(fd, b'HOSTLOCK 1 slots=3\\n'.ljust(64, b'\\0'), 0)",
                            os.path.join(shared, "S.lock")])
        assert r.returncode == 0, r.stderr
        with pytest.raises(ValueError, match="3-slot semaphore"):
            hostlock.Lock("S", directory=shared).acquire(timeout=0)
        assert hostlock.status("S", shared).state == "held"
    finally:
        end_holder(holder)
