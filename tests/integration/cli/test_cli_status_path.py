"""`hostlock status --path FILE`: who holds kernel locks on any file (flock(2), POSIX, OFD), from
/proc/locks completed with /proc/PID/fdinfo, naming the process and its job."""

import json
import os
import shutil
import subprocess
import sys

import pytest
from cli_support import wait_until

FLOCK = shutil.which("flock")

HOLD_PY = """
import fcntl, os, struct, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
kind = sys.argv[2]
if kind == "ofd":
    fcntl.fcntl(fd, 37, struct.pack("hhqqi", fcntl.F_WRLCK, 0, 0, 0, 0))  # F_OFD_SETLK
elif kind == "posix":
    fcntl.lockf(fd, fcntl.LOCK_EX)
else:
    fcntl.flock(fd, fcntl.LOCK_SH)
print("held", flush=True)
sys.stdin.read()
"""


def _status(cli, path, *extra):
    r = cli.run("status", "--path", path, "--json", *extra)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema"] == "hostlock.path-status/1"
    return doc


@pytest.fixture
def holder(tmp_path):
    started = []

    def start(kind):
        p = subprocess.Popen([sys.executable, "-c", HOLD_PY, str(tmp_path / "f"), kind], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
        started.append(p)
        assert p.stdout.readline() == "held\n"
        return p

    yield start
    for p in started:
        p.kill()
        p.wait()


@pytest.mark.parametrize(("kind", "mode"), [("ofd", "exclusive"), ("posix", "exclusive"), ("flock", "shared")])
def test_names_the_holder_of_each_kind(kind, mode, cli, tmp_path, holder):
    """OFD locks show pid -1 in /proc/locks; status still names the process through its fdinfo."""
    p = holder(kind)
    doc = _status(cli, tmp_path / "f")
    [lk] = doc["locks"]
    assert (lk["kind"], lk["mode"], lk["waiting"]) == (kind, mode, False)
    assert [h["pid"] for h in lk["holders"]] == [p.pid]
    assert "HOLD_PY" not in lk["holders"][0]["cmdline"] and lk["holders"][0]["cmdline"].startswith(sys.executable)
    if kind == "ofd":
        assert lk["proc_locks_pid"] is None
    text = cli.run("status", "--path", tmp_path / "f").stdout
    assert "%s %s held by pid %d" % (kind, mode, p.pid) in text


@pytest.mark.skipif(FLOCK is None, reason="util-linux flock(1) is not installed")
def test_flock1_holder_and_its_job_then_an_orphan_that_kept_the_lock(cli, tmp_path):
    """flock(1)'s lock: the holder is flock and its job is named; after flock exits, the background child
    that inherited the descriptor is shown as the holder (lslocks would show the dead flock pid)."""
    lock = tmp_path / "f"
    gate = tmp_path / "gate"
    p = subprocess.Popen([FLOCK, str(lock), "sh", "-c", "echo held; exec cat"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline() == "held\n"
        [lk] = _status(cli, lock)["locks"]
        pids = {h["pid"] for h in lk["holders"]}
        assert p.pid in pids
        flock_holder = [h for h in lk["holders"] if h["pid"] == p.pid][0]
        assert flock_holder["jobs"] and flock_holder["jobs"][0]["cmdline"] == "cat"
    finally:
        p.stdin.close()
        p.wait()
    job = "(exec >/dev/null 2>&1; while [ ! -e %s ]; do sleep 0.05; done) & echo $!" % gate
    r = subprocess.run([FLOCK, str(lock), "sh", "-c", job], capture_output=True, text=True, check=True)
    orphan = int(r.stdout)
    try:
        [lk] = _status(cli, lock)["locks"]
        assert orphan in {h["pid"] for h in lk["holders"]}
    finally:
        gate.touch()


def test_waiter_and_no_locks(cli, tmp_path, holder):
    """A blocked request is listed as waiting, naming the waiter; a file nobody locks has no locks."""
    (tmp_path / "f").touch()
    assert _status(cli, tmp_path / "f")["locks"] == []
    holder("ofd")
    fd = os.open(tmp_path / "f", os.O_RDWR)
    w = subprocess.Popen([sys.executable, "-c", "import fcntl,os,struct,sys; fd=os.open(sys.argv[1],os.O_RDWR); "
                          "fcntl.fcntl(fd, 38, struct.pack('hhqqi', fcntl.F_WRLCK, 0, 0, 0, 0))", str(tmp_path / "f")])
    try:
        def waiting():
            return [lk for lk in _status(cli, tmp_path / "f")["locks"] if lk["waiting"]]

        wait_until(waiting, what="the waiter to block")
        [lk] = waiting()
        assert (lk["kind"], lk["mode"]) == ("ofd", "exclusive")
        # an OFD waiter has pid -1 and no fdinfo line: it cannot be named, and is not guessed
        assert lk["holders"] == []
    finally:
        w.kill()
        w.wait()
        os.close(fd)


def test_errors(cli, tmp_path):
    """A missing file is 66 with one line; NAME with --path is a usage error."""
    r = cli.run("status", "--path", tmp_path / "missing")
    assert r.returncode == 66 and r.stderr.count("\n") == 1
    r = cli.run("status", "x", "--path", tmp_path)
    assert r.returncode == 64
