"""Hostile surroundings: planted symlinks and FIFOs, untrusted directories, full and read-only disks, other users."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from engine_helpers import LIB

import hostlock

ROOT = os.geteuid() == 0
NOBODY = 65534


def test_symlink_at_lock_path_is_refused_and_target_untouched(lockdir, tmp_path):
    target = tmp_path / "precious"
    target.write_text("keep me")
    os.symlink(target, os.path.join(lockdir, "s.lock"))
    with pytest.raises(hostlock.LockFileError, match="symlink"):
        hostlock.Lock("s", directory=lockdir).acquire(timeout=0)
    assert target.read_text() == "keep me"


def test_symlink_at_record_owner_path_is_not_followed(tmp_path):
    d = tmp_path / "rec"
    d.mkdir(mode=0o700)
    hostlock.Lock("init", directory=str(d), mechanism="record").close()
    target = tmp_path / "precious"
    target.write_text("keep me")
    os.symlink(target, d / "s~owner")
    with pytest.raises(hostlock.LockTimeout):
        hostlock.Lock("s", directory=str(d)).acquire(timeout=0.1)  # counted as a (suspicious) holder
    assert "symlink" in (hostlock.holders("s", str(d))[0].cmdline or "")
    assert target.read_text() == "keep me"


def test_fifo_at_lock_path_is_refused_without_blocking(lockdir):
    os.mkfifo(os.path.join(lockdir, "f.lock"))
    with pytest.raises(hostlock.LockFileError, match="not a regular file"):
        hostlock.Lock("f", directory=lockdir).acquire(timeout=0)
    st = hostlock.status("f", lockdir)  # reported, never opened: status shows what is planted
    assert st.state == "refused" and "not a regular file" in st.problem and st.holders == []


def test_directory_that_is_a_symlink_is_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    os.symlink(real, tmp_path / "link")
    with pytest.raises(hostlock.LockDirectoryError, match="symlink"):
        hostlock.Lock("x", directory=str(tmp_path / "link"))


def test_world_writable_directory_without_sticky_bit_is_refused(tmp_path):
    d = tmp_path / "open"
    d.mkdir()
    os.chmod(d, 0o777)
    with pytest.raises(hostlock.LockDirectoryError, match="sticky"):
        hostlock.Lock("x", directory=str(d))
    os.chmod(d, 0o1777)
    hostlock.Lock("x", directory=str(d)).acquire().release()


@pytest.mark.skipif(not ROOT, reason="needs root to chown")
def test_directory_owned_by_another_user_is_refused(tmp_path):
    d = tmp_path / "theirs"
    d.mkdir(mode=0o700)
    os.chown(d, NOBODY, NOBODY)
    with pytest.raises(hostlock.LockDirectoryError, match="owned by another user"):
        hostlock.Lock("x", directory=str(d))


def test_missing_parent_is_a_clear_error(tmp_path):
    with pytest.raises(hostlock.LockDirectoryError, match="does not exist"):
        hostlock.Lock("x", directory=str(tmp_path / "no" / "such"))


def _in_mount_namespace(body: str, tmp_path) -> subprocess.CompletedProcess:
    script = "set -e\n" + textwrap.dedent(body)
    return subprocess.run(["unshare", "-m", "sh", "-c", script], check=False, capture_output=True, text=True,
                          timeout=60, env=dict(os.environ, PYTHONPATH=LIB, PY=sys.executable, D=str(tmp_path / "mnt")))


needs_mounts = pytest.mark.skipif(not ROOT or not shutil.which("unshare"), reason="needs root and unshare -m")


@needs_mounts
def test_read_only_filesystem_is_a_clear_error(tmp_path):
    (tmp_path / "mnt").mkdir()
    out = _in_mount_namespace("""
        mount -t tmpfs -o size=1m,mode=0700 tmpfs "$D"
        mount -o remount,ro "$D"
        "$PY" -c 'import sys, hostlock
try:
    hostlock.Lock("x", directory=sys.argv[1]).acquire(timeout=0)
except hostlock.HostlockError as e:
    print("ERR", type(e).__name__, e)' "$D"
    """, tmp_path)
    assert "ERR" in out.stdout and "read-only" in out.stdout, out.stdout + out.stderr


@needs_mounts
@pytest.mark.parametrize("mechanism", ["ofd", "record"])
def test_full_disk_is_a_clear_error_and_leaves_no_partial_files(tmp_path, mechanism):
    (tmp_path / "mnt").mkdir()
    out = _in_mount_namespace("""
        mount -t tmpfs -o size=64k,mode=0700 tmpfs "$D"
        mkdir -m 0700 "$D/locks"
        "$PY" -c 'import sys, hostlock
hostlock.Lock("init", directory=sys.argv[1], mechanism=sys.argv[2]).close()' "$D/locks" %s
        dd if=/dev/zero of="$D/fill" bs=4k 2>/dev/null || true
        "$PY" -c 'import os, sys, hostlock
try:
    hostlock.Lock("x", directory=sys.argv[1]).acquire(timeout=0)
    print("ACQUIRED")
except hostlock.HostlockError as e:
    print("ERR", type(e).__name__, e)
print("FILES", sorted(n for n in os.listdir(sys.argv[1]) if "~t~" in n))' "$D/locks"
    """ % mechanism, tmp_path)
    assert "ERR" in out.stdout and "no space" in out.stdout, out.stdout + out.stderr
    assert "FILES []" in out.stdout


@needs_mounts
def test_full_disk_on_a_fresh_directory_leaves_no_temporary_marker(tmp_path):
    """The mechanism marker is written under a temporary name: a failed write must not leave that name."""
    (tmp_path / "mnt").mkdir()
    out = _in_mount_namespace("""
        mount -t tmpfs -o size=64k,mode=0700 tmpfs "$D"
        mkdir -m 0700 "$D/locks"
        dd if=/dev/zero of="$D/fill" bs=4k 2>/dev/null || true
        "$PY" -c 'import os, sys, hostlock
try:
    hostlock.Lock("x", directory=sys.argv[1]).acquire(timeout=0)
    print("ACQUIRED")
except hostlock.HostlockError as e:
    print("ERR", type(e).__name__, e)
print("LEFT", sorted(os.listdir(sys.argv[1])))' "$D/locks"
        rm "$D/fill"
        "$PY" -c 'import sys, hostlock
hostlock.Lock("x", directory=sys.argv[1]).acquire(timeout=0).release(); print("AFTER ok")' "$D/locks"
    """, tmp_path)
    assert "ERR" in out.stdout and "no space" in out.stdout, out.stdout + out.stderr
    assert "LEFT []" in out.stdout, out.stdout
    assert "AFTER ok" in out.stdout, out.stdout + out.stderr


@pytest.mark.skipif(not ROOT, reason="needs root to act as another user")
def test_other_users_get_clear_errors_and_cannot_break_our_lock(tmp_path):
    import pathlib
    import tempfile

    top = pathlib.Path(tempfile.mkdtemp(prefix="hostlock-users-", dir="/tmp"))
    os.chmod(top, 0o755)  # pytest's own tmp_path is private to root
    try:
        _other_user_checks(top)
    finally:
        shutil.rmtree(top)


def _other_user_checks(top):
    private = top / "private"
    private.mkdir(mode=0o700)
    sticky = top / "sticky"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    held = hostlock.Lock("mine", directory=str(sticky)).acquire()
    os.chmod(sticky / "mine.lock", 0o644)  # readable, so the other user can see who holds it
    script = textwrap.dedent("""
        import os, signal, sys, hostlock  # import before dropping privileges: stdlib may be under /root
        os.setgid(65534); os.setuid(65534)
        for what, fn in [
            ("private", lambda: hostlock.Lock("x", directory=sys.argv[1]).acquire(timeout=0)),
            ("steal", lambda: hostlock.Lock("mine", directory=sys.argv[2]).acquire(timeout=0)),
            ("break", lambda: hostlock.break_lock("mine", sys.argv[2], force=True)),
        ]:
            try:
                fn(); print(what, "NO ERROR")
            except hostlock.HostlockError as e:
                print(what, type(e).__name__, e)
    """)
    out = subprocess.run([sys.executable, "-c", script, str(private), str(sticky)], check=False, capture_output=True,
                         text=True, timeout=30, env=dict(os.environ, PYTHONPATH=LIB))
    lines = out.stdout.splitlines()
    assert any(line.startswith("private LockDirectoryError") for line in lines), out.stdout + out.stderr
    assert any(line.startswith("steal LockFileError") and "permission denied" in line for line in lines), out.stdout
    refused = [line for line in lines if line.startswith("break HostlockError") and "only that user or root" in line]
    assert refused, out.stdout + out.stderr
    assert held.locked
    held.release()
