"""Issue 8 through the command line: another local user (uid 65534 via setpriv) attacks a lease taken with
`hostlock hold`; the owner's renew and release still work at once and `run -n` still finds the lock busy."""

import os
import shutil
import subprocess
import textwrap

import pytest
from cli_support import LIB, wait_until

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
PYTHON = "/usr/bin/python3"  # readable and runnable by nobody (the test's own launcher lives in a 0700 dir)

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv") or not os.path.exists(PYTHON),
                                reason="needs root, setpriv and %s to run an attacker as another user" % PYTHON)

# Connect-and-close 200 times, then open 500 idle connections (half of them with half a request) and hold
# them until stdin closes, at every address a holder could listen on: its socket file in the lock directory
# (0600 in a directory nobody else can change: the kernel refuses the connect) and the abstract name of
# the fallback (nobody listens there; the attacker could bind it, which the next test does).
FLOOD = textwrap.dedent(r"""
    import socket, sys
    addresses = [sys.argv[2] + "/.lease-" + sys.argv[1] + ".sock", "\0hostlock-lease/" + sys.argv[1]]
    refused = 0
    def connect():
        global refused
        for address in addresses:
            s = socket.socket(socket.AF_UNIX)
            try:
                s.connect(address)
                return s
            except OSError:
                refused += 1
                s.close()
        return None
    for _ in range(200):
        s = connect()
        if s:
            s.close()
    keep = []
    for i in range(500):
        s = connect()
        if s is None:
            continue
        if i % 2:
            try:
                s.send(b"HL2 release victim ")
            except OSError:  # the holder hung up already: it never reads another user's bytes
                pass
        keep.append(s)
    print("READY", flush=True)
    print(refused, len(keep), flush=True)
    sys.stdin.read()
""")


@pytest.fixture
def lease(cli):
    r = cli.run("hold", "victim", "--lease", "10m")
    assert r.returncode == 0, r.stderr
    token = r.stdout.strip()
    yield token
    cli.run("release", "victim", token)


def test_another_users_flood_neither_ends_nor_stalls_the_lease(cli, lease):
    tid = lease.split(".")[0]
    attacker = subprocess.Popen(NOBODY + [PYTHON, "-I", "-c", FLOOD, tid, cli.lockdir], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert attacker.stdout.readline().strip() == "READY", attacker.stderr.read()
        assert attacker.stdout.readline().split()[1] == "0"  # not one connection reached the holder
        r = cli.run("renew", "victim", lease, "--lease", "5m")  # queued behind all 700 connections
        assert r.returncode == 0 and "renewed until" in r.stdout, r
        assert cli.run("run", "-n", "victim", "true").returncode == 75  # still held
        (h,) = cli.holders("victim")
        assert h["token_id"] == tid and not h["stale"]
        r = cli.run("release", "victim", lease)
        assert (r.returncode, r.stdout, r.stderr) == (0, "", "")
        assert cli.run("run", "-n", "victim", "true").returncode == 0  # free the moment release returned
    finally:
        attacker.stdin.close()
        attacker.wait(timeout=30)


def test_another_user_holding_the_token_is_refused_with_77(cli, lease):
    launcher = f"import sys; sys.path.append({str(LIB)!r}); from hostlock.cli import main; sys.exit(main())"
    r = subprocess.run(NOBODY + [PYTHON, "-I", "-c", launcher, "release", "victim", lease], capture_output=True,
                       text=True, timeout=30, env=dict(cli.env), check=False)
    assert r.returncode == 77 and r.stderr.count("\n") == 1, r
    assert "not the lease holder's user" in r.stderr and "Traceback" not in r.stderr
    assert cli.run("run", "-n", "victim", "true").returncode == 75
    assert cli.run("release", "victim", lease).returncode == 0
    wait_until(lambda: cli.is_free("victim"), 5, "the lease to end")
