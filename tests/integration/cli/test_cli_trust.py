"""The command line in a shared directory another user can write (issue 39): every decision root's `hostlock`
makes rests on kernel facts. Real users (setpriv), the installed command (cli_support), real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import engine_helpers
from engine_helpers import LIB, as_member, needs_users, wait_line

shared_group = engine_helpers.shared_group  # a fixture

HOLD = textwrap.dedent(r"""
    import sys, hostlock
    lock = hostlock.Lock(sys.argv[2], directory=sys.argv[1]).acquire()
    print("held", lock.mechanism, flush=True)
    sys.stdin.readline()
""")


def _root_holder(shared: str, name: str) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", HOLD, shared, name], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=LIB))
    wait_line(p, "held")
    return p


def _end(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.stdin.write("\n")
        p.stdin.flush()
    p.wait(timeout=30)


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
    holder = _root_holder(shared, "big")
    try:
        _member(gid, "truncate -s 64G %s" % os.path.join(shared, "big.lock"))
        _member(gid, "truncate -s 64G %s/other.lock" % shared)
        launcher, env = cli.launcher, dict(cli.env, HOSTLOCK_DIR=shared)

        def run(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run(["prlimit", "--as=%d" % (512 << 20), launcher, *args], capture_output=True,
                                  text=True, timeout=60, env=env)

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
        _end(holder)
