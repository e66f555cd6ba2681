"""`hostlock run` with real processes and real signals: each of flock(1)'s options, and each of its failures turned
into a test (docs/cli.md, "The lock and the job live and die together")."""

import os
import shlex
import signal
import subprocess
import time

import pytest
from cli_support import fd_links, pid_alive, wait_file, wait_until
from engine_helpers import default_signals, signum

# ----------------------------------------------------------------------------------------- exit status


def test_passes_the_jobs_output_and_status(cli):
    r = cli.run("run", "a", "--", "sh", "-c", "echo out; echo err >&2; exit 7")
    assert (r.returncode, r.stdout, r.stderr) == (7, "out\n", "err\n")


def test_arguments_after_the_command_pass_untouched(cli):
    r = cli.run("run", "a", "printf", "%s|", "-n", "--", "-c", "x y")
    assert (r.returncode, r.stdout) == (0, "-n|--|-c|x y|")


def test_dash_c_uses_bin_sh(cli):
    r = cli.run("run", "a", "-c", 'echo "$0"; exit 3', env=dict(cli.env, SHELL="/bin/false"))
    assert (r.returncode, r.stdout) == (3, "/bin/sh\n")


def test_options_may_follow_the_name_like_flock(cli):
    r = cli.run("run", "a", "-n", "-E", "9", "-c", "exit 4")
    assert r.returncode == 4


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL, signal.SIGSEGV])
def test_job_killed_by_signal_n_exits_128_plus_n(cli, sig):
    r = cli.run("run", "a", "sh", "-c", f"kill -{int(sig)} $$")
    assert r.returncode == 128 + sig


def test_cannot_execute_is_69(cli):
    r = cli.run("run", "a", "/nonexistent/cmd")
    assert r.returncode == 69
    assert "cannot execute /nonexistent/cmd" in r.stderr
    assert cli.is_free("a")


def test_verbose_goes_to_stderr_never_stdout(cli):
    r = cli.run("run", "-v", "a", "echo", "job")
    assert r.stdout == "job\n"
    assert "got exclusive lock a" in r.stderr and "job started" in r.stderr


# ----------------------------------------------------------------------------------------- conflicts


def test_nonblock_conflict_default_75_names_the_holder_and_its_job(cli):
    holder = cli.start("run", "a", "sleep", "300")
    (h,) = cli.wait_held("a")
    r = cli.run("run", "-n", "a", "echo", "second copy")  # had it waited, cli.run's timeout would fail it
    assert r.returncode == 75
    assert r.stdout == ""
    assert f"pid {holder.pid}" in r.stderr and f"job pid {h['job_pid']}" in r.stderr
    assert "sleep 300" in r.stderr


def test_conflict_exit_code_and_quiet_like_flock(cli):
    cli.start("run", "a", "sleep", "30")
    cli.wait_held("a")
    r = cli.run("run", "-n", "-q", "-E", "1", "a", "true")
    assert (r.returncode, r.stdout, r.stderr) == (1, "", "")
    r = cli.run("run", "--nb", "--conflict-exit-code=0", "a", "true")
    assert r.returncode == 0 and "busy" in r.stderr


def test_wait_with_fraction_times_out(cli):
    cli.start("run", "a", "sleep", "300")  # outlives cli.run's timeout: a wait past -w fails the test
    cli.wait_held("a")
    t0 = time.monotonic()
    r = cli.run("run", "-w", "0.4", "a", "echo", "ran")
    assert r.returncode == 75 and r.stdout == ""
    assert time.monotonic() - t0 >= 0.4  # it did wait (an upper bound would be a timing assertion)


def test_wait_gets_the_lock_when_the_holder_ends(cli, tmp_path):
    first = cli.start("run", "a", "sleep", "0.5")
    cli.wait_held("a")
    r = cli.run("run", "-w", "10", "a", "echo", "second")
    assert (r.returncode, r.stdout) == (0, "second\n")
    assert first.wait(5) == 0


def test_exclusive_jobs_never_overlap(cli, tmp_path):
    log = tmp_path / "log"
    script = f'echo start >> {log}; sleep 0.2; echo end >> {log}'
    procs = [cli.start("run", "a", "-c", script) for _i in range(4)]
    assert [p.wait(20) for p in procs] == [0] * 4
    assert log.read_text().split() == ["start", "end"] * 4


def test_shared_holders_run_together_and_exclude_a_writer(cli):
    for _i in range(2):
        cli.start("run", "-s", "a", "sleep", "30")
    hs = cli.wait_held("a", count=2)
    assert {h["mode"] for h in hs} == {"shared"}
    assert cli.run("run", "-s", "-n", "a", "true").returncode == 0
    assert cli.run("run", "-x", "-n", "a", "true").returncode == 75


def test_slots_allow_n_holders(cli):
    for _i in range(2):
        cli.start("run", "--slots", "2", "a", "sleep", "30")
    hs = cli.wait_held("a", count=2)
    assert sorted(h["slot"] for h in hs) == [0, 1]
    r = cli.run("run", "--slots", "2", "-n", "a", "true")
    assert r.returncode == 75


def slots_busy(cli):
    cli.start("run", "--slots", "2", "a", "sleep", "30")
    cli.start("run", "--slots", "2", "a", "sleep", "0.5")
    cli.wait_held("a", count=2)


def test_slots_wait_for_a_free_slot(cli):
    slots_busy(cli)
    r = cli.run("run", "--slots", "2", "a", "echo", "third")
    assert (r.returncode, r.stdout, r.stderr) == (0, "third\n", "")


def test_slots_wait_with_a_deadline_for_a_free_slot(cli):
    slots_busy(cli)
    r = cli.run("run", "-w", "10", "--slots", "2", "a", "echo", "third")
    assert (r.returncode, r.stdout, r.stderr) == (0, "third\n", "")


# ----------------------------------------------------------------------------------------- the job's life


def test_status_names_the_job_not_only_hostlock(cli, tmp_path):
    pidfile = tmp_path / "pid"
    p = cli.start("run", "--label", "nightly", "a", "-c", f"echo $$ > {pidfile}; exec sleep 30")
    job = int(wait_file(pidfile))
    (h,) = cli.wait_held("a")
    assert h["pid"] == p.pid and h["job_pid"] == job
    assert h["job_cmdline"] == "sleep 30" and h["label"] == "nightly"
    table = cli.run("status", "a").stdout
    assert f"{job} sleep 30" in table and str(p.pid) in table and "[nightly]" in table


def test_a_newline_in_the_job_or_label_stays_inside_its_row_and_line(cli, tmp_path):
    """A command line or label is another user's text: printed with its control characters escaped, every
    status row and every path-status line stays one line (a newline could forge a row)."""
    pidfile = tmp_path / "pid"
    cli.start("run", "--label", "a\nfake  row", "a", "-c", f"echo $$ > {pidfile}; exec sh -c 'sleep 300; :' 'x\ny'")
    job = int(wait_file(pidfile))
    cli.wait_held("a")
    table = cli.run("status").stdout.splitlines()
    assert len(table) == 3, table  # directory, header, one row
    assert f"{job} sh -c sleep 300; : x\\x0ay [a\\x0afake  row]" in table[2], table
    lock = os.path.join(cli.lockdir, "a.lock")
    lines = cli.run("status", "--path", lock, "--wide").stdout.splitlines()
    # the path, then one line per kernel lock (the lock byte and the OPEN guard), each naming the job
    assert len(lines) == 3 and all(line.startswith("  ") and "$'x\\ny'" in line for line in lines[1:]), lines


def test_sigterm_to_hostlock_reaches_the_job_and_hostlock_exits_with_its_status(cli, tmp_path):
    mark = tmp_path / "got"
    ready = tmp_path / "trapped"
    p = cli.start("run", "a", "-c", f"trap 'echo TERM > {mark}; exit 9' TERM; echo ok > {ready}; sleep 30 & wait")
    cli.wait_held("a")
    wait_file(ready)  # the trap is set: a SIGTERM before it would end the shell with 143
    p.send_signal(signal.SIGTERM)
    assert p.wait(10) == 9
    assert mark.read_text() == "TERM\n"
    assert cli.is_free("a")


# Every signal that would end hostlock (hostlock.core.signals), real-time ones and SIGALRM too.
@pytest.mark.parametrize("sig", ["HUP", "INT", "QUIT", "USR1", "USR2", "ALRM", "PWR", "RTMIN+2"])
def test_other_signals_are_forwarded(cli, tmp_path, sig):
    mark = tmp_path / "got"
    ready = tmp_path / "trapped"
    p = cli.start("run", "a", "-c", f"trap 'echo {sig} >> {mark}; exit 0' {sig}; echo ok > {ready}; sleep 30 & wait")
    cli.wait_held("a")
    wait_file(ready)  # the trap is set: a signal before it would end the shell, not test the forwarding
    os.kill(p.pid, signum(sig))
    assert p.wait(10) == 0
    assert mark.read_text() == f"{sig}\n"  # exactly once


def test_an_untrapped_forwarded_signal_gives_128_plus_n(cli):
    p = cli.start("run", "a", "sleep", "30")
    cli.wait_held("a")
    p.send_signal(signal.SIGTERM)
    assert p.wait(10) == 128 + signal.SIGTERM


def test_sigkill_to_hostlock_kills_the_job_and_its_children_and_frees_the_lock(cli, tmp_path):
    pids = tmp_path / "pids"
    # A shell job whose sleep is a grandchild of hostlock: PR_SET_PDEATHSIG reaches only the shell, the
    # watcher kills the rest of the job's process group.
    p = cli.start("run", "a", "-c", f"sleep 300 & echo $$ $! > {pids}; wait")
    shell, grandchild = map(int, wait_file(pids).split())
    cli.wait_held("a")
    p.send_signal(signal.SIGKILL)
    p.wait(5)
    wait_until(lambda: not pid_alive(shell) and not pid_alive(grandchild), 5, "the job to die with hostlock")
    # The watcher lets go of the lock once it has seen the job gone, a moment after the job died: waited for
    # (-w), the next run takes it; test_no_second_copy_starts_while_a_killed_holders_job_lives proves the order.
    r = cli.run("run", "-w", "60", "a", "echo", "free")
    assert (r.returncode, r.stdout) == (0, "free\n")
    assert cli.is_free("a")


def test_no_second_copy_starts_while_a_killed_holders_job_lives(cli, tmp_path):
    """A waiter queued behind a holder that gets SIGKILL must not start before the old job is gone."""
    pids = tmp_path / "pids"
    p = cli.start("run", "a", "-c", f"sleep 300 & echo $$ $! > {pids}; wait")
    old = wait_file(pids).split()
    cli.wait_held("a")
    alive = " ".join(f"$(cut -d' ' -f3 /proc/{pid}/stat 2>/dev/null)" for pid in old)
    waiter = cli.start("run", "-w", "20", "a", "-c", f'echo "old job states: [{alive}]"')
    wait_until(lambda: cli.status("a")["waiters"] == 1, 10, "the second copy to queue")
    p.send_signal(signal.SIGKILL)
    out, err = waiter.communicate(timeout=20)
    assert waiter.returncode == 0, err
    states = out.split("[", 1)[1].split("]")[0].split()
    assert all(state == "Z" for state in states), out  # dead (at most not yet reaped), never running


def test_sigkill_kills_the_job_in_the_same_process_group_too(cli, tmp_path):
    pidfile = tmp_path / "pid"
    p = cli.start("run", "--process-group", "same", "a", "-c", f"echo $$ > {pidfile}; exec sleep 300")
    job = int(wait_file(pidfile))
    cli.wait_held("a")
    assert os.getpgid(job) == os.getpgid(p.pid)
    p.send_signal(signal.SIGKILL)
    wait_until(lambda: not pid_alive(job), 5, "PR_SET_PDEATHSIG to kill the job")
    wait_until(lambda: cli.is_free("a"), 60, "the watcher to let go of the lock once it saw the job gone")


def test_a_daemon_started_by_the_job_does_not_keep_the_lock(cli, tmp_path):
    pidfile = tmp_path / "pid"
    # flock(1) leaves the lock held here: the backgrounded sleep inherits its lock descriptor.
    r = cli.run("run", "a", "-c", f"sleep 60 > /dev/null 2>&1 & echo $! > {pidfile}", timeout=10)
    daemon = int(pidfile.read_text())
    try:
        assert r.returncode == 0
        assert pid_alive(daemon)
        assert cli.is_free("a")
        assert cli.run("run", "-n", "a", "true").returncode == 0
        fds = os.listdir(f"/proc/{daemon}/fd")
        assert not any(os.readlink(f"/proc/{daemon}/fd/{fd}").startswith(cli.lockdir) for fd in fds)
    finally:
        os.kill(daemon, signal.SIGKILL)


def test_the_watcher_lets_go_of_the_callers_streams_and_keeps_the_lock(cli, tmp_path):
    """The watcher closes hostlock's standard streams at once (`out=$(hostlock run ...)` never waits for it) and
    keeps a duplicate of the lock's descriptor, which holds the lock if hostlock dies: killed, the job dies
    before the lock is free."""
    from hostlock.core import procstat

    pidfile = tmp_path / "pid"
    p = cli.start("run", "a", "-c", f"echo $$ > {pidfile}.tmp && mv {pidfile}.tmp {pidfile} && exec sleep 300")
    job = int(wait_file(pidfile))
    try:
        (watcher,) = [int(d) for d in os.listdir("/proc") if d.isdigit() and int(d) != job
                      and (procstat.fields(int(d)) or [None] * 2)[procstat.PPID] == b"%d" % p.pid]
        theirs = fd_links(watcher)
        caller = {link for fd, link in fd_links(p.pid).items() if fd in (0, 1, 2)}
        assert not set(theirs) & {0, 1, 2} and not set(theirs.values()) & caller, (theirs, caller)
        assert any(link.startswith(cli.lockdir) for link in theirs.values()), theirs
        p.send_signal(signal.SIGKILL)
        p.wait(5)
        wait_until(lambda: not pid_alive(job), 10, "the watcher to kill the job")
        wait_until(lambda: cli.is_free("a"), 10, "the watcher to let go of the lock")
    finally:
        if pid_alive(job):
            os.kill(job, signal.SIGKILL)


def test_no_lock_descriptor_reaches_the_job(cli):
    r = cli.run("run", "a", "sh", "-c", "ls -l /proc/$$/fd")
    assert r.returncode == 0
    assert cli.lockdir not in r.stdout


# -------------------------------------------------------------------------------------- --time-limit


def test_timeout_terms_the_job_and_exits_124(cli):
    r = cli.run("run", "--time-limit", "300ms", "a", "sleep", "300")  # only the time limit can end it in time
    assert r.returncode == 124
    assert cli.is_free("a")


def test_timeout_kills_after_kill_after_when_term_is_ignored(cli, tmp_path):
    pids = tmp_path / "pids"
    # TERM ignored from the start (inherited through hostlock and exec, as nohup-like wrappers do), not by a
    # trap: a 0.3 s time limit could end a loaded machine's shell before it reached the trap.
    r = cli.run("run", "--time-limit", "0.3", "--kill-after", "0.3", "-v", "a", "-c",
                f"sleep 300 & echo $! > {pids}; while :; do sleep 0.05; done",
                preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_IGN))
    assert r.returncode == 124
    assert "sending SIGKILL" in r.stderr
    # the whole process group went, not only the shell
    wait_until(lambda: not pid_alive(int(pids.read_text())), 5, "the job's child to be killed")


def test_timeout_ends_what_left_the_jobs_group_before_the_lock_is_free(cli, tmp_path):
    """--time-limit ends the job's whole tree, as the watcher would: a child that left the job's group with
    setsid is gone by the time hostlock exits 124 and frees the lock (it ran on before, unlocked). The limit
    only has to outlast the job's first steps (a fork, a write); nothing here waits for it to pass sooner."""
    escaped = tmp_path / "escaped"
    inner = "echo $$ > %s; exec sleep 300" % escaped
    r = cli.run("run", "--time-limit", "3s", "--kill-after", "1s", "a", "-c",
                "setsid sh -c %s & while [ ! -s %s ]; do sleep 0.02; done; sleep 300" % (shlex.quote(inner), escaped))
    assert r.returncode == 124, r.stderr
    assert not pid_alive(int(escaped.read_text()))
    assert cli.is_free("a")


def test_a_job_that_finishes_in_time_keeps_its_status(cli):
    assert cli.run("run", "--time-limit", "10", "a", "sh", "-c", "exit 5").returncode == 5


# ----------------------------------------------------------------------------------------- a terminal


def test_ctrl_c_in_a_terminal_reaches_the_job_once_and_hostlock_dies_of_sigint(cli, tmp_path):
    """In a terminal the job shares hostlock's process group, so Ctrl-C reaches it directly: hostlock
    must not forward it a second time, and dies of SIGINT itself so a calling shell loop stops."""
    import pty

    log = tmp_path / "log"
    ready = tmp_path / "ready"
    job = f"trap 'echo INT >> {log}; trap - INT; kill -INT $$' INT; touch {ready}; sleep 30 & wait"
    pid, master = pty.fork()
    if pid == 0:  # the child: a session leader whose controlling terminal is the pty
        default_signals()
        os.execve(cli.launcher, cli.argv("run", "a", "-c", job), cli.env)
    try:
        wait_until(ready.exists, 10, "the job to start")
        os.write(master, b"\x03")  # Ctrl-C: the line discipline sends SIGINT to the foreground group
        status = os.waitpid(pid, 0)[1]
    finally:
        os.close(master)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGINT
    assert log.read_text() == "INT\n"
    assert cli.is_free("a")


# ----------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "args, message",
    [
        (["run"], "missing lock NAME"),
        (["run", "a"], "missing COMMAND"),
        (["run", "a", "--"], "missing COMMAND"),
        (["run", "--bogus", "a", "true"], "unknown option --bogus"),
        (["run", "-Z", "a", "true"], "unknown option -Z"),
        (["run", "-w"], "option -w needs a value"),
        (["run", "-w", "soon", "a", "true"], "invalid duration"),
        (["run", "-n", "-w", "1", "a", "true"], "cannot be used together"),
        (["run", "-E", "300", "a", "true"], "out of range"),
        (["run", "--slots", "0", "a", "true"], "invalid count"),
        (["run", "-s", "--slots", "2", "a", "true"], "cannot be used together"),
        (["run", "a", "-c", "echo", "extra"], "exactly one shell command"),
        (["run", "a", ""], "empty word"),
        (["run", "--time-limit", "1e10", "a", "true"], "too long"),
        (["run", "--kill-after", "1e300", "a", "true"], "too long"),
        (["run", "--kill-after", "nan", "a", "true"], "invalid duration"),
        (["run", "--time-limit", "inf", "a", "true"], "too long"),
        (["run", "-w", "-1", "a", "true"], "invalid duration"),
        (["cron", "--time-limit", "1e10", "true"], "too long"),
        (["run", "../etc", "true"], "invalid lock name"),
        (["run", "a/b", "true"], "invalid lock name"),
        (["run", "x" * 101, "true"], "101 characters"),
        (["frobnicate"], "unknown command"),
        ([], "missing command"),
        (["status", "--bogus"], "unrecognized arguments"),
        (["hold", "a"], "--lease"),
    ],
)
def test_bad_input_is_one_line_and_exit_64(cli, args, message):
    r = cli.run(*args)
    assert r.returncode == 64, r
    assert r.stdout == ""
    assert message in r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("hostlock: ")


def test_unusable_lock_directory(cli, tmp_path):
    notadir = tmp_path / "file"
    notadir.write_text("")
    r = cli.run("run", "-d", str(notadir), "a", "true")
    assert r.returncode == 66
    assert str(notadir) in r.stderr and r.stderr.count("\n") == 1


@pytest.mark.parametrize("plant", ["symlink", "fifo", "world-writable"])
def test_hostile_lock_paths_are_refused_with_66(cli, tmp_path, plant):
    d = tmp_path / "hostile"
    d.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    if plant == "symlink":
        (d / "a.lock").symlink_to(victim)
    elif plant == "fifo":
        os.mkfifo(d / "a.lock")
    else:
        d.chmod(0o777)
    r = cli.run("run", "-d", d, "a", "echo", "ran", timeout=10)
    assert (r.returncode, r.stdout) == (66, "")
    assert str(d) in r.stderr and r.stderr.count("\n") == 1
    assert victim.read_text() == "precious\n"


def test_read_only_file_system_is_73(cli, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root for a private read-only mount")
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o700)
    script = f'mount -t tmpfs -o ro,mode=700 tmpfs {ro} && exec "$@"'
    r = subprocess.run(["unshare", "-m", "sh", "-c", script, "sh", *cli.argv("run", "-d", ro, "a", "true")],
                       check=False, capture_output=True, text=True, env=cli.env, timeout=30)
    if "mount" in r.stderr and r.returncode != 73:
        pytest.skip(f"cannot mount here: {r.stderr.strip()}")
    assert r.returncode == 73, r.stderr
    assert r.stderr.count("\n") == 1


@pytest.mark.parametrize("command", ["run", "cron", "status", "list", "hold", "renew", "release", "break"])
def test_every_subcommand_has_help(cli, command):
    r = cli.run(command, "--help")
    assert r.returncode == 0 and r.stderr == ""
    assert r.stdout.startswith(f"usage: hostlock {command}")


def test_top_level_help_and_version(cli):
    assert "run NAME" in cli.run("--help").stdout
    assert cli.run("--version").stdout.startswith("hostlock ")
