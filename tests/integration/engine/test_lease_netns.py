"""Leases across network namespaces (issue 22 item 6): a holder in another network namespace (`unshare -n`,
as in a container or a unit with PrivateNetwork=) is reached by renew and release from this one and the
other way round, and nobody can answer in its place by binding its name in either namespace.

Abstract Unix sockets are per network namespace: the old channel (`@hostlock-lease/ID`) made release
say "gone" (exit 77) while status showed the lease held, and anyone in the client's namespace could bind
the name. The channel is now a pathname socket in the lock directory: the filesystem is shared.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

import pytest
from engine_helpers import LIB

import hostlock

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
PYTHON = "/usr/bin/python3"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("setpriv") or not os.path.exists(PYTHON),
    reason="needs root, unshare, setpriv and %s" % PYTHON)

HOLD = "import sys; sys.path.insert(0, sys.argv[1]); import hostlock; print(hostlock.hold(sys.argv[2], 600, " \
       "directory=sys.argv[3]))"
ACT = textwrap.dedent("""
    import sys; sys.path.insert(0, sys.argv[1]); import hostlock
    verb, name, token, d = sys.argv[2:6]
    try:
        print(hostlock.renew(name, token, 300, d) if verb == "renew" else hostlock.release(name, token, d))
    except hostlock.TokenError as e:
        print("TokenError", e.reason, e)
""")
# Another user in this (the client's) namespace binds the abstract name the old holder used, and answers
# every request with a forged OK: the client must reach the real holder, not this.
SQUAT = textwrap.dedent(r"""
    import socket, sys, threading
    s = socket.socket(socket.AF_UNIX)
    s.bind("\0hostlock-lease/" + sys.argv[1])
    s.listen(64)
    print("READY", flush=True)
    def serve():
        while True:
            c = s.accept()[0]
            c.recv(4096)
            try:
                c.sendall(b"OK 99999999999.000 " + b"0" * 64 + b"\n")
            except OSError:
                pass
            c.close()
    threading.Thread(target=serve, daemon=True).start()
    sys.stdin.read()
""")


@pytest.fixture
def lockdir_shared():
    d = tempfile.mkdtemp(prefix="hostlock-netns-", dir="/tmp")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _in_new_netns(code: str, *args: str) -> str:
    r = subprocess.run(["unshare", "-n", sys.executable, "-I", "-c", code, LIB, *args], capture_output=True,
                       text=True, timeout=60, check=False)
    assert r.returncode == 0, r
    return r.stdout.strip()


def _held(name: str, d: str) -> bool:
    try:
        hostlock.Lock(name, directory=d).acquire(timeout=0).release()
        return False
    except hostlock.LockTimeout:
        return True


def test_holder_in_another_netns_is_renewed_and_released_from_here(lockdir_shared):
    d = lockdir_shared
    token = _in_new_netns(HOLD, "ns", d)
    tid = token.split(".")[0]
    (h,) = hostlock.holders("ns", d)
    assert h.token_id == tid and _held("ns", d)
    squatter = subprocess.Popen(NOBODY + [PYTHON, "-I", "-c", SQUAT, tid], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert squatter.stdout.readline().strip() == "READY", squatter.stderr.read()
        expires = hostlock.renew("ns", token, lease=120, directory=d)
        assert hostlock.holders("ns", d)[0].lease_expires == pytest.approx(expires, abs=0.01)
        hostlock.release("ns", token, d)  # the old channel: TokenError "gone" (exit 77) while held
        assert not _held("ns", d) and hostlock.holders("ns", d) == []
    finally:
        squatter.kill()
        squatter.wait()


def test_holder_here_is_released_from_another_netns(lockdir_shared):
    d = lockdir_shared
    token = hostlock.hold("here", lease=600, directory=d)
    try:
        assert _in_new_netns(ACT, "renew", "here", token, d).replace(".", "").isdigit()
        assert _in_new_netns(ACT, "release", "here", token, d) == "None"
        assert not _held("here", d)
    finally:
        try:
            hostlock.release("here", token, d)
        except hostlock.TokenError:
            pass


def test_cli_release_of_a_lease_held_in_another_netns(lockdir_shared):
    """Through the command line, as the issue reproduced it: release exits 0, and run -n finds it free."""
    d = lockdir_shared
    env = dict(os.environ, PYTHONPATH=LIB, HOSTLOCK_DIR=d)
    cli = [sys.executable, "-I", "-c", "import sys; sys.path.insert(0, %r); from hostlock.cli import main; "
           "sys.exit(main())" % LIB]
    r = subprocess.run(["unshare", "-n", *cli, "hold", "cli", "--lease", "10m"], capture_output=True, text=True,
                       timeout=60, env=env, check=False)
    assert r.returncode == 0, r
    token = r.stdout.strip()
    assert subprocess.run([*cli, "run", "-n", "cli", "true"], env=env, timeout=60, check=False).returncode == 75
    r = subprocess.run([*cli, "release", "cli", token], capture_output=True, text=True, env=env, timeout=60,
                       check=False)
    assert (r.returncode, r.stderr) == (0, "")
    assert subprocess.run([*cli, "run", "-n", "cli", "true"], env=env, timeout=60, check=False).returncode == 0


@pytest.mark.skipif(not shutil.which("nsenter"), reason="needs nsenter")
def test_a_binder_in_the_holders_netns_cannot_answer_for_it(lockdir_shared):
    """Another user inside the holder's own network namespace binds every abstract name it could want there
    (after the holder's own would be gone, or beside it): renew and release from inside that namespace and
    from this one still reach the real holder."""
    d = lockdir_shared
    token = _in_new_netns(HOLD, "inside", d)
    tid = token.split(".")[0]
    (h,) = hostlock.holders("inside", d)
    netns = "--net=/proc/%d/ns/net" % h.pid
    squatter = subprocess.Popen(["nsenter", netns, *NOBODY, PYTHON, "-I", "-c", SQUAT, tid], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert squatter.stdout.readline().strip() == "READY", squatter.stderr.read()
        inside = subprocess.run(["nsenter", netns, sys.executable, "-I", "-c", ACT, LIB, "renew", "inside", token, d],
                                capture_output=True, text=True, timeout=60, check=False)
        assert inside.returncode == 0 and inside.stdout.strip().replace(".", "").isdigit(), inside
        assert _held("inside", d)
        hostlock.release("inside", token, d)
        assert not _held("inside", d)
    finally:
        squatter.kill()
        squatter.wait()
