"""`hostlock run --path FILE`: flock(1)'s lock on FILE beside named locks, with run's supervision."""

import json
import os
import shutil
import subprocess

import pytest

FLOCK = shutil.which("flock")
pytestmark = pytest.mark.skipif(FLOCK is None, reason="util-linux flock(1) is not installed")


def _hold_with_flock(path, *opts):
    p = subprocess.Popen([FLOCK, *opts, str(path), "sh", "-c", "echo held; exec cat >/dev/null"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline() == "held\n"
    return p


def test_excluded_by_flock1_and_names_the_holder(cli, tmp_path):
    lock = tmp_path / "f"
    h = _hold_with_flock(lock)
    try:
        r = cli.run("run", "-n", "--path", lock, "true")
        assert r.returncode == 75  # run's conflict code; -E 1 gives flock's
        assert f"{lock} is busy" in r.stderr and f"pid {h.pid}" in r.stderr and "job pid" in r.stderr
        assert cli.run("run", "-n", "-E", "1", "--path", lock, "true").returncode == 1
        assert cli.run("run", "-w", "0.2", "-q", "--path", lock, "true").returncode == 75
    finally:
        h.stdin.close()
        h.wait()
    assert cli.run("run", "-n", "--path", lock, "-c", "exit 4").returncode == 4


def test_excludes_flock1_and_its_job_does_not_inherit_the_lock(cli, tmp_path):
    lock = tmp_path / "f"
    p = cli.start("run", "--path", lock, "--", "sh", "-c", "echo held; exec cat >/dev/null", stdin=subprocess.PIPE)
    assert p.stdout.readline() == "held\n"
    try:
        assert subprocess.run([FLOCK, "-n", str(lock), "true"], check=False).returncode == 1
        assert subprocess.run([FLOCK, "-s", "-n", str(lock), "true"], check=False).returncode == 1
        [lk] = json.loads(cli.run("status", "--path", lock, "--json").stdout)["locks"]
        # hostlock holds it (so does its watcher, a fork that lets go only once it has killed the job's
        # group after hostlock died); the job is named as hostlock's job and does not hold the lock itself
        holders = {h["pid"]: h for h in lk["holders"]}
        assert p.pid in holders
        jobs = {j["cmdline"]: j["pid"] for j in holders[p.pid]["jobs"]}
        assert "cat" in jobs and jobs["cat"] not in holders
    finally:
        p.stdin.close()
        assert p.wait(timeout=30) == 0
    assert subprocess.run([FLOCK, "-n", str(lock), "true"], check=False).returncode == 0


def test_lock_is_free_as_soon_as_run_exits(cli, tmp_path):
    """run's watcher process shares the lock's descriptor; release unlocks explicitly, so the lock is
    free the moment hostlock exits, not when the watcher gets round to exiting (repeated)."""
    lock = tmp_path / "f"
    for _round in range(10):
        assert cli.run("run", "--path", lock, "true").returncode == 0
        assert subprocess.run([FLOCK, "-n", str(lock), "true"], check=False).returncode == 0


def test_shared_and_ofd(cli, tmp_path):
    lock = tmp_path / "f"
    h = _hold_with_flock(lock, "-s")
    try:
        assert cli.run("run", "-s", "-n", "--path", lock, "true").returncode == 0
        assert cli.run("run", "-n", "--path", lock, "true").returncode == 75
        # OFD locks are independent of flock(2) locks, as with flock(1) --fcntl
        assert cli.run("run", "-n", "--mechanism", "ofd", "--path", lock, "true").returncode == 0
    finally:
        h.stdin.close()
        h.wait()


@pytest.mark.parametrize("args", [
    ["run", "name", "--path", "F", "true"],
    ["run", "--path", "F", "--slots", "2", "true"],
    ["run", "--path", "F", "-d", "D", "true"],
    ["run", "--path", "F", "--mechanism", "record", "true"],
    ["cron", "--name", "x", "--path", "F", "--", "true"],
])
def test_usage_errors(cli, tmp_path, args):
    r = cli.run(*[str(tmp_path / a) if a in ("F", "D") else a for a in args])
    assert r.returncode == 64 and r.stderr.count("\n") == 1, r.stderr


def test_cron_path(cli, tmp_path):
    lock = tmp_path / "f"
    h = _hold_with_flock(lock)
    try:
        r = cli.run("cron", "--path", lock, "--", "echo", "ran")
        assert (r.returncode, r.stdout) == (0, "")  # skipped quietly, like any cron conflict
    finally:
        h.stdin.close()
        h.wait()
    r = cli.run("cron", "--path", lock, "--", "sh", "-c", "echo out; exit 2")
    assert r.returncode == 2 and "out" in r.stdout


def test_fifo_at_the_path_is_refused(cli, tmp_path):
    """run --path opens the file the way hostlock flock does (one home, _pathlock): a FIFO is exit 66."""
    os.mkfifo(tmp_path / "f")
    r = cli.run("run", "-n", "--path", tmp_path / "f", "true")
    assert r.returncode == 66 and "FIFO" in r.stderr and r.stderr.count("\n") == 1
