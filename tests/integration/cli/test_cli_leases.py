"""hold / renew / release / break and status through the command line."""

import json
import os
import signal
import time

import pytest
from cli_support import wait_file, wait_until


@pytest.fixture
def lease(cli):
    r = cli.run("hold", "deploy", "--lease", "60", "--label", "ansible: site.yml")
    assert r.returncode == 0, r.stderr
    token = r.stdout.strip()
    assert r.stdout == token + "\n" and r.stderr == ""
    yield token
    cli.run("release", "deploy", token)


def test_hold_shows_in_status_and_blocks_run(cli, lease):
    (h,) = cli.wait_held("deploy")
    assert h["label"] == "ansible: site.yml" and time.time() < h["lease_expires"] <= time.time() + 60
    assert h["token_id"] and h["token_id"] in lease
    assert lease.split(".")[1] not in json.dumps(cli.status())  # the secret never shows
    assert cli.run("run", "-n", "deploy", "true").returncode == 75
    table = cli.run("status").stdout
    assert "deploy" in table and "[ansible: site.yml]" in table and "(in " in table


def test_renew_and_release(cli, lease):
    r = cli.run("renew", "deploy", lease, "--lease", "2h")
    assert r.returncode == 0 and "renewed until" in r.stdout
    (h,) = cli.holders("deploy")
    assert h["lease_expires"] > time.time() + 7000
    r = cli.run("renew", "deploy", lease, "--json")
    assert json.loads(r.stdout)["lease_expires"] < time.time() + 100
    r = cli.run("release", "deploy", "-", input=lease + "\n")  # token from stdin, out of ps
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")
    wait_until(lambda: cli.is_free("deploy"), 5, "the lease to end")
    r = cli.run("release", "deploy", lease)
    assert r.returncode == 77 and "no lease" in r.stderr


@pytest.mark.parametrize("command", ["renew", "release"])
def test_wrong_token_is_77_and_leaves_the_lease(cli, lease, command):
    tid, secret = lease.split(".")[:2]
    for bad in (f"{tid}.{'0' * 32}", "garbage", f"{'a' * 12}.{secret}"):
        r = cli.run(command, "deploy", bad)
        assert r.returncode == 77, (bad, r)
        assert r.stderr.count("\n") == 1
    assert len(cli.holders("deploy")) == 1


def test_an_expired_lease_frees_the_lock_and_its_token_is_refused(cli):
    token = cli.run("hold", "short", "--lease", "0.3").stdout.strip()
    wait_until(lambda: cli.is_free("short"), 5, "the lease to expire")
    assert cli.run("renew", "short", token).returncode == 77


def test_hold_conflict_uses_the_conflict_code(cli, lease):
    r = cli.run("hold", "deploy", "--lease", "5", "-n")
    assert r.returncode == 75, r.stderr
    r = cli.run("hold", "deploy", "--lease", "5", "-w", "0.2", "-E", "4")
    assert r.returncode == 4


def test_hold_json(cli):
    before = time.time()
    r = cli.run("hold", "j", "--lease", "30", "--json")
    doc = json.loads(r.stdout)
    assert doc["schema"] == "hostlock.lease/1" and doc["name"] == "j" and doc["directory"] == cli.lockdir
    assert before + 29.999 <= doc["lease_expires"] <= time.time() + 30.001  # 30 s from when it was taken
    assert cli.run("release", "j", doc["token"]).returncode == 0


def test_break_leaves_a_live_holder_without_force_and_ends_it_with_force(cli, lease):
    r = cli.run("break", "deploy")
    assert r.returncode == 75
    assert "nothing to remove" in r.stdout and "use --force" in r.stdout
    assert len(cli.holders("deploy")) == 1
    r = cli.run("break", "deploy", "--force")
    assert r.returncode == 0, r
    assert "ended live holder" in r.stdout
    assert cli.is_free("deploy")


def test_break_removes_a_dead_holders_record_lock(cli, tmp_path):
    """With the record mechanism a killed holder leaves its file: status flags it, break removes it."""
    pidfile = tmp_path / "pid"
    p = cli.start("run", "--mechanism", "record", "r", "-c", f"echo $$ > {pidfile}; exec sleep 60")
    job = int(wait_file(pidfile))
    cli.wait_held("r")
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    wait_until(lambda: not os.path.exists(f"/proc/{job}/stat") or open(f"/proc/{job}/stat").read().split()[2] == "Z",
               5, "the job to die with hostlock")
    st = cli.status("r")
    assert st["state"] == "stale" and st["holders"][0]["stale"] and st["holders"][0]["pid"] == p.pid
    assert "stale" in cli.run("status", "r").stdout
    r = cli.run("break", "r", "--json")
    doc = json.loads(r.stdout)
    assert r.returncode == 0 and doc["removed"][0]["pid"] == p.pid and doc["remaining"] == []
    assert cli.status("r")["state"] == "free"


def test_status_json_schema(cli):
    cli.start("run", "--slots", "3", "sem", "sleep", "30")
    cli.wait_held("sem")
    doc = cli.status()
    assert doc["schema"] == "hostlock.status/1" and doc["directory"] == cli.lockdir
    (lock,) = doc["locks"]
    assert set(lock) == {"name", "path", "mechanism", "slots", "state", "stale", "problem", "waiters", "holders"}
    assert (lock["name"], lock["slots"], lock["state"], lock["waiters"]) == ("sem", 3, "held", 0)
    assert set(lock["holders"][0]) == {
        "pid", "user", "uid", "mode", "slot", "cmdline", "job_pid", "job_cmdline", "label", "acquired_at",
        "lease_expires", "token_id", "alive", "stale", "verified", "forged", "problem", "hostname", "boot_id",
        "start_time", "pid_namespace", "fence",
    }
    assert lock["holders"][0]["verified"] is True and lock["holders"][0]["forged"] is False
    assert lock["holders"][0]["fence"] is None  # a host lock has no fencing token


def test_status_counts_waiters(cli):
    cli.start("run", "q", "sleep", "30")
    cli.wait_held("q")
    cli.start("run", "q", "true")
    wait_until(lambda: cli.status("q")["waiters"] == 1, 5, "the waiter to be counted")
    assert "WAIT" in cli.run("status", "q").stdout


def test_list_of_an_empty_directory(cli):
    r = cli.run("list")
    assert (r.returncode, r.stdout) == (0, f"directory: {cli.lockdir}\nno locks\n")
    assert cli.status() == {"schema": "hostlock.status/1", "directory": cli.lockdir, "locks": []}


@pytest.mark.parametrize("value", ["1e10", "1e300", "inf", "nan", "25d", "-1"])
def test_absurd_lease_is_a_usage_error_not_a_silent_lie(cli, value):
    r = cli.run("hold", "huge", "--lease", value)
    assert (r.returncode, r.stdout) == (64, ""), r
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    if value in ("1e10", "1e300", "25d"):
        assert "at most 2147483.647 seconds" in r.stderr
    assert cli.is_free("huge") and not cli.holders("huge")


def test_renew_past_the_limit_is_a_usage_error_and_keeps_the_lease(cli, lease):
    r = cli.run("renew", "deploy", lease, "--lease", "1e10")
    assert r.returncode == 64 and r.stderr.count("\n") == 1 and "at most" in r.stderr
    (h,) = cli.holders("deploy")
    assert h["lease_expires"] < time.time() + 100


@pytest.mark.parametrize("command", ["renew", "hold"])
@pytest.mark.parametrize("value", ["nan", "0", "inf", "-1"])
def test_a_lease_that_is_not_positive_says_it_must_be_more_than_zero(cli, lease, command, value):
    args = ("renew", "deploy", lease) if command == "renew" else ("hold", "other")
    r = cli.run(*args, "--lease", value)
    assert r.returncode == 64 and r.stderr.count("\n") == 1, r
    assert "> 0" in r.stderr or "at most" in r.stderr, r.stderr
    assert ">= 0" not in r.stderr
    (h,) = cli.holders("deploy")
    assert h["lease_expires"] < time.time() + 100  # the lease is as it was
