"""Default lock directories that no other user can pre-create, replace or squat (docs/security.md).

Each scenario runs in a private mount namespace with fresh tmpfs mounts on /run and /tmp (and a private
/etc/passwd where it needs a user with a home), so the machine's real directories are never touched.
Users are real: the children drop to other uids after importing hostlock.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from engine_helpers import LIB

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                                reason="needs root and unshare -m")

# Runs as root inside `unshare -m`: mounts, then `as_user(uid, code)` runs code in a child with that uid.
PRELUDE = textwrap.dedent("""
    import os, subprocess, sys, json
    import hostlock
    from hostlock.host import directory as _directory
    def sh(cmd):
        subprocess.run(cmd, shell=True, check=True)
    sh("mount --make-rprivate / && mount -t tmpfs -o mode=0755 tmpfs /run && mkdir -m 1777 /run/lock")
    sh("mount -t tmpfs -o mode=1777 tmpfs /tmp")
    def as_user(uid, fn):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            os.setgroups([]); os.setgid(uid); os.setuid(uid)
            try:
                out = fn()
            except hostlock.HostlockError as e:
                out = "ERR %s %s" % (type(e).__name__, e)
            except OSError as e:
                out = "OSERR %s" % e
            os.write(w, json.dumps(out).encode()); os._exit(0)
        os.close(w)
        data = b""
        while True:
            chunk = os.read(r, 65536)
            if not chunk:
                break
            data += chunk
        os.waitpid(pid, 0)
        return json.loads(data)
    def take(name="x"):
        lock = hostlock.Lock(name).acquire(timeout=0)
        d = lock.directory
        lock.release()
        return d
""")


def _run(body: str) -> list[str]:
    script = PRELUDE + textwrap.dedent(body)
    env = dict(os.environ, PYTHONPATH=LIB)
    env.pop("HOSTLOCK_DIR", None)
    out = subprocess.run(["unshare", "-m", sys.executable, "-c", script], check=False, capture_output=True,
                         text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout.splitlines()


def test_root_default_is_not_squattable_through_run_lock():
    """Any user may mkdir in /run/lock (1777); root's default is under /run, which only root can write."""
    lines = _run("""
        print("squat", as_user(65534, lambda: os.mkdir("/run/lock/hostlock") or "made"))
        print("squat2", as_user(65534, lambda: os.mkdir(hostlock.SYSTEM_DIRECTORY) or "made"))
        print("root", take())
    """)
    assert "squat made" in lines
    assert any(line.startswith("squat2 OSERR") and "Permission denied" in line for line in lines), lines
    assert "root /run/hostlock" in lines


def test_user_default_is_in_a_home_only_that_user_controls(tmp_path):
    """A user with a home of their own gets ~/.local/state/hostlock: same in cron and login shells."""
    lines = _run("""
        home = "/tmp/home/hl"
        os.makedirs(home); os.chown(home, 64000, 64000); os.chmod(home, 0o700)
        with open("/etc/passwd") as f:
            text = f.read()
        with open("/tmp/passwd", "w") as f:
            f.write(text + "hltest:x:64000:64000::%s:/bin/sh\\n" % home)
        sh("mount --bind /tmp/passwd /etc/passwd")
        os.environ["HOME"] = "/root"  # an inherited $HOME must not matter: the password database decides
        os.environ.pop("XDG_RUNTIME_DIR", None)
        print("user", as_user(64000, take))
        st = os.stat(home + "/.local/state/hostlock")
        print("owner", st.st_uid, oct(st.st_mode & 0o777))
        print("squat", as_user(64001, lambda: os.mkdir(home + "/.local/state/x") or "made"))
    """)
    assert "user /tmp/home/hl/.local/state/hostlock" in lines, lines
    assert "owner 64000 0o700" in lines
    assert any(line.startswith("squat OSERR") and "Permission denied" in line for line in lines), lines


def test_squatted_tmp_fallback_is_a_clear_error_naming_the_squatter():
    """A user without a home of their own falls back to /tmp/hostlock-UID; a squatter is named, not obeyed."""
    lines = _run("""
        print("squat", as_user(65533, lambda: os.mkdir("/tmp/hostlock-65534") or "made"))
        print("victim", as_user(65534, take))
    """)
    assert "squat made" in lines
    victim = [line for line in lines if line.startswith("victim")][0]
    assert "ERR LockDirectoryError" in victim and "uid 65533" in victim and "HOSTLOCK_DIR" in victim, victim


def test_unsquatted_tmp_fallback_is_private():
    lines = _run("""
        print("victim", as_user(65534, take))
        st = os.stat("/tmp/hostlock-65534")
        print("owner", st.st_uid, oct(st.st_mode & 0o777))
    """)
    assert "victim /tmp/hostlock-65534" in lines and "owner 65534 0o700" in lines, lines


def test_group_member_uses_the_shared_system_directory():
    """The cli role's 3770 root:GROUP directory is every member's default, so root and members meet."""
    lines = _run("""
        os.mkdir(hostlock.SYSTEM_DIRECTORY); os.chown(hostlock.SYSTEM_DIRECTORY, 0, 64100)
        os.chmod(hostlock.SYSTEM_DIRECTORY, 0o3770)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.setgroups([64100]); os.setgid(64002); os.setuid(64002)
            os.write(w, take().encode()); os._exit(0)
        os.close(w); os.waitpid(pid, 0)
        print("member", os.read(r, 4096).decode())
    """)
    assert "member /run/hostlock" in lines, lines
