"""`run`/`cron --replace` (issue 41): the running copy of your own job is ended (SIGTERM, SIGKILL after --kill-after,
its whole tree gone before the lock is free) and the new run runs; another user's job, a lease, or a holder
nobody can prove is never signalled (real users: setpriv)."""

from __future__ import annotations

import os
import signal
import subprocess

import engine_helpers
import pytest
from cli_support import pid_alive, wait_file, wait_until
from engine_helpers import LIB, NOBODY, needs_users
from test_cli_metrics import samples

shared_group = engine_helpers.shared_group  # a fixture


def _job_pid(cli, name):
    (h,) = cli.wait_held(name)
    return h["pid"], h["job_pid"]


def test_replace_ends_the_running_copy_then_runs(cli, tmp_path):
    m = tmp_path / "metrics"
    m.mkdir()
    old = cli.start("cron", "--name", "sync", "--", "sh", "-c", "sleep 60")
    holder, job = _job_pid(cli, "sync")
    out = tmp_path / "new"
    r = cli.run("cron", "--name", "sync", "--replace", "--metrics-dir", str(m), "--", "sh", "-c",
                "echo ran > %s" % out)
    assert r.returncode == 0, r.stderr
    assert out.read_text() == "ran\n"
    assert old.wait(10) == 143  # the old copy's job got the SIGTERM: its run failed (cron reports it)
    assert "killed by signal 15" in old.stderr.read()
    assert not pid_alive(holder) and not pid_alive(job)
    got = samples((m / "hostlock-job-sync.prom").read_text())
    assert got['hostlock_job_replaced_total{job="sync"}'] == 1
    assert got['hostlock_job_runs_total{job="sync",result="ok"}'] == 1


def test_a_copy_that_ignores_sigterm_is_killed_after_kill_after_with_its_whole_tree(cli, tmp_path):
    started = tmp_path / "started"
    # The shell and its child ignore SIGTERM; the child leaves the group (setsid) as a daemon would.
    old = cli.start("run", "stuck", "sh", "-c", "trap '' TERM; setsid sleep 60 & echo $! > %s; wait" % started)
    _job_pid(cli, "stuck")
    orphan = int(wait_file(started))
    probe = tmp_path / "probe"
    # Alive means running: a zombie (killed, not yet reaped) runs nothing and holds no descriptor.
    r = cli.run("run", "--replace", "--kill-after", "0.3", "-v", "stuck", "sh", "-c",
                'st=$(cut -d" " -f3 /proc/%d/stat 2>/dev/null); if [ -n "$st" ] && [ "$st" != Z ]; then '
                'echo alive > %s; else echo gone > %s; fi' % (orphan, probe, probe))
    assert r.returncode == 0, r.stderr
    assert "SIGKILL" in r.stderr, r.stderr
    assert probe.read_text() == "gone\n"  # the old job's whole tree ended before the lock was free
    assert old.wait(10) == -signal.SIGKILL


def test_replace_leaves_a_lease_alone(cli):
    r = cli.run("hold", "leased", "--lease", "60")
    assert r.returncode == 0, r.stderr
    token = r.stdout.strip()
    (h,) = cli.holders("leased")
    r = cli.run("run", "--replace", "leased", "true")
    assert r.returncode == 75, r.stderr  # busy, as without --replace: a lease is not a running copy of a job
    assert pid_alive(h["pid"]) and cli.holders("leased")[0]["pid"] == h["pid"]
    assert cli.run("release", "leased", token).returncode == 0


@pytest.mark.parametrize("extra", [["--shared"], ["--slots", "2"], ["--fleet", "etcd://127.0.0.1:1"], ["--path", "F"]])
def test_replace_is_refused_where_there_is_no_single_provable_copy(cli, extra):
    args = ["run", "--replace", *extra] + ([] if "--path" in extra else ["L"]) + ["true"]
    r = cli.run(*args)
    assert r.returncode == 64 and "--replace" in r.stderr and r.stderr.count("\n") == 1, r.stderr


def _member(gid, *args):
    """argv running `hostlock ARGS` as uid 65534 in group `gid` only, from the copy of the package everyone can
    read (engine_helpers.LIB) with the distribution's interpreter (pytest's and pyenv's are root's alone)."""
    code = "import sys; sys.path.append(%r); from hostlock.cli import main; sys.exit(main())" % LIB
    return ["setpriv", "--reuid=%d" % NOBODY, "--regid=%d" % gid, "--groups=%d" % gid, "/usr/bin/python3", "-I",
            "-c", code, *args]


def _holders(cli, env, name):
    import json

    r = cli.run("status", "--json", name, env=env)
    assert r.returncode == 0, r.stderr
    return [h for h in json.loads(r.stdout)["locks"][0]["holders"] if not h["stale"]]


def _wait(cli, env, name):
    wait_until(lambda: any(h["job_pid"] for h in _holders(cli, env, name)), 10, name)
    return _holders(cli, env, name)


@needs_users
@pytest.mark.skipif(not os.path.exists("/usr/bin/python3"), reason="needs /usr/bin/python3 for the other user")
def test_another_users_running_job_is_never_ended(cli, shared_group):
    """A member's job holds the lock: root's --replace ends nothing (busy); and the member's --replace never
    ends root's job either. Each job is checked alive afterwards."""
    shared, gid = shared_group
    env = dict(cli.env, HOSTLOCK_DIR=shared)
    member = subprocess.Popen(_member(gid, "run", "shared-job", "sleep", "60"), env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, start_new_session=True,
                              preexec_fn=engine_helpers.default_signals)
    try:
        (h,) = _wait(cli, env, "shared-job")
        assert h["uid"] == NOBODY
        r = cli.run("run", "--replace", "-v", "shared-job", "true", env=env)
        assert r.returncode == 75, r.stderr
        assert "not ending" in r.stderr, r.stderr
        r = cli.run("cron", "--name", "shared-job", "--replace", "--", "true", env=env)
        assert r.returncode == 0 and r.stderr == "", r.stderr  # cron's quiet skip
        assert member.poll() is None and pid_alive(h["job_pid"])
    finally:
        os.killpg(member.pid, signal.SIGKILL)
        member.wait()
    wait_until(lambda: not _holders(cli, env, "shared-job"), 10, "the member's lock released")

    root_job = cli.start("run", "root-job", "sleep", "60", env=env)
    (rh,) = _wait(cli, env, "root-job")
    r = subprocess.run(_member(gid, "run", "--replace", "root-job", "true"), env=env, capture_output=True, text=True,
                       timeout=30, check=False)
    assert r.returncode == 75, r.stderr
    assert root_job.poll() is None and pid_alive(rh["job_pid"])
