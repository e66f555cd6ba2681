"""`hostlock break` and `hostlock status` tell the truth (issue 8): forged records, stopped holders,
planted and corrupt lock paths, exit codes as docs/cli.md documents them."""

import fcntl
import json
import os
import signal
import subprocess
import sys
import time

import engine_helpers
import pytest
from cli_support import wait_until
from engine_helpers import ENDED_LEASE, LIB, as_member, needs_users, start_victim, victim_signals

import hostlock
import hostlock.host.gc
import hostlock.host.kernel
from hostlock.core import owner as _owner

shared_group = engine_helpers.shared_group  # a fixture


@needs_users
def test_status_shows_a_forged_record_and_root_break_leaves_its_victim_alone(cli, shared_group):
    shared, gid = shared_group
    hostlock.Lock("init", directory=shared, mechanism="record").close()
    victim = start_victim()
    try:
        line = "HL1|pid=%d|start=%s|boot=%s|host=%s|uid=0|cmd=backup|mode=exclusive|lease=%f" % (
            victim.pid, _owner.start_time(victim.pid), _owner.BOOT_ID, _owner.HOSTNAME, time.time() - 30)
        r = as_member(gid, ["sh", "-c", 'printf "%s\\n" "$1" > "$2"', "sh", line, os.path.join(shared, "svc~owner")])
        assert r.returncode == 0, r.stderr
        env = dict(cli.env, HOSTLOCK_DIR=shared)
        r = cli.run("status", env=env)
        assert r.returncode == 0, r.stderr
        assert "forged" in r.stdout and "uid 65534" in r.stdout and "stale:" not in r.stdout, r.stdout
        doc = json.loads(cli.run("status", "--json", "svc", env=env).stdout)
        (h,) = doc["locks"][0]["holders"]
        assert h["forged"] is True and h["verified"] is False and h["stale"] is False
        assert "forged" in doc["locks"][0]["problem"]
        # The victim is alive but does not have the file open, which every holder does: the file is nobody's
        # lock, and root's break removes it (a member's planted file must not stall root's name for good),
        # and signals nothing.
        r = cli.run("break", "svc", "--force", env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "planted or forged" in r.stdout and "nothing was signalled" in r.stdout, r.stdout
        assert "ended" not in r.stdout and not os.path.exists(os.path.join(shared, "svc~owner")), r.stdout
        assert victim_signals(victim) == "signals []"
    finally:
        victim.kill()
        victim.wait()


def _holder_pid(cli, name):
    (h,) = cli.holders(name)
    return h["pid"]


def _stop(pid):
    os.kill(pid, signal.SIGSTOP)

    def stopped():
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")

    wait_until(stopped, 10, "the holder to stop")


def test_break_ends_a_stopped_lease_holder_and_the_lock_is_free(cli):
    r = cli.run("hold", "paused", "--lease", "1")
    assert r.returncode == 0, r.stderr
    pid = _holder_pid(cli, "paused")
    _stop(pid)
    wait_until(lambda: cli.holders("paused")[0]["stale"], 30, "the lease to end")  # stopped: it cannot release
    r = cli.run("break", "paused", "--json")
    doc = json.loads(r.stdout)
    assert r.returncode == 0, r.stdout + r.stderr
    assert [h["pid"] for h in doc["removed"]] == [pid] and doc["remaining"] == []
    assert cli.status("paused")["state"] == "free"
    assert cli.run("run", "-n", "paused", "true").returncode == 0


def test_break_reports_a_stopped_holder_that_ignores_sigterm_and_exits_75(cli):
    code = ENDED_LEASE + (
        "import signal, sys, time, hostlock; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "l = hostlock.Lock('stuck', directory=sys.argv[1]).acquire(); "
        "channel = end_lease(l, sys.argv[1]); print('held', flush=True); sys.stdin.read()")
    p = subprocess.Popen([sys.executable, "-c", code, cli.lockdir], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True, env=dict(os.environ, PYTHONPATH=str(LIB)))
    try:
        assert p.stdout.readline().startswith("held")
        _stop(p.pid)
        r = cli.run("break", "stuck")
        assert r.returncode == 75, r.stdout + r.stderr
        assert "signalled pid %d" % p.pid in r.stdout and "still holds the lock" in r.stdout, r.stdout
        assert "still held by pid %d" % p.pid in r.stdout and "did not exit after SIGTERM" in r.stdout
        doc = json.loads(cli.run("break", "stuck", "--json").stdout)
        assert doc["removed"] == [] and [h["pid"] for h in doc["remaining"]] == [p.pid]
    finally:
        p.kill()
        p.wait()


def test_status_shows_planted_symlinks_and_fifos_as_refused(cli, tmp_path):
    assert cli.run("run", "real", "true").returncode == 0
    target = tmp_path / "precious"
    target.write_text("keep")
    os.symlink(target, os.path.join(cli.lockdir, "sym.lock"))
    os.mkfifo(os.path.join(cli.lockdir, "fifo.lock"))
    locks = {x["name"]: x for x in cli.status()["locks"]}
    assert set(locks) == {"real", "sym", "fifo"}
    assert locks["sym"]["state"] == "refused" and "symlink" in locks["sym"]["problem"]
    assert locks["fifo"]["state"] == "refused" and "not a regular file" in locks["fifo"]["problem"]
    assert locks["real"]["state"] == "free" and locks["real"]["problem"] is None
    r = cli.run("status")
    assert r.returncode == 0 and "refused: sym: " in r.stdout and "refused: fifo: " in r.stdout, r.stdout
    r = cli.run("status", "sym")
    assert r.returncode == 0 and "refused: sym: lock path" in r.stdout, r.stdout
    assert target.read_text() == "keep"


def test_corrupt_header_exits_65_and_break_force_really_removes_it(cli):
    path = os.path.join(cli.lockdir, "bad.lock")
    assert cli.run("run", "bad", "true").returncode == 0
    with open(path, "r+b") as f:
        f.write(b"garbage, not a hostlock header")
    r = cli.run("run", "bad", "true")
    assert r.returncode == 65 and "corrupt header" in r.stderr and "break --force bad" in r.stderr, r.stderr
    assert len(r.stderr.splitlines()) == 1
    st = cli.status("bad")
    assert st["state"] == "refused" and "corrupt header" in st["problem"]
    r = cli.run("break", "bad")
    assert r.returncode == 65 and "add --force" in r.stdout, r.stdout
    assert os.path.exists(path)
    r = cli.run("break", "bad", "--force")
    assert r.returncode == 0, r.stdout + r.stderr
    assert not os.path.exists(path)
    assert cli.run("run", "bad", "true").returncode == 0


def test_break_force_keeps_a_corrupt_file_that_someone_has_locked(cli):
    path = os.path.join(cli.lockdir, "inuse.lock")
    # Made in-process, not with `hostlock run`: run's watcher keeps the file open (and so its OPEN range
    # read-locked) for a moment after run has exited, and the whole-file lock below would race with it.
    with hostlock.Lock("inuse", directory=cli.lockdir):
        pass
    with open(path, "r+b") as f:
        f.write(b"garbage")
        f.flush()
        fcntl.fcntl(f.fileno(), hostlock.host.kernel.F_OFD_SETLK, hostlock.host.kernel.WHOLE_FILE)  # locked
        r = cli.run("break", "inuse", "--force")
        # The kernel shows the lock held (the whole-file lock covers MAIN): still held, 75, never removed.
        assert r.returncode == 75 and "still held" in r.stdout and os.path.exists(path), r.stdout + r.stderr


@pytest.mark.parametrize("command", [["run", "--slots", "2000", "s", "true"], ["hold", "s", "--lease", "5",
                                                                               "--slots", "2000"]])
def test_too_many_slots_is_a_usage_error(cli, command):
    r = cli.run(*command)
    assert r.returncode == 64 and "1 to 1024" in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr


@needs_users
def test_break_names_the_planted_file_not_the_live_holders_own(cli, shared_group):
    """A planted file it cannot act on (a symlink at a reader's name): break said 'remove NAME~owner after
    checking who made it', the live holder's own file, whose removal lets a second holder in."""
    shared, gid = shared_group
    lock = hostlock.Lock("svc", directory=shared, mechanism="record")
    assert lock.acquire(timeout=0)
    try:
        planted = os.path.join(shared, "svc~r~evil")
        r = as_member(gid, ["ln", "-s", "/etc/shadow", planted])
        assert r.returncode == 0, r.stderr
        r = cli.run("break", "svc", env=dict(cli.env, HOSTLOCK_DIR=shared))
        assert r.returncode == 75, r.stdout + r.stderr
        assert "remove %s after checking" % planted in r.stdout, r.stdout
        assert "svc~owner after" not in r.stdout and os.path.exists(os.path.join(shared, "svc~owner")), r.stdout
    finally:
        lock.close()
