"""Root decides on kernel facts, never on bytes another user could write (issue 39, items 1, 5 and 6).

In a root:group 3770 directory (as the cli role makes /run/hostlock) a member may write every 0660 lock file
root locks, plant names, link root's files from elsewhere and grow files sparse. None of that may split
root's locks, hide a holder, or make status and break fail. Real users (setpriv), real processes.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import textwrap

import pytest
from engine_helpers import LIB, as_member, needs_users, wait_line

import hostlock

MARKER = ".hostlock-mechanism"
SYSTEM_PYTHON = "/usr/bin/python3"  # runnable by uid 65534 (the venv's interpreter may live under /root)

HOLD = textwrap.dedent(r"""
    import sys, hostlock
    lock = hostlock.Lock(sys.argv[2], directory=sys.argv[1]).acquire()
    print("held", lock.mechanism, flush=True)
    sys.stdin.readline()
""")


def _root_holder(shared: str, name: str) -> tuple[subprocess.Popen, str]:
    p = subprocess.Popen([sys.executable, "-c", HOLD, shared, name], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=LIB))
    return p, wait_line(p, "held").split()[1]


def _end(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.stdin.write("\n")
        p.stdin.flush()
    p.wait(timeout=30)


def _member(gid: int, script: str) -> subprocess.CompletedProcess:
    r = as_member(gid, ["sh", "-c", script])
    assert r.returncode == 0, r.stderr
    return r


def _excluded(shared: str, name: str) -> None:
    """A second root Lock of the name finds it held (the holder's lock is the one everyone sees)."""
    with pytest.raises(hostlock.LockTimeout):
        hostlock.Lock(name, directory=shared).acquire(timeout=0)
    assert hostlock.status(name, shared).held


def _roots_marker(shared: str) -> None:
    st = os.lstat(os.path.join(shared, MARKER))
    assert st.st_uid == 0 and st.st_nlink == 1 and not st.st_mode & 0o022, oct(st.st_mode)
    with open(os.path.join(shared, MARKER)) as f:
        assert f.read().strip() == "ofd"


# What a member can put at the marker's name before root's first lock, and what it can do to it afterwards
# through whatever it keeps (the same inode by another name, or its own file there).
PLANTS = {
    "own-file-record": "printf 'record\\n' > {m}",
    "own-file-flock": "printf 'flock\\n' > {m}",
    "own-file-garbage": "printf 'xyz\\n' > {m}",
    "symlink": "ln -s /etc/passwd {m}",
    "fifo": "mkfifo {m}",
    "directory": "mkdir {m} && touch {m}/f",
    # A root-owned 0660 file of another shared directory on the same file system (a lock file root made
    # there), linked in: root owns the inode, the member may write it.
    "link-of-roots-0660-file": "ln {other} {m}",
}


@needs_users
@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_a_marker_a_member_planted_never_decides_roots_mechanism(shared_group, tmp_path, plant):
    shared, gid = shared_group
    other = os.path.join(os.path.dirname(shared), "other")
    os.mkdir(other)
    os.chown(other, 0, gid)
    os.chmod(other, 0o3770)
    hostlock.Lock("x", directory=other).acquire(timeout=0).release()  # root's 0660 other/x.lock
    assert os.stat(os.path.join(other, "x.lock")).st_mode & 0o777 == 0o660
    _member(gid, PLANTS[plant].format(m=os.path.join(shared, MARKER), other=os.path.join(other, "x.lock")))
    holder, mechanism = _root_holder(shared, "J")
    try:
        assert mechanism == "ofd"  # the kernel's answer, never the planted text
        _roots_marker(shared)  # set aside, root's own recorded in its place
        # Whatever the member still reaches (the other name of the linked inode, anything it may write) changes
        # nothing: a second root process and a member's own lock agree with the first.
        planted = (os.path.join(other, "x.lock"), shared, shared, os.path.join(shared, MARKER))
        _member(gid, "printf 'record\\n' > %s 2>/dev/null || true; printf 'record\\n' > %s/.m 2>/dev/null; "
                     "mv -f %s/.m %s 2>/dev/null || true" % planted)
        _roots_marker(shared)
        _excluded(shared, "J")
        r = as_member(gid, [SYSTEM_PYTHON, "-c",
                            "import sys; sys.path.insert(0, %r); import hostlock\n"
                            "l = hostlock.Lock('J', directory=%r)\n"
                            "try:\n    l.acquire(timeout=0); print('HELD')\n"
                            "except hostlock.LockTimeout:\n    print('busy', l.mechanism)" % (LIB, shared)])
        assert r.stdout.strip() == "busy ofd", r.stdout + r.stderr
    finally:
        _end(holder)


@needs_users
@pytest.mark.parametrize("mode", [0o660, 0o664, 0o666])
def test_roots_own_marker_that_others_may_write_or_that_has_two_names_is_not_trusted(shared_group, mode):
    """Root-owned, but the group (or anyone) may write it, or it has a second name: its bytes are not root's word."""
    shared, gid = shared_group
    path = os.path.join(shared, MARKER)
    with open(path, "w") as f:
        f.write("record\n")
    os.chmod(path, mode)
    holder, mechanism = _root_holder(shared, "K")
    try:
        assert mechanism == "ofd"
        _roots_marker(shared)
    finally:
        _end(holder)
    os.link(path, os.path.join(os.path.dirname(shared), "second-name"))  # 0644, root's, but two links
    assert hostlock.status("K", shared).mechanism == "ofd"
    with open(os.path.join(os.path.dirname(shared), "second-name"), "w") as f:
        f.write("record\n")
    # A reader does not take the linked text either: it reports the kernel's mechanism, never "record".
    assert hostlock.status("K", shared).mechanism == "ofd"
    hostlock.Lock("K", directory=shared).acquire(timeout=0).release()
    _roots_marker(shared)


@needs_users
def test_a_member_rewriting_its_marker_while_root_processes_start_never_splits_them(shared_group, tmp_path):
    """Two root processes starting together on a directory whose marker the member keeps rewriting: exactly
    one holds, every time (it was both, in 6 of 80 pairs)."""
    shared, gid = shared_group
    flipper = subprocess.Popen(
        ["setpriv", "--reuid=65534", "--regid=%d" % gid, "--groups=%d" % gid, "sh", "-c",
         "while :; do printf 'record\\n' > %s 2>/dev/null; printf 'ofd\\n' > %s 2>/dev/null; done"
         % ((os.path.join(shared, MARKER),) * 2)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for i in range(12):
            name = "P%d" % i
            pair = [subprocess.Popen([sys.executable, "-c", HOLD, shared, name], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=dict(os.environ, PYTHONPATH=LIB)) for _twice in range(2)]
            # Exactly one holds; the other must be seen waiting in the kernel's queue of the same file (a
            # process on another mechanism would never show up there, and would print "held" instead).
            ready = select.select([p.stdout for p in pair], [], [], 30)[0]
            assert ready, "neither root process took the lock"
            first = pair[0] if pair[0].stdout in ready else pair[1]
            second = pair[1] if first is pair[0] else pair[0]
            assert first.stdout.readline().split() == ["held", "ofd"]
            while hostlock.status(name, shared).waiters < 1:
                assert not select.select([second.stdout], [], [], 0.01)[0], second.stdout.readline()
            st = hostlock.status(name, shared)
            assert [h.pid for h in st.holders if not h.stale] == [first.pid], st.as_dict()
            _end(first)
            _end(second)  # it holds once the first let go
            # the directory is root's from the first pair on: the member's loop only fails to write
            if i == 0:
                _roots_marker(shared)
    finally:
        flipper.kill()
        flipper.wait()


# -- item 5: the header and the other bytes of a 0660 lock file ------------------------------------------------

OVERWRITES = {
    "nul-header": (0, b"\0" * 64),
    "garbage-header": (0, b"not a hostlock header at all\n".ljust(64, b"\0")),
    "other-slot-count": (0, b"HOSTLOCK 1 slots=7\n".ljust(64, b"\0")),
    "counter": (64, b"\xff" * 8),
    "records": (4096, b"HL1|pid=1|start=1|uid=0|lease=1.000|mode=exclusive\n".ljust(4096, b"\0")),
    "everything": (0, b"\0" * 16384),
}


@needs_users
@pytest.mark.parametrize("what", sorted(OVERWRITES))
def test_bytes_a_member_writes_into_roots_lock_file_never_report_a_held_lock_free(shared_group, what):
    shared, gid = shared_group
    holder, _m = _root_holder(shared, "H")
    try:
        at, data = OVERWRITES[what]
        path = os.path.join(shared, "H.lock")
        r = as_member(gid, ["dd", "of=" + path, "bs=1", "seek=%d" % at, "conv=notrunc", "status=none"],
                      input=data.decode("latin-1"), text=True, encoding="latin-1")
        assert r.returncode == 0, r.stderr
        st = hostlock.status("H", shared)
        assert st.held and st.state == "held", st.as_dict()
        assert [h.pid for h in st.holders if h.verified] == [holder.pid] or what in ("records", "everything"), \
            st.as_dict()
        assert hostlock.break_lock("H", shared) == []  # nothing ended: no lease of the holder's has ended
        assert holder.poll() is None
        if what not in ("garbage-header", "other-slot-count"):  # those make root's next lock refuse the file
            _excluded(shared, "H")
        listed = {s.name: s for s in hostlock.list_locks(shared)}
        assert listed["H"].held
        # break --force (root's explicit word) ends the holder the kernel shows, never reports "nothing to remove"
        ended = hostlock.break_lock("H", shared, force=True)
        assert [h.pid for h in ended] == [holder.pid] or what in ("records", "everything"), ended
    finally:
        _end(holder)
