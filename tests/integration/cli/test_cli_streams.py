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


def _to_a_broken_pipe(cli, *args):
    """Run hostlock with stdout a pipe whose reading end is closed before it starts: every write is EPIPE."""
    r, w = os.pipe()
    os.close(r)
    try:
        return subprocess.run(cli.argv(*args), stdout=w, stderr=subprocess.PIPE, text=True, env=cli.env, timeout=60,
                              check=False)
    finally:
        os.close(w)


@pytest.mark.parametrize("how", ["full", "broken-pipe"])
@pytest.mark.parametrize("json_out", [False, True], ids=["token", "json"])
def test_hold_whose_token_cannot_be_written_gives_the_lease_back(cli, how, json_out):
    """Nobody got the token, so nobody could release or renew the lease: it was held for its whole length.
    Now it is given back before hostlock exits (73 for a full disk, 141 for a broken pipe, as for any of
    hostlock's own output), and the lock is free at once."""
    args = ["hold", "fullx", "--lease", "10m", *(["--json"] if json_out else [])]
    r = sh(cli, ">/dev/full", *args) if how == "full" else _to_a_broken_pipe(cli, *args)
    assert r.returncode == (73 if how == "full" else 141), r
    assert "Traceback" not in r.stderr
    assert cli.run("run", "-n", "fullx", "true").returncode == 0, "the lease outlived a hold that failed"


def test_a_token_from_a_closed_stdin_is_a_usage_error(cli):
    for command in ("release", "renew"):
        r = sh(cli, "<&-", command, "x", "-")
        assert r.returncode == 64 and "no token on stdin" in r.stderr and r.stderr.count("\n") == 1, r


@pytest.mark.parametrize("command", ["status", "list", "hold", "renew", "release", "break", "gc"])
def test_admin_help_to_a_full_stdout_is_one_line_and_73(cli, command):
    r = sh(cli, ">/dev/full", command, "--help")
    assert r.returncode == 73 and "No space left on device" in r.stderr and r.stderr.count("\n") == 1, r


def test_admin_output_to_a_broken_pipe_ends_quietly(cli):
    """`hostlock list | head -c0`: 141 with nothing on stderr, as for hostlock's other output."""
    cli.run("hold", "a", "--lease", "1m")
    for args in (["list"], ["status", "a"], ["gc", "--dry-run"]):
        r = _to_a_broken_pipe(cli, *args)
        assert r.returncode == 141 and r.stderr == "", (args, r)
