"""Proofs of holders and of death: break and stale act on kernel facts, never on a record alone (issue 8).

Real users (setpriv into a real group), real signals, a real victim that must not be signalled, real
SIGSTOP, a real PID namespace (unshare).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from engine_helpers import (
    ENDED_LEASE,
    LIB,
    as_member,
    needs_users,
    spawn,
    start_victim,
    victim_signals,
    wait_line,
)

import hostlock
from hostlock.core import owner as _owner


def _record_line(**fields) -> str:
    return "HL1" + "".join("|%s=%s" % kv for kv in fields.items())


def _forge_owner_file(shared: str, gid: int, name: str, victim: int, lease: float) -> None:
    """As a group member: create NAME~owner claiming the victim's pid, start time, boot id and uid 0."""
    line = _record_line(pid=victim, start=_owner.start_time(victim), boot=_owner.BOOT_ID, host=_owner.HOSTNAME,
                        uid=0, cmd="forged", mode="exclusive", at=time.time() - 60, lease=lease)
    r = as_member(gid, ["sh", "-c", 'printf "%s\\n" "$1" > "$2"', "sh", line, os.path.join(shared, name + "~owner")])
    assert r.returncode == 0, r.stderr
    assert os.stat(os.path.join(shared, name + "~owner")).st_uid == 65534


@needs_users
def test_forged_record_is_reported_and_root_break_never_signals_its_victim(shared_group):
    shared, gid = shared_group
    hostlock.Lock("init", directory=shared, mechanism="record").close()
    victim = start_victim()
    try:
        _forge_owner_file(shared, gid, "svc", victim.pid, lease=time.time() - 30)
        (h,) = hostlock.status("svc", shared).holders
        assert h.forged and h.verified is False and not h.stale, h.as_dict()
        assert "forged" in h.problem and "uid 65534" in h.problem
        assert hostlock.status("svc", shared).problem == h.problem
        # Nobody has the file open, which every holder does: it is nobody's lock, and root's break removes
        # it (else it stalls the name for good), signalling nothing.
        assert [x.pid for x in hostlock.break_lock("svc", shared)] == [victim.pid]
        assert hostlock.break_lock("svc", shared, force=True) == []
        assert victim_signals(victim) == "signals []"
        assert victim.poll() is None
        assert not os.path.exists(os.path.join(shared, "svc~owner"))
    finally:
        victim.kill()
        victim.wait()


@needs_users
def test_group_member_cannot_get_a_process_signalled_by_naming_it_in_an_unforged_record(shared_group):
    """A member's own record (its file, its uid) naming root's process: uid and open files disprove it."""
    shared, gid = shared_group
    hostlock.Lock("init", directory=shared, mechanism="record").close()
    victim = start_victim()
    try:
        line = _record_line(pid=victim.pid, start=_owner.start_time(victim.pid), boot=_owner.BOOT_ID,
                            host=_owner.HOSTNAME, uid=65534, cmd="x", mode="exclusive", lease=time.time() - 30)
        r = as_member(gid, ["sh", "-c", 'printf "%s\\n" "$1" > "$2"', "sh", line, os.path.join(shared, "m~owner")])
        assert r.returncode == 0, r.stderr
        (h,) = hostlock.status("m", shared).holders
        assert not h.forged and h.alive is True and h.verified is False and not h.stale
        # A file nobody has open: removed (a planted file), and its named process never signalled.
        assert [x.pid for x in hostlock.break_lock("m", shared, force=True)] == [victim.pid]
        assert victim_signals(victim) == "signals []"
    finally:
        victim.kill()
        victim.wait()


def test_break_never_signals_a_process_that_does_not_have_the_lock_file_open(mechdir):
    """A holder's record rewritten to name another live process of the same uid: not proven, not signalled."""
    victim = start_victim()
    lock = hostlock.Lock("k", directory=mechdir).acquire()
    try:
        lock.update_record(pid=victim.pid, start=_owner.start_time(victim.pid), lease="%f" % (time.time() - 5))
        (h,) = hostlock.status("k", mechdir).holders
        assert h.pid == victim.pid and h.alive is True and h.verified is False and not h.stale
        assert hostlock.break_lock("k", mechdir, force=True) == []
        assert victim_signals(victim) == "signals []"
        assert lock.locked and hostlock.status("k", mechdir).held
    finally:
        lock.release()
        victim.kill()
        victim.wait()


def test_a_real_holder_is_verified_by_its_open_lock_file(mechdir):
    p = spawn("""
        import sys, hostlock
        l = hostlock.Lock("v", directory=sys.argv[1]).acquire()
        print("held", flush=True)
        sys.stdin.read()
    """, mechdir, stdin=subprocess.PIPE)
    try:
        wait_line(p, "held")
        (h,) = hostlock.status("v", mechdir).holders
        assert h.pid == p.pid and h.alive is True and h.verified is True and not h.forged
        assert h.pid_namespace == _owner.pid_namespace() != ""
        assert h.to_json()["verified"] is True
    finally:
        p.kill()
        p.wait()


HOLDER_WITH_ENDED_LEASE = ENDED_LEASE + """
import signal, sys, time, hostlock
if sys.argv[2] == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
l = hostlock.Lock("stopped", directory=sys.argv[1]).acquire()
channel = end_lease(l, sys.argv[1])  # a lease that has ended, on the holder's own word: break may end it
print("held", flush=True)
sys.stdin.read()
"""


def _stop(pid: int) -> None:
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while True:  # wait for the kernel to report it stopped (state T), not for a time to pass
        with open("/proc/%d/stat" % pid) as f:
            if f.read().rsplit(")", 1)[1].split()[0] in ("T", "t"):
                return
        assert time.monotonic() < deadline, "never stopped"
        time.sleep(0.001)


def test_break_continues_a_stopped_holder_so_it_really_ends(mechdir):
    p = spawn(HOLDER_WITH_ENDED_LEASE, mechdir, "default", stdin=subprocess.PIPE)
    try:
        wait_line(p, "held")
        _stop(p.pid)
        (h,) = hostlock.status("stopped", mechdir).holders
        assert h.stale and h.verified is True
        ended = hostlock.break_lock("stopped", mechdir, wait=60)
        assert [x.pid for x in ended] == [p.pid]
        assert p.wait(30) == -signal.SIGTERM
        assert hostlock.status("stopped", mechdir).holders == []  # the kernel holds nothing any more
        hostlock.Lock("stopped", directory=mechdir).acquire(timeout=0).release()
    finally:
        p.kill()
        p.wait()


def test_break_reports_a_holder_that_survives_sigterm_as_remaining(mechdir):
    p = spawn(HOLDER_WITH_ENDED_LEASE, mechdir, "ignore", stdin=subprocess.PIPE)
    try:
        wait_line(p, "held")
        _stop(p.pid)
        ended = hostlock.break_lock("stopped", mechdir, wait=0.2)
        assert [x.pid for x in ended] == [p.pid]  # signalled, continued ...
        left = hostlock.status("stopped", mechdir).holders
        assert [x.pid for x in left] == [p.pid]  # ... and still the holder: status says so
        with pytest.raises(hostlock.LockTimeout):
            hostlock.Lock("stopped", directory=mechdir).acquire(timeout=0)
    finally:
        p.kill()
        p.wait()


def _unshare_works() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    r = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], check=False, capture_output=True)
    return r.returncode == 0


needs_pidns = pytest.mark.skipif(not _unshare_works(), reason="needs root and a working unshare --pid --mount-proc")


@needs_pidns
@pytest.mark.parametrize("mode", ["exclusive", "shared"])
def test_record_from_another_pid_namespace_is_never_proven_dead_here(tmp_path, mode):
    d = tmp_path / "rec"
    d.mkdir(mode=0o700)
    hostlock.Lock("init", directory=str(d), mechanism="record").close()
    inner = textwrap.dedent("""
        import os, sys, time
        sys.path.insert(0, sys.argv[2])
        import hostlock
        l = hostlock.Lock("ns", directory=sys.argv[1], mode=sys.argv[3]).acquire()
        l.update_record(lease="%f" % (time.time() - 1))  # even an ended lease: nothing here can prove it
        print("held", os.getpid(), flush=True)
        sys.stdin.read()
    """)
    p = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", inner, str(d), LIB,
                          mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = wait_line(p, "held", timeout=30)
        inner_pid = int(line.split()[1])
        (h,) = hostlock.status("ns", str(d)).holders
        # Its pid (1 in there) names another process, or none, out here: unknown, never dead.
        assert h.pid == inner_pid and h.pid_namespace and h.pid_namespace != _owner.pid_namespace()
        assert h.alive is None and not h.stale and h.verified is None
        with pytest.raises(hostlock.LockTimeout):
            hostlock.Lock("ns", directory=str(d)).acquire(timeout=0.2)  # never a second holder
        assert hostlock.break_lock("ns", str(d), force=True) == []
        assert hostlock.status("ns", str(d)).holders
    finally:
        p.stdin.close()
        p.wait(30)
    assert hostlock.status("ns", str(d)).holders == []  # it released on its own


SYSTEM_PYTHON = "/usr/bin/python3"  # an interpreter user nobody can run (the venv's lives under /root)
MEMBER_HOLDER = ENDED_LEASE + """
import sys, time, hostlock
l = hostlock.Lock("m", directory=sys.argv[1]).acquire()
channel = end_lease(l, sys.argv[1])
print("held", flush=True)
sys.stdin.read()
"""


@needs_users
@pytest.mark.skipif(not os.access(SYSTEM_PYTHON, os.X_OK), reason="needs /usr/bin/python3 for the other user")
@pytest.mark.parametrize("mechanism", ["ofd", "record"])
@pytest.mark.parametrize("breaker", ["root", "member"])
def test_a_group_members_real_stopped_holder_is_proven_not_forged_and_ended(shared_group, mechanism, breaker):
    """No false alarm: a member's own record is theirs (not forged), proven, and its ended lease breakable by
    root or by the member (whose /proc/PID/fd of their own process the kernel lets them read)."""
    shared, gid = shared_group
    hostlock.Lock("init", directory=shared, mechanism=mechanism).close()
    env = dict(os.environ, PYTHONPATH=LIB)
    p = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=%d" % gid, "--groups=%d" % gid, SYSTEM_PYTHON, "-c",
                          MEMBER_HOLDER, shared], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    try:
        wait_line(p, "held")
        _stop(p.pid)
        (h,) = hostlock.status("m", shared).holders
        assert (h.pid, h.uid, h.forged, h.verified, h.stale) == (p.pid, 65534, False, True, True), h.as_dict()
        if breaker == "root":
            assert [x.pid for x in hostlock.break_lock("m", shared, wait=60)] == [p.pid]
        else:
            r = as_member(gid, [SYSTEM_PYTHON, "-c", "import sys, hostlock; "
                                "print('ended', [h.pid for h in hostlock.break_lock('m', sys.argv[1], wait=60)])",
                                shared], env=env, timeout=90)
            assert r.stdout.strip() == "ended [%d]" % p.pid, r.stdout + r.stderr
        assert p.wait(30) == -signal.SIGTERM
        assert hostlock.status("m", shared).holders == []
    finally:
        p.kill()
        p.wait()
