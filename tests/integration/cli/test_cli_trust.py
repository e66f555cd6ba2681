"""The command line in a shared directory another user can write (issue 39): every decision root's `hostlock`
makes rests on kernel facts. Real users (setpriv), the installed command (cli_support), real processes."""

from __future__ import annotations

import os
import subprocess

import engine_helpers
import pytest
from engine_helpers import (
    as_member,
    end_holder,
    holder_pid,
    kill_daemon,
    needs_users,
    root_holder,
    seen,
    squat,
    wait_line,
)

shared_group = engine_helpers.shared_group  # a fixture

SYSTEM_PYTHON = "/usr/bin/python3"  # runnable by other users (the venv's interpreter may live under /root)


def _member(gid: int, script: str) -> None:
    r = as_member(gid, ["sh", "-c", script])
    assert r.returncode == 0, r.stderr


# -- item 6: a file another user grows ---------------------------------------------------------------------------


@needs_users
def test_a_sparse_file_a_member_grows_costs_status_list_and_break_nothing(cli, shared_group):
    """truncate -s 64G: status, list and break read bounded pieces (they read the whole file before:
    MemoryError, 65), and a busy `run -n` is busy (75), as cron must see it. Memory is capped (prlimit) so a
    read of the file would fail rather than pass slowly."""
    shared, gid = shared_group
    holder = root_holder(shared, "big")
    try:
        _member(gid, "truncate -s 64G %s" % os.path.join(shared, "big.lock"))
        _member(gid, "truncate -s 64G %s/other.lock" % shared)
        launcher, env = cli.launcher, dict(cli.env, HOSTLOCK_DIR=shared)

        def run(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run(["prlimit", "--as=%d" % (512 << 20), launcher, *args], capture_output=True,
                                  text=True, timeout=60, env=env, check=False)

        r = run("status", "big")
        assert r.returncode == 0 and "big" in r.stdout, r.stdout + r.stderr
        r = run("list")
        assert r.returncode == 0 and "big" in r.stdout and "other" in r.stdout, r.stdout + r.stderr
        r = run("break", "big")
        assert r.returncode == 75 and "still held" in r.stdout, r.stdout + r.stderr
        r = run("run", "-n", "big", "true")
        assert r.returncode == 75, r.stdout + r.stderr
        r = run("cron", "--name", "big", "--", "true")
        assert r.returncode == 0 and r.stdout == "", r.stdout + r.stderr  # a busy skip, quiet
        r = run("run", "-n", "other", "true")
        assert r.returncode == 0, r.stdout + r.stderr  # a grown file still locks
    finally:
        end_holder(holder)


# -- item 3: the lock directory's parents -------------------------------------------------------------------------

OUTSIDER = 65533  # a user in no group of the test's: "another user", neither root nor a member


@pytest.fixture
def arena():
    """A directory every user can reach (pytest's own tmp_path is root's, 0700), removed afterwards."""
    import shutil
    import tempfile
    from pathlib import Path

    top = tempfile.mkdtemp(prefix="hostlock-trust-", dir="/tmp")
    os.chmod(top, 0o755)
    yield Path(top)
    shutil.rmtree(top, ignore_errors=True)


@pytest.fixture(scope="module")
def public_launcher():
    """The installed command as other users can run it: the distribution's python3, a readable directory."""
    import shutil
    import tempfile
    from pathlib import Path

    from cli_support import make_launcher

    if not os.path.exists(SYSTEM_PYTHON):
        pytest.skip("needs %s, which other users can run" % SYSTEM_PYTHON)
    top = tempfile.mkdtemp(prefix="hostlock-bin-", dir="/tmp")
    os.chmod(top, 0o755)
    yield str(make_launcher(Path(top), SYSTEM_PYTHON))
    shutil.rmtree(top, ignore_errors=True)


def _as(uid: int, gid: int, argv: list, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["setpriv", "--reuid=%d" % uid, "--regid=%d" % gid, "--groups=%d" % gid, *argv],
                          capture_output=True, text=True, timeout=30, check=False, **kw)


def _parents(top: str, kind: str) -> str:
    """A lock directory of root's under a parent `kind` makes another user's to change; returns its path."""
    import grp
    import uuid

    base = os.path.join(top, kind)
    os.mkdir(base, 0o755)
    if kind == "parent-of-another-user":
        os.chown(base, OUTSIDER, OUTSIDER)
        locks = os.path.join(base, "locks")
    elif kind == "grandparent-of-another-user":
        os.chown(base, OUTSIDER, OUTSIDER)
        os.makedirs(os.path.join(base, "mid"), 0o755)
        locks = os.path.join(base, "mid", "locks")
    elif kind == "world-writable-parent":
        os.chmod(base, 0o777)
        locks = os.path.join(base, "locks")
    else:  # group-writable-parent: a group root is not in (2775, as a team's directory)
        name = "hlp%s" % uuid.uuid4().hex[:10]
        subprocess.run(["groupadd", name], check=True, capture_output=True)
        os.chown(base, 0, grp.getgrnam(name).gr_gid)
        os.chmod(base, 0o2775)
        locks = os.path.join(base, "locks")
    os.mkdir(locks, 0o755)
    return locks


PARENTS = ["parent-of-another-user", "grandparent-of-another-user", "world-writable-parent", "group-writable-parent"]


@needs_users
@pytest.mark.parametrize("kind", PARENTS)
@pytest.mark.parametrize("how", ["--dir", "HOSTLOCK_DIR"])
def test_root_refuses_a_lock_directory_whose_parents_another_user_can_change(cli, arena, kind, how):
    """Whoever may rename the lock directory away (or one above it) while root holds a lock in it would let the
    next `run -n` make a new one and run beside the first job: refused from the first open, 66, one line."""
    locks = _parents(str(arena), kind)
    try:
        args = ["-d", locks] if how == "--dir" else []
        env = dict(cli.env, HOSTLOCK_DIR=locks) if how == "HOSTLOCK_DIR" else cli.env
        for command in (["run", "-n", *args, "job", "true"], ["hold", *args, "job", "--lease", "10"],
                        ["status", *args, "job"]):
            r = cli.run(*command, env=env)
            assert r.returncode == 66 and "rename it away" in r.stderr, (command, r.stdout, r.stderr)
            assert len(r.stderr.splitlines()) == 1, r.stderr
        assert os.listdir(locks) == []  # nothing was created under it
    finally:
        if kind == "group-writable-parent":
            import grp

            subprocess.run(["groupdel", grp.getgrgid(os.stat(os.path.dirname(locks)).st_gid).gr_name],
                           capture_output=True, check=False)


@needs_users
def test_the_attack_itself_renaming_roots_lock_directory_away_cannot_start(cli, arena):
    """The reproduction: the parent's owner renames the directory away while root holds a lock in it. It is
    refused before root holds anything, so there is no lock to split."""
    parent = arena / "theirs"
    parent.mkdir(mode=0o755)
    os.chown(parent, OUTSIDER, OUTSIDER)
    locks = parent / "locks"
    locks.mkdir(mode=0o755)
    job = cli.start("run", "-d", locks, "j", "--", "sleep", "60")
    assert job.wait(timeout=30) == 66, job.stderr.read()
    r = _as(OUTSIDER, OUTSIDER, ["mv", str(locks), str(parent / "away")])
    assert r.returncode == 0, r.stderr  # they can: which is why root refuses the directory
    assert cli.run("run", "-n", "-d", locks, "j", "true").returncode == 66


@needs_users
def test_a_member_is_held_to_the_same_rule_and_trusted_parents_are_used(cli, shared_group, arena,
                                                                        public_launcher):
    """The same for another user pair: a member's lock directory under an unrelated user's directory is refused;
    root's own, a sticky /tmp with the directory root's, a member's directory in root's 3770 one are used."""
    shared, gid = shared_group
    top = arena
    theirs = top / "outsiders"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, OUTSIDER, OUTSIDER)
    (theirs / "locks").mkdir(mode=0o777)
    os.chmod(theirs / "locks", 0o1777)
    r = as_member(gid, [public_launcher, "run", "-n", "-d", str(theirs / "locks"), "m", "true"], env=dict(cli.env))
    assert r.returncode == 66 and "belongs to uid %d" % OUTSIDER in r.stderr, r.stdout + r.stderr
    sticky = top / "sticky"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    (sticky / "roots").mkdir(mode=0o700)
    assert cli.run("run", "-n", "-d", sticky / "roots", "r", "true").returncode == 0
    r = as_member(gid, [public_launcher, "run", "-n", "-d", shared, "m", "true"], env=dict(cli.env))
    assert r.returncode == 0, r.stderr


# -- item 9: a file hostlock creates for a path lock --------------------------------------------------------------

SHARE_LOCK = "import fcntl, os, sys\nfd = os.open(sys.argv[1], os.O_RDONLY)\nfcntl.flock(fd, fcntl.LOCK_SH)\n" \
             "print('locked', flush=True)\nsys.stdin.readline()\n"


@needs_users
@pytest.mark.parametrize("command", [["flock", "-n", "{f}", "true"], ["run", "-n", "--path", "{f}", "true"],
                                     ["cron", "--path", "{f}", "--on-conflict", "fail", "--", "true"]])
def test_a_file_hostlock_creates_for_a_path_lock_is_not_another_users_to_stall(cli, arena, command):
    """flock(1) creates the file 0666 less the umask (0644): anyone may open it read-only and hold LOCK_SH for
    ever, and root's next `flock` waits until killed. hostlock creates it 0600; a file someone created with
    the mode they meant is used as it is (so sharing is asked for, as with flock(1))."""
    locks = arena / "paths"
    locks.mkdir(mode=0o755)
    path = locks / "job.lock"
    argv = [a.format(f=path) for a in command]
    assert cli.run(*argv).returncode == 0
    assert os.stat(path).st_mode & 0o777 == 0o600
    r = _as(OUTSIDER, OUTSIDER, [SYSTEM_PYTHON, "-c", SHARE_LOCK, str(path)], input="\n")
    assert r.returncode != 0 and "Permission denied" in r.stderr, r.stdout + r.stderr
    assert cli.run(*argv).returncode == 0  # not stalled
    # Asked for: a file made 0644 beforehand is opened as it is, and then its readers can hold it (as flock(1)).
    shared = locks / "shared.lock"
    shared.write_text("")
    os.chmod(shared, 0o644)
    p = subprocess.Popen(["setpriv", "--reuid=%d" % OUTSIDER, "--regid=%d" % OUTSIDER, "--clear-groups",
                          SYSTEM_PYTHON, "-c", SHARE_LOCK, str(shared)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_line(p, "locked")
        argv = [a.format(f=shared) for a in command]
        assert cli.run(*argv).returncode in (1, 75), argv
        assert os.stat(shared).st_mode & 0o777 == 0o644
    finally:
        p.stdin.write("\n")
        p.stdin.flush()
        p.wait(timeout=30)


# -- item 10: a lease's name taken after its holder died ----------------------------------------------------


@needs_users
def test_the_command_line_says_gone_77_to_a_squatted_name(cli, shared_group):
    """Issue 39 item 10 from the command line: one line, 77, the squatter never reached."""
    shared, gid = shared_group
    launcher, env = cli.launcher, dict(cli.env, HOSTLOCK_DIR=shared)
    r = subprocess.run([launcher, "hold", "C", "--lease", "10m"], capture_output=True, text=True, env=env, timeout=30,
                       check=False)
    token = r.stdout.strip()
    kill_daemon(holder_pid("C", shared))
    # removes the dead one
    subprocess.run([launcher, "renew", "C", token], capture_output=True, env=env, timeout=30, check=False)
    squatter = squat(65534, gid, os.path.join(shared, ".lease-%s.sock" % token.split(".")[0]), "silent")
    try:
        for verb in ("renew", "release"):
            r = subprocess.run([launcher, verb, "C", token], capture_output=True, text=True, env=env, timeout=30,
                               check=False)
            assert r.returncode == 77 and "no lease" in r.stderr and len(r.stderr.splitlines()) == 1, r
        assert seen(squatter) == 0
    finally:
        squatter.kill()
        squatter.wait()
