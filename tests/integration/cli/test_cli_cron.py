"""`hostlock cron`: silent when the job succeeds or another copy runs, the captured output on failure, a
max runtime, one syslog line per run, and cron's bare environment."""

import os
import socket

import pytest
from cli_support import wait_file, wait_until


def bare_env(cli):
    """What cron gives a job: a minimal PATH, no HOME, no terminal, nothing else but our lock directory."""
    return {"PATH": "/usr/bin:/bin", "SHELL": "/bin/sh", "LOGNAME": "root", "HOSTLOCK_DIR": cli.lockdir}


def test_success_is_silent(cli):
    r = cli.run("cron", "--", "sh", "-c", "echo lots of output; echo and errors >&2", env=bare_env(cli))
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")


def test_failure_prints_the_captured_output_in_order_then_the_status(cli):
    r = cli.run("cron", "--name", "job", "-c", "echo one; echo two >&2; echo three; exit 3", env=bare_env(cli))
    assert r.returncode == 3
    assert r.stdout == "one\ntwo\nthree\n"  # stdout and stderr interleaved as written
    assert r.stderr.count("\n") == 1
    assert "cron job: exit status 3" in r.stderr and "echo one" in r.stderr


def test_a_large_output_does_not_block_the_job(cli):
    # 4 MB: a pipe (64 KB) would block the job until someone read it; the unlinked file does not.
    r = cli.run("cron", "--time-limit", "20", "-c", "head -c 4000000 /dev/zero | tr '\\0' x; exit 1")
    assert r.returncode == 1
    assert len(r.stdout) == 4000000


def test_a_signal_death_is_a_failure(cli):
    r = cli.run("cron", "--", "sh", "-c", "echo before; kill -KILL $$")
    assert r.returncode == 128 + 9
    assert r.stdout == "before\n" and "killed by signal 9 (SIGKILL)" in r.stderr


def test_timeout_is_a_failure_with_124(cli):
    r = cli.run("cron", "--time-limit", "0.3", "-c", "echo started; sleep 300")  # only the limit ends it in time
    assert r.returncode == 124
    assert r.stdout == "started\n" and "timed out" in r.stderr


def test_cannot_execute_is_reported(cli):
    r = cli.run("cron", "--", "/nonexistent/backup")
    assert r.returncode == 69
    assert "cannot execute /nonexistent/backup" in r.stdout + r.stderr


def test_default_name_is_derived_from_the_command_and_shown_by_status(cli, tmp_path):
    started = tmp_path / "started"
    script = tmp_path / "backup.sh"
    script.write_text(f"#!/bin/sh\necho $$ > {started}\nexec sleep 30\n")
    script.chmod(0o755)
    p = cli.start("cron", "--", str(script), "--full", env=bare_env(cli))
    job = int(wait_file(started))
    (lock,) = [entry for entry in cli.status()["locks"] if entry["holders"]]
    assert lock["name"].startswith("cron-backup.sh-") and len(lock["name"]) == len("cron-backup.sh-") + 8
    assert lock["holders"][0]["job_pid"] == job
    # The same entry maps to the same lock (a second copy is skipped); other arguments to another one.
    assert cli.run("cron", "--on-conflict", "fail", "--", str(script), "--full").returncode == 75
    r = cli.run("cron", "--", "true", "--full")
    assert r.returncode == 0
    p.kill()


def test_conflict_quiet_by_default_report_and_fail(cli):
    cli.start("run", "nightly", "sleep", "30")
    cli.wait_held("nightly")
    r = cli.run("cron", "--name", "nightly", "echo", "second copy", env=bare_env(cli))
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")
    r = cli.run("cron", "--name", "nightly", "--on-conflict", "report", "echo", "second copy")
    assert r.returncode == 0 and r.stdout == ""
    assert "lock nightly is busy" in r.stderr and "not running echo" in r.stderr
    r = cli.run("cron", "--name", "nightly", "--on-conflict=fail", "echo", "second copy")
    assert r.returncode == 75 and "busy" in r.stderr
    r = cli.run("cron", "--name", "nightly", "-E", "3", "echo", "second copy")
    assert (r.returncode, r.stderr) == (3, "")


def test_wait_for_the_previous_run(cli):
    cli.start("run", "nightly", "sleep", "0.4")
    cli.wait_held("nightly")
    r = cli.run("cron", "--name", "nightly", "-w", "10", "--", "sh", "-c", "echo ran; exit 1")
    assert (r.returncode, r.stdout) == (1, "ran\n")


def test_sigterm_to_cron_mode_reaches_the_job(cli, tmp_path):
    mark = tmp_path / "got"
    ready = tmp_path / "ready"
    job = f"trap 'echo TERM > {mark}; exit 0' TERM; touch {ready}; sleep 30 & wait"
    p = cli.start("cron", "--name", "n", "-c", job)
    wait_until(ready.exists, 10, "the job to start")
    p.terminate()
    assert p.wait(10) == 0
    assert mark.read_text() == "TERM\n"


@pytest.fixture
def syslog(tmp_path):
    path = str(tmp_path / "log.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    s.settimeout(5)
    yield path, s
    s.close()


def test_syslog_one_line_per_run(cli, syslog):
    path, server = syslog
    r = cli.run("cron", "--syslog-socket", path, "--name", "ok", "true")
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")
    line = server.recv(4096).decode()
    assert line.startswith("<14>") and "hostlock[" in line and "cron ok: exit status 0" in line
    r = cli.run("cron", "--syslog-socket", path, "--name", "bad", "false")
    assert r.returncode == 1
    line = server.recv(4096).decode()
    assert line.startswith("<11>") and "cron bad: exit status 1" in line
    cli.start("run", "busy", "sleep", "30")
    cli.wait_held("busy")
    assert cli.run("cron", "--syslog-socket", path, "--name", "busy", "true").returncode == 0
    assert "cron busy: skipped, lock busy is busy" in server.recv(4096).decode()
    server.settimeout(0.2)
    with pytest.raises(socket.timeout):
        server.recv(4096)  # exactly one line per run


def test_syslog_unavailable_is_said_once_and_the_job_still_runs(cli, tmp_path):
    r = cli.run("cron", "--syslog-socket", str(tmp_path / "none"), "--", "sh", "-c", "echo ran > /dev/null")
    assert r.returncode == 0
    assert r.stderr.count("\n") == 1 and "cannot write to syslog" in r.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["cron"], "missing COMMAND"),
        (["cron", "--on-conflict", "loud", "true"], "invalid mode"),
        (["cron", "--name", "a/b", "true"], "invalid lock name"),
        (["cron", "--syslog-socket"], "needs a value"),
    ],
)
def test_cron_bad_input(cli, args, message):
    r = cli.run(*args)
    assert r.returncode == 64 and message in r.stderr and r.stderr.count("\n") == 1


def test_cron_without_home_or_path(cli, tmp_path):
    env = {"HOSTLOCK_DIR": cli.lockdir}  # not even PATH: execvp falls back to the default search path
    r = cli.run("cron", "--", "sh", "-c", "exit 2", env=env)
    assert r.returncode == 2
    assert os.environ.get("HOME") is not None  # the test itself had one; the command did not need it
