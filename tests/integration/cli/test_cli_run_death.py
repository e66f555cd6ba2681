"""The job and its lock live and die together (issue 8 item 3; docs/security.md): whatever kills hostlock,
the job's whole process tree is dead before anyone else can take the lock.

Each test starts a job that ignores the polite signals and leaves two descendants (one in its process
group, one that called setsid()), checks that the lock is busy while they live, queues an independent
observer (a second `hostlock run -w` whose own job records what it sees in /proc of the old job's
processes the moment it gets the lock), kills hostlock one way, and proves the observer found every
process of the old job dead. No sleeps: every step waits on an event (a file written, a waiter queued,
a process exited).
"""

import os
import platform
import pty
import signal
import subprocess

import pytest
from cli_support import PYTHON, kill_quietly, pid_alive, wait_file, wait_until

# The job: ignores TERM, HUP and INT, starts a child in its group and a child in a session of its own,
# publishes the three pids at once (write then rename), then waits for them.
JOB = (
    'trap "" TERM HUP INT; sleep 300 & a=$!; setsid sleep 300 & b=$!; '
    'echo "$$ $a $b" > {pids}.tmp; mv {pids}.tmp {pids}; wait'
)


def start_job(cli, tmp_path, *, argv_prefix=(), pty_child=False):
    """Start `hostlock run L -c JOB`; returns (Popen or pid, [job pids])."""
    pids = tmp_path / "pids"
    argv = [*argv_prefix, *cli.argv("run", "L", "-c", JOB.format(pids=pids))]
    p = subprocess.Popen(argv, env=cli.env, start_new_session=True, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    cli.procs.append(p)
    return p, [int(x) for x in wait_file(pids).split()]


def observe(cli, job):
    """Queue a second copy behind the holder; its job prints the old job's process states when it runs."""
    states = " ".join(f"$(cut -d' ' -f3 /proc/{pid}/stat 2>/dev/null || echo gone)" for pid in job)
    observer = cli.start("run", "-w", "120", "L", "-c", f'echo "[{states}]"')
    wait_until(lambda: cli.status("L")["waiters"] == 1, 20, "the observer to queue for the lock")
    return observer


def assert_busy_while_alive(cli, job):
    assert all(pid_alive(pid) for pid in job)
    r = cli.run("run", "-n", "L", "true")
    assert r.returncode == 75, r  # the lock is held while the job lives
    assert "is busy" in r.stderr


def assert_observer_found_all_dead(cli, observer, job):
    out, err = observer.communicate(timeout=60)
    assert observer.returncode == 0, err
    states = out.split("[", 1)[1].split("]", 1)[0].split()
    assert len(states) == len(job)
    assert all(state in ("Z", "gone") for state in states), out  # dead (a zombie at most), never running
    wait_until(lambda: not any(pid_alive(pid) for pid in job), 20, "the old job's processes to be gone")
    assert cli.run("run", "-n", "L", "true").returncode == 0  # and the lock is not leaked


@pytest.fixture
def reap():
    """Kill whatever a failed test leaves running."""
    pids = []
    yield pids
    kill_quietly(pids)


def test_sigkill_to_hostlock(cli, tmp_path, reap):
    p, job = start_job(cli, tmp_path)
    reap.extend(job)
    assert_busy_while_alive(cli, job)
    observer = observe(cli, job)
    p.send_signal(signal.SIGKILL)
    assert_observer_found_all_dead(cli, observer, job)


def test_sigkill_to_hostlocks_process_group(cli, tmp_path, reap):
    p, job = start_job(cli, tmp_path)
    reap.extend(job)
    assert os.getpgid(p.pid) == p.pid
    assert_busy_while_alive(cli, job)
    observer = observe(cli, job)
    os.killpg(p.pid, signal.SIGKILL)  # kill -9 -PGID: the old watcher, in this group, died with it
    assert_observer_found_all_dead(cli, observer, job)


def test_sigkill_to_hostlocks_session(cli, tmp_path, reap):
    p, job = start_job(cli, tmp_path)
    reap.extend(job)
    sid = os.getsid(p.pid)
    assert os.getsid(job[0]) == sid  # the job and its group child share hostlock's session
    assert_busy_while_alive(cli, job)
    observer = observe(cli, job)
    r = subprocess.run(["pkill", "-9", "-s", str(sid)], check=False)
    assert r.returncode == 0
    assert_observer_found_all_dead(cli, observer, job)


def test_timeout_kill_after(cli, tmp_path, reap):
    """timeout(1) -k: SIGTERM (ignored by the job, forwarded by hostlock), then SIGKILL to hostlock and to
    timeout's whole process group. The 300 s limit never fires: SIGTERM to timeout starts the sequence."""
    p, job = start_job(cli, tmp_path, argv_prefix=("timeout", "-k", "0.2", "300"))
    reap.extend(job)
    assert_busy_while_alive(cli, job)
    observer = observe(cli, job)
    p.send_signal(signal.SIGTERM)  # timeout passes it on, then SIGKILLs after 0.2 s
    assert p.wait(60) in (-signal.SIGKILL, 128 + signal.SIGKILL)  # timeout(1) SIGKILLs its own group too
    assert_observer_found_all_dead(cli, observer, job)


# A job caught inside vfork(): its first process waits in the kernel (state D) until its child execs or
# exits, and the child blocks before either. A shell does this for every command it runs (dash and bash
# vfork), so a kill can always land there. raw clone(CLONE_VFORK | SIGCHLD) without CLONE_VM: the wait of
# vfork() with the memory of fork(), which Python survives. Publishes "parent child" once both exist.
VFORK_JOB = """
import ctypes, os, sys
r, w = os.pipe()
pid = ctypes.CDLL(None, use_errno=True).syscall({nr}, 0x4000 | 17, 0, 0, 0, 0)
if pid == 0:
    with open(sys.argv[1] + ".tmp", "w") as f:
        f.write("%d %d\\n" % (os.getppid(), os.getpid()))
    os.rename(sys.argv[1] + ".tmp", sys.argv[1])
    os.read(r, 1)
    os._exit(0)
os._exit(1)
"""
CLONE_SYSCALL = {"x86_64": 56, "aarch64": 220}.get(platform.machine())


@pytest.mark.skipif(CLONE_SYSCALL is None, reason="clone(2)'s syscall number is known for x86_64 and aarch64")
def test_sigkill_to_hostlock_while_the_job_waits_in_vfork(cli, tmp_path, reap):
    """A frozen vfork child leaves its parent in D, never T: the watcher must not wait for that parent to
    stop (it did, forever, holding the lock: found by a CI run under load), but kill the tree at once."""
    pids = tmp_path / "pids"
    p = subprocess.Popen(cli.argv("run", "L", "--", PYTHON, "-c", VFORK_JOB.format(nr=CLONE_SYSCALL), pids),
                         env=cli.env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True)
    cli.procs.append(p)
    job = [int(x) for x in wait_file(pids).split()]
    reap.extend(job)
    wait_until(lambda: open(f"/proc/{job[0]}/stat").read().rsplit(")", 1)[1].split()[0] == "D", 20,
               "the job to wait in vfork")
    assert_busy_while_alive(cli, job)
    observer = observe(cli, job)
    p.send_signal(signal.SIGKILL)
    assert_observer_found_all_dead(cli, observer, job)


# Sends the job SIGCONT once, the moment the watcher's freeze shows (the job's setsid child, which nothing
# else stops, is in T): what the kernel does when hostlock's death orphans the job's group while a member
# is stopped (SIGHUP, ignored by this job, then SIGCONT). Writes "sent" after the signals.
RESUMER = """
import os, sys, time
out, pids = sys.argv[1], [int(p) for p in sys.argv[2:]]
def state(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"
deadline = time.monotonic() + 120
while state(pids[-1]) not in ("T", "gone") and time.monotonic() < deadline:
    pass
for pid in pids:
    try:
        os.kill(pid, 18)
    except OSError:
        pass
with open(out, "w") as f:
    f.write("sent\\n")
"""


def test_a_sigcont_after_the_watchers_freeze_does_not_keep_the_job_alive(cli, tmp_path, reap):
    """A SIGCONT that lands after the watcher's SIGSTOP (the kernel sends one when hostlock's death orphans
    the job's group): the watcher stops what runs again and kills the tree; it used to wait for a stop
    that never came, holding the lock for good (found under load, 3 runs in 60)."""
    p, job = start_job(cli, tmp_path)
    reap.extend(job)
    assert_busy_while_alive(cli, job)
    observer = observe(cli, job)
    sent = tmp_path / "sent"
    resumer = subprocess.Popen([PYTHON, "-c", RESUMER, str(sent), *map(str, job)], start_new_session=True)
    try:
        p.send_signal(signal.SIGKILL)
        assert_observer_found_all_dead(cli, observer, job)
        assert wait_file(sent) == "sent\n"  # the SIGCONT was sent: the freeze was undone once at least
    finally:
        resumer.kill()
        resumer.wait()


def start_in_terminal(cli, tmp_path):
    """hostlock as the session leader of a real pty, in the terminal's foreground (so the job shares its
    process group, as an interactive job does); returns (hostlock pid, pty master, [job pids])."""
    pids = tmp_path / "pids"
    pid, master = pty.fork()
    if pid == 0:  # the child: session leader, controlling terminal = the pty
        try:
            os.execve(cli.launcher, cli.argv("run", "L", "-c", JOB.format(pids=pids)), cli.env)
        finally:
            os._exit(127)
    job = [int(x) for x in wait_file(pids).split()]
    assert os.getpgid(job[0]) == pid  # the job is in hostlock's (the foreground) group
    return pid, master, job


def test_sigkill_to_hostlock_in_a_terminal(cli, tmp_path, reap):
    """With a terminal the job stays in hostlock's group: PR_SET_PDEATHSIG freezes it, and the watcher
    kills it and its children (in the group or not) before the lock is free."""
    pid, master, job = start_in_terminal(cli, tmp_path)
    reap.extend(job)
    try:
        assert_busy_while_alive(cli, job)
        observer = observe(cli, job)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        assert_observer_found_all_dead(cli, observer, job)
    finally:
        os.close(master)


def test_terminal_hangup_then_the_sessions_kill(cli, tmp_path, reap):
    """A hang-up (the pty's master closes): hostlock does not die of SIGHUP; the job, which ignores it, runs
    on holding the lock. Then the session is killed (what a login manager does after a hang-up)."""
    pid, master, job = start_in_terminal(cli, tmp_path)
    reap.extend(job)
    try:
        assert_busy_while_alive(cli, job)
        os.close(master)  # the hang-up: SIGHUP (and SIGCONT) to the session leader and foreground group
        master = -1
        assert_busy_while_alive(cli, job)  # the job lives on, still under the lock,
        assert os.waitpid(pid, os.WNOHANG) == (0, 0)  # and so does hostlock
        observer = observe(cli, job)
        r = subprocess.run(["pkill", "-9", "-s", str(pid)], check=False)
        assert r.returncode == 0
        os.waitpid(pid, 0)
        assert_observer_found_all_dead(cli, observer, job)
    finally:
        if master >= 0:
            os.close(master)


def test_a_job_that_ends_normally_leaves_its_daemons_running_without_the_lock(cli, tmp_path, reap):
    """The decision for descendants that leave: killed with the job if hostlock dies mid-job (above); a
    job that ends by itself may leave daemons, which never hold the lock (its descriptors are close-on-exec)."""
    pidfile = tmp_path / "pid"
    r = cli.run("run", "L", "-c", f"setsid sleep 300 > /dev/null 2>&1 & echo $! > {pidfile}")
    daemon = int(pidfile.read_text())
    reap.append(daemon)
    assert r.returncode == 0
    assert pid_alive(daemon)
    assert cli.run("run", "-n", "L", "true").returncode == 0


@pytest.mark.parametrize("where", [["L"], ["--path", "FILE"], ["--mechanism", "flock", "L"]])
def test_the_lock_is_free_the_moment_a_normal_run_exits(cli, tmp_path, where):
    """The watcher shares the lock's description, but hostlock unlocks before it exits: a run started
    right after another one ended never finds the lock busy (repeated, to give a race every chance)."""
    where = [str(tmp_path / "file") if w == "FILE" else w for w in where]
    if where[0] == "--mechanism":
        where = ["-d", str(tmp_path / "flockdir"), *where]
    for _i in range(20):
        first = cli.run("run", "-n", *where, "true")
        second = cli.run("run", "-n", *where, "true")
        assert (first.returncode, second.returncode) == (0, 0), (first.stderr, second.stderr)
