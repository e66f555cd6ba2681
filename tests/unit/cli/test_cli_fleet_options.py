"""In-process tests of the command line's fleet options: --fleet and $HOSTLOCK_FLEET, --ttl, the host-only
options refused beside a fleet (exit 64, one line, before any I/O), the exit codes 76 and 79, and the
supervisor's abort (what stops the job of a lost fleet lock), on real processes."""

from __future__ import annotations

import os
import signal
import threading

import pytest

import hostlock
from hostlock.cli import admin, main, options, supervise
from hostlock.cli import common as c
from hostlock.proc import forward
from hostlock.proc.job import Job

URL = "etcd://127.0.0.1:1"  # never contacted: every case here fails or is decided before any I/O


@pytest.fixture(autouse=True)
def no_fleet_env(monkeypatch):
    monkeypatch.delenv("HOSTLOCK_FLEET", raising=False)


@pytest.fixture(autouse=True)
def signal_mask_restored(monkeypatch):
    """waker() blocks SIGALRM in this (pytest's) thread for good, as it should in hostlock: undo it after
    each test, or every later test in this worker starts children with SIGALRM blocked (flock -w then
    never times out) and the next waker() finds it blocked already."""
    monkeypatch.setattr(forward, "_wake_was_blocked", [False])
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, ())
    yield
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def parse(*args, cron=False):
    return options.parse(list(args), cron=cron)


def test_fleet_option_and_environment(monkeypatch):
    assert parse("n", "true").fleet is None
    o = parse("--fleet", URL, "--ttl", "3s", "n", "true")
    assert (o.fleet, o.ttl, o.name, o.command) == (URL, 3.0, "n", ["true"])
    monkeypatch.setenv("HOSTLOCK_FLEET", URL)
    assert parse("n", "true").fleet == URL
    assert parse("--fleet", "", "n", "true").fleet is None  # '' forces a host lock
    assert parse("--fleet=", "-d", "/tmp", "n", "true").directory == "/tmp"
    assert parse("--fleet", URL, "--name", "x", "true", cron=True).fleet == URL


@pytest.mark.parametrize("args, message", [
    (["--fleet", URL, "-d", "/tmp", "n", "true"], "--dir is for host locks, not a fleet lock (--fleet %s)" % URL),
    (["--fleet", URL, "--mechanism", "ofd", "n", "true"], "--mechanism is for host locks"),
    (["--fleet", URL, "--path", "/tmp/f", "true"], "--path is for host locks"),
    (["--fleet", URL, "-d", "/x", "--mechanism", "flock", "n", "true"], "--dir and --mechanism are for host locks"),
    (["--ttl", "5", "n", "true"], "--ttl applies to fleet locks only"),
    (["--fleet", URL, "--ttl", "0", "n", "true"], "--ttl must be more than 0"),
    (["--fleet", URL, "--ttl", "nan", "n", "true"], "--ttl"),
])
def test_refused_combinations(args, message):
    with pytest.raises(c.UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse(*args)


def test_a_fleet_from_the_environment_is_named_in_the_refusal(monkeypatch):
    monkeypatch.setenv("HOSTLOCK_FLEET", URL)
    with pytest.raises(c.UsageError, match=r"\(\$HOSTLOCK_FLEET etcd://127.0.0.1:1\).*--fleet ''"):
        parse("-d", "/tmp", "n", "true")


@pytest.mark.parametrize("argv", [
    ["run", "--fleet", URL, "-d", "DIR", "n", "true"],
    ["cron", "--fleet", URL, "--path", "FILE", "true"],
    ["status", "--fleet", URL, "-d", "DIR"],
    ["list", "--fleet", URL, "-d", "DIR"],
    ["hold", "n", "--lease", "1m", "--fleet", URL, "--mechanism", "ofd"],
    ["renew", "n", "tok", "--fleet", URL, "-d", "DIR"],
    ["release", "n", "tok", "--fleet", URL, "-d", "DIR"],
    ["break", "n", "--fleet", URL, "-d", "DIR"],
    ["gc", "--fleet", URL],
    ["status", "--path", "FILE", "--fleet", URL],
    ["flock", "--fleet", URL, "FILE", "true"],
    ["run", "--fleet", "http://127.0.0.1:1", "n", "true"],
    ["run", "--fleet", "etcd://", "n", "true"],
    ["status", "--fleet", "etcd://h:notaport"],
])
def test_usage_errors_are_one_line_and_64_before_any_io(argv, tmp_path, capfd):
    argv = [str(tmp_path / a) if a in ("DIR", "FILE") else a for a in argv]
    assert main(argv) == c.EX_USAGE
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and err.startswith("hostlock"), err
    assert list(tmp_path.iterdir()) == []  # nothing created: not the directory, not the file


def test_gc_and_status_path_ignore_the_environment(monkeypatch, tmp_path, capfd):
    monkeypatch.setenv("HOSTLOCK_FLEET", URL)
    f = tmp_path / "f"
    f.write_text("")
    assert main(["status", "--path", str(f)]) == 0
    assert main(["gc", "-d", str(tmp_path), "--dry-run"]) in (0, c.EX_DATAERR)  # never 64, never etcd
    assert "etcd" not in capfd.readouterr().err


def test_exit_codes_of_fleet_errors():
    assert c.error_exit_code(hostlock.FleetUnavailable("no member of 127.0.0.1:1 answered")) == c.EX_FLEET == 76
    assert c.error_exit_code(hostlock.LockLost("lost")) == c.EX_LOST == 79


def test_help_texts_name_the_fleet_options_and_codes(capfd):
    assert main(["run", "--help"]) == 0
    out = capfd.readouterr().out
    assert "--fleet URL" in out and "--ttl DURATION" in out and "76" in out and "79" in out
    assert main(["cron", "--help"]) == 0
    assert "--fleet URL" in capfd.readouterr().out
    for command in ("status", "list", "hold", "renew", "release", "break"):
        assert "--fleet URL" in admin._build(command).format_help(), command


# --- the supervisor's abort: a real job, stopped because another thread says its lock is lost -------------

def _trap_job(tmp_path, ignore_term=False):
    ready = tmp_path / "ready"
    got = tmp_path / "got-term"
    body = "trap 'echo term > %s; %s' TERM; echo > %s; while :; do sleep 0.05; done" % (
        got, ":" if ignore_term else "exit 3", ready)
    return ["/bin/sh", "-c", body], ready, got


def _abort_when_ready(ready, flag, wake):
    def run():
        while not ready.exists():  # the job's trap is set once it wrote this
            threading.Event().wait(0.01)
        flag.set()
        wake()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_abort_sends_sigterm_to_the_job(tmp_path):
    argv, ready, got = _trap_job(tmp_path)
    flag = threading.Event()
    wake = forward.waker()
    t = _abort_when_ready(ready, flag, wake)
    outcome = supervise.supervise(Job(argv, abort=flag.is_set, kill_after=60))
    t.join()
    assert outcome.aborted and not outcome.timed_out
    assert os.WIFEXITED(outcome.status) and os.WEXITSTATUS(outcome.status) == 3  # its TERM trap ran
    assert got.read_text() == "term\n"
    assert "stopped, exit status 3" in outcome.describe()


def test_abort_kills_a_job_that_ignores_sigterm_after_kill_after(tmp_path):
    argv, ready, got = _trap_job(tmp_path, ignore_term=True)
    flag = threading.Event()
    wake = forward.waker()
    t = _abort_when_ready(ready, flag, wake)
    outcome = supervise.supervise(Job(argv, abort=flag.is_set, kill_after=0.2))
    t.join()
    assert outcome.aborted and os.WIFSIGNALED(outcome.status) and os.WTERMSIG(outcome.status) == signal.SIGKILL
    assert got.read_text() == "term\n"


def test_a_stray_wake_signal_does_not_abort(tmp_path):
    argv, ready, _got = _trap_job(tmp_path)
    argv[2] = argv[2].replace("while :; do sleep 0.05; done", "while [ ! -e %s ]; do sleep 0.05; done"
                              % (tmp_path / "go"))
    wake = forward.waker()

    def poke():
        while not ready.exists():
            threading.Event().wait(0.01)
        wake()  # abort() is still false: nothing happens
        (tmp_path / "go").write_text("")

    t = threading.Thread(target=poke, daemon=True)
    t.start()
    outcome = supervise.supervise(Job(argv, abort=lambda: False))
    t.join()
    assert not outcome.aborted and os.WEXITSTATUS(outcome.status) == 0


def test_the_job_does_not_inherit_the_blocked_wake_signal(tmp_path):
    forward.waker()
    out = tmp_path / "mask"
    # grep itself, not through sh: dash and bash clear the signal mask when they start.
    with out.open("w") as f:
        job = Job(["grep", "SigBlk", "/proc/self/status"], abort=lambda: False, out_fd=f.fileno())
        outcome = supervise.supervise(job)
    assert outcome.exit_code() == 0
    blocked = int(out.read_text().split()[1], 16)
    assert not blocked & (1 << (forward.WAKE - 1))


def test_a_wake_signal_blocked_before_waker_stays_blocked_for_the_job(tmp_path):
    signal.pthread_sigmask(signal.SIG_BLOCK, {forward.WAKE})  # as a caller's mask gave it to us
    forward.waker()
    out = tmp_path / "mask"
    with out.open("w") as f:
        job = Job(["grep", "SigBlk", "/proc/self/status"], abort=lambda: False, out_fd=f.fileno())
        assert supervise.supervise(job).exit_code() == 0
    assert int(out.read_text().split()[1], 16) & (1 << (forward.WAKE - 1))
