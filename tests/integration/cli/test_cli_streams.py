"""Closed and full standard streams (issue 8 item 7): the job's status stays the exit status, hostlock
never prints a traceback, and a closed stream stays closed for the job (hostlock never puts a file of its
own there, so nothing it writes can land in the lock file)."""

import os
import subprocess

import pytest


def sh(cli, redirections, *args, timeout=30):
    """Run hostlock with shell redirections applied to it (`>&-`, `2>&-`, `<&-`, `>/dev/full`)."""
    words = " ".join("'%s'" % a.replace("'", "'\\''") for a in cli.argv(*args))
    return subprocess.run(["/bin/sh", "-c", f"exec {words} {redirections}"], capture_output=True, text=True,
                          env=cli.env, timeout=timeout, check=False)


def lock_file_intact(cli, name):
    with open(os.path.join(cli.lockdir, name + ".lock"), "rb") as f:
        return f.read(9) == b"HOSTLOCK "


@pytest.mark.parametrize("redirections", [">&-", "2>&-", "<&-", ">&- 2>&- <&-", ">/dev/full"])
def test_closed_or_full_streams_keep_the_jobs_status(cli, redirections):
    r = sh(cli, redirections, "run", "-v", "a", "sh", "-c", "exit 3")
    assert r.returncode == 3, r
    assert "Traceback" not in r.stderr
    assert lock_file_intact(cli, "a")
    assert cli.run("run", "-n", "a", "true").returncode == 0


def test_a_closed_stream_stays_closed_for_the_job(cli):
    """Not /dev/null in its place: the job sees what its caller gave it (its own write fails, with its status)."""
    r = sh(cli, ">&-", "run", "a", "sh", "-c", "echo hi; echo $? >&2")
    assert r.returncode == 0, r
    assert r.stderr.strip().endswith("1")  # echo to a closed stdout fails: EBADF


def test_diagnostics_with_stderr_closed_never_reach_the_lock_file(cli):
    holder = cli.start("run", "a", "sleep", "300")
    cli.wait_held("a")
    r = sh(cli, "2>&-", "run", "-n", "-v", "a", "true")  # conflict: hostlock has a line to say
    assert r.returncode == 75
    assert lock_file_intact(cli, "a")
    holder.kill()


def test_a_full_stdout_for_our_own_output_is_one_line_and_73(cli):
    r = sh(cli, ">/dev/full", "run", "--help")
    assert r.returncode == 73
    assert r.stderr == "hostlock: cannot write output: No space left on device\n"


def test_cron_with_a_full_stdout_reports_the_failure_and_keeps_its_status(cli):
    r = sh(cli, ">/dev/full", "cron", "--", "sh", "-c", "echo out; exit 2")
    assert r.returncode == 2
    assert "cannot copy the job's captured output" in r.stderr
    assert "exit status 2" in r.stderr
    assert "Traceback" not in r.stderr
