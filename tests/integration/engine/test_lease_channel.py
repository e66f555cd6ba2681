"""The lease control channel against hostile peers: another user (uid 65534, run with setpriv) and garbage.

Issue 8: any local user could end any lease by connecting to the holder's abstract socket and closing it,
and a flood of idle connections made the owner's own release fail. Each test attacks a live lease with
real processes, then proves the owner's renew and release still work at once and the lock stayed held.
Attackers report READY once their connections are made (and hold them until told), never a sleep.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import textwrap
import time

import pytest
from engine_helpers import LIB

import hostlock
from hostlock import lease as _lease
from hostlock.host import channel as _channel

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
PYTHON = "/usr/bin/python3"  # the attacker needs no hostlock: plain sockets, readable by nobody

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv") or not os.path.exists(PYTHON),
                                reason="needs root, setpriv and %s to run an attacker as another user" % PYTHON)

ATTACK = textwrap.dedent(r"""
    import os, socket, sys
    address, mode, count = sys.argv[1].encode().decode("unicode_escape"), sys.argv[2], int(sys.argv[3])
    keep, refused = [], 0
    for i in range(count):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(address)
        except OSError:
            refused += 1
            s.close()
            continue
        try:
            if mode == "close":        # connect and hang up before any answer (the BrokenPipe of issue 8)
                s.close()
                continue
            if mode == "partial":      # half a request, never finished
                s.send(b"HL2 release victim ")
            elif mode == "garbage":    # binary junk, an endless line, a forged request with a wrong proof
                s.send([os.urandom(64) + b"\n", b"x" * 4000, b"HL2 release victim " + b"0" * 32 + b" - "
                        + b"f" * 64 + b"\n", b"\xff\xfe\n"][i % 4])
            elif mode == "reset":      # unread data at close makes the kernel reset the connection
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
                s.send(b"HL2 renew victim ")
                s.close()
                continue
        except OSError:
            pass
        keep.append(s)                 # "hang" keeps the connection open and idle
    print("READY %d %d" % (len(keep), refused), flush=True)
    sys.stdin.read()                   # hold every connection until the test says so
""")


def _attack(address: str, mode: str, count: int, as_nobody: bool = True) -> subprocess.Popen:
    argv = [PYTHON, "-I", "-c", ATTACK, address.encode("unicode_escape").decode(), mode, str(count)]
    p = subprocess.Popen((NOBODY if as_nobody else []) + argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    assert line.startswith("READY"), (line, p.stderr.read() if p.poll() is not None else "")
    return p


def _end(p: subprocess.Popen) -> None:
    p.stdin.close()
    p.wait(timeout=30)


@pytest.fixture
def victim(lockdir):
    """A live 10-minute lease on "victim"; yields (token, its control address)."""
    token = hostlock.hold("victim", lease=600, directory=lockdir)
    yield token, _lease.channel_address(lockdir, token)
    try:
        hostlock.release("victim", token, lockdir)
    except hostlock.TokenError:
        pass


def _still_held_and_owner_in_control(lockdir: str, token: str) -> None:
    (h,) = hostlock.holders("victim", lockdir)
    assert h.alive and h.token_id == token.split(".")[0]
    with pytest.raises(hostlock.LockTimeout):
        hostlock.Lock("victim", directory=lockdir).acquire(timeout=0)
    expires = hostlock.renew("victim", token, lease=300, directory=lockdir)
    assert 250 < expires - time.time() <= 300.01  # expiry is kept to the millisecond
    hostlock.release("victim", token, lockdir)
    assert hostlock.holders("victim", lockdir) == []
    hostlock.Lock("victim", directory=lockdir).acquire(timeout=0).release()


@pytest.mark.parametrize("mode", ["close", "reset", "hang", "partial", "garbage"])
def test_another_user_cannot_end_or_stall_a_lease(victim, lockdir, mode):
    token, address = victim
    attacker = _attack(address, mode, 500 if mode == "hang" else 100)
    try:
        # The owner's requests queue behind every attacking connection (accept is first come, first
        # served), so by the time renew answers, the holder has dealt with all of them.
        _still_held_and_owner_in_control(lockdir, token)
    finally:
        _end(attacker)


CONNECT = ("import socket, sys\ns = socket.socket(socket.AF_UNIX)\ntry:\n"
           "    s.connect(sys.argv[1].encode().decode('unicode_escape'))\n"
           "except OSError as e:\n    print('connect:', e.strerror)\nelse:\n    print(s.recv(200).decode().strip())")


def _connect_as_nobody(address: str) -> str:
    return subprocess.run(NOBODY + [PYTHON, "-I", "-c", CONNECT, address.encode("unicode_escape").decode()],
                          capture_output=True, text=True, timeout=30, check=True).stdout.strip()


@pytest.fixture
def reachable(tmp_path):
    """A lock directory of root's that uid 65534 can reach (mode 0755), unlike tmp_path."""
    import tempfile

    d = tempfile.mkdtemp(prefix="hostlock-lease-", dir="/tmp")
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_another_user_cannot_even_connect_to_the_socket_file(reachable):
    """The holder's socket file is 0600: only its uid and root can connect (the kernel refuses the rest)."""
    token = hostlock.hold("victim", lease=600, directory=reachable)
    try:
        address = _lease.channel_address(reachable, token)
        st = os.lstat(address)
        assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == 0
        assert _connect_as_nobody(address) == "connect: Permission denied"
    finally:
        hostlock.release("victim", token, reachable)
    assert not os.path.exists(address)  # removed by the holder on its way out


def test_a_path_lease_binds_its_socket_file_or_is_refused_never_an_abstract_name(tmp_path):
    """There is no weaker channel any more (issue 39 item 2): a path lease's socket is a 0600 file in the
    path's directory, judged as the lock file beside it is (root's path lease in another user's directory is
    refused: that user could swap the lock file itself, host.pathlock._replaceable); nothing listens on
    @hostlock-lease/ID, where anyone could bind the name once it is free."""
    import tempfile

    d = tempfile.mkdtemp(prefix="hostlock-lease-", dir="/tmp")
    try:
        os.chown(d, 65534, 65534)
        os.chmod(d, 0o755)
        with pytest.raises(hostlock.HostlockError, match="belongs to uid 65534, another user, who could"):
            _lease.hold("ignored", lease=600, path=os.path.join(d, "f"))
        # root's group may write it: root is in that group, so the lock file and the socket are both trusted
        os.chown(d, 0, 0)
        os.chmod(d, 0o775)
        token = _lease.hold("ignored", lease=600, path=os.path.join(d, "f"))
        tid = token.split(".")[0]
        sock = os.path.join(d, ".lease-%s.sock" % tid)
        assert stat.S_ISSOCK(os.lstat(sock).st_mode) and stat.S_IMODE(os.lstat(sock).st_mode) == 0o600
        assert "@hostlock-lease/" + tid not in open("/proc/net/unix").read()
        assert _connect_as_nobody(sock) == "connect: Permission denied"
        _lease.release("ignored", token, path=os.path.join(d, "f"))
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_another_user_with_the_right_token_is_refused_before_a_byte_is_read(victim, lockdir):
    token, address = victim
    # The whole client, as nobody, holding the real token: refused (not "gone"), and the lease lives.
    client = ("import sys; sys.path.insert(0, sys.argv[1]); import hostlock\n"
              "try:\n    hostlock.release('victim', sys.argv[2], sys.argv[3])\n"
              "except hostlock.TokenError as e:\n    print(e.reason, e)\n")
    r = subprocess.run(NOBODY + [PYTHON, "-I", "-c", client, LIB,
                                 token, lockdir], capture_output=True, text=True, timeout=30, check=False)
    assert r.stdout.startswith("refused ") and "not the lease holder's user" in r.stdout, r
    _still_held_and_owner_in_control(lockdir, token)


def test_wrong_secret_is_refused_distinct_from_gone_and_malformed(victim, lockdir):
    token, _address = victim
    tid, secret = token.split(".")[:2]
    for bad in (tid + "." + "0" * 32, tid + "." + secret[::-1], tid + "." + secret[:-1] + "x"):
        with pytest.raises(hostlock.TokenError) as e:
            hostlock.renew("victim", bad, directory=lockdir)
        if bad.endswith("x"):
            assert e.value.reason == "malformed"
        else:
            assert e.value.reason == "refused" and "wrong token" in str(e.value)
    with pytest.raises(hostlock.TokenError) as e:
        hostlock.release("victim", "%012x.%s" % (int(tid, 16) ^ 1, secret), lockdir)
    assert e.value.reason == "gone"  # nobody answers at that id
    _still_held_and_owner_in_control(lockdir, token)


def test_a_flood_by_the_holders_own_uid_cannot_crowd_out_the_owner(victim, lockdir):
    """Even peers the holder trusts (its uid, root) are bounded: idle ones beyond the limit are dropped."""
    token, address = victim
    idle = _attack(address, "hang", 300, as_nobody=False)
    junk = _attack(address, "garbage", 100, as_nobody=False)
    half = _attack(address, "partial", 100, as_nobody=False)
    try:
        _still_held_and_owner_in_control(lockdir, token)
    finally:
        for p in (idle, junk, half):
            _end(p)


def test_the_holder_itself_refuses_a_renewal_past_the_limit(victim, lockdir):
    token, address = victim
    with pytest.raises(hostlock.TokenError) as e:
        _channel.request("victim", token, lockdir, "renew", "1e10")  # past the client's own check
    assert e.value.reason == "refused" and "at most" in str(e.value)
    with pytest.raises(hostlock.TokenError) as e:
        _channel.request("victim", token, lockdir, "renew", "nan")
    assert e.value.reason == "refused"
    _still_held_and_owner_in_control(lockdir, token)


def test_a_stopped_holder_is_a_bounded_wait_then_a_clear_error(victim, lockdir, monkeypatch):
    import errno
    import signal

    token, _address = victim
    monkeypatch.setattr(_channel, "CLIENT_SECONDS", 0.5)  # the real bound is 10 s; the behaviour is the same
    pid = hostlock.holders("victim", lockdir)[0].pid
    os.kill(pid, signal.SIGSTOP)
    try:
        with pytest.raises(hostlock.HostlockError, match="did not answer within") as e:
            hostlock.renew("victim", token, directory=lockdir)
        assert e.value.errno == errno.ETIMEDOUT and not isinstance(e.value, hostlock.TokenError)
    finally:
        os.kill(pid, signal.SIGCONT)
    _still_held_and_owner_in_control(lockdir, token)


def test_root_may_renew_and_release_another_users_lease(tmp_path):
    import tempfile

    d = tempfile.mkdtemp(prefix="hostlock-lease-", dir="/tmp")  # reachable by uid 65534, unlike tmp_path
    try:
        os.chown(d, 65534, 65534)
        code = ("import sys; sys.path.insert(0, sys.argv[1]); import hostlock; "
                "print(hostlock.hold('theirs', lease=600, directory=sys.argv[2]))")
        r = subprocess.run(NOBODY + [PYTHON, "-I", "-c", code, LIB,
                                     d], capture_output=True, text=True, timeout=30, check=False)
        assert r.returncode == 0, r
        token = r.stdout.strip()
        # (Root's own status refuses a directory another user owns; the lease's channel needs no directory.)
        assert hostlock.renew("theirs", token, lease=120, directory=d) > time.time() + 100
        hostlock.release("theirs", token, d)
        with pytest.raises(hostlock.TokenError) as e:
            hostlock.renew("theirs", token, directory=d)
        assert e.value.reason == "gone"
    finally:
        shutil.rmtree(d, ignore_errors=True)
