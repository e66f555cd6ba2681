"""A lease's channel and its end, in a directory other users can write (issue 39 items 2, 4 and 10).

The client talks only to the process the kernel shows holding the lease (its uid, as the token names it; its
open lock file); a holder that cannot bind its own socket file fails instead of listening where anyone could
answer for it; and a lease has ended only on its holder's own word (its socket's time, proven by the socket's
peer credentials), never on text in a record another user may write. Real users (setpriv), real processes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest
from engine_helpers import ENDED_LEASE, LIB, as_member, holder_pid, kill_daemon, needs_users, seen, squat, wait_line

import hostlock
from hostlock.core.errors import error_exit_code
from hostlock.host import channel as _channel

SYSTEM_PYTHON = "/usr/bin/python3"  # runnable by other users (the venv's interpreter may live under /root)
OUTSIDER = 65533  # in no group of the test's


def _sticky_world(tmp: str) -> str:
    d = os.path.join(tmp, "sticky")
    os.mkdir(d)
    os.chmod(d, 0o1777)
    return d


@needs_users
@pytest.mark.parametrize("how", ["answers-ok", "answers-refused", "silent", "holds-the-lock"])
@pytest.mark.parametrize("who", ["member", "outsider"])
def test_a_name_taken_after_the_holder_died_is_never_talked_to(shared_group, how, who):
    """Root's holder SIGKILLed, its stale socket removed by root's next renew; another user binds the name (a
    member in the 3770 directory, an unrelated user in a sticky world-writable one), even after taking the
    lock itself. Root's renew and release are "gone" at once, and nothing reaches the squatter."""
    shared, gid = shared_group
    if who == "outsider":
        if how == "holds-the-lock":
            pytest.skip("an unrelated user cannot open root's lock file to take it (0660, another group)")
        shared, gid = _sticky_world(os.path.dirname(shared)), OUTSIDER
        uid = OUTSIDER
    else:
        uid = 65534
    token = hostlock.hold("L", lease=600, directory=shared)
    tid = token.split(".")[0]
    kill_daemon(holder_pid("L", shared))
    with pytest.raises(hostlock.TokenError) as e:
        hostlock.renew("L", token, directory=shared)
    assert e.value.reason == "gone"
    sock = os.path.join(shared, ".lease-%s.sock" % tid)
    assert not os.path.lexists(sock)  # root removed its dead holder's socket
    squatter = squat(uid, gid, sock, how, "L")
    try:
        for call in (lambda: hostlock.renew("L", token, directory=shared),
                     lambda: hostlock.release("L", token, shared)):
            started = time.monotonic()
            with pytest.raises(hostlock.TokenError) as e:
                call()
            assert e.value.reason == "gone" and "member's own words" not in str(e.value), e.value
            assert time.monotonic() - started < _channel.CLIENT_SECONDS  # never the bounded wait for an answer
        assert seen(squatter) == 0  # not even connected to: a uid the token does not name
    finally:
        squatter.kill()
        squatter.wait()


@needs_users
def test_a_holder_that_cannot_bind_its_socket_fails_and_leaves_no_lease(shared_group):
    """A member used up the directory's inodes: the holder used to listen on @hostlock-lease/ID instead, and the
    member then bound .lease-ID.sock and told root's renew and release "expired". Now the hold fails with one
    clear error (73: no space), nothing is held, and nobody can answer for a lease that does not exist."""
    shared, gid = shared_group
    small = os.path.join(os.path.dirname(shared), "small")  # a directory the member can reach
    os.mkdir(small)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "nr_inodes=64,mode=3770,gid=%d" % gid, "tmpfs", small], check=True)
    try:
        d = small
        hostlock.Lock("I", directory=d).acquire(timeout=0).release()  # root's lock file and marker exist
        r = as_member(gid, ["sh", "-c", "i=0; while touch %s/f$i 2>/dev/null; do i=$((i+1)); done; echo $i" % d])
        assert int(r.stdout) > 0, r
        with pytest.raises(hostlock.HostlockError) as e:
            hostlock.hold("I", lease=600, directory=d)
        assert "control socket" in str(e.value) and "No space" in str(e.value), e.value
        assert error_exit_code(e.value) == 73  # the command line's "no space": EX_CANTCREAT
        assert not [h for h in hostlock.holders("I", d) if h.alive]
        hostlock.Lock("I", directory=d).acquire(timeout=0).release()  # free: the failed holder took nothing
    finally:
        subprocess.run(["umount", "-l", small], check=False)


# -- item 4: text in a record never ends a live holder ---------------------------------------------------------

ENDED = ENDED_LEASE + textwrap.dedent(r"""
    import signal, sys, hostlock
    l = hostlock.Lock(sys.argv[2], directory=sys.argv[1]).acquire()
    channel = end_lease(l, sys.argv[1])
    print("held", l._locker.read_record(l._held).decode().split("|tid=")[1].split("|")[0], flush=True)
    sys.stdin.readline()
""")


def _rewrite_record(gid: int, path: str, edit: str) -> None:
    """As the member: rewrite the first owner record of a 0660 lock file with a Python expression of `r`."""
    code = ("import sys\nf = open(sys.argv[1], 'r+b')\nf.seek(4096)\nr = f.read(1024).split(b'\\n')[0].decode()\n"
            "r = %s\nf.seek(4096)\nf.write((r + '\\n').encode().ljust(1024, b'\\0'))\n" % edit)
    r = as_member(gid, [SYSTEM_PYTHON, "-c", code, path])
    assert r.returncode == 0, r.stderr


@needs_users
@pytest.mark.parametrize("edit", ["r + '|lease=1.000'", "r.replace('|mode=', '|lease=1.000|mode=')",
                                  "r + '|lease=1.000|tid={other}'",
                                  "r.split('|at=')[0] + '|lease=1.000|tid={other}|at=1.0'"])
def test_lease_text_a_member_writes_into_roots_record_never_ends_roots_live_job(shared_group, edit):
    """`status` called root's job stale ("ended 20788d ago") and root's plain `break` ended it: the kernel
    proved the holder alive, and "its lease ended" was text the member wrote. Also with the id of root's other
    lease, one that really has ended and whose (stopped) holder's socket says so: it is not this holder's."""
    shared, gid = shared_group
    other = subprocess.Popen([sys.executable, "-c", ENDED, shared, "other"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=LIB))
    other_tid = wait_line(other, "held").split()[1]
    job = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import sys, hostlock
        l = hostlock.Lock(sys.argv[2], directory=sys.argv[1]).acquire()
        print("held", flush=True)
        sys.stdin.readline()
    """), shared, "J"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=LIB))
    try:
        wait_line(job, "held")
        _rewrite_record(gid, os.path.join(shared, "J.lock"), edit.format(other=other_tid))
        (h,) = hostlock.holders("J", shared)
        assert h.pid == job.pid and h.verified is True, h.as_dict()
        assert not h.stale and not h.lease_expired and h.lease_expires is None, h.as_dict()
        assert hostlock.break_lock("J", shared) == []
        assert job.poll() is None
        (o,) = hostlock.holders("other", shared)  # no false calm: a lease that did end is still breakable
        assert o.stale and o.lease_expired, o.as_dict()
    finally:
        for p in (job, other):
            p.stdin.write("\n")
            p.stdin.flush()
            p.wait(timeout=30)
