"""The watcher's kill (hostlock/proc/jobkill.py) run in-process against real processes, for the moments an
end-to-end test cannot place: a SIGCONT landing right after its SIGSTOP, a pid reused under it, a process
the watcher may not signal.

The end-to-end tests (test_cli_run_death.py) kill hostlock and check the lock and the job; these call
`kill_job` the way a watcher does, with the job's first process, its group and its /proc stat line.
"""

import os
import shutil
import signal
import subprocess
import threading

import pytest
from cli_support import LIB, kill_quietly, pid_alive, wait_file

from hostlock.proc import jobkill as _jobkill


def stat_line(pid):
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read()


@pytest.fixture
def job(tmp_path):
    """A job in its own process group that ignores SIGHUP (as one does under nohup), with a child in its
    group; returns [first process, child]. Killed afterwards whatever happens."""
    pidfile = tmp_path / "child"
    p = subprocess.Popen(["sh", "-c", f'trap "" HUP; sleep 300 & echo $! > {pidfile}; wait'],
                         start_new_session=True)
    pids = [p.pid, int(wait_file(pidfile))]
    yield pids
    kill_quietly(pids)
    p.wait()


def kill_in_thread(pid, timeout=60):
    """Run kill_job as the watcher would; returns whether it came back within `timeout` seconds."""
    t = threading.Thread(target=_jobkill.kill_job, args=(pid, True, stat_line(pid), b""), daemon=True)
    t.start()
    t.join(timeout)
    return not t.is_alive()


def test_a_sigcont_right_after_the_freeze_is_answered(job, monkeypatch):
    """Each process gets SIGCONT the instant after the watcher's first SIGSTOP reaches it, as the kernel's
    SIGCONT to a newly orphaned process group can: the stop is undone before it happens. The watcher used
    to wait for a stop that never came (the lock held for good); now it stops them again and kills them."""
    undone = []
    signal_victim = _jobkill._Victim.signal

    def signal_then_resume(victim, sig):
        signal_victim(victim, sig)
        if sig == signal.SIGSTOP and victim.pid not in undone:
            undone.append(victim.pid)
            os.kill(victim.pid, signal.SIGCONT)  # cancels the pending stop as well

    monkeypatch.setattr(_jobkill._Victim, "signal", signal_then_resume)
    assert kill_in_thread(job[0]), "kill_job still waiting for a stop that a SIGCONT undid"
    assert sorted(undone) == sorted(job)
    assert not any(pid_alive(pid) for pid in job)


def test_a_victim_whose_pid_now_names_another_process_is_not_signalled(job):
    """A victim pinned by pid and start time: when the pid names a process with another start time (the
    victim died, its pid was reused), signal() sends nothing, with or without a pidfd."""
    start = _jobkill._stat(job[1])[3]
    ghost = _jobkill._Victim(job[1], start + 1, None)  # the same pid, a different process
    assert ghost.state() is None
    ghost.signal(signal.SIGKILL)
    assert pid_alive(job[1])
    assert _jobkill._Victim.pin(job[1], start + 1) is None
    real = _jobkill._Victim.pin(job[1], start)
    assert real is not None
    try:
        real.signal(signal.SIGKILL)
        assert kill_in_thread(job[0])
        assert not pid_alive(job[1])
    finally:
        real.close()


def test_a_vfork_parent_counts_as_frozen():
    """A process in D (a vfork() parent waiting for a frozen child) counts as stopped: waiting for its T hung
    the watcher (test_cli_run_death.py has the end-to-end case)."""
    assert _jobkill._stopped(("D", 1, 1, 1))
    assert _jobkill._stopped(("T", 1, 1, 1)) and _jobkill._stopped(None) and _jobkill._stopped(("Z", 1, 1, 1))
    assert not _jobkill._stopped(("S", 1, 1, 1)) and not _jobkill._stopped(("R", 1, 1, 1))


NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
SYSTEM_PYTHON = "/usr/bin/python3"  # runnable by nobody (pyenv's lives under root's 0700 home on some machines)
WATCHER = """
import sys
sys.path.insert(0, sys.argv[1])
from hostlock.proc import jobkill as _jobkill
job = int(sys.argv[2])
with open("/proc/%d/stat" % job, "rb") as f:
    _jobkill.kill_job(job, True, f.read(), b"")
print("done")
"""


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv") or not os.path.exists(SYSTEM_PYTHON),
                    reason="needs root, setpriv and %s to run the watcher as another user" % SYSTEM_PYTHON)
def test_a_process_the_watcher_may_not_signal_does_not_keep_the_rest_of_the_job_alive():
    """A job of a user who is not root, `producer | sudo tee`: the tee runs as root, so the watcher (the
    user) may not signal it. The watcher used to wait forever for it to stop while the producer it reads
    from was frozen (the lock held for good). Now the freeze goes on without it, the producer is killed,
    the reader sees EOF and ends, and kill_job returns only once it has: never with any of the job alive."""
    producer = subprocess.Popen([*NOBODY, "sleep", "300"], stdout=subprocess.PIPE,
                                preexec_fn=lambda: os.setpgid(0, 0))  # the job's own group, led by the user
    reader = subprocess.Popen(["cat"], stdin=producer.stdout, stdout=subprocess.DEVNULL,
                              preexec_fn=lambda: os.setpgid(0, producer.pid))  # root's, in the job's group
    producer.stdout.close()
    try:
        watcher = subprocess.run([*NOBODY, SYSTEM_PYTHON, "-B", "-c", WATCHER, str(LIB), str(producer.pid)],
                                 capture_output=True, text=True, timeout=60, check=False)
        assert (watcher.returncode, watcher.stdout) == (0, "done\n"), watcher.stderr
        assert not pid_alive(producer.pid) and not pid_alive(reader.pid)
        assert reader.wait(10) == 0  # it ended on its own, at EOF: nobody could kill it
    finally:
        for p in (producer, reader):
            p.kill()
            p.wait()
